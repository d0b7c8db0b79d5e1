#include <doctest/doctest.h>

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

#include "messages/messages.hpp"

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

  model_state ms{{{"w", t}, {"b", tensor::from<int64_t>({1}, {42})}}, {{"w/adam_m", t.clone()}}};
  auto buf2 = serialize(*f.sys, ms);
  model_state ms2;
  caf::binary_deserializer src2{*f.sys, buf2};
  REQUIRE(!src2(ms2));
  CHECK(ms2.variables == ms.variables);
  CHECK(ms2.slots == ms.slots);
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
