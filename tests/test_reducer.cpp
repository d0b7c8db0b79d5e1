// Reducers: all-reduce and broadcast across a group of reducer actors, for
// every algorithm, group size and operation, against references computed
// here; ordering, bucketing, mismatches and bad configurations.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "actors/reducer.hpp"
#include "actors/system_config.hpp"
#include "actors/visible_mailbox.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr auto timeout = std::chrono::seconds(10);
const reduce_op all_ops[] = {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max};

// Sizes not divisible by group sizes or chunk sizes, a single element, and
// one tensor that spans several buckets and chunks (with the small sizes below).
const std::vector<shape_t> odd_shapes{{1}, {7}, {3, 5}, {130}, {1}, {2, 129}, {11}};

reducer_config small_config(const std::string& algo) {
  reducer_config c;
  c.algorithm = algo;
  c.bucket_bytes = 512;  // 128 floats
  c.chunk_bytes = 40;    // 10 floats
  return c;
}

std::vector<tensor> random_tensors(const std::vector<shape_t>& shapes, std::mt19937& g) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<tensor> ts;
  for (const auto& s : shapes) {
    tensor t(s);
    for (auto& x : t.span<float>()) x = d(g);
    ts.push_back(t);
  }
  return ts;
}

std::vector<tensor> clones(const std::vector<tensor>& ts) {
  std::vector<tensor> r;
  for (const auto& t : ts) r.push_back(t.clone());
  return r;
}

// The expected all-reduce of inputs[rank][tensor], from the originals.
std::vector<std::vector<double>> reference(const std::vector<std::vector<tensor>>& inputs,
                                           reduce_op op) {
  std::vector<std::vector<double>> ref;
  auto n = inputs.size();
  for (std::size_t t = 0; t < inputs[0].size(); ++t) {
    auto numel = static_cast<std::size_t>(inputs[0][t].numel());
    std::vector<double> r(numel);
    for (std::size_t i = 0; i < numel; ++i) {
      double acc = inputs[0][t].f32()[i];
      for (std::size_t k = 1; k < n; ++k) {
        double x = inputs[k][t].f32()[i];
        if (op == reduce_op::sum || op == reduce_op::mean)
          acc += x;
        else if (op == reduce_op::min)
          acc = std::min(acc, x);
        else
          acc = std::max(acc, x);
      }
      if (op == reduce_op::mean) acc /= static_cast<double>(n);
      r[i] = acc;
    }
    ref.push_back(std::move(r));
  }
  return ref;
}

struct outcome {
  std::vector<tensor> value;
  reducer_stats stats;
  std::string error;
  bool ok() const { return error.empty(); }
};

enum class call_kind { allreduce, broadcast, stats, reduce_scatter, all_gather };

struct call {
  reducer_actor target;
  call_kind kind = call_kind::allreduce;
  reduce_op op = reduce_op::sum;
  int32_t root = 0;
  std::vector<tensor> tensors;
};

// Calls and their outcomes, shared between the test thread and the caller
// actor under a mutex.
struct board {
  std::mutex m;
  std::condition_variable cv;
  std::vector<call> calls;
  std::vector<std::optional<outcome>> out;

  std::size_t add(call c) {
    std::lock_guard<std::mutex> lk{m};
    calls.push_back(std::move(c));
    out.emplace_back();
    return calls.size() - 1;
  }
  call get(std::size_t i) {
    std::lock_guard<std::mutex> lk{m};
    return calls[i];
  }
  void put(std::size_t i, outcome o) {
    std::lock_guard<std::mutex> lk{m};
    out[i] = std::move(o);
    cv.notify_all();
  }
  outcome wait(std::size_t i) {
    std::unique_lock<std::mutex> lk{m};
    if (!cv.wait_for(lk, timeout + 5s, [&] { return out[i].has_value(); }))
      return outcome{{}, {}, "test: no reply, not even a timeout"};
    return *out[i];
  }
};

