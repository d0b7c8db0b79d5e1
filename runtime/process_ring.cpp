#include "runtime/process_ring.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "actors/reducers/collective.hpp"
#include "collectives/idle_wait.hpp"
#include "crypto/crypto.hpp"
#include "net/socket.hpp"
#include "net/tls_records.hpp"
#include "runtime/ring_detail.hpp"
#include "runtime/ring_shm.hpp"
#include "trace/trace.hpp"

namespace troupe {
namespace {

using namespace ring_detail;

// Sealed and sent at a time: 4 records of 16 KB. Sealing a piece in such
// steps cuts the same records as sealing it whole, which the receiver's
// byte count relies on.
constexpr std::size_t kSendBytes = 4 * tls13::max_plaintext;
constexpr std::size_t kReadBytes = 256 * 1024;  // read from the socket at a time
// A shared ring: combined from it at a time before the room is handed back
// (a multiple of 4; small, so the writer refills while the reader combines).
constexpr std::size_t kShmReadBytes = 64 * 1024;
// Copied into a shared ring and published at a time (whole 16 KB records of
// the forwarding rule below: a multiple of 4).
constexpr std::size_t kShmSendBytes = 64 * 1024;
// A doorbell on a shared ring's socket: the peer sleeps in poll() on it. A
// full socket buffer holds doorbells enough; a broken socket shows in poll.
void ring_doorbell(int fd) {
  const char b = 1;
  [[maybe_unused]] auto n = ::send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Empties the doorbells on a shared ring's socket; true once the peer has
// closed it (what it wrote before may still lie in the ring).
bool drain_doorbells(int fd) {
  char buf[64];
  for (;;) {
    const ssize_t k = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k > 0) continue;
    if (k == 0) return true;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    throw link_broken(errno_text("recv"));
  }
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw device_error("process ring: " + errno_text("fcntl"));
}

// A flat range of the caller's spans as pieces that lie in one span each.
// Each piece is sealed on its own, so both ends cut the same records.
struct piece {
  float* data = nullptr;
  std::size_t floats = 0;
};

std::vector<piece> pieces_of(const std::vector<float_span>& spans, int64_t b, int64_t e) {
  std::vector<piece> out;
  int64_t at = 0;
  for (const auto& s : spans) {
    const int64_t sb = at;
    const int64_t se = at + static_cast<int64_t>(s.size);
    at = se;
    const int64_t lo = std::max(b, sb);
    const int64_t hi = std::min(e, se);
    if (lo < hi) out.push_back({s.data + (lo - sb), static_cast<std::size_t>(hi - lo)});
    if (se >= e) break;
  }
  return out;
}

// bfloat16: the top half of a float, rounded to nearest even (NaN kept NaN).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

std::string link_kind(const ring_socket& s) {
  if (s.shm) return "shared memory, same host";
  if (s.same_host) return "Unix socket, same host";
  return s.traffic_secret.empty() ? "plain, cluster.insecure" : "TLS 1.3 records";
}

std::size_t wire_size(ring_wire w) {
  return w == ring_wire::bf16 ? 2 : sizeof(float);
}

}  // namespace

// One step of a collective: the flat ranges sent to the next rank and
// received from the previous one, and what becomes of the received floats.
struct process_ring::step {
  std::vector<piece> send, recv;
  bool combine = false;  // combined into the buffer (else copied over it)
  bool finish = false;   // the last combine: these floats are final here
  float scale = 1.0f;    // finishing a mean: 1/P
};

// The receiving half: reads exactly the collective's wire bytes and combines
// (or copies) the floats they carry into the caller's pieces as they come,
// counting what each step has delivered (the sending half forwards from it).
class process_ring::inbound {
 public:
  inbound(ring_socket s, ring_wire wire) : sock_(std::move(s)), wire_(wire) {
    if (!sock_.traffic_secret.empty()) {
      reader_ = std::make_unique<tls13::record_reader>(sock_.traffic_secret);
      raw_.resize(kReadBytes);
      // Room for a read's records and a partial one kept from the read before.
      scratch_.resize(kReadBytes + tls13::header_size + tls13::max_ciphertext);
    } else {
      scratch_.resize(kReadBytes + sizeof(float));
    }
    if (wire_ == ring_wire::bf16) widened_.resize(scratch_.size() / 2);
  }
  ~inbound() {
    if (sock_.fd >= 0) ::close(sock_.fd);
  }
  int fd() const { return sock_.fd; }
  const std::string& peer() const { return sock_.peer; }
  void shut() { ::shutdown(sock_.fd, SHUT_RDWR); }
  ring_shm* shm() const { return sock_.shm.get(); }

