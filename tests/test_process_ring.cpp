// process_ring: collectives between ranks over sockets of their own
// (runtime/process_ring.hpp). The ranks are threads of this process on
// 127.0.0.1, connected through ring_link_listener / connect_ring_link as
// processes are.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/process_ring.hpp"
#include "runtime/ring_shm.hpp"
#include "tests/fixtures.hpp"
#include "trace/trace.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;

namespace {

using ring_ptr = std::unique_ptr<process_ring>;

std::string task(int r) {
  return "worker:" + std::to_string(r);
}

// P ranks joined as processes join: rank r listens for r-1 and connects to
// r+1 with the offer r+1 made.
// `same_host`: on the listeners' Unix sockets (and shared rings).
std::vector<ring_ptr> make_ring(int P, bool encrypted,
                                std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                ring_wire wire = ring_wire::fp32,
                                same_host_link same_host = same_host_link::tcp) {
  std::vector<std::unique_ptr<ring_link_listener>> listeners;
  for (int r = 0; r < P; ++r)
    listeners.push_back(std::make_unique<ring_link_listener>("127.0.0.1", same_host));
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  std::vector<std::future<ring_socket>> accepted;
  for (int r = 0; r < P; ++r)
    accepted.push_back(std::async(std::launch::async, [&, r] {
      return listeners[r]->accept(deadline, task((r + P - 1) % P), encrypted);
    }));
  std::vector<ring_socket> to_next;
  for (int r = 0; r < P; ++r)
    to_next.push_back(connect_ring_link(listeners[(r + 1) % P]->offer(), deadline,
                                        task((r + 1) % P), encrypted, same_host));
  std::vector<ring_ptr> ring;
  for (int r = 0; r < P; ++r)
    ring.push_back(std::make_unique<process_ring>(r, P, std::move(to_next[r]), accepted[r].get(),
                                                  timeout, wire));
  return ring;
}

// Runs f(rank) on one thread per rank; rethrows the first failure.
void on_every_rank(int P, const std::function<void(int)>& f) {
  std::vector<std::future<void>> done;
  for (int r = 0; r < P; ++r) done.push_back(std::async(std::launch::async, f, r));
  for (auto& d : done) d.get();
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// The ring's order for an element of segment j: x_j + x_{j+1} + ... (mod P).
float ring_order_sum(const std::vector<std::vector<float>>& x, std::size_t i, int j) {
  const int P = static_cast<int>(x.size());
  float acc = x[static_cast<std::size_t>(j)][i];
  for (int k = 1; k < P; ++k) acc += x[static_cast<std::size_t>((j + k) % P)][i];
  return acc;
}

// The segment of element i under reducers::split_range (as the ring nodes).
int segment_of(std::size_t i, std::size_t n, int P) {
  for (int j = P - 1; j >= 0; --j) {
    auto b = static_cast<int64_t>(n) * j / P;
    if (j > 0 && static_cast<int64_t>(n) >= 16 * P) b = b / 16 * 16;
    if (static_cast<int64_t>(i) >= b) return j;
  }
  return 0;
}

// Each rank all-reduces n floats of its own (random_floats(n, seed(r))):
// every rank ends with the same sums, each formed in the ring's order.
void check_sums_in_ring_order(const std::vector<ring_ptr>& ring, std::size_t n,
                              const std::function<unsigned(int)>& seed) {
  const int P = static_cast<int>(ring.size());
  std::vector<std::vector<float>> x, y;
  for (int r = 0; r < P; ++r) x.push_back(random_floats(n, seed(r)));
  y = x;
  on_every_rank(P, [&](int r) { ring[r]->all_reduce(y[r].data(), n, reduce_op::sum); });
  for (int r = 1; r < P; ++r) CHECK(y[r] == y[0]);
  bool ordered = true;
  for (std::size_t i = 0; i < n; ++i)
    ordered = ordered && y[0][i] == ring_order_sum(x, i, segment_of(i, n, P));
  CHECK(ordered);
}

std::string link_name(bool encrypted, same_host_link same_host) {
  if (same_host == same_host_link::shared_memory) return "shared memory, same host";
  if (same_host == same_host_link::unix_socket) return "Unix socket, same host";
  return encrypted ? "TLS 1.3 records" : "plain, cluster.insecure";
}

}  // namespace

TEST_CASE("process ring: all-reduce sums in the ring's order, bit-identical on every rank") {
  // TLS over TCP, plain TCP (cluster.insecure), Unix sockets and shared
  // rings (one host).
  const std::pair<bool, same_host_link> links[] = {{true, same_host_link::tcp},
                                                   {false, same_host_link::tcp},
                                                   {true, same_host_link::unix_socket},
                                                   {true, same_host_link::shared_memory}};
  for (auto [encrypted, same_host] : links) {
    for (int P : {2, 3}) {
      CAPTURE(encrypted);
      CAPTURE(static_cast<int>(same_host));
      CAPTURE(P);
      auto ring = make_ring(P, encrypted, std::chrono::seconds(20), ring_wire::fp32, same_host);
      CHECK(ring[0]->next_link() == link_name(encrypted, same_host));
      for (std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{300'001}}) {
        CAPTURE(n);
        check_sums_in_ring_order(ring, n,
                                 [](int r) { return 100u * static_cast<unsigned>(r) + 7; });
      }
      CHECK(ring[0]->bytes_sent() > 0);
      CHECK(ring[0]->bytes_received() == ring[P - 1]->bytes_sent());
    }
  }
}

TEST_CASE("process ring: a shared ring carries collectives larger than itself, one after another") {
  // 12 MB through a 2 MB ring: the writer waits for room, the positions wrap
  // and go on from one collective to the next.
  for (int P : {2, 3}) {
    CAPTURE(P);
    auto ring = make_ring(P, false, std::chrono::seconds(20), ring_wire::fp32,
                          same_host_link::shared_memory);
    for (std::size_t n : {std::size_t{3'000'001}, std::size_t{5}, std::size_t{600'000}}) {
      CAPTURE(n);
      check_sums_in_ring_order(ring, n, [](int r) { return static_cast<unsigned>(r + 3); });
    }
  }
}

// strategy.reducer.yield_us: a waiting side gives its core away between
// looks for that long, then sleeps; with 0 it sleeps after its first empty
// look, and the sums are the same.
TEST_CASE("idle_wait: yields until its window ends; a window of 0 sleeps at once") {
  idle_wait none(std::chrono::microseconds(0));
  CHECK(!none.look_again());
  idle_wait window(std::chrono::microseconds(20'000));
  const auto start = std::chrono::steady_clock::now();
  int looks = 0;
  while (window.look_again()) ++looks;
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(looks > 0);
  CHECK(waited >= std::chrono::microseconds(20'000));
  window.reset();  // something moved: a fresh window
  CHECK(window.look_again());
  for (same_host_link link : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(link));
    auto ring = make_ring(2, true, std::chrono::seconds(20), ring_wire::fp32, link);
    for (auto& r : ring) r->set_yield_for(std::chrono::microseconds(0));
    check_sums_in_ring_order(ring, 300'001, [](int r) { return 11u * static_cast<unsigned>(r); });
  }
}

TEST_CASE("process ring: a trace shows the exchange and, inside it, TLS's sealing and opening") {
  const std::size_t n = 300'001;
  for (bool encrypted : {true, false}) {
    CAPTURE(encrypted);
    auto ring = make_ring(2, encrypted);
    test::temp_dir dir;
    std::vector<std::vector<float>> y{random_floats(n, 1), random_floats(n, 2)};
    {
      trace::session traced(dir / "trace.json", {"process_ring", "mirrored", 2});
      on_every_rank(2, [&](int r) {
        trace::name_this_thread("device:" + std::to_string(r));
        ring[r]->all_reduce(y[r].data(), n, reduce_op::sum);
      });
      traced.finish();
    }
    CHECK(y[0] == y[1]);
    std::ifstream in(dir / "trace.json");
    const auto events = nlohmann::json::parse(in)["traceEvents"];
    std::map<int64_t, std::string> tracks;  // tid -> name
    for (const auto& e : events)
      if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      // One exchange of everything sent and received; the crypto inside it:
      // the plaintext floats sealed (n in all: a segment each way), the
      // records read opened.
      double begin = -1, end = -1;
      int64_t exchanged = 0, sealed = 0, opened = 0, exchanges = 0;
      std::vector<std::pair<double, double>> inner;
      for (const auto& e : events) {
        if (e["ph"] != "X" || tracks[e["tid"]] != "device:" + std::to_string(r)) continue;
        const double b = e["ts"], d = e["dur"];
        const int64_t bytes =
            e.contains("args") ? e["args"].value("bytes", int64_t{-1}) : int64_t{-1};
        if (e["name"] == "across_processes") {
          ++exchanges;
          exchanged = bytes;
          begin = b;
          end = b + d;
        } else if (e["name"] == "tls_seal" || e["name"] == "tls_open") {
          (e["name"] == "tls_seal" ? sealed : opened) += bytes;
          inner.emplace_back(b, b + d);
        }
      }
      CHECK(exchanges == 1);
      CHECK(exchanged == static_cast<int64_t>(ring[r]->bytes_sent() + ring[r]->bytes_received()));
      CHECK(sealed == (encrypted ? static_cast<int64_t>(n * sizeof(float)) : 0));
      CHECK(opened == (encrypted ? static_cast<int64_t>(ring[r]->bytes_received()) : 0));
      for (auto [b, e] : inner) CHECK((b >= begin && e <= end));
    }
  }
}

TEST_CASE("process ring: spans are one buffer (gradients of several variables), mean divides") {
  const int P = 2;
  for (auto same_host : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(same_host));
    auto ring = make_ring(P, true, std::chrono::seconds(20), ring_wire::fp32, same_host);
    const std::vector<std::size_t> sizes{5, 1, 0, 200'003, 7, 65'536};
    std::vector<std::vector<std::vector<float>>> vars(P);
    for (int r = 0; r < P; ++r)
      for (std::size_t v = 0; v < sizes.size(); ++v)
        vars[r].push_back(random_floats(sizes[v], static_cast<unsigned>(10 * r + v)));
    auto expected = vars[0];
    for (std::size_t v = 0; v < sizes.size(); ++v)
      for (std::size_t i = 0; i < sizes[v]; ++i)
        expected[v][i] = (vars[0][v][i] + vars[1][v][i]) * 0.5f;
    on_every_rank(P, [&](int r) {
      std::vector<float_span> spans;
      for (auto& v : vars[r]) spans.push_back({v.data(), v.size()});
      ring[r]->all_reduce_spans(spans, reduce_op::mean);
    });
    CHECK(vars[0] == expected);
    CHECK(vars[1] == expected);
  }
}

TEST_CASE("process ring: bf16 on the wire halves the bytes, sums in float32, ranks stay equal") {
  std::vector<float> tcp_half;  // the shared rings' bf16 sums: the same bits
  for (auto [encrypted, same_host] :
       {std::pair{true, same_host_link::tcp}, std::pair{false, same_host_link::tcp},
        std::pair{true, same_host_link::shared_memory}}) {
    CAPTURE(encrypted);
    CAPTURE(static_cast<int>(same_host));
    const int P = 3;
    const std::size_t n = 100'003;
    auto fp32 = make_ring(P, encrypted, std::chrono::seconds(20), ring_wire::fp32, same_host);
    auto bf16 = make_ring(P, encrypted, std::chrono::seconds(20), ring_wire::bf16, same_host);
    std::vector<std::vector<float>> x;
    for (int r = 0; r < P; ++r) x.push_back(random_floats(n, static_cast<unsigned>(r + 40)));
    auto exact = x, half = x;
    on_every_rank(P, [&](int r) {
      fp32[r]->all_reduce(exact[r].data(), n, reduce_op::sum);
      bf16[r]->all_reduce(half[r].data(), n, reduce_op::sum);
    });
    for (int r = 1; r < P; ++r) CHECK(half[r] == half[0]);
    // Each value crossed the wire as bf16 (8 bits of mantissa) at most P - 1
    // times in a partial sum, and once finished.
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double scale = std::fabs(x[0][i]) + std::fabs(x[1][i]) + std::fabs(x[2][i]);
      worst = std::max(worst, std::fabs(half[0][i] - exact[0][i]) / scale);
    }
    MESSAGE("bf16 wire: worst |error| / sum|x| = " << worst);
    CHECK(worst < 4 * std::ldexp(1.0, -8));
    CHECK(worst > 0);
    CHECK(bf16[0]->bytes_sent() * 2 < fp32[0]->bytes_sent() + 4096);
    CHECK(bf16[0]->bytes_sent() * 2 > fp32[0]->bytes_sent() - 4096);
    if (tcp_half.empty()) tcp_half = half[0];
    CHECK(half[0] == tcp_half);
  }
}

TEST_CASE("process ring: reduce-scatter leaves rank r its chunk, all-gather spreads them") {
  const int P = 3;
  const std::size_t chunk = 50'000;
  auto ring = make_ring(P, true);
  std::vector<std::vector<float>> x;
  for (int r = 0; r < P; ++r) x.push_back(random_floats(chunk * P, static_cast<unsigned>(r + 1)));
  auto y = x;
  on_every_rank(P, [&](int r) { ring[r]->reduce_scatter(y[r].data(), chunk, reduce_op::sum); });
  for (int r = 0; r < P; ++r) {
    bool right = true;
    for (std::size_t i = r * chunk; i < (r + 1) * chunk; ++i)
      right = right && std::fabs(y[r][i] - (x[0][i] + x[1][i] + x[2][i])) < 1e-5f;
    CHECK(right);
  }
  auto g = x;
  on_every_rank(P, [&](int r) { ring[r]->all_gather(g[r].data(), chunk); });
  for (int r = 0; r < P; ++r)
    for (int k = 0; k < P; ++k)
      CHECK(std::equal(g[r].begin() + k * chunk, g[r].begin() + (k + 1) * chunk,
                       x[k].begin() + k * chunk));
}

TEST_CASE("process ring: min and max are refused, naming the collective") {
  auto ring = make_ring(2, false);
  float x = 1.0f;
  CHECK_THROWS_WITH_AS(ring[0]->all_reduce(&x, 1, reduce_op::max), doctest::Contains("all_reduce"),
                       device_error);
}

TEST_CASE("process ring: abort ends a collective a peer never joins, and the peer's next one") {
  for (auto same_host : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(same_host));
    auto ring = make_ring(2, true, std::chrono::seconds(20), ring_wire::fp32, same_host);
    std::vector<float> x(1000, 1.0f);
    auto blocked = std::async(std::launch::async,
                              [&] { ring[0]->all_reduce(x.data(), x.size(), reduce_op::sum); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ring[0]->abort("replica 0 failed");
    CHECK_THROWS_WITH_AS(blocked.get(), doctest::Contains("aborted: replica 0 failed"),
                         device_error);
    CHECK_THROWS_AS(ring[0]->check(), device_error);
    std::vector<float> y(1000, 1.0f);
    CHECK_THROWS_AS(ring[1]->all_reduce(y.data(), y.size(), reduce_op::sum), device_error);
  }
}

TEST_CASE("process ring: a group aborted mid-collective frees every rank; the survivors re-form") {
  // The collective layer's contract (collectives/process_group.hpp) on the
  // backend between processes: rank 2 leaves while 0 and 1 wait in an
  // all-reduce; both fail, naming the abort, and a ring of the two
  // survivors sums as a group of 2.
  for (auto same_host : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(same_host));
    auto ring = make_ring(3, true, std::chrono::seconds(20), ring_wire::fp32, same_host);
    std::vector<std::future<void>> waiting;
    std::vector<std::vector<float>> x(2, std::vector<float>(1000, 1.0f));
    for (int r = 0; r < 2; ++r)
      waiting.push_back(std::async(std::launch::async, [&, r] {
        ring[static_cast<std::size_t>(r)]->all_reduce(x[static_cast<std::size_t>(r)].data(), 1000,
                                                      reduce_op::sum);
      }));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ring[2]->abort("rank 2 is lost");
    for (auto& w : waiting) CHECK_THROWS_AS(w.get(), device_error);
    auto survivors = make_ring(2, true, std::chrono::seconds(20), ring_wire::fp32, same_host);
    on_every_rank(2, [&](int r) {
      std::vector<float> y(1000, static_cast<float>(r + 1));
      survivors[static_cast<std::size_t>(r)]->all_reduce(y.data(), y.size(), reduce_op::sum);
      CHECK(y == std::vector<float>(1000, 3.0f));
    });
  }
}

TEST_CASE("process ring: a peer that goes away fails the collective, naming the link") {
  for (auto same_host : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(same_host));
    auto ring = make_ring(2, true, std::chrono::seconds(20), ring_wire::fp32, same_host);
    ring[1].reset();  // its sockets close (and its mappings go)
    std::vector<float> x(100'000, 1.0f);
    CHECK_THROWS_WITH_AS(ring[0]->all_reduce(x.data(), x.size(), reduce_op::sum),
                         doctest::Contains("worker:1"), device_error);
  }
}

TEST_CASE(
    "process ring: a shared ring's peer that leaves mid-collective fails it, naming the link") {
  // More than the ring holds (2 MB), so rank 0 waits for room when rank 1
  // stops reading.
  auto ring =
      make_ring(2, false, std::chrono::seconds(20), ring_wire::fp32, same_host_link::shared_memory);
  std::vector<float> x(3'000'000, 1.0f);
  auto blocked = std::async(std::launch::async,
                            [&] { ring[0]->all_reduce(x.data(), x.size(), reduce_op::sum); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ring[1].reset();
  CHECK_THROWS_WITH_AS(blocked.get(), doctest::Contains("worker:1"), device_error);
}

TEST_CASE("process ring: a silent peer times out with what was moved") {
  for (auto same_host : {same_host_link::tcp, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(same_host));
    auto ring = make_ring(2, false, std::chrono::milliseconds(200), ring_wire::fp32, same_host);
    std::vector<float> x(10, 1.0f);
    CHECK_THROWS_WITH_AS(ring[0]->all_reduce(x.data(), x.size(), reduce_op::sum),
                         doctest::Contains("timed out after 200 ms"), device_error);
  }
}

TEST_CASE("process ring: records sealed with another key do not open") {
  // Two links made by hand; rank 0 then opens with a key rank 1 does not
  // seal with.
  ring_link_listener l0("127.0.0.1"), l1("127.0.0.1");
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  auto a0 = std::async(std::launch::async, [&] { return l0.accept(deadline, task(1), true); });
  auto a1 = std::async(std::launch::async, [&] { return l1.accept(deadline, task(0), true); });
  auto c0 = connect_ring_link(l1.offer(), deadline, task(1), true);
  auto c1 = connect_ring_link(l0.offer(), deadline, task(0), true);
  auto from1 = a0.get();
  from1.traffic_secret[0] ^= 1;  // rank 0 expects another key than rank 1 seals with
  process_ring r0(0, 2, std::move(c0), std::move(from1), std::chrono::seconds(5));
  process_ring r1(1, 2, std::move(c1), a1.get(), std::chrono::seconds(5));
  std::vector<float> x(1000, 1.0f), y(1000, 2.0f);
  auto other = std::async(std::launch::async, [&] {
    try {
      r1.all_reduce(y.data(), y.size(), reduce_op::sum);
    } catch (const device_error&) {
    }
  });
  CHECK_THROWS_WITH_AS(r0.all_reduce(x.data(), x.size(), reduce_op::sum),
                       doctest::Contains("did not open"), device_error);
  other.get();
}

namespace {

int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

}  // namespace

TEST_CASE("process ring: the listener admits only a proof of its key; strangers wait beside") {
  ring_link_listener l("127.0.0.1");
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  auto accepted = std::async(std::launch::async, [&] { return l.accept(deadline, task(0), true); });
  // A stranger that says nothing, and one that answers wrongly.
  int silent = raw_connect(l.offer().port);
  int wrong = raw_connect(l.offer().port);
  char challenge[32];
  REQUIRE(::recv(wrong, challenge, sizeof(challenge), MSG_WAITALL) == 32);
  std::string bad(32, 'x');
  REQUIRE(::send(wrong, bad.data(), bad.size(), 0) == 32);
  char more;
  CHECK(::recv(wrong, &more, 1, 0) == 0);  // closed after the wrong answer, nothing else sent
  // The right peer gets in while the silent one still waits.
  const auto start = clock_type::now();
  auto s = connect_ring_link(l.offer(), deadline, task(1), true);
  auto got = accepted.get();
  CHECK(clock_type::now() - start < std::chrono::seconds(4));
  CHECK(got.traffic_secret == s.traffic_secret);
  CHECK(got.traffic_secret.size() == 32);
  CHECK(got.traffic_secret != l.offer().key);
  ::close(got.fd);
  ::close(s.fd);
  ::close(silent);
  ::close(wrong);
}

namespace {

// A connection to the listener's Unix socket, under effective uid `euid`
// (set for this thread only, by the raw system call); -1 if refused.
int raw_connect_unix(const ring_link_offer& o, uid_t euid) {
  const std::string name = ring_link_unix_name(o.key);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  int fd = -1;
  std::thread([&] {
    const uid_t was = ::geteuid();
    if (euid != was && ::syscall(SYS_setresuid, -1, euid, -1) != 0) return;
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      ::close(fd);
      fd = -1;
    }
    if (euid != was) ::syscall(SYS_setresuid, -1, was, -1);
  }).join();
  return fd;
}

}  // namespace

TEST_CASE("process ring: the Unix socket admits only a proof of its key, from our own user") {
  for (auto how : {same_host_link::unix_socket, same_host_link::shared_memory}) {
    CAPTURE(static_cast<int>(how));
    ring_link_listener l("127.0.0.1", how);
    const auto deadline = clock_type::now() + std::chrono::seconds(10);
    auto accepted =
        std::async(std::launch::async, [&] { return l.accept(deadline, task(0), true); });
    int wrong = raw_connect_unix(l.offer(), ::geteuid());
    REQUIRE(wrong >= 0);
    char challenge[32];
    REQUIRE(::recv(wrong, challenge, sizeof(challenge), MSG_WAITALL) == 32);
    std::string bad(32, 'x');
    REQUIRE(::send(wrong, bad.data(), bad.size(), 0) == 32);
    // Closed after the wrong answer: no byte, and no descriptor (the shared
    // ring goes only to a proven peer).
    char more;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{&more, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    CHECK(::recvmsg(wrong, &msg, 0) == 0);
    CHECK(CMSG_FIRSTHDR(&msg) == nullptr);
    if (::geteuid() == 0) {
      // Another user (nobody) is closed before it is even challenged.
      int other = raw_connect_unix(l.offer(), 65534);
      REQUIRE(other >= 0);
      CHECK(::recv(other, challenge, sizeof(challenge), MSG_WAITALL) == 0);
      ::close(other);
    } else {
      MESSAGE("not root: the other-user check needs a second uid");
    }
    auto s = connect_ring_link(l.offer(), deadline, task(1), true, how);
    auto got = accepted.get();
    CHECK(s.same_host);
    CHECK(got.same_host);
    // Plain bytes: the link never leaves the kernel (or this host's memory).
    CHECK(s.traffic_secret.empty());
    CHECK(got.traffic_secret.empty());
    const bool shared = how == same_host_link::shared_memory;
    CHECK((s.shm != nullptr) == shared);
    CHECK((got.shm != nullptr) == shared);
    if (shared) {
      // Both ends map one ring: what one writes, the other reads.
      CHECK(s.shm->write("abcd", 4) == 4);
      auto [data, n] = got.shm->readable(4);
      REQUIRE(n == 4);
      CHECK(std::string(data, 4) == "abcd");
    }
    ::close(got.fd);
    ::close(s.fd);
    ::close(wrong);
  }
}

TEST_CASE("process ring: a shared ring needs both ends to ask for one") {
  // A listener that makes Unix-socket links: a connector that waits for a
  // shared ring is told it got none (naming the peer), not left hanging.
  ring_link_listener l("127.0.0.1", same_host_link::unix_socket);
  const auto deadline = clock_type::now() + std::chrono::seconds(2);
  auto accepted = std::async(std::launch::async, [&] { return l.accept(deadline, task(0), true); });
  CHECK_THROWS_WITH_AS(
      connect_ring_link(l.offer(), deadline, task(1), true, same_host_link::shared_memory),
      doctest::Contains("worker:1 at 127.0.0.1"), device_error);
  ::close(accepted.get().fd);
}

TEST_CASE("process ring: where the offer has no Unix socket here, the link is TLS over TCP") {
  ring_link_listener l("127.0.0.1");  // as a listener on another host looks from here
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  auto accepted = std::async(std::launch::async, [&] { return l.accept(deadline, task(0), true); });
  auto s = connect_ring_link(l.offer(), deadline, task(1), true, same_host_link::shared_memory);
  auto got = accepted.get();
  CHECK_FALSE(s.same_host);
  CHECK(s.shm == nullptr);
  CHECK(s.traffic_secret.size() == 32);
  CHECK(got.traffic_secret == s.traffic_secret);
  ::close(got.fd);
  ::close(s.fd);
}

TEST_CASE("process ring: no peer by the deadline is an error naming it") {
  ring_link_listener l("127.0.0.1");
  CHECK_THROWS_WITH_AS(
      l.accept(clock_type::now() + std::chrono::milliseconds(100), "worker:3", true),
      doctest::Contains("worker:3 did not connect"), device_error);
  ring_link_offer nowhere = l.offer();
  nowhere.port = 1;  // nothing listens there
  CHECK_THROWS_WITH_AS(
      connect_ring_link(nowhere, clock_type::now() + std::chrono::milliseconds(100), "worker:4",
                        true),
      doctest::Contains("cannot connect to worker:4"), device_error);
}
