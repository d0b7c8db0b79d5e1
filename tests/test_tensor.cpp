#include <doctest/doctest.h>

#include <memory>

#include "messages/tensor.hpp"

using namespace troupe;

TEST_CASE("tensor: shape, zero fill, typed access") {
  tensor t({2, 3});
  CHECK(t.numel() == 6);
  CHECK(t.nbytes() == 24);
  CHECK(t.type() == dtype::f32);
  for (float v : t.span<float>()) CHECK(v == 0.0f);
  CHECK_THROWS_AS(t.data<int32_t>(), std::logic_error);
  CHECK_THROWS_AS(tensor({2, -1}), std::invalid_argument);
}

TEST_CASE("tensor: copies share the buffer, clone does not") {
  auto a = tensor::from<float>({3}, {1, 2, 3});
  tensor b = a;
  CHECK(b.shares_buffer_with(a));
  b.f32()[0] = 7;
  CHECK(a.f32()[0] == 7);
  tensor c = a.clone();
  CHECK_FALSE(c.shares_buffer_with(a));
  CHECK(c == a);
  c.f32()[1] = -1;
  CHECK_FALSE(c == a);
  CHECK_THROWS(tensor::from<float>({2}, {1, 2, 3}));
  auto r = a.reshaped({3, 1});
  CHECK(r.shares_buffer_with(a));
  CHECK_THROWS(a.reshaped({4}));
}

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <random>

#include "messages/messages.hpp"
#include "messages/node_messages.hpp"
#include "messages/remote_ring_messages.hpp"
#include "messages/rl_messages.hpp"

namespace {
template <class T>
std::vector<char> serialize(caf::actor_system& sys, T& x) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  auto err = sink(x);
  REQUIRE(!err);
  return buf;
}
struct sys_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  sys_fixture() {
    register_messages(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};
}  // namespace