  void start(const std::vector<step>& steps, reduce_op op) {
    steps_ = &steps;
    op_ = op;
    step_ = next_ = offset_ = carry_ = 0;
    delivered_.assign(steps.size(), 0);
    total_ = 0;
    for (const auto& st : steps)
      for (const auto& p : st.recv) {
        const std::size_t bytes = p.floats * wire_size(wire_);
        total_ += reader_ ? tls13::record_writer::sealed_size(bytes) : bytes;
      }
    left_ = total_;
    skip_empty_steps();
  }
  bool done() const { return left_ == 0; }
  uint64_t received() const { return total_ - left_; }
  uint64_t total() const { return total_; }
  // Floats of step k in the caller's buffer so far.
  uint64_t delivered(std::size_t k) const { return delivered_[k]; }

  // Reads what the socket has now (one read, so that the sending half can
  // forward it at once); false if nothing moved.
  bool progress(uint64_t& counter) {
    if (left_ == 0) return false;
    if (sock_.shm) return progress_shm(counter);
    for (;;) {
      char* dst = reader_ ? raw_.data() : scratch_.data() + carry_;
      const std::size_t room = reader_ ? raw_.size() : scratch_.size() - carry_;
      ssize_t k =
          ::recv(sock_.fd, dst, static_cast<std::size_t>(std::min<uint64_t>(left_, room)), 0);
      if (k == 0) throw link_broken("the peer closed the link");
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        throw link_broken(errno_text("recv"));
      }
      left_ -= static_cast<uint64_t>(k);
      counter += static_cast<uint64_t>(k);
      take(static_cast<std::size_t>(k));
      if (left_ == 0 && step_ != steps_->size())
        throw link_broken("the peer's records do not match the collective (different sizes?)");
      return true;
    }
  }

 private:
  // Combines what lies ready in the shared ring straight from it, then
  // hands the room back (ringing the writer if it sleeps for it).
  bool progress_shm(uint64_t& counter) {
    const std::size_t unit = wire_size(wire_);
    auto [data, n] = sock_.shm->readable(unit);
    n = static_cast<std::size_t>(std::min<uint64_t>({n, left_, kShmReadBytes}));
    if (n == 0) return false;
    deliver(data, n / unit);
    sock_.shm->consume(n);
    if (sock_.shm->writer_owed_doorbell()) ring_doorbell(sock_.fd);
    left_ -= n;
    counter += n;
    if (left_ == 0 && step_ != steps_->size())
      throw link_broken("the peer's data do not match the collective (different sizes?)");
    return true;
  }

  void take(std::size_t k) {
    const std::size_t unit = wire_size(wire_);
    if (reader_) {
      std::size_t produced = 0;
      std::string err;
      {
        trace::scoped_span opening(trace::this_thread_track(), "tls_open",
                                   trace::category::communicate,
                                   {.bytes = static_cast<int64_t>(k)});
        err = reader_->feed_to(raw_.data(), k, scratch_.data(), &produced);
      }
      if (!err.empty()) throw link_broken("a record did not open: " + err);
      if (produced % unit != 0) throw link_broken("a record does not hold whole values");
      deliver(scratch_.data(), produced / unit);
      return;
    }
    const std::size_t have = carry_ + k;
    const std::size_t whole = have / unit * unit;
    deliver(scratch_.data(), whole / unit);
    carry_ = have - whole;
    std::memmove(scratch_.data(), scratch_.data() + whole, carry_);
  }

  void skip_empty_steps() {
    while (step_ < steps_->size() && next_ == (*steps_)[step_].recv.size()) {
      ++step_;
      next_ = 0;
    }
  }

