// `troupe bench kernels` (and bench_kernels, this file built with
// TROUPE_KERNELS_MAIN): what the CPU kernels reach on this machine, one
// thread, the sizes of the examples' MLP (784-256-256-10, batch 128 and the
// 64 of each of two mirrored replicas) and of the Fashion-MNIST convnet
// (conv 1->32, 32->64, 3x3 same, batch 128).
#include "bench/kernels.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu_kernels.hpp"
#include "kernels/cpu_layers.hpp"
#include "kernels/onednn.hpp"
#include "kernels/vector_kernels.hpp"

namespace troupe {
namespace {

using clock_type = std::chrono::steady_clock;

// Seconds per call of f, over about `seconds` (after one warm-up call).
double time_per_call(const std::function<void()>& f, double seconds) {
  f();
  const auto t0 = clock_type::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 4; ++i) f();
    calls += 4;
    elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  } while (elapsed < seconds);
  return elapsed / static_cast<double>(calls);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

// The core's FP32 peak, measured: independent chains of fused multiply-adds
// at the level's width (a VM's reported clock says nothing of its boost).
// Twelve chains cover two FMA pipes' latency on current cores.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iters) {
  // Loads, not _mm512_set1_ps: GCC 12 warns of an uninitialized value
  // inside its intrinsic.
  alignas(64) float lanes[16];
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) {
    for (float& x : lanes) x = static_cast<float>(j) * 0.01f;
    acc[j] = _mm512_load_ps(lanes);
  }
  for (float& x : lanes) x = 0.999f;
  const __m512 m = _mm512_load_ps(lanes);
  for (float& x : lanes) x = 0.001f;
  const __m512 c = _mm512_load_ps(lanes);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], m, c);
  float out = 0;
  for (int j = 0; j < 12; ++j) {
    _mm512_store_ps(lanes, acc[j]);
    for (float x : lanes) out += x;
  }
  return out;
}
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j) * 0.01f);
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], m, c);
  alignas(32) float lanes[8];
  float out = 0;
  for (int j = 0; j < 12; ++j) {
    _mm256_store_ps(lanes, acc[j]);
    for (float x : lanes) out += x;
  }
  return out;
}
#endif

double measured_peak_gflops(kernels::cpu_isa isa) {
#if defined(__x86_64__)
  constexpr int64_t iters = 2'000'000;
  double lanes = 0;
  std::function<float()> run;
  if (isa == kernels::cpu_isa::avx512) {
    lanes = 16;
    run = [] { return fma_chains_avx512(iters); };
  } else if (isa == kernels::cpu_isa::avx2) {
    lanes = 8;
    run = [] { return fma_chains_avx2(iters); };
  } else {
    return 0;  // no FMA below AVX2
  }
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clock_type::now();
    sink = sink + run();
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, 2.0 * lanes * 12.0 * static_cast<double>(iters) / s / 1e9);
  }
  return best;
#else
  (void)isa;
  return 0;
#endif
}

struct conv_case {
  const char* name;
  kernels::conv2d_shape shape;
  bool input_gradient;  // the first layer has none to pass on
};

kernels::conv2d_shape same_3x3(int64_t batch, int64_t in, int64_t out, int64_t hw) {
  kernels::conv2d_shape s;
  s.batch = batch, s.in_channels = in, s.out_channels = out, s.in_h = s.in_w = hw;
  s.kernel_h = s.kernel_w = 3;
  s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
  return s;
}

struct product_case {
  const char* name;
  int64_t m, k, n;
  int kind;  // 0 forward (bias + relu), 1 weight gradient, 2 input gradient
};

}  // namespace

