#pragma once
// Fan-in: one request to each of several actors, one continuation when every
// reply is in. Replies are kept in request order; the first error (a failed
// reply, or a request's own timeout, which the caller gives to request()) is
// reported once and every later reply or error of the same fan-in is dropped,
// so a continuation never runs on a partial set.
//
//   fan_in<shard_values> pulls(n, [](std::vector<shard_values>& all) {...},
//                              [](caf::error& e) {...});
//   for (std::size_t i = 0; i < n; ++i)
//     self->request(shards[i], timeout, pull_atom::value, names)
//         .then(pulls.reply(i), pulls.error());
//
// Copies share one state; they are cheap to capture. Used only on the actor
// that made the requests (its continuations run one at a time).
#include <caf/all.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace troupe {

template <class T>
class fan_in {
 public:
  using done_fn = std::function<void(std::vector<T>&)>;
  using error_fn = std::function<void(caf::error&)>;

  // Waits for n replies; with n == 0, `done` runs at once, with no replies.
  fan_in(std::size_t n, done_fn done, error_fn on_error)
      : st_(std::make_shared<state>(n, std::move(done), std::move(on_error))) {
    if (n == 0) st_->finish();
  }

  // The reply handler of request i (0 <= i < n).
  auto reply(std::size_t i) const {
    return [st = st_, i](T& v) {
      if (st->over) return;
      st->results[i] = std::move(v);
      if (--st->left == 0) st->finish();
    };
  }

  // The error handler of every request of this fan-in.
  auto error() const {
    return [st = st_](caf::error& e) {
      if (st->over) return;
      st->over = true;
      if (st->on_error) st->on_error(e);
    };
  }

 private:
  struct state {
    state(std::size_t n, done_fn d, error_fn e)
        : results(n), left(n), done(std::move(d)), on_error(std::move(e)) {}
    void finish() {
      over = true;
      if (done) done(results);
    }
    std::vector<T> results;
    std::size_t left;
    bool over = false;
    done_fn done;
    error_fn on_error;
  };
  std::shared_ptr<state> st_;
};

}  // namespace troupe
