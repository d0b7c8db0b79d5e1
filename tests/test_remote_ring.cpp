// The cross-process ring all-reduce (actors/reducers/remote_ring.hpp): the
// math against a reference with P = 1..4 nodes in one process, flow control,
// failures, and a real 2-process ring over 127.0.0.1 (the child is the
// remote_ring_peer helper, ended by the test whatever happens).
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/scoped_execution_unit.hpp>

#include "actors/net_system_config.hpp"
#include "actors/reducer_group.hpp"
#include "actors/reducers/remote_ring.hpp"
#include "tests/remote_ring_data.hpp"

extern char** environ;

using namespace troupe;

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
struct lsan_disabled {
  lsan_disabled() { __lsan_disable(); }
  ~lsan_disabled() { __lsan_enable(); }
};
#else
struct lsan_disabled {
  lsan_disabled() {}  // user-provided: no unused-variable warning
};
#endif

using namespace std::chrono_literals;
namespace rt = troupe::ring_test;

namespace {

const reduce_op all_ops[] = {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max};

// Runs one collective on every node of `nodes` concurrently; returns each
// rank's result (or error).
using result_t = caf::expected<std::vector<tensor>>;

// The error text of a failed result ("" if it holds a value). doctest builds
// the messages of passing checks too (with -s), so never call .error() on
// a value.
std::string why(const result_t& r) {
  return r ? std::string{} : describe(r.error());
}

std::vector<result_t> run_all(caf::actor_system& sys, const std::vector<ring_node_actor>& nodes,
                              reduce_op op, std::vector<std::vector<tensor>> in,
                              caf::timespan timeout = 20s) {
  caf::scoped_actor self{sys};
  using handle_t =
      decltype(self->request(nodes[0], timeout, allreduce_atom::value, op, std::vector<tensor>{}));
  std::vector<handle_t> hs;
  for (std::size_t r = 0; r < nodes.size(); ++r)
    hs.push_back(self->request(nodes[r], timeout, allreduce_atom::value, op, std::move(in[r])));
  std::vector<result_t> out;
  for (auto& h : hs)
    h.receive([&](std::vector<tensor>& ts) { out.emplace_back(std::move(ts)); },
              [&](caf::error& e) { out.emplace_back(std::move(e)); });
  return out;
}

void check_results(const std::vector<result_t>& res, int p, int iter, int64_t numel, reduce_op op) {
  auto ref = rt::reference(p, iter, numel, op);
  for (int r = 0; r < p; ++r) {
    REQUIRE_MESSAGE(res[r], "rank " << r << ": " << why(res[r]));
    auto got = rt::flatten(*res[r]);
    REQUIRE(got.size() == ref.size());
    // Inputs are multiples of 1/4: every op is exact, so compare bits.
    const bool same_bits =
        got.empty() || std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0;
    CHECK_MESSAGE(same_bits,
                  "P=" << p << " op=" << reduce_op_name(op) << " n=" << numel << " rank " << r);
    CHECK(rt::hash(*res[r]) == rt::hash(*res[0]));
  }
}

struct local_fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
};

// A child process with pipes to its stdin and stdout, killed (SIGKILL) and
// reaped when this object goes away, whatever the test did.
struct child_process {
  pid_t pid = -1;
  int in_fd = -1;   // child's stdin
  int out_fd = -1;  // child's stdout
  std::string buf;

