// The two threads of an open TLS link (net/secure_link_detail.hpp): one
// per direction, each with its half of the record layer, the inbound one
// with the BASP guard's check of every frame.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "net/frame_budget.hpp"
#include "net/secure_link_detail.hpp"
#include "net/socket.hpp"

namespace troupe::secure_link_detail {

namespace {

constexpr std::size_t kChunk = 256 * 1024;         // one read from either side
constexpr auto kLinger = std::chrono::seconds(2);  // to flush after the other side closed
constexpr const char* kCutByBudget = "cut for the budget of unfinished frames";

// Waits until `fd` is ready for `events` (true), or the link is told to
// stop (stop() sets the flag, then writes the pipe).
bool wait_for(link& l, int fd, short events) {
  return !l.stopping && net::wait_ready(fd, events, net::kNoDeadline, l.stop_pipe[0]);
}

// Sends all of [data, data + n) to `fd`; false when the link stops (its
// pipe, never emptied, stays readable), `until` passes or the socket fails.
bool send_all(link& l, int fd, const char* data, std::size_t n,
              clock_type::time_point until = net::kNoDeadline) {
  return net::send_all(fd, {data, n}, until, l.stop_pipe[0]);
}

// The n wire bytes at `in` opened into `out`; n becomes the plaintext's
// size. "" or why the link ends (with the alert owed noted for the
// outbound side, which owns the writer).
std::string open_records(link& l, tls13::record_reader& records, const char* in, std::size_t& n,
                         char* out) {
  std::size_t got = 0;
  if (auto problem = records.feed_to(in, n, out, &got); !problem.empty()) {
    if (auto owed = records.alert()) l.alert_due = *owed;
    return "TLS: " + problem;  // a record that fails authentication lands here
  }
  if (records.take_key_update_request()) l.key_update_asked = true;
  n = got;
  return "";
}

// The guard's check of the n bytes at `data`, within the process's budget
// for unfinished frames; data and n become what passed (in `checked`): whole
// frames only. "" or why the link ends; kCutByBudget when the budget cut
// it (its callback logged why).
std::string check_frames(link& l, link_counters& counters, frame_budget::share& budget,
                         const char*& data, std::size_t& n, std::vector<char>& checked) {
  // A large frame's buffer, handed on, is not kept for the next chunk.
  if (checked.capacity() > basp_guard::kKeptBytes)
    std::vector<char>().swap(checked);
  else
    checked.clear();
  auto& process = frame_budget::process();
  if (!process.reserve(budget, n, l.unfinished_limit, [&l] { return !l.stopping; }).empty())
    return kCutByBudget;
  auto problem = l.guard->feed(data, n, checked);
  process.settle(budget, l.guard->held_bytes());
  if (auto drops = l.guard->take_drops(); drops.count > 0) {
    counters.dropped += drops.count;
    spdlog::warn("{}: dropped {} frame(s) from {}: {}", l.p.me, drops.count, l.who(),
                 drops.first_reason);
  }
  if (!problem.empty()) {
    ++counters.guard_closed;
    return problem;
  }
  data = checked.data();
  n = checked.size();
  return "";
}

}  // namespace

// Peer -> BASP: records opened, frames checked by the guard, written to the
// plain end. Ends when the peer closes or misbehaves, or the link stops.
void pump_inbound(link& l, link_counters& counters) {
  tls13::record_reader* records = l.reader.get();
  // Record plaintext goes straight into `opened` (never zero-filled): at
  // most what came in, plus a record left over from the last read.
  std::vector<char> buf(kChunk), checked;
  std::unique_ptr<char[]> opened(
      records ? new char[kChunk + tls13::header_size + tls13::max_ciphertext] : nullptr);
  std::string why;
  bool peer_closed = false, basp_gone = false;
  frame_budget::share budget(frame_budget::process(), l.who(), [&l](const std::string& reason) {
    spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), reason);
    l.stop();
  });
  while (!l.stopping && !peer_closed) {
    ssize_t n = ::recv(l.tcp, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (!wait_for(l, l.tcp, POLLIN)) break;
        continue;
      }
      why = std::strerror(errno);
      break;
    }
    if (n == 0) {
      peer_closed = true;
      break;
    }
    const char* data = buf.data();
    std::size_t len = static_cast<std::size_t>(n);
    if (records) {
      why = open_records(l, *records, buf.data(), len, opened.get());
      if (!why.empty()) break;
      peer_closed = records->closed();
      data = opened.get();
    }
    if (len == 0) continue;
    counters.bytes_in += len;
    l.decide({});
    if (l.guard) {
      why = check_frames(l, counters, budget, data, len, checked);
      if (why == kCutByBudget) why.clear();  // logged as it was cut
      if (!why.empty() || l.stopping) break;
    }
    if (!send_all(l, l.plain, data, len)) {  // BASP went away, or the link stops
      basp_gone = !l.stopping;
      break;
    }
  }
  if (!why.empty()) {
    spdlog::warn("{}: closed the connection with {}: {}", l.p.me, l.who(), why);
    l.decide(why);
  } else if (peer_closed) {
    l.decide("the peer closed the connection after the TLS handshake");
  }
  if (records) counters.key_updates += records->key_updates();
  // BASP closing its end may leave its last messages (a chief's stop to its
  // tasks) unread in the socketpair: the outbound side sends them, reads the
  // end, and ends the link then.
  if (!basp_gone) l.stop();
}

