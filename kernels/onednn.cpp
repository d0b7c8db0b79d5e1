#include "kernels/onednn.hpp"

#include <dlfcn.h>

#include <dnnl.hpp>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "kernels/onednn_internal.hpp"

namespace troupe::kernels::onednn {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

enum class product : uint8_t { forward, weight_gradient, input_gradient };

struct key {
  product kind;
  int64_t m, k, n;
  activation act;
  bool bias;
  bool accumulate;
  bool operator<(const key& o) const {
    return std::tie(kind, m, k, n, act, bias, accumulate) <
           std::tie(o.kind, o.m, o.k, o.n, o.act, o.bias, o.accumulate);
  }
};

dnnl::cpu_isa max_isa_for(cpu_isa isa) {
  switch (isa) {
    case cpu_isa::baseline:
      return dnnl::cpu_isa::sse41;
    case cpu_isa::avx2:
      return dnnl::cpu_isa::avx2_vnni;  // the widest level below AVX-512
    case cpu_isa::avx512:
      break;
  }
  return dnnl::cpu_isa::all;
}

// The process's engine. Its ISA cap must be set before oneDNN generates any
// kernel, so it is set here, on first use, from the one choice the loops use.
const dnnl::engine& engine() {
  static const dnnl::engine eng = [] {
    // Fails only when oneDNN already generated kernels (another user of the
    // library in this process); the cap it has then stays.
    (void)dnnl::set_max_cpu_isa(max_isa_for(active_isa()));
    // Each device thread keeps its own primitives (thread_state): oneDNN's
    // process-wide cache would only repeat that, behind a lock shared by
    // every device thread.
    dnnl::set_primitive_cache_capacity(0);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return eng;
}

// A row-major [rows, cols] matrix, or its transpose read in place.
memory::desc matrix(int64_t rows, int64_t cols) {
  return memory::desc({rows, cols}, dt::f32, memory::dims{cols, 1});
}
memory::desc transposed(int64_t rows, int64_t cols) {  // of a row-major [cols, rows]
  return memory::desc({rows, cols}, dt::f32, memory::dims{1, rows});
}

// One product, made once: the primitive and its memory objects, whose data
// handles are pointed at the caller's buffers on each call.
struct cached_product {
  dnnl::matmul prim;
  memory src, weights, bias, dst;
  std::unordered_map<int, memory> args;

  explicit cached_product(const key& k) {
    memory::desc s, w, d, b;
    switch (k.kind) {
      case product::forward:  // y[m,n] = x[m,k] w[k,n] + b
        s = matrix(k.m, k.k);
        w = matrix(k.k, k.n);
        d = matrix(k.m, k.n);
        if (k.bias) b = matrix(1, k.n);
        break;
      case product::weight_gradient:  // dw[k,n] = x[m,k]^T dy[m,n]
        s = transposed(k.k, k.m);
        w = matrix(k.m, k.n);
        d = matrix(k.k, k.n);
        break;
      case product::input_gradient:  // dx[m,k] = dy[m,n] w[k,n]^T
        s = matrix(k.m, k.n);
        w = transposed(k.n, k.k);
        d = matrix(k.m, k.k);
        break;
    }
    dnnl::post_ops ops;
    if (k.act == activation::relu)
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    if (k.accumulate) ops.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const auto& eng = engine();
    auto desc = k.bias ? dnnl::matmul::desc(s, w, b, d) : dnnl::matmul::desc(s, w, d);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, eng));
    src = memory(s, eng, DNNL_MEMORY_NONE);
    weights = memory(w, eng, DNNL_MEMORY_NONE);
    dst = memory(d, eng, DNNL_MEMORY_NONE);
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
    if (k.bias) {
      bias = memory(b, eng, DNNL_MEMORY_NONE);
      args.emplace(DNNL_ARG_BIAS, bias);
    }
  }
};

// oneDNN's products run on the OpenMP runtime its library was built with
// (Debian's: libgomp, loaded with libdnnl). troupe sets that runtime's team
// size for the calling thread through its C API, found by name in the
// process rather than linked: a clang build (the fuzz targets) would
// otherwise link LLVM's libomp beside libdnnl's libgomp. A oneDNN built on
// another runtime (sequential, TBB) has no such symbol and nothing to set.
void limit_openmp_team_to_this_thread() {
  using set_threads_fn = void (*)(int);
  static const auto set_threads =
      reinterpret_cast<set_threads_fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set_threads) set_threads(1);  // the ICV is per thread
}

// Per device thread: its stream, its primitives, and an OpenMP team of one,
// so this thread's products run on it alone.
struct thread_state {
  dnnl::stream stream;
  std::map<key, cached_product> products;
  thread_state() : stream(engine()) { limit_openmp_team_to_this_thread(); }
};

thread_state& local() {
  thread_local thread_state s;
  return s;
}

// Shapes come from the model and the batch sizes (training, evaluation
// chunks, a last partial batch): a handful. The bound only keeps a caller
// that varies them without end from growing the cache.
constexpr std::size_t kMaxCachedProducts = 256;

void run(const key& k, const float* src, const float* weights, const float* bias, float* dst) {
  auto& st = local();
  auto it = st.products.find(k);
  if (it == st.products.end()) {
    if (st.products.size() >= kMaxCachedProducts) st.products.clear();
    it = st.products.try_emplace(k, k).first;
  }
  auto& p = it->second;
  p.src.set_data_handle(const_cast<float*>(src));
  p.weights.set_data_handle(const_cast<float*>(weights));
  if (bias) p.bias.set_data_handle(const_cast<float*>(bias));
  p.dst.set_data_handle(dst);
  p.prim.execute(st.stream, p.args);
}

}  // namespace

void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k,
                   int64_t n, activation act) {
  // tanh is left to the vector loops (ew::tanh_f, the same as the CUDA path);
  // relu is exact either way.
  const activation fused = act == activation::relu ? act : activation::none;
  run({product::forward, m, k, n, fused, b != nullptr, false}, x, w, b, y);
}

void weight_gradient(const float* x, const float* dy, float* dw, int64_t m, int64_t k, int64_t n,
                     bool accumulate) {
  run({product::weight_gradient, m, k, n, activation::none, false, accumulate}, x, dy, nullptr, dw);
}

void input_gradient(const float* dy, const float* w, float* dx, int64_t m, int64_t k, int64_t n) {
  run({product::input_gradient, m, k, n, activation::none, false, false}, dy, w, nullptr, dx);
}

namespace detail {

const dnnl::engine& engine() {
  return onednn::engine();
}

dnnl::stream& thread_stream() {
  return local().stream;
}

}  // namespace detail

std::string effective_isa() {
  (void)engine();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa()));
  }
}

std::string version() {
  const auto* v = dnnl::version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::size_t cached_primitives() {
  return local().products.size();
}

}  // namespace troupe::kernels::onednn