// Makes the calls the test thread posts: an actor (not the test thread) so
// that CAF's hand-over of requests and replies is visible to ThreadSanitizer
// (see actors/visible_mailbox.hpp), with finite request timeouts.
class caller : public visible_mailbox<caf::event_based_actor> {
 public:
  caller(caf::actor_config& cfg, std::shared_ptr<board> b)
      : visible_mailbox(cfg), board_(std::move(b)) {}

  caf::behavior make_behavior() override {
    return {[this](std::size_t i) {
      auto c = board_->get(i);
      auto b = board_;
      auto fail = [b, i](caf::error& e) {
        auto text = describe(e);
        b->put(i, outcome{{}, {}, text.empty() ? to_string(e) : text});
      };
      auto done = [b, i](std::vector<tensor>& v) { b->put(i, outcome{v, {}, {}}); };
      switch (c.kind) {
        case call_kind::allreduce:
          request(c.target, timeout, allreduce_atom::value, c.op, c.tensors).then(done, fail);
          break;
        case call_kind::broadcast:
          request(c.target, timeout, broadcast_atom::value, c.root, c.tensors).then(done, fail);
          break;
        case call_kind::reduce_scatter:
          request(c.target, timeout, reduce_scatter_atom::value, c.op, c.tensors).then(done, fail);
          break;
        case call_kind::all_gather:
          request(c.target, timeout, all_gather_atom::value, c.tensors).then(done, fail);
          break;
        case call_kind::stats:
          request(c.target, timeout, stats_atom::value)
              .then(
                  [b, i](reducer_stats& s) {
                    b->put(i, outcome{{}, s, {}});
                  },
                  fail);
          break;
      }
    }};
  }

 private:
  std::shared_ptr<board> board_;
};

struct env {
  system_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<board> b = std::make_shared<board>();
  caf::actor calls = sys.spawn<caller>(b);
  ~env() { caf::anon_send_exit(calls, caf::exit_reason::user_shutdown); }

  std::size_t post(call c) {
    auto i = b->add(std::move(c));
    caf::anon_send(calls, i);
    return i;
  }
  outcome result(std::size_t i) { return b->wait(i); }
  std::vector<outcome> results(const std::vector<std::size_t>& is) {
    std::vector<outcome> r;
    for (auto i : is) r.push_back(result(i));
    return r;
  }
  reducer_stats stats(const reducer_actor& h) {
    auto o = result(post(call{h, call_kind::stats, reduce_op::sum, 0, {}}));
    REQUIRE_MESSAGE(o.ok(), o.error);
    return o.stats;
  }
};

// Every rank calls allreduce at once; returns each rank's outcome.
std::vector<outcome> allreduce(env& e, const std::vector<reducer_actor>& group, reduce_op op,
                               const std::vector<std::vector<tensor>>& data) {
  std::vector<std::size_t> is;
  for (std::size_t r = 0; r < group.size(); ++r)
    is.push_back(e.post(call{group[r], call_kind::allreduce, op, 0, data[r]}));
  return e.results(is);
}

std::vector<outcome> collective(env& e, const std::vector<reducer_actor>& group, call_kind k,
                                reduce_op op, const std::vector<std::vector<tensor>>& data) {
  std::vector<std::size_t> is;
  for (std::size_t r = 0; r < group.size(); ++r)
    is.push_back(e.post(call{group[r], k, op, 0, data[r]}));
  return e.results(is);
}

