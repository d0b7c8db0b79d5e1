// Would two cores train the examples' MLP faster at a global batch of 128
// with its first layer split by output columns between them (tensor
// parallel) than mirrored (ZeRO-1) does? A kernel-level loop, no actors,
// against one thread on the whole batch and the mirrored ZeRO-1 loop
// (bench/compute_threads.hpp), alternated in the same minutes.
//
//   bench_split_layer_ceiling [steps=600] [repeats=3]
//
// Why: mirrored at batch 128 moves ~1.08 MB of gradients and variables
// between the cores each step (reduce-scatter, all-gather), 74% of it the
// first layer's 784x256 weights. Split by columns, each core keeps its half
// of that layer and updates it itself; only activations cross:
//
//   rank r (rows R_r of the batch, columns C_r of the first layer)
//     H1[:, C_r]  = relu(X[all rows] W1[:, C_r] + b1[C_r])     128x784 . 784x128
//     --- barrier A: both halves of H1 made; the last all-gather landed
//     H1[R_r, :]  <- own columns and the peer's                  (32 KB in)
//     layers 2, 3 and the loss on rows R_r, and their backward   (data parallel)
//     gather the next step's rows R_r into the shared batch      (double buffered)
//     --- barrier B: both dZ1 row blocks made; the next batch gathered
//     dZ1[:, C_r] <- own rows and the peer's                     (32 KB in)
//     dW1[:, C_r] = X[all rows]^T dZ1[:, C_r]                    784x128 . 128x128
//     layers 2, 3: own chunk of the gradients + the peer's       (reduce-scatter)
//     Adam on W1[:, C_r], b1[C_r] and the own chunk of layers 2, 3
//     own chunk of layers 2, 3 into the peer's copy              (all-gather)
//
// The "gather" here copies the rank's rows from a private buffer, so the
// peer reads them from the other core's cache as it would a real batch; the
// model loops it is compared with take a fixed batch and pay no gather.
// Prints, per repeat, where rank 0's step went and the three loops' ms a
// step, then the medians.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/compute_threads.hpp"
#include "kernels/cpu_kernels.hpp"
#include "kernels/onednn.hpp"
#include "kernels/vector_kernels.hpp"

using namespace troupe;
namespace dnn = troupe::kernels::onednn;

namespace {

constexpr int64_t in = 784, hid = 256, out = 10, rows = 128;
constexpr int64_t half = hid / 2, mine = rows / 2;
constexpr auto relu = kernels::activation::relu;

// Two spinning threads meet; counts generations, so it is reused each step.
struct spin_barrier {
  std::atomic<int> arrived{0};
  std::atomic<int> generation{0};
  void wait() {
    const int g = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    while (generation.load(std::memory_order_acquire) == g) {
    }
  }
};

float small_weight(std::size_t i) {
  return static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-5f;
}

// Where a rank's step goes, us a step.
struct split_phases {
  double forward1 = 0;   // the first layer's product, its columns over every row
  double layers23 = 0;   // layers 2-3 and the loss on its rows, forward and backward
  double backward1 = 0;  // the first layer's weight and bias gradients, its columns
  double adam = 0;       // its first-layer columns and its chunk of layers 2-3
  double exchange = 0;   // activations in, gradients' chunk summed, variables' chunk out
  double gather = 0;     // its rows of the next batch
  double wait = 0;       // for the peer, at the two barriers
};

// One rank. Its block: [W1[:, C_r] | b1[C_r] | W2 | b2 | W3 | b3], and the
// gradients and Adam slots laid out alike; layers 2-3 (`rest`) are mirrored.
class split_rank {
 public:
  static constexpr std::size_t first = in * half + half;
  static constexpr std::size_t rest = hid * hid + hid + hid * out + out;

  split_rank(int r, std::vector<float> (&batch)[2])
      : r_(r), batch_(batch), c0_(r == 0 ? 0 : rest / 2), c1_(r == 0 ? rest / 2 : rest) {
    for (std::size_t i = 0; i < first; ++i)
      w_[i] = small_weight(i + static_cast<std::size_t>(r) * first);
    for (std::size_t i = 0; i < rest; ++i) w_[first + i] = small_weight(i + 7);
    for (std::size_t i = 0; i < src_.size(); ++i)
      src_[i] = static_cast<float>((i + static_cast<std::size_t>(r)) % 255) / 255.f;
    for (int64_t i = 0; i < mine; ++i) y_[i] = static_cast<int32_t>(i % 10);
  }
  void meet(split_rank& peer) { peer_ = &peer; }