  explicit child_process(const std::vector<std::string>& args) {
    int in_p[2], out_p[2];
    REQUIRE(pipe(in_p) == 0);
    REQUIRE(pipe(out_p) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in_p[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out_p[1], 1);
    posix_spawn_file_actions_addclose(&fa, in_p[1]);
    posix_spawn_file_actions_addclose(&fa, out_p[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in_p[0]);
    close(out_p[1]);
    in_fd = in_p[1];
    out_fd = out_p[0];
    REQUIRE_MESSAGE(rc == 0, "posix_spawn " << args[0] << ": " << std::strerror(rc));
  }
  ~child_process() {
    if (in_fd >= 0) close(in_fd);
    if (out_fd >= 0) close(out_fd);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // The next line of the child's stdout, or nullopt after `timeout`/EOF.
  std::optional<std::string> line(std::chrono::milliseconds timeout = 30s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf.find('\n'); nl != std::string::npos) {
        auto l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd pfd{out_fd, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      auto n = read(out_fd, tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
  }
  void say(const std::string& s) {
    auto l = s + "\n";
    CHECK(write(in_fd, l.data(), l.size()) == static_cast<ssize_t>(l.size()));
  }
  // Waits up to `timeout` for the child to exit; its exit status or -1.
  int wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
};

// Rank 0 here, rank 1 in a remote_ring_peer child; returns the child once
// both are wired.
struct two_process_ring {
  net_system_config cfg;
  caf::actor_system sys{cfg};
  ring_node_actor node;
  std::optional<child_process> child;

  two_process_ring(const std::string& mode, ring_options opt = {}) {
    node = spawn_ring_node(sys, opt);
    auto port = publish_ring_node(sys, node, 0);  // a free port, chosen now
    REQUIRE_MESSAGE(port, (port ? std::string{} : sys.render(port.error())));
    child.emplace(std::vector<std::string>{REMOTE_RING_PEER, std::to_string(*port), mode,
                                           std::to_string(opt.chunk_bytes),
                                           std::to_string(opt.window)});
    auto l = child->line();
    REQUIRE_MESSAGE((l && l->rfind("PORT ", 0) == 0), "child said: " << l.value_or("<nothing>"));
    auto port1 = static_cast<uint16_t>(std::stoi(l->substr(5)));
    auto err = join_ring(sys, node, 0, {{"127.0.0.1", *port}, {"127.0.0.1", port1}});
    REQUIRE_MESSAGE(!err, describe(err));
  }
  ~two_process_ring() { caf::anon_send_exit(node, caf::exit_reason::user_shutdown); }
};

}  // namespace

TEST_CASE("remote_ring: a chunk of views over several tensors travels as one raw block") {
  local_fixture f;
  auto a = tensor::from<float>({3}, {1, 2, 3});
  auto b = tensor::from<float>({2, 2}, {4, 5, 6, 7});
  ring_chunk ch;
  ch.seq = 7;
  ch.step = 1;
  ch.offset = 2;
  ch.total = 100;
  ch.op = reduce_op::max;
  ch.pieces = {{a.f32() + 1, 2}, {b.f32(), 4}};  // a[1..3) then all of b
  ch.keep = {a, b};
  CHECK(ch.numel() == 6);
  std::vector<char> buf;
  {
    caf::binary_serializer sink{f.sys, buf};
    REQUIRE(!inspect(static_cast<caf::serializer&>(sink), ch));
  }
  CHECK(buf.size() < 6 * sizeof(float) + 48);  // header fields + the floats, no per-float tags
  ring_chunk back;
  {
    caf::binary_deserializer src{f.sys, buf};
    REQUIRE(!inspect(static_cast<caf::deserializer&>(src), back));
  }
  CHECK(back.seq == 7);
  CHECK(back.step == 1);
  CHECK(back.offset == 2);
  CHECK(back.total == 100);
  CHECK(back.op == reduce_op::max);
  REQUIRE(back.pieces.size() == 1);
  REQUIRE(back.keep.size() == 1);
  CHECK(back.keep[0].shape() == shape_t{6});
  CHECK(back.keep[0] == tensor::from<float>({6}, {2, 3, 4, 5, 6, 7}));
  CHECK(back.pieces[0].data == back.keep[0].f32());
  CHECK(back.pieces[0].len == 6);
  auto u = tensor::uninitialized({300, 100}, dtype::i64);  // pooled size; zero-fill skipped
  CHECK(u.shape() == shape_t{300, 100});
  CHECK(u.type() == dtype::i64);
  CHECK(u.nbytes() == 300 * 100 * 8);
  // More floats than the collective has elements: an error, not a huge allocation.
  ch.total = 5;
  std::vector<char> bad;
  {
    caf::binary_serializer sink{f.sys, bad};
    REQUIRE(!inspect(static_cast<caf::serializer&>(sink), ch));
  }
  ring_chunk rejected;
  caf::binary_deserializer src{f.sys, bad};
  CHECK(inspect(static_cast<caf::deserializer&>(src), rejected));
  // Truncated bytes: an error.
  buf.resize(buf.size() - 3);
  ring_chunk truncated;
  caf::binary_deserializer src2{f.sys, buf};
  CHECK(inspect(static_cast<caf::deserializer&>(src2), truncated));
}

TEST_CASE("remote_ring: the deserializer lands a chunk in its receiver's buffer when asked") {
  local_fixture f;
  // A landing that copies what it accepts (the node's own applies it to the
  // running collective's buffer).
  struct recording_landing : ring_landing {
    bool accept = true;
    std::vector<float> got;
    bool land(const ring_chunk& x, int64_t len, caf::deserializer& src, caf::error& err) override {
      if (!accept || x.seq != 3) return false;
      got.resize(static_cast<std::size_t>(len));
      err = src.apply_raw(got.size() * sizeof(float), got.data());
      return true;
    }
  };
  auto l = std::make_shared<recording_landing>();
  set_ring_landing(f.sys, 42, l);
  auto a = tensor::from<float>({4}, {1, 2, 3, 4});
  auto encode = [&](uint64_t seq, uint64_t dest) {
    ring_chunk ch;
    ch.seq = seq;
    ch.step = 0;
    ch.offset = 0;
    ch.total = 4;
    ch.dest = dest;
    ch.pieces = {{a.f32(), 4}};
    ch.keep = {a};
    std::vector<char> buf;
    caf::binary_serializer sink{f.sys, buf};
    REQUIRE(!inspect(static_cast<caf::serializer&>(sink), ch));
    return buf;
  };
  // BASP deserializes with the middleman as context: that finds the system.
  caf::scoped_execution_unit ctx{&f.sys};
  auto decode = [&](const std::vector<char>& buf, caf::execution_unit* eu) {
    ring_chunk back;
    caf::binary_deserializer src{eu, buf};
    REQUIRE(!inspect(static_cast<caf::deserializer&>(src), back));
    CHECK(src.remaining() == 0);
    return back;
  };
  auto landed = decode(encode(3, 42), &ctx);
  CHECK(landed.landed == 4);
  CHECK(landed.numel() == 4);
  CHECK(landed.pieces.empty());
  CHECK(landed.dest == 42);
  CHECK(l->got == std::vector<float>{1, 2, 3, 4});
  // Not accepted (another collective), another receiver, no context, no
  // landing any more: the floats arrive in a tensor of their own.
  l->got.clear();
  for (auto [seq, dest, eu] :
       {std::tuple{4, 42, true}, std::tuple{3, 43, true}, std::tuple{3, 42, false}}) {
    auto back = decode(encode(static_cast<uint64_t>(seq), static_cast<uint64_t>(dest)),
                       eu ? &ctx : nullptr);
    CHECK(back.landed == 0);
    REQUIRE(back.pieces.size() == 1);
    CHECK(back.keep[0] == a);
  }
  set_ring_landing(f.sys, 42, nullptr);
  auto after = decode(encode(3, 42), &ctx);
  CHECK(after.landed == 0);
  CHECK(after.pieces.size() == 1);
  CHECK(l->got.empty());
}

TEST_CASE("remote_ring: P = 1..4 in one process, every op, odd sizes, back to back") {
  local_fixture f;
  const int64_t sizes[] = {0, 1, 2, 3, 5, 17, 1000, 4099, 100003};
  for (int p = 1; p <= 4; ++p) {
    // Small chunks and a small window: many chunks per segment, flow control
    // on every link.
    ring_options opt;
    opt.chunk_bytes = 1024;
    opt.window = 2;
    auto nodes = spawn_ring_group(f.sys, p, opt);
    int iter = 0;
    for (auto n : sizes)
      for (auto op : all_ops) {
        std::vector<std::vector<tensor>> in;
        for (int r = 0; r < p; ++r) in.push_back(rt::inputs(r, iter, n));
        auto res = run_all(f.sys, nodes, op, std::move(in));
        check_results(res, p, iter, n, op);
        ++iter;
      }
    stop_ring_nodes(nodes);
  }
}

TEST_CASE("remote_ring: nodes on the middleman's thread (brokers), P = 2..3 in one process") {
  // spawn_ring_node runs a node as a broker where the middleman is loaded
  // (the 2-process tests use that too); spawn_ring_group never does.
  net_system_config cfg;
  caf::actor_system sys{cfg};
  ring_options opt;
  opt.chunk_bytes = 4096;
  opt.window = 3;
  for (int p : {2, 3}) {
    std::vector<ring_node_actor> nodes;
    std::vector<ring_peer_actor> peers;
    for (int r = 0; r < p; ++r) {
      {
        // Brokers of one group in one process (only this test builds that;
        // in use each process has one node and its peers are proxies) can
        // strand each other's last messages at shutdown: CAF 0.17 does not
        // drain a stopped broker's mailbox, so they outlive the system.
        // LeakSanitizer is told to treat them as live.
        lsan_disabled off;
        nodes.push_back(spawn_ring_node(sys, opt));
      }
      peers.emplace_back(nodes.back());
    }
    for (int r = 0; r < p; ++r) REQUIRE(!wire_ring_node(sys, nodes[r], r, peers));
    int iter = 0;
    for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{4099}, int64_t{100003}})
      for (auto op : all_ops) {
        std::vector<std::vector<tensor>> in;
        for (int r = 0; r < p; ++r) in.push_back(rt::inputs(r, iter, n));
        check_results(run_all(sys, nodes, op, std::move(in)), p, iter, n, op);
        ++iter;
      }
    stop_ring_nodes(nodes);
  }
}

TEST_CASE("remote_ring: queued collectives (several requests in flight per rank)") {
  local_fixture f;
  const int p = 3;
  ring_options opt;
  opt.chunk_bytes = 4096;
  opt.window = 3;
  auto nodes = spawn_ring_group(f.sys, p, opt);
  caf::scoped_actor self{f.sys};
  const int k = 6;
  using handle_t = decltype(self->request(nodes[0], 20s, allreduce_atom::value, reduce_op::sum,
                                          std::vector<tensor>{}));
  std::vector<handle_t> hs;
  // Every rank issues all k collectives at once, ranks in different orders
  // of arrival; the node serializes them in call order.
  for (int r = p - 1; r >= 0; --r)
    for (int i = 0; i < k; ++i)
      hs.push_back(self->request(nodes[r], 20s, allreduce_atom::value, all_ops[i % 4],
                                 rt::inputs(r, i, 10007 + i)));
  std::vector<std::vector<result_t>> res(k);
  int idx = 0;
  for (int r = p - 1; r >= 0; --r)
    for (int i = 0; i < k; ++i, ++idx)
      hs[idx].receive([&](std::vector<tensor>& ts) { res[i].emplace_back(std::move(ts)); },
                      [&](caf::error& e) { res[i].emplace_back(std::move(e)); });
  for (int i = 0; i < k; ++i) {
    std::reverse(res[i].begin(), res[i].end());  // back to rank order
    check_results(res[i], p, i, 10007 + i, all_ops[i % 4]);
  }
  stop_ring_nodes(nodes);
}

TEST_CASE("remote_ring: random data, every rank bit-identical, close to the reference") {
  local_fixture f;
  for (int p : {2, 3, 4}) {
    auto nodes = spawn_ring_group(f.sys, p);  // default 1 MiB chunks
    const int64_t n = 3 * (1 << 20) / 4 + 7;  // ~3 MiB: several chunks per segment
    std::vector<std::vector<tensor>> in;
    std::vector<double> ref(n, 0.0);
    uint32_t seed = 12345;
    for (int r = 0; r < p; ++r) {
      tensor t(shape_t{n});
      for (int64_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        t.f32()[i] = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
        ref[i] += t.f32()[i];
      }
      in.push_back({t});
    }
    auto res = run_all(f.sys, nodes, reduce_op::mean, std::move(in));
    for (int r = 0; r < p; ++r) {
      REQUIRE(res[r]);
      CHECK(rt::hash(*res[r]) == rt::hash(*res[0]));
    }
    auto got = (*res[0])[0].f32();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - ref[i] / p));
    CHECK(worst < 1e-6);
    stop_ring_nodes(nodes);
  }
}