TEST_CASE("tensor::wrap: external memory lives as long as any tensor over it") {
  struct memory {
    alignas(64) float values[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  };
  bool freed = false;
  auto* m = new memory;
  std::shared_ptr<memory> owner(m, [&freed](memory* p) {
    freed = true;
    delete p;
  });
  {
    tensor t = tensor::wrap({2, 4}, dtype::f32, std::shared_ptr<void>(owner, m->values));
    owner.reset();
    CHECK_FALSE(freed);
    CHECK(t.f32() == m->values);  // no copy
    CHECK(t == tensor::from<float>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
    tensor row = t.reshaped({8});
    t = tensor{};
    CHECK_FALSE(freed);  // the reshaped copy still holds it
    CHECK(row.f32()[7] == 8);
  }
  CHECK(freed);
  auto keep = std::make_shared<memory>();
  CHECK_THROWS_AS(tensor::wrap({4}, dtype::f32, std::shared_ptr<void>(keep, keep->values + 1)),
                  std::invalid_argument);  // not 64-byte aligned
  CHECK_THROWS_AS(tensor::wrap({4}, dtype::f32, nullptr), std::invalid_argument);
  CHECK(tensor::wrap({0, 4}, dtype::f32, nullptr).numel() == 0);
}

TEST_CASE("serialization: tensors travel as one raw block and round-trip exactly") {
  sys_fixture f;
  auto t = tensor::from<float>({2, 3}, {1.5f, -2, 3, 4, 5, 6});
  auto buf = serialize(*f.sys, t);
  // The payload is the 24 data bytes plus a small header, not 6 tagged floats.
  CHECK(buf.size() < 24 + 40);
  tensor back;
  caf::binary_deserializer src{*f.sys, buf};
  REQUIRE(!src(back));
  CHECK(back == t);
  CHECK_FALSE(back.shares_buffer_with(t));

  model_state ms{{{"w", t}, {"b", tensor::from<int64_t>({1}, {42})}},
                 {{"w/adam_m", t.clone()}},
                 {{"bn/moving_mean", t.clone()}}};
  auto buf2 = serialize(*f.sys, ms);
  model_state ms2;
  caf::binary_deserializer src2{*f.sys, buf2};
  REQUIRE(!src2(ms2));
  CHECK(ms2.variables == ms.variables);
  CHECK(ms2.slots == ms.slots);
  CHECK(ms2.buffers == ms.buffers);
}

TEST_CASE("serialization: a default-constructed tensor round-trips") {
  sys_fixture f;
  tensor t;
  auto buf = serialize(*f.sys, t);
  tensor back = tensor::from<float>({1}, {3});
  caf::binary_deserializer src{*f.sys, buf};
  REQUIRE(!src(back));
  CHECK(back.empty());
  CHECK(back.rank() == 0);
}

TEST_CASE("serialization: truncated or inconsistent bytes give an error, not a crash") {
  sys_fixture f;
  auto t = tensor::from<float>({4}, {1, 2, 3, 4});
  auto buf = serialize(*f.sys, t);
  for (std::size_t cut : {std::size_t{1}, buf.size() / 2, buf.size() - 1}) {
    std::vector<char> part(buf.begin(), buf.begin() + static_cast<long>(cut));
    tensor back;
    caf::binary_deserializer src{*f.sys, part};
    CHECK(src(back));  // an error
  }
  buf[0] = 9;  // unknown dtype code
  tensor back;
  caf::binary_deserializer src{*f.sys, buf};
  CHECK(src(back));
}

TEST_CASE("serialization: a shape the data does not hold is refused before allocating") {
  sys_fixture f;
  // A peer claims a [2^40, 2^40] float tensor (or one whose element count
  // overflows) but sends 16 bytes: an error naming the shape, no allocation.
  for (int64_t d : {int64_t{1} << 40, int64_t{1} << 62}) {
    std::vector<char> buf;
    caf::binary_serializer sink{*f.sys, buf};
    uint8_t t = 0;
    shape_t shape{d, d};
    std::vector<float> four(4, 1.0f);
    size_t n = 16;
    REQUIRE(!sink(t, shape));
    REQUIRE(!sink.begin_sequence(n));
    REQUIRE(!sink.apply_raw(n, four.data()));
    REQUIRE(!sink.end_sequence());
    tensor back;
    caf::binary_deserializer src{*f.sys, buf};
    auto err = src(back);
    REQUIRE(err);
    auto text = describe(err);
    CHECK_MESSAGE(text.find("tensor: shape [") != std::string::npos, text);
    CHECK(back.empty());
  }
}

TEST_CASE(
    "serialization: a consistent shape larger than the message is refused before allocating") {
  sys_fixture f;
  // [2^28] floats = 1 GiB announced, shape and byte count agreeing, 16 bytes sent.
  std::vector<char> buf;
  caf::binary_serializer sink{*f.sys, buf};
  uint8_t t = 0;
  shape_t shape{int64_t{1} << 28};
  size_t n = size_t{4} << 28;
  std::vector<float> four(4, 1.0f);
  REQUIRE(!sink(t, shape));
  REQUIRE(!sink.begin_sequence(n));
  REQUIRE(!sink.apply_raw(16, four.data()));
  tensor back;
  caf::binary_deserializer src{*f.sys, buf};
  auto err = src(back);
  REQUIRE(err);
  auto text = describe(err);
  CHECK_MESSAGE(
      text.find("1073741824 data bytes announced, 16 in the message") != std::string::npos, text);
  CHECK(back.empty());
}

TEST_CASE("tensor: large buffers are recycled, and come back zeroed") {
  const void* first = nullptr;
  {
    tensor big({1024, 1024});  // 4 MiB: pooled
    big.fill(7.0f);
    first = big.raw();
  }
  tensor again({1024, 1024});
  CHECK(again.raw() == first);  // the same buffer, reused
  for (float v : again.span<float>()) REQUIRE(v == 0.0f);
  tensor other({1024, 1024});  // the pooled one is taken: a new buffer
  CHECK(other.raw() != again.raw());
}

// ---------------------------------------------------------------------------
// Every message type a peer can send, deserialized from mutated bytes: an
// error or a value, never a crash, an exception, or an allocation the bytes
// do not hold (ASan runs this too). Deterministic: a fixed seed, run in the
// normal suite.
namespace {

std::vector<char> mutate(const std::vector<char>& in, std::mt19937& rng) {
  auto out = in;
  switch (rng() % 5) {
    case 0:  // flip one byte
      if (!out.empty()) out[rng() % out.size()] ^= static_cast<char>(1 + rng() % 255);
      break;
    case 1:  // cut
      out.resize(out.empty() ? 0 : rng() % out.size());
      break;
    case 2: {  // insert random bytes
      auto at = out.empty() ? 0 : rng() % out.size();
      std::vector<char> junk(1 + rng() % 16);
      for (auto& c : junk) c = static_cast<char>(rng());
      out.insert(out.begin() + static_cast<long>(at), junk.begin(), junk.end());
      break;
    }
    case 3:  // a length-sized field set to all ones (huge sizes, -1)
      if (out.size() >= 8) {
        auto at = rng() % (out.size() - 7);
        for (int i = 0; i < 8; ++i) out[at + static_cast<std::size_t>(i)] = '\xff';
      }
      break;
    default:  // several flips
      for (int i = 0; i < 4 && !out.empty(); ++i)
        out[rng() % out.size()] = static_cast<char>(rng());
  }
  return out;
}

template <class T>
void survives_mutations(caf::actor_system& sys, T value, const char* name, int rounds) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(value));
  {  // the unmutated bytes round-trip
    T back;
    caf::binary_deserializer src{sys, buf};
    REQUIRE_MESSAGE(!src(back), std::string(name));
  }
  std::mt19937 rng(1234);
  int errors = 0;
  for (int i = 0; i < rounds; ++i) {
    auto bad = mutate(buf, rng);
    T back;
    caf::binary_deserializer src{sys, bad};
    try {
      if (src(back)) ++errors;
    } catch (const std::exception& e) {
      FAIL_CHECK(std::string(name) << ": mutation " << i << " threw " << e.what());
    }
  }
  MESSAGE(std::string(name) << ": " << errors << " of " << rounds
                            << " mutations refused, none crashed");
  CHECK(errors > 0);
}

}  // namespace

