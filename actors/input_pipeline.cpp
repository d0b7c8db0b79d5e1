#include "actors/input_pipeline.hpp"
#include "actors/failure.hpp"
#include "trace/trace.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>

namespace troupe {

int64_t batches_per_epoch(int64_t examples, int64_t global_batch, int64_t steps_per_update) {
  int64_t update = global_batch * steps_per_update;
  return (examples + update - 1) / update;
}

std::pair<int64_t, int64_t> replica_slice(int64_t n, int64_t k, int64_t r) {
  int64_t base = n / k, extra = n % k;
  int64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

namespace {

// One update's rows, chosen on the actor (the order is the pipeline's state,
// so the stream is the same wherever the rows are then gathered).
struct batch_plan {
  int64_t epoch = 0;
  int64_t index = 0;
  int64_t global_size = 0;
  std::vector<std::vector<int64_t>> rows;  // per micro-batch
};

// Plans batches in order; the epoch order depends only on (seed, epoch), so
// the stream is the same whatever the timing, and resumable at any batch.
class batch_source {
 public:
  explicit batch_source(const input_pipeline_config& cfg)
      : cfg_(cfg), epoch_(cfg_.start_epoch), index_(cfg_.start_index) {
    per_epoch_ = batches_per_epoch(cfg_.data->size(), cfg_.global_batch, cfg_.steps_per_update);
    load_order();
  }

  batch_plan next() {
    if (index_ >= per_epoch_) {
      ++epoch_;
      index_ = 0;
      load_order();
    }
    const int64_t n = cfg_.data->size();
    const int64_t g = cfg_.global_batch;
    int64_t ub = index_ * g * cfg_.steps_per_update;
    int64_t ue = std::min(n, ub + g * cfg_.steps_per_update);
    batch_plan out;
    out.epoch = epoch_;
    out.index = index_;
    out.global_size = ue - ub;
    for (int64_t m = 0; m < cfg_.steps_per_update; ++m) {
      int64_t mb = std::min(ue, ub + m * g);
      int64_t me = std::min(ue, mb + g);
      auto [b, e] = replica_slice(me - mb, cfg_.context.num_replicas_in_sync, cfg_.replica);
      auto first = order_.begin() + mb + b;
      out.rows.emplace_back(first, first + (e - b));
    }
    ++index_;
    return out;
  }

 private:
  void load_order() {
    order_ = data::epoch_order(cfg_.data->size(), cfg_.seed, epoch_, cfg_.shuffle);
  }
  input_pipeline_config cfg_;
  int64_t epoch_;
  int64_t index_;
  int64_t per_epoch_ = 0;
  std::vector<int64_t> order_;
};

// A batch being gathered, in pieces: on the devices, each piece is a slice of
// background work (batches may complete out of order: two idle devices may
// gather two of them at once); on the pipeline's thread, all at once.
struct gathering {
  batch_plan plan;
  batch result;
  std::atomic<bool> done{false};  // set on the device before it reports
  bool prepared = false;
  std::size_t micro = 0;  // the micro-batch being gathered
  int64_t row = 0;        // and the next row of it
  std::string error;

  // ~20 us of work: a task queued on the device waits no longer than that.
  static constexpr int64_t rows_per_piece = 64;

  // x and y allocated (and the indices checked), once.
  void prepare(const data::dataset& d) {
    if (prepared) return;
    prepared = true;
    result.epoch = plan.epoch;
    result.index = plan.index;
    result.global_size = plan.global_size;
    result.x.resize(plan.rows.size());
    result.y.resize(plan.rows.size());
    result.ids.resize(plan.rows.size());
    for (std::size_t m = 0; m < plan.rows.size(); ++m) {
      data::prepare_batch(d, plan.rows[m], result.x[m], result.y[m]);
      const auto k = static_cast<int64_t>(plan.rows[m].size());
      result.ids[m] = tensor::uninitialized({k}, dtype::i64);
      std::copy(plan.rows[m].begin(), plan.rows[m].end(), result.ids[m].data<int64_t>());
    }
  }

  // One piece; true when the whole batch is gathered.
  bool step(const data::dataset& d) {
    prepare(d);
    while (micro < plan.rows.size()) {
      const auto& rows = plan.rows[micro];
      const auto k = static_cast<int64_t>(rows.size());
      if (row < k) {
        const int64_t end = std::min(k, row + rows_per_piece);
        data::gather_rows(d, rows, row, end, result.x[micro], result.y[micro]);
        row = end;
        if (row < k) return false;
      }
      ++micro;
      row = 0;
      if (micro < plan.rows.size()) return false;
    }
    return true;
  }
};

// The batch with x and y allocated and its rows left for the step to copy.
batch gather_later(std::shared_ptr<const data::dataset> d, batch_plan plan) {
  auto g = std::make_shared<gathering>();
  g->plan = std::move(plan);
  g->prepare(*d);
  batch out = g->result;  // shares x and y with what the copy fills
  out.pending = std::make_shared<batch::pending_rows>([g, d = std::move(d)] {
    trace::scoped_span span(trace::this_thread_track(), "batch_gather", trace::category::compute);
    while (!g->step(*d)) {
    }
  });
  return out;
}

batch gather(const data::dataset& d, batch_plan plan) {
  gathering g;
  g.plan = std::move(plan);
  while (!g.step(d)) {
  }
  return std::move(g.result);
}

struct pipeline_state {
  explicit pipeline_state(input_pipeline_config c)
      : cfg(std::move(c)), source(cfg), track("input_pipeline:" + std::to_string(cfg.replica)) {}
  input_pipeline_config cfg;
  batch_source source;
  std::deque<batch> ready;
  std::deque<std::shared_ptr<gathering>> in_flight;  // in stream order
  std::deque<caf::typed_response_promise<batch>> waiting;
  // Gathering (here or on a device) or idle, and the depth of `ready`.
  trace::state_track track;
};

using self_ptr = input_pipeline_actor::pointer;

void produce_one(self_ptr self, pipeline_state& st) {
  batch_plan plan = st.source.next();
  if (st.cfg.gather_in_step) {
    st.ready.push_back(gather_later(st.cfg.data, std::move(plan)));
    return;
  }
  if (!st.cfg.gather_device) {
    trace::scoped_span span(st.track.id(), "batch_gather", trace::category::compute);
    st.ready.push_back(gather(*st.cfg.data, std::move(plan)));
    return;
  }
  auto g = std::make_shared<gathering>();
  g->plan = std::move(plan);
  st.in_flight.push_back(g);
  st.cfg.gather_device->submit_background(
      [g, data = st.cfg.data] {
        try {
          trace::scoped_span span(trace::this_thread_track(), "batch_gather",
                                  trace::category::compute);
          return g->step(*data);
        } catch (const std::exception& e) {
          g->error = e.what();
          if (g->error.empty())
            g->error = "gathering a batch failed (an exception without a message)";
          return true;
        } catch (...) {
          g->error = "gathering a batch failed (an exception not derived from std::exception)";
          return true;
        }
      },
      [g, handle = caf::actor_cast<input_pipeline_actor>(self)] {
        g->done = true;
        caf::anon_send(handle, computed_atom::value, uint64_t{0});
      });
}

// Answers what can be answered, then prepares `prefetch` batches ahead (after
// answering, so the consumer never waits for a gather it need not).
void serve(self_ptr self, pipeline_state& st) {
  while (!st.waiting.empty() && !st.ready.empty()) {
    st.waiting.front().deliver(std::move(st.ready.front()));
    st.waiting.pop_front();
    st.ready.pop_front();
  }
  const auto prefetch = static_cast<std::size_t>(std::max<int64_t>(1, st.cfg.prefetch));
  while (st.ready.size() + st.in_flight.size() < prefetch + st.waiting.size())
    produce_one(self, st);
  if (trace::enabled()) {
    trace::counter(st.track.id(), "queue_depth", static_cast<double>(st.ready.size()));
    if (st.in_flight.empty())
      st.track.set("idle", trace::category::wait);
    else
      st.track.set("batch_gather", trace::category::compute);
  }
}

}  // namespace

input_pipeline_actor::behavior_type input_pipeline(self_ptr self, input_pipeline_config cfg) {
  keep_exception_cause(self, "input pipeline " + std::to_string(cfg.replica));
  auto st = std::make_shared<pipeline_state>(std::move(cfg));
  return {
      [self, st](next_atom) -> caf::result<batch> {
        auto rp = self->make_response_promise<batch>();
        st->waiting.push_back(rp);
        if (st->ready.empty() && st->in_flight.empty()) produce_one(self, *st);
        serve(self, *st);
        return rp;
      },
      [self, st](computed_atom, uint64_t) {
        // The stream's order: batches done ahead of an earlier one wait for it.
        while (!st->in_flight.empty() && st->in_flight.front()->done) {
          auto g = std::move(st->in_flight.front());
          st->in_flight.pop_front();
          if (!g->error.empty()) {
            self->quit(caf::make_error(
                caf::sec::runtime_error,
                "input pipeline " + std::to_string(st->cfg.replica) + ": " + g->error));
            return;
          }
          st->ready.push_back(std::move(g->result));
        }
        serve(self, *st);
      },
  };
}

}  // namespace troupe