// The alert the inbound side found owed (a record that failed), sealed and
// sent if the socket takes it now: best effort, the link is ending.
void send_owed_alert(link& l) {
  const int owed = l.alert_due.exchange(-1);
  if (owed < 0 || !l.writer || l.writer->failed()) return;
  std::vector<char> alert;
  l.writer->seal_alert(static_cast<unsigned char>(owed), alert);
  [[maybe_unused]] auto n = ::send(l.tcp, alert.data(), alert.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// BASP -> peer: what BASP writes, sealed into records and sent. When BASP
// closes its end, what is left goes out (within kLinger) with a
// close_notify.
void pump_outbound(link& l, link_counters& counters, std::vector<char> pending) {
  tls13::record_writer* records = l.writer.get();
  // The handshake's last flight first, if the socket had not taken it all.
  if (!pending.empty() && !send_all(l, l.tcp, pending.data(), pending.size())) return l.stop();
  std::vector<char> buf(kChunk);
  // Records are sealed straight into `wire` (never zero-filled).
  std::unique_ptr<char[]> wire(records ? new char[records->max_sealed_size(kChunk)] : nullptr);
  while (!l.stopping) {
    ssize_t n = ::recv(l.plain, buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (!wait_for(l, l.plain, POLLIN)) break;
        continue;
      }
      break;
    }
    if (n == 0) {  // BASP closed this connection: say so, then end
      if (records) {
        std::vector<char> close_notify;
        records->seal_close_notify(close_notify);
        send_all(l, l.tcp, close_notify.data(), close_notify.size(), clock_type::now() + kLinger);
      }
      ::shutdown(l.tcp, SHUT_WR);
      break;
    }
    const auto len = static_cast<std::size_t>(n);
    bool sent;
    if (records) {
      if (l.key_update_asked.exchange(false)) records->request_key_update();
      // Sealed records go out while the ones after them are sealed.
      std::size_t gone = 0;
      sent = true;
      records->seal_to(buf.data(), len, wire.get(), [&](std::size_t ready) {
        if (sent && ready > gone) sent = send_all(l, l.tcp, wire.get() + gone, ready - gone);
        gone = ready;
      });
    } else {
      sent = send_all(l, l.tcp, buf.data(), len);
    }
    if (!sent) break;
    counters.bytes_out += len;
  }
  send_owed_alert(l);
  if (records) counters.key_updates += records->key_updates();
  l.stop();
}

}  // namespace troupe::secure_link_detail