  // `n` values from the wire into the pieces, in order, step after step.
  void deliver(const char* data, std::size_t n) {
    const float* x = reinterpret_cast<const float*>(data);
    if (wire_ == ring_wire::bf16) {
      const auto* h = reinterpret_cast<const uint16_t*>(data);
      for (std::size_t i = 0; i < n; ++i) widened_[i] = from_bf16(h[i]);
      x = widened_.data();
    }
    while (n > 0) {
      if (step_ == steps_->size())
        throw link_broken("the peer sent more than the collective holds");
      const step& st = (*steps_)[step_];
      const piece& p = st.recv[next_];
      const std::size_t k = std::min(n, p.floats - offset_);
      float* acc = p.data + offset_;
      if (st.combine)
        reducers::combine_final(acc, x, static_cast<int64_t>(k), op_, st.scale);
      else
        std::memcpy(acc, x, k * sizeof(float));
      // A finished value goes on in bf16: this rank keeps what it sends.
      if (st.finish && wire_ == ring_wire::bf16)
        for (std::size_t i = 0; i < k; ++i) acc[i] = from_bf16(to_bf16(acc[i]));
      delivered_[step_] += k;
      offset_ += k;
      x += k;
      n -= k;
      if (offset_ == p.floats) {
        ++next_;
        offset_ = 0;
        skip_empty_steps();
      }
    }
  }

  ring_socket sock_;
  ring_wire wire_;
  std::unique_ptr<tls13::record_reader> reader_;
  std::vector<char> raw_, scratch_;
  std::vector<float> widened_;  // bf16 values as floats
  const std::vector<step>* steps_ = nullptr;
  reduce_op op_ = reduce_op::sum;
  std::size_t step_ = 0, next_ = 0, offset_ = 0, carry_ = 0;
  std::vector<uint64_t> delivered_;
  uint64_t total_ = 0, left_ = 0;
};

// The sending half: step 0 goes out as it is; a later step sends the range
// the step before it received, as far as it has been delivered, so a
// received chunk goes on to the next rank while the rest is still coming.
// Sealed (or sent from the caller's memory on a plain fp32 link) in pieces
// of at most kSendBytes on the wire, whose records are cut as if the piece
// were sealed whole.
class process_ring::outbound {
 public:
  outbound(ring_socket s, ring_wire wire) : sock_(std::move(s)), wire_(wire) {
    if (!sock_.traffic_secret.empty()) {
      writer_ = std::make_unique<tls13::record_writer>(sock_.traffic_secret);
      sealed_.resize(tls13::record_writer::sealed_size(kSendBytes));
    }
    if (wire_ == ring_wire::bf16) narrowed_.resize(kSendBytes / 2);
  }
  ~outbound() {
    if (sock_.fd >= 0) ::close(sock_.fd);
  }
  int fd() const { return sock_.fd; }
  const std::string& peer() const { return sock_.peer; }
  void shut() { ::shutdown(sock_.fd, SHUT_RDWR); }
  ring_shm* shm() const { return sock_.shm.get(); }

  void start(const std::vector<step>& steps, const inbound& in) {
    steps_ = &steps;
    in_ = &in;
    step_ = next_ = offset_ = 0;
    step_sent_ = 0;
    cur_ = nullptr;
    cur_b_ = cur_e_ = 0;
    total_ = 0;
    for (const auto& st : steps)
      for (const auto& p : st.send) {
        const std::size_t bytes = p.floats * wire_size(wire_);
        total_ += writer_ ? tls13::record_writer::sealed_size(bytes) : bytes;
      }
    left_ = total_;
  }
  bool done() const { return left_ == 0; }
  // Bytes ready and waiting for the socket (poll for POLLOUT only then).
  bool pending() const { return cur_b_ < cur_e_; }
  uint64_t sent() const { return total_ - left_; }
  uint64_t total() const { return total_; }