TEST_CASE("remote_ring: a sender never has more than `window` chunks unacknowledged") {
  local_fixture f;
  // A fake right neighbour that counts chunks and never grants credits.
  auto counted = std::make_shared<std::atomic<int>>(0);
  // (Spawned with an argument: CAF 0.17 binds a reference to a null empty
  // tuple for argument-less function actors, which UBSan reports.)
  auto fake = f.sys.spawn(
      [](ring_peer_actor::pointer,
         std::shared_ptr<std::atomic<int>> n) -> ring_peer_actor::behavior_type {
        return {
            [n](ring_chunk_atom, const ring_chunk&) { ++*n; },
            [](ring_credit_atom, int32_t) {},
            [](ring_abort_atom, uint64_t, int32_t, const std::string&) {},
            [](ring_offer_atom, int32_t, const std::string&, uint16_t, const std::string&) {},
        };
      },
      counted);
  ring_options opt;
  opt.chunk_bytes = 4096;
  opt.window = 5;
  opt.timeout = 500ms;
  auto node = spawn_ring_node(f.sys, opt);
  REQUIRE(!wire_ring_node(f.sys, node, 0, {node, fake}));
  auto t0 = std::chrono::steady_clock::now();
  // 1 MiB to reduce: 128 chunks per segment, but only 5 may go out.
  auto r = ring_allreduce(f.sys, node, reduce_op::sum, {tensor(shape_t{1 << 18})}, 5s);
  auto dt = std::chrono::steady_clock::now() - t0;
  REQUIRE(!r);
  CHECK(describe(r.error()).find("timed out") != std::string::npos);
  CHECK(describe(r.error()).find("rank 0/2") != std::string::npos);
  CHECK(dt < 2s);
  CHECK(counted->load() == 5);
  // Broken from now on: fails at once, same reason.
  auto again = ring_allreduce(f.sys, node, reduce_op::sum, {tensor(shape_t{4})}, 5s);
  REQUIRE(!again);
  CHECK(describe(again.error()).find("timed out") != std::string::npos);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
}