TEST_CASE("serialization: mutated bytes of every message type give an error or a value") {
  sys_fixture f;
  auto& sys = *f.sys;
  auto t = tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto ids = tensor::from<int64_t>({2}, {3, 7});
  const int n = 3000;
  survives_mutations(sys, t, "tensor", n);
  survives_mutations(sys, named_tensor{"w", t}, "named_tensor", n);
  survives_mutations(sys, batch{1, 2, 8, {t}, {ids}, {ids}, nullptr}, "batch", n);
  survives_mutations(sys, step_stats{5, 1, 2.5, 3, 8, 0.1}, "step_stats", n);
  survives_mutations(sys, model_state{{{"w", t}}, {{"w/m", t.clone()}}, {{"b", t.clone()}}},
                     "model_state", n);
  survives_mutations(sys, shard_values{4, {{"w", t}, {"b", t.clone()}}}, "shard_values", n);
  survives_mutations(sys, shard_state{4, {{"w", t}}, {{"w/m", t}}}, "shard_state", n);
  shard_stats ss;
  ss.staleness_histogram = {1, 2, 3};
  survives_mutations(sys, ss, "shard_stats", n);
  survives_mutations(sys, policy_weights{3, {t}}, "policy_weights", n);
  episode_report er;
  er.returns = {1.0, 2.0};
  er.lengths = {10, 20};
  survives_mutations(sys, er, "episode_report", n);
  unroll u;
  u.observations = t;
  u.actions = ids;
  u.rewards = tensor::from<float>({2}, {1, 0});
  survives_mutations(sys, u, "unroll", n);
  ring_chunk rc;
  rc.seq = 1;
  rc.total = 6;
  rc.keep.push_back(t);
  rc.pieces.push_back({t.f32(), 6});
  survives_mutations(sys, rc, "ring_chunk", n);
  node_build nb;
  nb.start_step = 3;
  nb.ring_tasks = {"worker:0", "worker:1"};
  nb.device_group_id.assign(128, 7);
  survives_mutations(sys, nb, "node_build", n);
}