  void gather(int64_t step) {
    std::memcpy(batch_[step % 2].data() + r_ * mine * in, src_.data(), sizeof(float) * mine * in);
  }
  void forward_first(int64_t step) {
    dnn::dense_forward(batch_[step % 2].data(), w_.data(), w_.data() + in * half, h1_cols_.data(),
                       rows, in, half, relu);
  }
  // H1 on its rows: columns [0, half) from rank 0's product, the rest from rank 1's.
  void rows_in() {
    const split_rank& lo = r_ == 0 ? *this : *peer_;
    const split_rank& hi = r_ == 0 ? *peer_ : *this;
    for (int64_t i = 0; i < mine; ++i) {
      const int64_t row = r_ * mine + i;
      std::memcpy(&h1_[i * hid], &lo.h1_cols_[row * half], sizeof(float) * half);
      std::memcpy(&h1_[i * hid + half], &hi.h1_cols_[row * half], sizeof(float) * half);
    }
  }
  // Layers 2-3 and the loss on its rows; leaves dZ1 on its rows.
  void layers_above() {
    const auto& vk = kernels::active_vector_kernels();
    float *w2 = w_.data() + first, *b2 = w2 + hid * hid, *w3 = b2 + hid, *b3 = w3 + hid * out;
    float *g2 = g_.data() + first, *gb2 = g2 + hid * hid, *g3 = gb2 + hid, *gb3 = g3 + hid * out;
    dnn::dense_forward(h1_.data(), w2, b2, h2_.data(), mine, hid, hid, relu);
    dnn::dense_forward(h2_.data(), w3, b3, z3_.data(), mine, hid, out, kernels::activation::none);
    int64_t hits = 0;
    vk.softmax_cross_entropy(z3_.data(), y_.data(), mine, out, 1.f / rows, dz3_.data(), &hits);
    dnn::weight_gradient(h2_.data(), dz3_.data(), g3, mine, hid, out, false);
    vk.column_sums(dz3_.data(), gb3, mine, out, false);
    dnn::input_gradient(dz3_.data(), w3, dh_.data(), mine, hid, out);
    vk.activation_backward_bias(relu, h2_.data(), dh_.data(), dz_.data(), gb2, mine, hid, false);
    dnn::weight_gradient(h1_.data(), dz_.data(), g2, mine, hid, hid, false);
    dnn::input_gradient(dz_.data(), w2, dh_.data(), mine, hid, hid);
    vk.activation_backward_bias(relu, h1_.data(), dh_.data(), dz_.data(), nullptr, mine, hid,
                                false);
  }
  // dZ1 in its columns over every row: rank q's rows from rank q.
  void columns_in() {
    for (int q = 0; q < 2; ++q) {
      const split_rank& from = q == r_ ? *this : *peer_;
      for (int64_t i = 0; i < mine; ++i)
        std::memcpy(&dz_cols_[(q * mine + i) * half], &from.dz_[i * hid + r_ * half],
                    sizeof(float) * half);
    }
  }
  void backward_first(int64_t step) {
    dnn::weight_gradient(batch_[step % 2].data(), dz_cols_.data(), g_.data(), rows, in, half,
                         false);
    kernels::active_vector_kernels().column_sums(dz_cols_.data(), g_.data() + in * half, rows, half,
                                                 false);
  }
  void reduce_scatter() {
    kernels::active_vector_kernels().add_inplace(&g_[first + c0_], &peer_->g_[first + c0_],
                                                 c1_ - c0_);
  }
  void update() {
    adam(0, first);
    adam(first + c0_, c1_ - c0_);
  }
  void all_gather() {
    std::memcpy(&peer_->w_[first + c0_], &w_[first + c0_], sizeof(float) * (c1_ - c0_));
  }

 private:
  // The scalars of an early step; Adam's cost does not depend on them.
  void adam(std::size_t at, std::size_t n) {
    kernels::active_vector_kernels().adam_step(&w_[at], &m_[at], &v_[at], &g_[at], n, 1e-3f, 0.9f,
                                               0.999f, 1e-8f, 1e-3f, 1.0f, 0.f, false);
  }

