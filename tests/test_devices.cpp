#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/system_config.hpp"
#include "devices/device.hpp"
#include "kernels/cpu_isa.hpp"

using namespace troupe;

TEST_CASE("parse_device") {
  CHECK(parse_device("cpu:0").str() == "cpu:0");
  CHECK(parse_device("cuda:3").kind == device_spec::kind_t::cuda);
  CHECK(parse_device("cuda:3").index == 3);
  for (auto bad : {"gpu:0", "cpu", "cpu:", "cpu:-1", "cpu:1x", "cuda:a", ""})
    CHECK_THROWS_WITH_AS(parse_device(bad),
                         doctest::Contains("expected \"cpu:N\", \"cuda:N\" or \"sim:N\""),
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

// A denormal product (1e-30 * 1e-10 = 1e-40) and a denormal input times one:
// both 0 on a device thread (flush to zero, denormals are zero), both kept
// on this one, which was left as the C runtime set it.
TEST_CASE("cpu_device: device threads flush denormals to zero; other threads keep them") {
  auto probe = [] {
    volatile float tiny = 1e-30f, small = 1e-10f, denormal = 1e-40f, one = 1.0f;
    const float product = tiny * small;
    const float passed = denormal * one;
    return std::pair<float, float>{product, passed};
  };
  std::pair<float, float> on_device{-1, -1};
  bool flag = false;
  {
    cpu_device d("test:cpu:ftz");
    d.submit([&] {
      on_device = probe();
      flag = kernels::flushes_denormals_on_this_thread();
    });
  }
  CHECK(flag);
  CHECK(on_device.first == 0.0f);
  CHECK(on_device.second == 0.0f);
  REQUIRE_FALSE(kernels::flushes_denormals_on_this_thread());
  const auto here = probe();
  CHECK(here.first > 0.0f);
  CHECK(here.second > 0.0f);
}

TEST_CASE("the actor system's threads flush denormals too (a shard's update runs there)") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // (Spawned with an argument: CAF 0.17 dereferences a null argument tuple
  // for a functor without arguments, which UBSan reports.)
  auto probe = sys.spawn(
      [](int) -> caf::behavior {
        return {[](int) {
          volatile float tiny = 1e-30f, small = 1e-10f;
          const float product = tiny * small;
          return std::vector<float>{product,
                                    kernels::flushes_denormals_on_this_thread() ? 1.f : 0.f};
        }};
      },
      0);
  std::vector<float> got;
  self->request(probe, caf::infinite, 1)
      .receive([&](std::vector<float>& r) { got = r; },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  REQUIRE(got.size() == 2);
  CHECK(got[0] == 0.0f);
  CHECK(got[1] == 1.0f);
  CHECK_FALSE(kernels::flushes_denormals_on_this_thread());  // this thread is not CAF's
  self->send_exit(probe, caf::exit_reason::user_shutdown);
}

TEST_CASE("cpu_device: background work runs in pieces between tasks, in order, and drains") {
  auto piece_name = [](char job, int left) {  // (GCC 12 warns on "a" + std::string)
    std::string s(1, job);
    s += std::to_string(left);
    return s;
  };
  std::vector<std::string> log;  // written on the device thread only
  std::mutex gate;
  std::unique_lock<std::mutex> held(gate);
  std::atomic<bool> first_piece{false}, task_queued{false};
  {
    int left_a = 3, left_b = 2;  // before the device: its destructor runs the jobs
    cpu_device d("test:cpu:bg");
    // Hold the device in a task, queue two background jobs behind it.
    d.submit([&] {
      std::lock_guard<std::mutex> wait(gate);
      log.push_back("task 0");
    });
    d.submit_background([&] {
      first_piece = true;
      log.push_back(piece_name('a', left_a));
      // a's first piece lasts until the next task is queued.
      if (left_a == 3)
        while (!task_queued) std::this_thread::yield();
      return --left_a == 0;
    });
    d.submit_background([&] {
      log.push_back(piece_name('b', left_b));
      return --left_b == 0;
    });
    held.unlock();
    while (!first_piece) std::this_thread::yield();
    d.submit([&] { log.push_back("task 1"); });
    task_queued = true;
  }  // the destructor finishes the background jobs too
  // Task 1 was queued during a's first piece: it runs before a's second.
  CHECK(log == std::vector<std::string>{"task 0", "a3", "task 1", "a2", "a1", "b2", "b1"});
}

TEST_CASE("device_group: an idle device runs the background work of a busy one") {
  auto group = std::make_shared<device_group>();
  std::atomic<bool> release{false};
  std::thread::id busy_thread, ran_on;
  std::atomic<int> pieces{0};
  {
    cpu_device a("test:cpu:a", group);
    cpu_device b("test:cpu:b", group);
    a.submit([&] {
      busy_thread = std::this_thread::get_id();
      while (!release) std::this_thread::yield();
    });
    a.submit_background([&] {
      ran_on = std::this_thread::get_id();
      return ++pieces == 5;
    });
    // a is busy until the job is done: only b can have run it.
    while (pieces < 5) std::this_thread::yield();
    release = true;
  }
  CHECK(pieces == 5);
  CHECK(ran_on != busy_thread);
  CHECK(ran_on != std::thread::id{});
}

TEST_CASE("device_group: a job put back for a task is taken up by an idle device") {
  // a runs a piece of the job while b sleeps; a task queued on a meanwhile
  // waits for the job (as a step waits for the batch gathered in the
  // background): b must wake and finish the job, or both wait for ever.
  auto group = std::make_shared<device_group>();
  std::atomic<bool> b_released{false}, b_idle{false}, piece_may_end{false};
  std::atomic<int> pieces{0};
  std::atomic<bool> job_done{false}, task_saw_job_done{false}, task_ended{false};
  {
    cpu_device a("test:cpu:a", group);
    cpu_device b("test:cpu:b", group);
    b.submit([&] {
      while (!b_released) std::this_thread::yield();
    });
    group->submit_background(
        [&] {
          if (++pieces == 1)  // on a: b is busy
            while (!piece_may_end) std::this_thread::yield();
          return pieces == 2;
        },
        [&] { job_done = true; });
    while (pieces < 1) std::this_thread::yield();
    b_released = true;
    b.submit([&] { b_idle = true; });
    while (!b_idle) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // b back asleep
    a.submit([&] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!job_done && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      task_saw_job_done = job_done.load();
      task_ended = true;
    });
    piece_may_end = true;
    while (!task_ended) std::this_thread::yield();  // b stays up meanwhile
  }
  CHECK(pieces == 2);
  CHECK(task_saw_job_done);
}

TEST_CASE("device_group: work left when devices stop is finished by the last one") {
  auto group = std::make_shared<device_group>();
  std::atomic<int> pieces{0};
  std::atomic<bool> release{false};
  auto b = std::make_unique<cpu_device>("test:cpu:b", group);
  {
    cpu_device a("test:cpu:a", group);
    // Both devices busy, then a stops with the job still queued.
    a.submit([&] {
      while (!release) std::this_thread::yield();
    });
    b->submit([&] {
      while (!release) std::this_thread::yield();
    });
    group->submit_background([&] { return ++pieces == 100; });
    release = true;
  }
  b.reset();  // the last device: it drains the group's work before it ends
  CHECK(pieces == 100);
}
