#include "actors/input_pipeline.hpp"

#include <deque>

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

// Produces batches in order; the epoch order depends only on (seed, epoch), so
// the stream is the same whatever the timing, and resumable at any batch.
class batch_source {
 public:
  explicit batch_source(input_pipeline_config cfg)
      : cfg_(std::move(cfg)), epoch_(cfg_.start_epoch), index_(cfg_.start_index) {
    per_epoch_ = batches_per_epoch(cfg_.data->size(), cfg_.global_batch, cfg_.steps_per_update);
    load_order();
  }

  batch next() {
    if (index_ >= per_epoch_) {
      ++epoch_;
      index_ = 0;
      load_order();
    }
    const int64_t n = cfg_.data->size();
    const int64_t g = cfg_.global_batch;
    int64_t ub = index_ * g * cfg_.steps_per_update;
    int64_t ue = std::min(n, ub + g * cfg_.steps_per_update);
    batch out;
    out.epoch = epoch_;
    out.index = index_;
    out.global_size = ue - ub;
    for (int64_t m = 0; m < cfg_.steps_per_update; ++m) {
      int64_t mb = std::min(ue, ub + m * g);
      int64_t me = std::min(ue, mb + g);
      auto [b, e] = replica_slice(me - mb, cfg_.context.num_replicas_in_sync, cfg_.replica);
      std::span<const int64_t> idx(order_.data() + mb + b, static_cast<std::size_t>(e - b));
      tensor x, y;
      data::gather_batch(*cfg_.data, idx, x, y);
      out.x.push_back(std::move(x));
      out.y.push_back(std::move(y));
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

}  // namespace

input_pipeline_actor::behavior_type input_pipeline(input_pipeline_actor::pointer self,
                                                   input_pipeline_config cfg) {
  struct state_t {
    batch_source source;
    std::deque<batch> ready;
    int64_t prefetch;
  };
  auto prefetch = std::max<int64_t>(1, cfg.prefetch);
  auto st = std::make_shared<state_t>(state_t{batch_source(std::move(cfg)), {}, prefetch});
  return {
      [self, st](next_atom) -> caf::result<batch> {
        if (st->ready.empty()) st->ready.push_back(st->source.next());
        auto rp = self->make_response_promise<batch>();
        rp.deliver(std::move(st->ready.front()));
        st->ready.pop_front();
        // Refill after answering, so the consumer never waits for the gather.
        while (static_cast<int64_t>(st->ready.size()) < st->prefetch)
          st->ready.push_back(st->source.next());
        return rp;
      },
  };
}

}  // namespace troupe