std::vector<outcome> broadcast(env& e, const std::vector<reducer_actor>& group, int32_t root,
                               const std::vector<std::vector<tensor>>& data) {
  std::vector<std::size_t> is;
  for (std::size_t r = 0; r < group.size(); ++r)
    is.push_back(e.post(call{group[r], call_kind::broadcast, reduce_op::sum, root, data[r]}));
  return e.results(is);
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Sum and mean: every rank's float result within 1e-5 of the double
// reference (inputs in [-1, 1], at most 5 ranks: float rounding stays below
// 1e-6). Min and max: exact.
void check_allreduce(const std::vector<outcome>& out, const std::vector<std::vector<tensor>>& data,
                     const std::vector<std::vector<double>>& ref, reduce_op op) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    REQUIRE_MESSAGE(out[r].ok(), "rank ", r, ": ", out[r].error);
    REQUIRE(out[r].value.size() == ref.size());
    for (std::size_t t = 0; t < ref.size(); ++t) {
      const tensor& got = out[r].value[t];
      CHECK(got.shares_buffer_with(data[r][t]));  // in place, no copy
      for (std::size_t i = 0; i < ref[t].size(); ++i) {
        double g = got.f32()[i];
        if (op == reduce_op::min || op == reduce_op::max) {
          if (g != ref[t][i])
            FAIL_CHECK("rank ", r, " tensor ", t, "[", i, "] = ", g, ", expected ", ref[t][i]);
        } else if (std::abs(g - ref[t][i]) > 1e-5) {
          FAIL_CHECK("rank ", r, " tensor ", t, "[", i, "] = ", g, ", expected ", ref[t][i]);
        }
      }
      // Every rank holds the very same bits.
      CHECK(same_bits(got, out[0].value[t]));
    }
  }
}

}  // namespace

TEST_CASE("allreduce: every algorithm, group size 1-5 and op matches the reference") {
  env e;
  std::mt19937 g(42);
  for (const auto& algo : reducer_algorithms()) {
    for (int n = 1; n <= 5; ++n) {
      auto group = spawn_reducer_group(e.sys, n, small_config(algo));
      for (auto op : all_ops) {
        CAPTURE(algo);
        CAPTURE(n);
        CAPTURE(reduce_op_name(op));
        std::vector<std::vector<tensor>> data, originals;
        for (int r = 0; r < n; ++r) {
          data.push_back(random_tensors(odd_shapes, g));
          originals.push_back(clones(data.back()));
        }
        auto ref = reference(originals, op);
        auto out = allreduce(e, group, op, data);
        check_allreduce(out, data, ref, op);
      }
    }
  }
}

TEST_CASE("allreduce: default bucket and chunk sizes on a 12 MB tensor (several buckets)") {
  env e;
  std::mt19937 g(7);
  for (const auto& algo : reducer_algorithms()) {
    CAPTURE(algo);
    reducer_config c;
    c.algorithm = algo;
    auto group = spawn_reducer_group(e.sys, 3, c);
    std::vector<std::vector<tensor>> data, originals;
    for (int r = 0; r < 3; ++r) {
      data.push_back(random_tensors({{3 << 20}, {5}}, g));
      originals.push_back(clones(data.back()));
    }
    auto out = allreduce(e, group, reduce_op::sum, data);
    check_allreduce(out, data, reference(originals, reduce_op::sum), reduce_op::sum);
    CHECK(e.stats(group[0]).buckets == 4);  // 12 MB / 4 MB, + 5 floats
  }
}

TEST_CASE("broadcast: every algorithm, group size and root") {
  env e;
  std::mt19937 g(3);
  for (const auto& algo : reducer_algorithms()) {
    for (int n = 1; n <= 5; ++n) {
      auto group = spawn_reducer_group(e.sys, n, small_config(algo));
      for (int root = 0; root < n; ++root) {
        CAPTURE(algo);
        CAPTURE(n);
        CAPTURE(root);
        std::vector<std::vector<tensor>> data;
        for (int r = 0; r < n; ++r) data.push_back(random_tensors(odd_shapes, g));
        auto expected = clones(data[static_cast<std::size_t>(root)]);
        auto out = broadcast(e, group, root, data);
        for (int r = 0; r < n; ++r) {
          auto& o = out[static_cast<std::size_t>(r)];
          REQUIRE_MESSAGE(o.ok(), "rank ", r, ": ", o.error);
          for (std::size_t t = 0; t < expected.size(); ++t) {
            CHECK(o.value[t].shares_buffer_with(data[static_cast<std::size_t>(r)][t]));
            CHECK(same_bits(o.value[t], expected[t]));
          }
        }
      }
    }
  }
}