  int r_;
  std::vector<float> (&batch_)[2];
  split_rank* peer_ = nullptr;
  std::size_t c0_, c1_;  // its chunk of `rest`
  std::vector<float> w_ = std::vector<float>(first + rest), g_ = w_, m_ = w_, v_ = w_;
  std::vector<float> src_ = std::vector<float>(mine * in),
                     h1_cols_ = std::vector<float>(rows * half),
                     h1_ = std::vector<float>(mine * hid), h2_ = h1_, dh_ = h1_, dz_ = h1_,
                     z3_ = std::vector<float>(mine * out), dz3_ = z3_, dz_cols_ = h1_cols_;
  std::vector<int32_t> y_ = std::vector<int32_t>(mine);
};

// Accumulates the time since the last lap into a phase.
struct stopwatch {
  bench::clock_type::time_point mark = bench::clock_type::now();
  void lap(double& into) {
    const auto now = bench::clock_type::now();
    into += std::chrono::duration<double, std::micro>(now - mark).count();
    mark = now;
  }
};

// ms a step (the slower rank), and where rank 0's step went.
double split_ms(int steps, split_phases& rank0) {
  std::vector<float> batch[2] = {std::vector<float>(rows * in), std::vector<float>(rows * in)};
  split_rank* ranks[2] = {nullptr, nullptr};
  spin_barrier a, b;
  std::vector<double> ms(2);
  std::vector<split_phases> phases(2);
  bench::on_threads(2, [&](int r, auto start_together) {
    split_rank me(r, batch);
    ranks[r] = &me;
    start_together();
    me.meet(*ranks[1 - r]);
    me.gather(0);
    b.wait();
    auto& p = phases[r];
    stopwatch t;
    const auto t0 = t.mark;
    // Each part of the step, then its time into its phase.
    auto timed = [&t](double& phase, auto&& part) {
      part();
      t.lap(phase);
    };
    for (int64_t s = 0; s < steps; ++s) {
      timed(p.forward1, [&] { me.forward_first(s); });
      timed(p.wait, [&] { a.wait(); });
      timed(p.exchange, [&] { me.rows_in(); });
      timed(p.layers23, [&] { me.layers_above(); });
      timed(p.gather, [&] { me.gather(s + 1); });
      timed(p.wait, [&] { b.wait(); });
      timed(p.exchange, [&] { me.columns_in(); });
      timed(p.backward1, [&] { me.backward_first(s); });
      timed(p.exchange, [&] { me.reduce_scatter(); });
      timed(p.adam, [&] { me.update(); });
      timed(p.exchange, [&] { me.all_gather(); });
    }
    a.wait();  // the peer's last all-gather into `me` has landed
    ms[r] = bench::us_since(t0) / 1000.0 / steps;
    b.wait();  // and it no longer reads `me`
  });
  for (double* f : {&phases[0].forward1, &phases[0].layers23, &phases[0].backward1, &phases[0].adam,
                    &phases[0].exchange, &phases[0].gather, &phases[0].wait})
    *f /= steps;
  rank0 = phases[0];
  return std::max(ms[0], ms[1]);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  if (steps < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: bench_split_layer_ceiling [steps>=1] [repeats>=1] (got %s %s)\n",
                 argc > 1 ? argv[1] : "600", argc > 2 ? argv[2] : "3");
    return 2;
  }
  kernels::init_cpu_kernels();
  std::vector<double> one, split, zero1;
  for (int k = 0; k < repeats; ++k) {
    split_phases p;
    one.push_back(bench::run_threads(1, rows, steps, true));
    split.push_back(split_ms(steps, p));
    zero1.push_back(bench::run_threads(2, mine, steps, true, true));
    std::printf(
        "{\"bench\":\"split_layer_ceiling\",\"repeat\":%d,\"one_thread_ms\":%.3f,"
        "\"split_ms\":%.3f,\"zero1_ms\":%.3f,\"split_speedup\":%.3f,\"zero1_speedup\":%.3f,"
        "\"split_rank0_us\":{\"forward1\":%.1f,\"layers23\":%.1f,\"backward1\":%.1f,"
        "\"adam\":%.1f,\"exchange\":%.1f,\"gather\":%.1f,\"wait\":%.1f}}\n",
        k, one.back(), split.back(), zero1.back(), one.back() / split.back(),
        one.back() / zero1.back(), p.forward1, p.layers23, p.backward1, p.adam, p.exchange,
        p.gather, p.wait);
    std::fflush(stdout);
  }
  const double o = bench::median(one), s = bench::median(split), z = bench::median(zero1);
  std::printf(
      "{\"bench\":\"split_layer_ceiling\",\"median\":true,\"one_thread_ms\":%.3f,"
      "\"split_ms\":%.3f,\"zero1_ms\":%.3f,\"split_speedup\":%.3f,\"zero1_speedup\":%.3f}\n",
      o, s, z, o / s, o / z);
  return 0;
}