int run_kernels_bench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  double seconds = 0.2;
  bool json = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--seconds" && i + 1 < args.size()) {
      try {
        seconds = std::stod(args[++i]);
      } catch (const std::exception&) {
        seconds = -1;
      }
      if (!(seconds > 0 && seconds <= 60)) {
        err << "troupe bench kernels: --seconds: expected a number in (0, 60], got " << args[i]
            << "\n";
        return 2;
      }
    } else {
      err << "troupe bench kernels: unknown argument '" << args[i]
          << "' (usage: troupe bench kernels [--seconds S] [--json])\n";
      return 2;
    }
  }
  kernels::init_cpu_kernels();
  const double peak = measured_peak_gflops(kernels::active_isa());
  nlohmann::json report = {{"cpu", cpu_model()},
                           {"kernels", kernels::describe_cpu_kernels(false)},
                           {"peak_gflops_per_core", peak},
                           {"products", nlohmann::json::array()},
                           {"convolutions", nlohmann::json::array()},
                           {"layers", nlohmann::json::array()},
                           {"loops", nlohmann::json::array()}};
  if (!json) {
    char peak_line[160];
    std::snprintf(peak_line, sizeof peak_line,
                  "peak: %.0f GFLOP/s on one core (measured: 12 chains of %s FMAs)\n\n", peak,
                  kernels::isa_name(kernels::active_isa()));
    out << "CPU: " << cpu_model() << "\n"
        << "kernels: " << report["kernels"].get<std::string>() << "\n"
        << (peak > 0 ? peak_line : "peak: not measured (no FMA at this level)\n\n");
    char head[128];
    std::snprintf(head, sizeof head, "%-44s %10s %10s %8s\n", "dense product (oneDNN, 1 thread)",
                  "us/call", "GFLOP/s", "of peak");
    out << head;
  }
  const product_case products[] = {
      {"forward 128x784 . 784x256 +bias relu", 128, 784, 256, 0},
      {"forward 64x784 . 784x256 +bias relu", 64, 784, 256, 0},
      {"forward 128x256 . 256x256 +bias relu", 128, 256, 256, 0},
      {"forward 128x256 . 256x10 +bias", 128, 256, 10, 0},
      {"weight grad 784x128 . 128x256", 128, 784, 256, 1},
      {"weight grad 784x64 . 64x256", 64, 784, 256, 1},
      {"weight grad 256x128 . 128x256", 128, 256, 256, 1},
      {"input grad 128x256 . 256x256", 128, 256, 256, 2},
      {"input grad 128x10 . 10x256", 128, 256, 10, 2},
  };
  for (const auto& p : products) {
    std::vector<float> a(static_cast<std::size_t>(p.m * std::max(p.k, p.n)), 0.5f);
    std::vector<float> w(static_cast<std::size_t>(p.k * p.n), 0.01f);
    std::vector<float> bias(static_cast<std::size_t>(p.n), 0.1f);
    std::vector<float> y(static_cast<std::size_t>(std::max(p.m, p.k) * std::max(p.k, p.n)));
    std::function<void()> f;
    if (p.kind == 0)
      f = [&] {
        kernels::dense_forward(a.data(), w.data(), bias.data(), y.data(), p.m, p.k, p.n,
                               p.n > 16 ? kernels::activation::relu : kernels::activation::none);
      };
    else if (p.kind == 1)
      f = [&] {
        kernels::onednn::weight_gradient(a.data(), a.data(), y.data(), p.m, p.k, p.n, false);
      };
    else
      f = [&] { kernels::onednn::input_gradient(a.data(), w.data(), y.data(), p.m, p.k, p.n); };
    const double t = time_per_call(f, seconds);
    const double gflops = 2.0 * static_cast<double>(p.m * p.k * p.n) / t / 1e9;
    report["products"].push_back({{"name", p.name},
                                  {"us", t * 1e6},
                                  {"gflops", gflops},
                                  {"of_peak", peak > 0 ? gflops / peak : 0.0}});
    if (!json) {
      char line[160];
      std::snprintf(line, sizeof line, "%-44s %10.1f %10.1f %7.0f%%\n", p.name, t * 1e6, gflops,
                    peak > 0 ? 100.0 * gflops / peak : 0.0);
      out << line;
    }
  }

  // The convnet's convolutions (oneDNN, kernels/cpu_layers.cpp), batch 128:
  // forward with bias; backward: weights and bias, and the input gradient
  // where a layer below needs it.
  if (!json) {
    char head[160];
    std::snprintf(head, sizeof head, "\n%-44s %10s %10s %8s\n", "convolution (oneDNN, 1 thread)",
                  "ms/call", "GFLOP/s", "of peak");
    out << head;
  }
  const conv_case convs[] = {
      {"conv 1->32 3x3 same 28x28", same_3x3(128, 1, 32, 28), false},
      {"conv 32->64 3x3 same 14x14", same_3x3(128, 32, 64, 14), true},
  };
  double total_s = 0, total_flop = 0;
  for (const auto& c : convs) {
    const auto& s = c.shape;
    const double macs = static_cast<double>(s.batch * s.out_channels * s.out_h() * s.out_w() *
                                            s.in_channels / s.groups * s.kernel_h * s.kernel_w);
    std::vector<float> x(static_cast<std::size_t>(s.batch * s.in_channels * s.in_h * s.in_w), 0.5f);
    std::vector<float> w(static_cast<std::size_t>(s.out_channels * s.in_channels / s.groups *
                                                  s.kernel_h * s.kernel_w),
                         0.01f);
    std::vector<float> b(static_cast<std::size_t>(s.out_channels), 0.1f), db(b.size());
    std::vector<float> y(
        static_cast<std::size_t>(s.batch * s.out_channels * s.out_h() * s.out_w()));
    std::vector<float> dx(x.size()), dw(w.size());
    const double fwd = time_per_call(
        [&] { kernels::cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y.data()); }, seconds);
    const double bwd = time_per_call(
        [&] {
          kernels::cpu::conv2d_backward(s, x.data(), w.data(), y.data(),
                                        c.input_gradient ? dx.data() : nullptr, dw.data(),
                                        db.data(), false);
        },
        seconds);
    const double bwd_flop = 2.0 * macs * (c.input_gradient ? 2 : 1);
    total_s += fwd + bwd;
    total_flop += 2.0 * macs + bwd_flop;
    const std::string names[2] = {
        std::string(c.name) + " forward",
        std::string(c.name) + (c.input_gradient ? " backward dx dw db" : " backward dw db")};
    const double secs[2] = {fwd, bwd}, flops[2] = {2.0 * macs, bwd_flop};
    for (int i = 0; i < 2; ++i) {
      const double gflops = flops[i] / secs[i] / 1e9;
      report["convolutions"].push_back({{"name", names[i]},
                                        {"ms", secs[i] * 1e3},
                                        {"gflops", gflops},
                                        {"of_peak", peak > 0 ? gflops / peak : 0.0}});
      if (!json) {
        char line[160];
        std::snprintf(line, sizeof line, "%-44s %10.2f %10.1f %7.0f%%\n", names[i].c_str(),
                      secs[i] * 1e3, gflops, peak > 0 ? 100.0 * gflops / peak : 0.0);
        out << line;
      }
    }
  }
  {
    const double gflops = total_flop / total_s / 1e9;
    report["convolutions"].push_back({{"name", "convnet convolutions forward + backward"},
                                      {"ms", total_s * 1e3},
                                      {"gflops", gflops},
                                      {"of_peak", peak > 0 ? gflops / peak : 0.0}});
    if (!json) {
      char line[160];
      std::snprintf(line, sizeof line, "%-44s %10.2f %10.1f %7.0f%%\n", "both, forward + backward",
                    total_s * 1e3, gflops, peak > 0 ? 100.0 * gflops / peak : 0.0);
      out << line;
    }
  }

  // The convnet's other layers on the first convolution's output
  // (128x32x28x28, 12.8 MB): batch norm in training (sums, statistics,
  // normalise; backward sums and backward), relu, max pooling 2x2; and its
  // dropout on the flattened features.
  {
    const int64_t n = 128, c = 32, hw = 28 * 28;
    const std::size_t total = static_cast<std::size_t>(n * c * hw);
    std::vector<float> x(total, 0.5f), y(total), dy(total, 0.1f), dx(total);
    std::vector<float> sums(2 * c), mean(c), invstd(c), gamma(c, 1.0f), beta(c, 0.0f);
    std::vector<float> rmean(c), rvar(c, 1.0f);
    for (std::size_t i = 0; i < total; ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
    kernels::pool2d_shape pool;
    pool.batch = n, pool.channels = c, pool.in_h = pool.in_w = 28;
    pool.kernel_h = pool.kernel_w = pool.stride_h = pool.stride_w = 2;
    std::vector<unsigned char> ws(kernels::cpu::pool2d_workspace_bytes(pool));
    std::vector<float> pooled(total / 4), dpooled(total / 4, 0.2f);
    std::vector<int64_t> ids(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i;
    struct layer_case {
      const char* name;
      std::function<void()> run;
    };
    const layer_case cases[] = {
        {"batch norm forward (training)",
         [&] {
           kernels::cpu::batch_norm_sums(x.data(), n, c, hw, sums.data());
           kernels::cpu::batch_norm_statistics(sums.data(), c, double(n * hw), 1e-5f, 0.1f,
                                               mean.data(), invstd.data(), rmean.data(),
                                               rvar.data());
           kernels::cpu::batch_norm_forward(x.data(), mean.data(), invstd.data(), gamma.data(),
                                            beta.data(), y.data(), n, c, hw);
         }},
        {"batch norm backward",
         [&] {
           kernels::cpu::batch_norm_backward_sums(x.data(), dy.data(), mean.data(), invstd.data(),
                                                  n, c, hw, sums.data());
           kernels::cpu::batch_norm_backward(x.data(), dy.data(), mean.data(), invstd.data(),
                                             gamma.data(), sums.data(), double(n * hw), dx.data(),
                                             n, c, hw);
         }},
        {"relu forward + backward",
         [&] {
           kernels::cpu::unary_forward(kernels::unary_op::relu, 0, x.data(), y.data(), total);
           kernels::cpu::unary_backward(kernels::unary_op::relu, 0, x.data(), y.data(), dy.data(),
                                        dx.data(), total);
         }},
        {"dropout 0.25 on 128x3136 (flattened)",
         [&] { kernels::cpu::dropout(x.data(), y.data(), n, 3136, 0.25f, 42, ids.data()); }},
        {"max pool 2x2 forward + backward",
         [&] {
           kernels::cpu::pool2d_forward(pool, x.data(), pooled.data(), ws.data());
           kernels::cpu::pool2d_backward(pool, x.data(), dpooled.data(), dx.data(), ws.data());
         }},
    };
    if (!json) {
      char head[160];
      std::snprintf(head, sizeof head, "\n%-44s %10s\n",
                    "convnet layers on 128x32x28x28 (1 thread)", "ms/call");
      out << head;
    }
    for (const auto& l : cases) {
      const double t = time_per_call(l.run, seconds / 2);
      report["layers"].push_back({{"name", l.name}, {"ms", t * 1e3}});
      if (!json) {
        char line[160];
        std::snprintf(line, sizeof line, "%-44s %10.2f\n", l.name, t * 1e3);
        out << line;
      }
    }
  }

  // The loops, at every level the CPU has: bytes each call reads and writes.
  constexpr std::size_t params = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10;
  std::vector<float> w(params, 0.1f), g(params, 0.01f), m(params, 0.0f), v(params, 0.0f);
  std::vector<float> act(128 * 256, 0.5f), dact(128 * 256, 0.1f), db(256), logits(128 * 10, 0.3f);
  std::vector<int32_t> labels(128, 3);
  // A batch of 64 Fashion-MNIST-sized rows of bytes, decoded through the
  // normalisation's 256-entry table (the input pipelines' gather).
  std::vector<uint8_t> pixels(64 * 784);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<float> decode_table(256, 0.5f), decoded(pixels.size());
  struct loop_case {
    const char* name;
    double bytes;
    std::function<void(const kernels::vector_kernels&)> run;
  };
  const std::vector<loop_case> loops = {
      {"adam_step (the MLP's 269k parameters)", 28.0 * params,
       [&](const kernels::vector_kernels& k) {
         k.adam_step(w.data(), m.data(), v.data(), g.data(), params, 1e-3f, 0.9f, 0.999f, 1e-8f,
                     0.01f, 31.6f, 0.0f, false);
       }},
      {"sgd_step (269k)", 12.0 * params,
       [&](const kernels::vector_kernels& k) {
         k.sgd_step(w.data(), g.data(), params, 1e-3f, 0.0f);
       }},
      {"add_inplace (reducer sum, 269k)", 12.0 * params,
       [&](const kernels::vector_kernels& k) { k.add_inplace(m.data(), g.data(), params); }},
      {"relu backward + bias grad 128x256", 12.0 * 128 * 256,
       [&](const kernels::vector_kernels& k) {
         k.activation_backward_bias(kernels::activation::relu, act.data(), dact.data(), dact.data(),
                                    db.data(), 128, 256, false);
       }},
      {"softmax-CE 128x10", 8.0 * 128 * 10,
       [&](const kernels::vector_kernels& k) {
         int64_t hits = 0;
         (void)k.softmax_cross_entropy(logits.data(), labels.data(), 128, 10, 1.0f / 128,
                                       logits.data() + 0, &hits);
       }},
      {"reduce_sum (269k)", 4.0 * params,
       [&](const kernels::vector_kernels& k) { (void)k.reduce_sum(g.data(), params); }},
      {"decode_bytes 64x784 (the input's gather)", 5.0 * 64 * 784,
       [&](const kernels::vector_kernels& k) {
         k.decode_bytes(pixels.data(), decode_table.data(), decoded.data(), pixels.size());
       }},
  };
  if (!json) {
    char head[160];
    std::snprintf(head, sizeof head, "\n%-44s %-9s %10s %10s\n", "troupe's loops (1 thread)",
                  "level", "us/call", "GB/s");
    out << head;
  }
  for (const auto& l : loops) {
    for (int level = static_cast<int>(kernels::detected_isa()); level >= 0; --level) {
      const auto isa = static_cast<kernels::cpu_isa>(level);
      const auto* table = kernels::vector_kernels_for(isa);
      if (!table) continue;
      const double t = time_per_call([&] { l.run(*table); }, seconds / 2);
      const double gbs = l.bytes / t / 1e9;
      report["loops"].push_back(
          {{"name", l.name}, {"isa", kernels::isa_name(isa)}, {"us", t * 1e6}, {"gb_per_s", gbs}});
      if (!json) {
        char line[160];
        std::snprintf(line, sizeof line, "%-44s %-9s %10.2f %10.1f\n", l.name,
                      kernels::isa_name(isa), t * 1e6, gbs);
        out << line;
      }
    }
  }
  if (json) out << report.dump() << "\n";
  return 0;
}

}  // namespace troupe

#ifdef TROUPE_KERNELS_MAIN
#include <iostream>

int main(int argc, char** argv) {
  return troupe::run_kernels_bench(std::vector<std::string>(argv + 1, argv + argc), std::cout,
                                   std::cerr);
}
#endif