  // Writes what the socket takes and the data allow now; false if nothing moved.
  bool progress(uint64_t& counter) {
    bool moved = false;
    while (left_ > 0) {
      if (cur_b_ == cur_e_ && !fill()) return moved;
      ssize_t k =
          sock_.shm ? put_shm() : ::send(sock_.fd, cur_ + cur_b_, cur_e_ - cur_b_, MSG_NOSIGNAL);
      if (k == 0) return moved;  // a shared ring with no room
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        throw link_broken(errno_text("send"));
      }
      cur_b_ += static_cast<std::size_t>(k);
      left_ -= static_cast<uint64_t>(k);
      counter += static_cast<uint64_t>(k);
      moved = true;
    }
    return moved;
  }

 private:
  // Copies what fits of the current bytes into the shared ring (ringing the
  // reader if it sleeps for them); the bytes taken.
  ssize_t put_shm() {
    const std::size_t k = sock_.shm->write(cur_ + cur_b_, cur_e_ - cur_b_);
    if (k > 0 && sock_.shm->reader_owed_doorbell()) ring_doorbell(sock_.fd);
    return static_cast<ssize_t>(k);
  }

  // How many floats of the current piece go out next; 0: not delivered yet.
  std::size_t next_count(const piece& p) const {
    const std::size_t unit = wire_size(wire_);
    const std::size_t chunk = sock_.shm ? kShmSendBytes : kSendBytes;
    std::size_t n = std::min(chunk / unit, p.floats - offset_);
    if (step_ == 0) return n;
    // What the step before has delivered and this step has not yet sent, in
    // whole records (cut at multiples of max_plaintext from the piece's
    // start; a plain link the same, so a trickle of small reads is not
    // forwarded as a trickle of small sends).
    const uint64_t ready = in_->delivered(step_ - 1) - step_sent_;
    if (ready >= n) return n;
    const std::size_t record = tls13::max_plaintext / unit;
    return static_cast<std::size_t>(ready) / record * record;
  }

  // The next bytes to send, if the data allow; false if they do not yet.
  bool fill() {
    while (next_ == (*steps_)[step_].send.size()) {  // steps with nothing to send
      ++step_;
      next_ = 0;
      step_sent_ = 0;
    }
    const piece& p = (*steps_)[step_].send[next_];
    const std::size_t n = next_count(p);
    if (n == 0) return false;
    const float* src = p.data + offset_;
    const char* bytes = reinterpret_cast<const char*>(src);
    std::size_t len = n * sizeof(float);
    if (wire_ == ring_wire::bf16) {
      for (std::size_t i = 0; i < n; ++i) narrowed_[i] = to_bf16(src[i]);
      bytes = reinterpret_cast<const char*>(narrowed_.data());
      len = n * 2;
    }
    if (writer_) {
      trace::scoped_span sealing(trace::this_thread_track(), "tls_seal",
                                 trace::category::communicate,
                                 {.bytes = static_cast<int64_t>(len)});
      cur_e_ = writer_->seal_to(bytes, len, sealed_.data());
      cur_ = sealed_.data();
    } else {
      cur_ = bytes;
      cur_e_ = len;
    }
    cur_b_ = 0;
    offset_ += n;
    step_sent_ += n;
    if (offset_ == p.floats) {
      ++next_;
      offset_ = 0;
    }
    return true;
  }

  ring_socket sock_;
  ring_wire wire_;
  std::unique_ptr<tls13::record_writer> writer_;
  std::vector<char> sealed_;
  std::vector<uint16_t> narrowed_;  // a piece's floats as bf16
  const std::vector<step>* steps_ = nullptr;
  const inbound* in_ = nullptr;
  std::size_t step_ = 0, next_ = 0, offset_ = 0;
  uint64_t step_sent_ = 0;
  const char* cur_ = nullptr;
  std::size_t cur_b_ = 0, cur_e_ = 0;
  uint64_t total_ = 0, left_ = 0;
};

