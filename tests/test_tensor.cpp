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