TEST_CASE("remote_ring: mismatched calls fail on every rank") {
  local_fixture f;
  auto nodes = spawn_ring_group(f.sys, 2);
  auto res =
      run_all(f.sys, nodes, reduce_op::sum, {{tensor(shape_t{10})}, {tensor(shape_t{11})}}, 5s);
  for (auto& r : res) {
    REQUIRE(!r);
    CHECK(describe(r.error()).find("mismatch") != std::string::npos);
  }
  stop_ring_nodes(nodes);
}

TEST_CASE("remote_ring: a lost peer fails the pending collective at once, naming it") {
  local_fixture f;
  auto nodes = spawn_ring_group(f.sys, 3);
  caf::scoped_actor self{f.sys};
  auto t0 = std::chrono::steady_clock::now();
  auto h0 =
      self->request(nodes[0], 10s, allreduce_atom::value, reduce_op::sum, rt::inputs(0, 0, 100000));
  auto h1 =
      self->request(nodes[1], 10s, allreduce_atom::value, reduce_op::sum, rt::inputs(1, 0, 100000));
  std::this_thread::sleep_for(50ms);
  caf::anon_send_exit(nodes[2], caf::exit_reason::kill);  // rank 2 never joins, then dies
  std::vector<std::string> errs;
  for (auto* h : {&h0, &h1})
    h->receive([&](std::vector<tensor>&) { errs.push_back("ok?!"); },
               [&](caf::error& e) { errs.push_back(describe(e)); });
  auto dt = std::chrono::steady_clock::now() - t0;
  CHECK(dt < 2s);
  REQUIRE(errs.size() == 2);
  // Rank 1 sends to rank 2: it sees the down_msg itself; rank 0 either
  // sees it too or gets rank 1's abort; both name rank 2.
  for (auto& e : errs) CHECK_MESSAGE(e.find("rank 2") != std::string::npos, e);
  stop_ring_nodes(nodes);
}