process_ring::process_ring(int rank, int size, ring_socket to_next, ring_socket from_prev,
                           std::chrono::milliseconds timeout, ring_wire wire)
    : rank_(rank),
      size_(size),
      next_link_(link_kind(to_next)),
      prev_link_(link_kind(from_prev)),
      timeout_(timeout) {
  const int next_fd = to_next.fd, prev_fd = from_prev.fd;
  try {
    out_ = std::make_unique<outbound>(std::move(to_next), wire);
    in_ = std::make_unique<inbound>(std::move(from_prev), wire);
  } catch (...) {
    if (!out_ && next_fd >= 0) ::close(next_fd);
    if (!in_ && prev_fd >= 0) ::close(prev_fd);
    throw;
  }
  if (size < 1 || rank < 0 || rank >= size)
    throw device_error("process ring: rank " + std::to_string(rank) + " of " +
                       std::to_string(size));
  if (size > 1) {
    set_nonblocking(out_->fd());
    set_nonblocking(in_->fd());
    int one = 1;
    ::setsockopt(out_->fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  poller_ = std::make_unique<net::reactor>();
  if (!poller_->problem().empty()) throw device_error("process ring: " + poller_->problem());
}

process_ring::~process_ring() = default;

void process_ring::check() {
  if (!failed_.load()) return;
  std::lock_guard lock(failure_mutex_);
  throw device_error(failure_);
}

void process_ring::abort(const std::string& why) {
  {
    std::lock_guard lock(failure_mutex_);
    if (failed_.load()) return;
    failure_ = "process ring rank " + std::to_string(rank_) + ": aborted: " + why;
    failed_.store(true);
  }
  poller_->wake();
  if (size_ > 1) {
    out_->shut();
    in_->shut();
  }
}

void process_ring::fail(const std::string& why) {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failed_.load()) {
      failure_ = "process ring rank " + std::to_string(rank_) + ": " + why;
      failed_.store(true);
    }
  }
  out_->shut();
  in_->shut();
  check();
  throw device_error(why);  // not reached: check() throws
}

void process_ring::run(const std::vector<step>& steps, reduce_op op) {
  in_->start(steps, op);
  out_->start(steps, *in_);
  const auto deadline = clock_type::now() + timeout_;
  const std::string next = "rank " + std::to_string(mod(rank_ + 1)) + " (" + out_->peer() + ")";
  const std::string prev = "rank " + std::to_string(mod(rank_ - 1)) + " (" + in_->peer() + ")";
  // A trace shows the exchange as one span and, inside it, the crypto
  // (tls_seal, tls_open) and each stretch with nothing to move (link_wait:
  // spinning, yielding or asleep until the peer's data or room come).
  const trace::track_id track = trace::this_thread_track();
  trace::scoped_span exchange(track, "across_processes", trace::category::communicate,
                              {.bytes = static_cast<int64_t>(out_->total() + in_->total())});
  double waiting_since = -1;
  try {
    idle_wait idle(yield_for_);  // a side with nothing to move looks again before it sleeps
    for (;;) {
      bool moved = out_->progress(sent_bytes_);
      moved = in_->progress(received_bytes_) || moved;
      if (moved && waiting_since >= 0) {
        trace::complete(track, "link_wait", trace::category::communicate, waiting_since,
                        trace::now_us());
        waiting_since = -1;
      }
      if (out_->done() && in_->done()) return;
      check();
      if (moved) {
        idle.reset();
        continue;
      }
      if (waiting_since < 0 && trace::enabled()) waiting_since = trace::now_us();
      const auto now = clock_type::now();
      if (now >= deadline)
        fail("timed out after " + std::to_string(timeout_.count()) + " ms (received " +
             std::to_string(in_->received()) + " of " + std::to_string(in_->total()) +
             " bytes from " + prev + ", sent " + std::to_string(out_->sent()) + " of " +
             std::to_string(out_->total()) + " to " + next + ")");
      if (idle.look_again()) continue;
      if (sleep(deadline)) idle.reset();
    }
  } catch (const link_broken& e) {
    // Which half broke is not known here when both moved; name both links.
    fail(std::string("link to ") + next + " or from " + prev + ": " + e.what());
  }
}