TEST_CASE("collectives back to back, ranks calling in different orders and times") {
  env e;
  std::mt19937 g(11);
  const int n = 4;
  // Collective k: allreduce with ops[k], or a broadcast from rank 2 for k == 2.
  const reduce_op ops[] = {reduce_op::sum, reduce_op::max, reduce_op::sum, reduce_op::mean,
                           reduce_op::min};
  const int count = 5;
  for (const auto& algo : reducer_algorithms()) {
    CAPTURE(algo);
    auto group = spawn_reducer_group(e.sys, n, small_config(algo));
    std::vector<std::vector<std::vector<tensor>>> data(count), originals(count);
    for (int k = 0; k < count; ++k)
      for (int r = 0; r < n; ++r) {
        data[k].push_back(random_tensors(odd_shapes, g));
        originals[k].push_back(clones(data[k].back()));
      }
    std::vector<std::vector<std::size_t>> hs(static_cast<std::size_t>(n));
    auto call = [&](int r, int k) {
      auto& d = data[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      auto& target = group[static_cast<std::size_t>(r)];
      hs[static_cast<std::size_t>(r)].push_back(
          k == 2 ? e.post({target, call_kind::broadcast, reduce_op::sum, 2, d})
                 : e.post({target, call_kind::allreduce, ops[k], 0, d}));
    };
    // Rank 2 queues everything at once, rank 0 two now and three later, rank 1
    // in between, rank 3 only after a long pause: its peers' messages for
    // collectives it has not begun must wait for it.
    for (int k = 0; k < count; ++k) call(2, k);
    call(0, 0);
    call(0, 1);
    std::this_thread::sleep_for(20ms);
    for (int k = 0; k < count; ++k) call(1, k);
    for (int k = 2; k < count; ++k) call(0, k);
    std::this_thread::sleep_for(100ms);
    for (int k = 0; k < count; ++k) call(3, k);
    std::vector<std::vector<outcome>> out(count, std::vector<outcome>(n));
    for (int r = 0; r < n; ++r) {
      auto o = e.results(hs[static_cast<std::size_t>(r)]);
      for (int k = 0; k < count; ++k)
        out[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] =
            std::move(o[static_cast<std::size_t>(k)]);
    }
    for (int k = 0; k < count; ++k) {
      CAPTURE(k);
      auto& ok = out[static_cast<std::size_t>(k)];
      if (k == 2) {
        for (int r = 0; r < n; ++r) {
          REQUIRE_MESSAGE(ok[static_cast<std::size_t>(r)].ok(),
                          ok[static_cast<std::size_t>(r)].error);
          for (std::size_t t = 0; t < odd_shapes.size(); ++t)
            CHECK(same_bits(ok[static_cast<std::size_t>(r)].value[t], originals[2][2][t]));
        }
      } else {
        check_allreduce(ok, data[static_cast<std::size_t>(k)],
                        reference(originals[static_cast<std::size_t>(k)], ops[k]), ops[k]);
      }
    }
  }
}

TEST_CASE("bucketing: 100 tiny tensors cost about one collective's messages") {
  env e;
  std::mt19937 g(5);
  const int n = 4;
  std::vector<shape_t> tiny(100, shape_t{3});
  for (const auto& algo : reducer_algorithms()) {
    CAPTURE(algo);
    auto stats = [&](const std::vector<reducer_actor>& group) {
      int64_t messages = 0, buckets = 0, collectives = 0;
      for (auto& h : group) {
        auto s = e.stats(h);
        messages += s.messages_sent;
        buckets += s.buckets;
        collectives += s.collectives;
      }
      return std::make_tuple(messages, buckets, collectives);
    };
    // Fused: one call with 100 tensors.
    auto fused = spawn_reducer_group(e.sys, n, reducer_config{algo, 4 << 20, 1 << 20});
    std::vector<std::vector<tensor>> data, originals;
    for (int r = 0; r < n; ++r) {
      data.push_back(random_tensors(tiny, g));
      originals.push_back(clones(data.back()));
    }
    check_allreduce(allreduce(e, fused, reduce_op::sum, data), data,
                    reference(originals, reduce_op::sum), reduce_op::sum);
    auto [fused_messages, fused_buckets, fused_collectives] = stats(fused);
    CHECK(fused_collectives == n);
    CHECK(fused_buckets == n);  // one bucket per rank
    // Unfused: the same 100 tensors as 100 collectives.
    auto single = spawn_reducer_group(e.sys, n, reducer_config{algo, 4 << 20, 1 << 20});
    for (std::size_t t = 0; t < tiny.size(); ++t) {
      std::vector<std::vector<tensor>> one;
      for (int r = 0; r < n; ++r) one.push_back({data[static_cast<std::size_t>(r)][t]});
      for (auto& o : allreduce(e, single, reduce_op::sum, one)) REQUIRE(o.ok());
    }
    auto [single_messages, single_buckets, single_collectives] = stats(single);
    CHECK(single_collectives == 100 * n);
    MESSAGE(algo, ": 100 tensors fused: ", fused_messages,
            " peer messages; as 100 collectives: ", single_messages);
    CHECK(fused_messages > 0);
    CHECK(fused_messages <= 8 * n);  // ring: 2(n-1) steps + 1 release per rank
    CHECK(single_messages >= 100 * fused_messages / 2);
    // A bucket size of 400 bytes splits the 1200 bytes into 3 buckets.
    auto three = spawn_reducer_group(e.sys, n, reducer_config{algo, 400, 1 << 20});
    auto out = allreduce(e, three, reduce_op::max, data);
    for (auto& o : out) REQUIRE(o.ok());
    auto [m3, b3, c3] = stats(three);
    CHECK(b3 == 3 * n);
  }
}

TEST_CASE("mismatched calls fail on every rank, quickly, and the group goes on") {
  env e;
  std::mt19937 g(9);
  const int n = 4;
  for (const auto& algo : reducer_algorithms()) {
    CAPTURE(algo);
    auto group = spawn_reducer_group(e.sys, n, small_config(algo));
    auto make = [&](int bad_rank, const std::vector<shape_t>& bad_shapes) {
      std::vector<std::vector<tensor>> d;
      for (int r = 0; r < n; ++r)
        d.push_back(random_tensors(r == bad_rank ? bad_shapes : odd_shapes, g));
      return d;
    };
    auto expect_all_fail = [&](const std::vector<outcome>& out, const std::string& needle) {
      CAPTURE(needle);
      for (std::size_t r = 0; r < out.size(); ++r) {
        CAPTURE(r);
        REQUIRE_FALSE(out[r].ok());
        CHECK_MESSAGE(out[r].error.find(needle) != std::string::npos, out[r].error);
      }
    };
    auto t0 = std::chrono::steady_clock::now();
    // A different shape on one rank (rank 3: a leaf of every tree).
    auto shapes = odd_shapes;
    shapes[3] = {131};
    expect_all_fail(allreduce(e, group, reduce_op::sum, make(3, shapes)), "tensor 3");
    // A different number of tensors on rank 0 (every tree's root).
    expect_all_fail(allreduce(e, group, reduce_op::sum, make(0, {{1}, {7}})), "tensors");
    // A different op on rank 1.
    {
      auto d = make(-1, {});
      std::vector<std::size_t> hs;
      for (int r = 0; r < n; ++r)
        hs.push_back(
            e.post({group[static_cast<std::size_t>(r)], call_kind::allreduce,
                    r == 1 ? reduce_op::max : reduce_op::sum, 0, d[static_cast<std::size_t>(r)]}));
      expect_all_fail(e.results(hs), "allreduce(max)");
    }
    // Broadcast with one rank's shape off, and with a root outside the group.
    expect_all_fail(broadcast(e, group, 1, make(2, shapes)), "tensor 3");
    expect_all_fail(broadcast(e, group, 7, make(-1, {})), "root 7");
    // A float64-free world: int32 tensors are refused on every rank.
    {
      auto d = make(-1, {});
      d[2][0] = tensor({1}, dtype::i32);
      expect_all_fail(allreduce(e, group, reduce_op::sum, d), "float32");
    }
    auto elapsed = std::chrono::steady_clock::now() - t0;
    CHECK(elapsed < 2s);
    // The sequence numbers stayed in step: a good call still works.
    std::vector<std::vector<tensor>> data, originals;
    for (int r = 0; r < n; ++r) {
      data.push_back(random_tensors(odd_shapes, g));
      originals.push_back(clones(data.back()));
    }
    check_allreduce(allreduce(e, group, reduce_op::mean, data), data,
                    reference(originals, reduce_op::mean), reduce_op::mean);
  }
}

TEST_CASE("empty collectives and zero-element tensors") {
  env e;
  for (const auto& algo : reducer_algorithms()) {
    CAPTURE(algo);
    auto group = spawn_reducer_group(e.sys, 3, small_config(algo));
    std::vector<std::vector<tensor>> none(3);
    for (auto& o : allreduce(e, group, reduce_op::sum, none)) CHECK(o.ok());
    std::vector<std::vector<tensor>> zero(3, std::vector<tensor>{tensor({0}), tensor({2, 0})});
    for (auto& o : allreduce(e, group, reduce_op::max, zero)) CHECK(o.ok());
    // One rank with an element more than the others: an error everywhere.
    std::vector<std::vector<tensor>> uneven{{tensor({0})}, {tensor({1})}, {tensor({0})}};
    for (auto& o : allreduce(e, group, reduce_op::sum, uneven)) CHECK_FALSE(o.ok());
  }
}

TEST_CASE("spawn_reducer_group refuses unknown algorithms and bad sizes") {
  env e;
  reducer_config c;
  c.algorithm = "butterfly";
  CHECK_THROWS_AS(spawn_reducer_group(e.sys, 4, c), std::invalid_argument);
  try {
    spawn_reducer_group(e.sys, 4, c);
  } catch (const std::invalid_argument& ex) {
    std::string what = ex.what();
    CHECK(what.find("butterfly") != std::string::npos);
    CHECK(what.find("ring, tree, reduce_to_one") != std::string::npos);
  }
  CHECK_THROWS_AS(spawn_reducer_group(e.sys, 0, reducer_config{}), std::invalid_argument);
  CHECK_THROWS_AS(spawn_reducer_group(e.sys, 2, reducer_config{"ring", 0, 1}),
                  std::invalid_argument);
  CHECK(std::string(reduce_op_name(reduce_op::mean)) == "mean");
  CHECK(parse_reduce_op("max") == reduce_op::max);
  CHECK_THROWS_AS(parse_reduce_op("avg"), std::invalid_argument);
}

// Element i of the tensors seen as one buffer (how segments are numbered).
float& flat_at(std::vector<tensor>& ts, int64_t i) {
  for (auto& t : ts) {
    if (i < t.numel()) return t.f32()[i];
    i -= t.numel();
  }
  throw std::out_of_range("flat_at");
}

TEST_CASE("reduce_scatter then all_gather: segments, ops and the same bits as allreduce") {
  env e;
  std::mt19937 g(11);
  int64_t numel = 0;
  for (const auto& s : odd_shapes) numel += shape_numel(s);
  for (const auto& algo : reducer_algorithms()) {
    for (int n = 1; n <= 5; ++n) {
      auto cfg = small_config(algo);
      auto group = spawn_reducer_group(e.sys, n, cfg);
      // The segments cover the buffer exactly once over the ranks.
      std::vector<int> owner(static_cast<std::size_t>(numel), -1);
      for (int r = 0; r < n; ++r)
        for (auto [a, b] : reduce_scatter_segments(numel, cfg, n, r))
          for (int64_t i = a; i < b; ++i) {
            CHECK(owner[static_cast<std::size_t>(i)] == -1);
            owner[static_cast<std::size_t>(i)] = r;
          }
      CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      for (auto op : all_ops) {
        CAPTURE(algo);
        CAPTURE(n);
        CAPTURE(reduce_op_name(op));
        std::vector<std::vector<tensor>> data, originals, again;
        for (int r = 0; r < n; ++r) {
          data.push_back(random_tensors(odd_shapes, g));
          originals.push_back(clones(data.back()));
          again.push_back(clones(data.back()));
        }
        auto ref = reference(originals, op);
        auto rs = collective(e, group, call_kind::reduce_scatter, op, data);
        for (int r = 0; r < n; ++r) {
          REQUIRE_MESSAGE(rs[static_cast<std::size_t>(r)].ok(),
                          rs[static_cast<std::size_t>(r)].error);
          auto& got = rs[static_cast<std::size_t>(r)].value;
          CHECK(got[0].shares_buffer_with(data[static_cast<std::size_t>(r)][0]));
          std::vector<double> flat_ref;
          for (auto& t : ref) flat_ref.insert(flat_ref.end(), t.begin(), t.end());
          for (auto [a, b] : reduce_scatter_segments(numel, cfg, n, r))
            for (int64_t i = a; i < b; ++i)
              if (std::abs(flat_at(got, i) - flat_ref[static_cast<std::size_t>(i)]) > 1e-5)
                FAIL_CHECK("rank ", r, " element ", i, " = ", flat_at(got, i), ", expected ",
                           flat_ref[static_cast<std::size_t>(i)]);
        }
        auto ag = collective(e, group, call_kind::all_gather, reduce_op::sum, data);
        auto ar = allreduce(e, group, op, again);
        for (int r = 0; r < n; ++r) {
          REQUIRE_MESSAGE(ag[static_cast<std::size_t>(r)].ok(),
                          ag[static_cast<std::size_t>(r)].error);
          REQUIRE(ar[static_cast<std::size_t>(r)].ok());
          for (std::size_t t = 0; t < odd_shapes.size(); ++t)
            if (algo == "ring")  // the same arithmetic, so the same bits
              CHECK(same_bits(ag[static_cast<std::size_t>(r)].value[t],
                              ar[static_cast<std::size_t>(r)].value[t]));
            else
              CHECK(same_bits(ag[static_cast<std::size_t>(r)].value[t], ag[0].value[t]));
        }
      }
    }
  }
}

TEST_CASE("all_gather copies each rank's segments to every rank; a mismatch fails everywhere") {
  env e;
  auto cfg = small_config("tree");
  const int n = 3;
  auto group = spawn_reducer_group(e.sys, n, cfg);
  std::vector<std::vector<tensor>> data;
  int64_t numel = 0;
  for (const auto& s : odd_shapes) numel += shape_numel(s);
  for (int r = 0; r < n; ++r) {
    data.push_back(random_tensors(odd_shapes, *std::make_unique<std::mt19937>(r)));
    for (auto [a, b] : reduce_scatter_segments(numel, cfg, n, r))
      for (int64_t i = a; i < b; ++i) flat_at(data.back(), i) = static_cast<float>(1000 * r + i);
  }
  auto out = collective(e, group, call_kind::all_gather, reduce_op::sum, data);
  for (int r = 0; r < n; ++r) {
    REQUIRE(out[static_cast<std::size_t>(r)].ok());
    for (int owner = 0; owner < n; ++owner)
      for (auto [a, b] : reduce_scatter_segments(numel, cfg, n, owner))
        for (int64_t i = a; i < b; ++i)
          CHECK(flat_at(out[static_cast<std::size_t>(r)].value, i) ==
                static_cast<float>(1000 * owner + i));
  }
  // Rank 2 calls allreduce where the others all_gather: everyone gets an error.
  std::vector<std::size_t> is;
  for (int r = 0; r < n; ++r)
    is.push_back(e.post(call{group[static_cast<std::size_t>(r)],
                             r == 2 ? call_kind::allreduce : call_kind::all_gather, reduce_op::sum,
                             0, data[static_cast<std::size_t>(r)]}));
  for (auto& o : e.results(is)) {
    CHECK_FALSE(o.ok());
    CHECK_MESSAGE(o.error.find("all_gather") != std::string::npos, o.error);
  }
  CHECK_THROWS_AS(reduce_scatter_segments(10, cfg, 3, 3), std::invalid_argument);
}
