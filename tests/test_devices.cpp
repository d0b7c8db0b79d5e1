#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "devices/device.hpp"

using namespace troupe;

TEST_CASE("parse_device") {
  CHECK(parse_device("cpu:0").str() == "cpu:0");
  CHECK(parse_device("cuda:3").kind == device_spec::kind_t::cuda);
  CHECK(parse_device("cuda:3").index == 3);
  for (auto bad : {"gpu:0", "cpu", "cpu:", "cpu:-1", "cpu:1x", "cuda:a", ""})
    CHECK_THROWS_WITH_AS(parse_device(bad), doctest::Contains("expected \"cpu:N\" or \"cuda:N\""),
                         device_error);
}

TEST_CASE("cuda devices are refused clearly when unusable; cpu always works") {
  CHECK_NOTHROW(check_device_available(parse_device("cpu:7")));
  if (cuda_device_count() == 0)
    CHECK_THROWS_WITH_AS(check_device_available(parse_device("cuda:0")),
                         doctest::Contains("cuda:0 requested, but no CUDA device is available"),
                         device_error);
}

TEST_CASE("cpu_device runs tasks in order on one thread, and drains on destruction") {
  std::vector<int> order;
  std::atomic<int> done{0};
  std::thread::id tid;
  {
    cpu_device d("test:cpu:0");
    for (int i = 0; i < 100; ++i)
      d.submit([&, i] {
        if (i == 0) tid = std::this_thread::get_id();
        CHECK(std::this_thread::get_id() == tid);
        order.push_back(i);
        ++done;
      });
  }
  CHECK(done == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  CHECK(tid != std::this_thread::get_id());
}