// Waits in poll() for the links (and abort's wake pipe); false when it did
// not wait (a shared ring moved once its side had raised its sleep flag).
bool process_ring::sleep(clock_type::time_point deadline) {
  ring_shm* in_shm = in_->shm();
  ring_shm* out_shm = out_->shm();
  const bool want_data = !in_->done(), want_room = out_->pending();
  if (in_shm && want_data) in_shm->reader_sleeps();
  if (out_shm && want_room) out_shm->writer_sleeps();
  if ((in_shm || out_shm) && (in_->progress(received_bytes_) || out_->progress(sent_bytes_))) {
    if (in_shm) in_shm->reader_wakes();
    if (out_shm) out_shm->writer_wakes();
    return false;
  }
  // Nothing more lies in the rings, and a peer closed: it is gone.
  if (shm_peer_closed_) throw link_broken("the peer closed the link");
  // A shared ring's socket carries doorbells, and its end: always POLLIN.
  const short out_events = out_shm ? POLLIN : (want_room ? POLLOUT : 0);
  const short in_events = in_shm || want_data ? POLLIN : 0;
  poller_->clear();
  const std::size_t out_at = poller_->watch(out_->fd(), out_events);
  const std::size_t in_at = poller_->watch(in_->fd(), in_events);
  if (poller_->wait(ms_until(deadline)) < 0 && errno != EINTR) fail(errno_text("poll"));
  if (out_shm) {
    out_shm->writer_wakes();
    if (poller_->revents(out_at) != 0 && drain_doorbells(out_->fd())) shm_peer_closed_ = true;
  }
  if (in_shm) {
    in_shm->reader_wakes();
    if (poller_->revents(in_at) != 0 && drain_doorbells(in_->fd())) shm_peer_closed_ = true;
  }
  return true;
}

// Rank r sends, at step s of the reduce-scatter, the segment it received at
// step s - 1 (its own at s = 0), so that it finishes segment r + finish; the
// all-gather then passes the finished segments on, P - 1 steps more.
std::vector<process_ring::step> process_ring::ring_steps(const std::vector<float_span>& spans,
                                                         const std::vector<int64_t>& seg,
                                                         int finish, bool reduce, bool gather,
                                                         reduce_op op) const {
  auto range = [&](int k) { return pieces_of(spans, seg[k], seg[k + 1]); };
  std::vector<step> steps;
  const float final_scale = op == reduce_op::mean ? 1.0f / static_cast<float>(size_) : 1.0f;
  for (int s = 0; reduce && s + 1 < size_; ++s)
    steps.push_back({range(mod(rank_ + finish - 1 - s)), range(mod(rank_ + finish - 2 - s)), true,
                     s + 2 == size_, s + 2 == size_ ? final_scale : 1.0f});
  for (int s = 0; gather && s + 1 < size_; ++s)
    steps.push_back(
        {range(mod(rank_ + finish - s)), range(mod(rank_ + finish - s - 1)), false, false, 1.0f});
  return steps;
}

void process_ring::all_reduce_spans(const std::vector<float_span>& spans, reduce_op op) {
  require_device_reduce_op(op, "all_reduce");
  check();
  if (size_ == 1) return;  // sum or mean over one rank: the data itself
  int64_t n = 0;
  for (const auto& s : spans) n += static_cast<int64_t>(s.size);
  run(ring_steps(spans, reducers::split_range(0, n, size_), 1, true, true, op), op);
}

void process_ring::all_reduce(float* data, std::size_t n, reduce_op op) {
  all_reduce_spans(std::vector<float_span>{{data, n}}, op);
}

namespace {
std::vector<int64_t> chunk_bounds(int size, std::size_t chunk) {
  std::vector<int64_t> seg(static_cast<std::size_t>(size) + 1);
  for (int k = 0; k <= size; ++k)
    seg[static_cast<std::size_t>(k)] = static_cast<int64_t>(chunk) * k;
  return seg;
}
}  // namespace

void process_ring::reduce_scatter(float* data, std::size_t chunk, reduce_op op) {
  require_device_reduce_op(op, "reduce_scatter");
  check();
  if (size_ == 1) return;
  std::vector<float_span> spans{{data, chunk * static_cast<std::size_t>(size_)}};
  run(ring_steps(spans, chunk_bounds(size_, chunk), 0, true, false, op), op);
}

void process_ring::all_gather(float* data, std::size_t chunk) {
  check();
  if (size_ == 1) return;
  std::vector<float_span> spans{{data, chunk * static_cast<std::size_t>(size_)}};
  run(ring_steps(spans, chunk_bounds(size_, chunk), 0, false, true, reduce_op::sum),
      reduce_op::sum);
}

}  // namespace troupe