TEST_CASE("remote_ring: two processes on 127.0.0.1, results equal the reference and each other") {
  ring_options opt;
  opt.chunk_bytes = 256 * 1024;  // a few chunks per segment for the big ones
  two_process_ring ring("check", opt);
  auto s = rt::script();
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto [n, op] = s[i];
    auto r = ring_allreduce(ring.sys, ring.node, op, rt::inputs(0, static_cast<int>(i), n), 30s);
    REQUIRE_MESSAGE(r, why(r));
    auto ref = rt::reference(2, static_cast<int>(i), n, op);
    auto got = rt::flatten(*r);
    REQUIRE(got.size() == ref.size());
    CHECK((got.empty() || std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0));
    auto l = ring.child->line();
    REQUIRE(l);
    CHECK(*l == "HASH " + std::to_string(i) + " " + std::to_string(rt::hash(*r)));
  }
  ring.child->say("QUIT");
  CHECK(ring.child->line() == std::optional<std::string>{"DONE"});
  CHECK(ring.child->wait_exit(10s) == 0);
}

TEST_CASE("remote_ring: peer process killed mid-collective -> error naming it within 2 s") {
  two_process_ring ring("hang");
  // One collective together first (the link is warm and works).
  auto first = ring_allreduce(ring.sys, ring.node, reduce_op::sum, rt::inputs(0, 0, 1000), 10s);
  REQUIRE_MESSAGE(first, why(first));
  auto l = ring.child->line(10s);
  REQUIRE(l == std::optional<std::string>{"READY"});
  caf::scoped_actor self{ring.sys};
  // Rank 0 starts a 16 MB collective that the child never joins; its first
  // window of chunks is on the way when the child dies.
  auto h = self->request(ring.node, 30s, allreduce_atom::value, reduce_op::sum,
                         rt::inputs(0, 1, 4 << 20));
  std::this_thread::sleep_for(200ms);
  auto t0 = std::chrono::steady_clock::now();
  kill(ring.child->pid, SIGKILL);
  std::string err;
  h.receive([&](std::vector<tensor>&) { err = "no error"; },
            [&](caf::error& e) { err = describe(e); });
  auto dt = std::chrono::steady_clock::now() - t0;
  CHECK(dt < 2s);
  CHECK_MESSAGE(err.find("lost peer rank 1") != std::string::npos, err);
  MESSAGE("peer loss reported after "
          << std::chrono::duration_cast<std::chrono::milliseconds>(dt).count() << " ms: " << err);
}

