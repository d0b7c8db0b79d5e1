// Enrolment of a launched task with the launcher's job CA
// (net/launch_enrol.hpp).
#include "net/launch_enrol.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "net/rendezvous.hpp"
#include "net/socket.hpp"

namespace troupe::launch_enrol {

namespace {

// Room for the reply: two PEM certificates and the JSON around them.
constexpr std::size_t kMaxReplyMessage = 64 << 10;

std::string padded(const std::string& text, std::size_t n) {
  std::string out(n, '\0');
  std::memcpy(out.data(), text.data(), std::min(text.size(), n));
  return out;
}

job_ca_error failure(const std::string& why) {
  return job_ca_error(std::string(kFdVariable) + ": " + why);
}

// Why `frame` is no request from `task`, or "".
std::string problem_of(std::string_view frame, const std::string& task) {
  if (frame.size() != kFrameBytes || frame.substr(0, kMagicBytes) != kMagic)
    return "not an enrolment request (" + std::to_string(frame.size()) + " bytes)";
  const auto field = frame.substr(kMagicBytes, kTaskBytes);
  const auto claimed = field.substr(0, field.find('\0'));
  if (claimed != task)
    return "it asks for a certificate as '" + std::string(claimed) + "', but was started as " +
           task;
  return "";
}

// One message from `fd` within `timeout`; throws job_ca_error.
std::string receive(int fd, std::chrono::seconds timeout) {
  if (!net::wait_ready(fd, POLLIN, net::clock_type::now() + timeout))
    throw failure("the launcher sent no certificate within " + std::to_string(timeout.count()) +
                  " s");
  std::string buf(kMaxReplyMessage, '\0');
  ssize_t got = 0;
  do {
    got = ::recv(fd, buf.data(), buf.size(), MSG_TRUNC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) throw failure(std::string("reading the launcher's answer: ") + std::strerror(errno));
  if (got == 0) throw failure("the launcher closed the socket without an answer");
  if (static_cast<std::size_t>(got) > buf.size())
    throw failure("the launcher's answer is over " + std::to_string(buf.size()) + " bytes");
  buf.resize(static_cast<std::size_t>(got));
  return buf;
}

}  // namespace

std::string make_request(const std::string& task, const std::string& public_key) {
  return std::string(kMagic, kMagicBytes) + padded(task, kTaskBytes) +
         padded(public_key, task_key::kPublicBytes);
}

std::string make_frame(const std::string& task, const task_key& key) {
  const auto request = make_request(task, key.public_raw());
  return request + padded(key.sign_request(request), task_key::kSignatureBytes);
}

std::string answer(const job_authority& ca, const std::string& task, std::string_view frame,
                   std::string& refusal) {
  refusal = task.size() < kTaskBytes ? problem_of(frame, task) : "its task name is too long";
  std::string certificate;
  if (refusal.empty()) {
    try {
      const auto request = frame.substr(0, kRequestBytes);
      certificate = ca.issue(task, request.substr(kMagicBytes + kTaskBytes), request,
                             frame.substr(kRequestBytes));
    } catch (const job_ca_error& e) {
      refusal = e.what();
    }
  }
  if (!refusal.empty()) return rendezvous_wire::make_reply({{"error", refusal}});
  return rendezvous_wire::make_reply({{"certificate", certificate}, {"ca", ca.ca_pem()}});
}

int fd_of_variable(const char* text) {
  const std::string value = text ? text : "";
  const auto bad = [&value](const std::string& why) {
    return failure("expected the number of the socket troupe launch passed, got '" + value + "' (" +
                   why + ")");
  };
  if (value.empty() || value.size() > 9 ||
      value.find_first_not_of("0123456789") != std::string::npos)
    throw bad("not a file descriptor number");
  const int fd = std::stoi(value);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw bad(std::strerror(errno));
  int type = 0;
  socklen_t len = sizeof type;
  if (!S_ISSOCK(st.st_mode) || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET)
    throw bad("not the launcher's socket");
  return fd;
}

task_identity enrol(int fd, const std::string& task, std::chrono::seconds timeout) {
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_fd{fd};
  const task_key key;
  const auto frame = make_frame(task, key);
  ssize_t sent = 0;
  do {
    sent = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(frame.size()))
    throw failure(std::string("sending the certificate request: ") +
                  (sent < 0 ? std::strerror(errno) : "short write"));
  const auto reply = receive(fd, timeout);
  const auto header = std::string_view(reply).substr(0, rendezvous_wire::kReplyHeaderBytes);
  const auto length = rendezvous_wire::reply_length(header);
  if (length < 0 || reply.size() != rendezvous_wire::kReplyHeaderBytes + std::size_t(length))
    throw failure("the launcher's answer is malformed");
  const auto payload = std::string_view(reply).substr(rendezvous_wire::kReplyHeaderBytes);
  std::string problem;
  auto id = identity_of_reply(payload, task, key, problem);
  if (!problem.empty()) throw failure("the launcher " + problem);
  return id;
}

task_identity identity_of_reply(std::string_view payload, const std::string& task,
                                const task_key& key, std::string& problem) {
  auto j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) {
    problem = "refused the certificate request: " + j["error"].get<std::string>();
    return {};
  }
  const auto issued = rendezvous_wire::certificate_of_reply(payload);
  task_identity id{task, issued.ca, issued.certificate, key.private_pem()};
  problem = issued.certificate.empty() ? "it sent none" : check_task_identity(id);
  if (!problem.empty()) problem = "issued no usable certificate for " + task + ": " + problem;
  return id;
}

}  // namespace troupe::launch_enrol