TEST_CASE("remote_ring: a group aborted mid-collective frees the other process; a new ring forms") {
  // The collective layer's contract (collectives/process_group.hpp) on the
  // ring nodes between processes, through their process_group: the child
  // waits in a collective this rank never joins; this rank's group aborts
  // (the rank leaves), the child's collective fails at once naming the
  // abort, and this process forms a new ring over itself, the survivor.
  two_process_ring ring("second");
  auto first = ring_allreduce(ring.sys, ring.node, reduce_op::sum, rt::inputs(0, 0, 1000), 10s);
  REQUIRE_MESSAGE(first, why(first));
  REQUIRE(ring.child->line(10s) == std::optional<std::string>{"READY"});
  auto group = make_ring_node_group(ring.node, 0, 2, caf::duration{30s});
  std::this_thread::sleep_for(200ms);  // the child is in its second collective
  group->abort("rank 0 leaves");
  auto said = ring.child->line(10s);
  REQUIRE(said);
  CHECK_MESSAGE(said->rfind("ERROR ", 0) == 0, *said);
  CHECK_MESSAGE(said->find("rank 0 leaves") != std::string::npos, *said);
  std::vector<float> x(100, 1.0f);
  CHECK_THROWS_AS(group->all_reduce(x.data(), x.size(), reduce_op::sum), device_error);

  auto alone = spawn_ring_node(ring.sys, ring_options{});
  auto port = publish_ring_node(ring.sys, alone, 0);
  REQUIRE(port);
  REQUIRE_FALSE(join_ring(ring.sys, alone, 0, {{"127.0.0.1", *port}}));
  auto survivors = make_ring_node_group(alone, 0, 1, caf::duration{30s});
  survivors->all_reduce(x.data(), x.size(), reduce_op::sum);
  CHECK(x == std::vector<float>(100, 1.0f));
  survivors.reset();
  caf::anon_send_exit(alone, caf::exit_reason::user_shutdown);
  ring.child->say("QUIT");
}
