// Convolution and pooling on the CPU (kernels/cpu_layers.hpp): oneDNN's
// primitives, planned once per shape and thread, and AVX-512 loops for 2x2
// max pooling. The other layers: kernels/cpu_layers.cpp.
#include "kernels/cpu_layers.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cpu_isa.hpp"
#include "kernels/cpu_layer_detail.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/onednn_internal.hpp"
#include "kernels/vector_kernels.hpp"

namespace troupe::kernels::cpu {
namespace {

using layer_detail::sz;
using layer_detail::zero;

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// ---- oneDNN plumbing for convolution and pooling ----------------------------
//
// Each shape gets, per calling thread, "plans": the primitive and the
// reorders around it, made once with their argument maps. A call points the
// plan's user memories at the caller's buffers and runs the steps; nothing is
// created or allocated in the steady state. Where a primitive wants its own
// layout, the copies live in the thread's scratch arena, shared by all plans
// of the thread (one plan runs at a time).

constexpr std::size_t kAlign = 64;

std::size_t round_up(std::size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

class scratch_arena {
 public:
  // At least `bytes`, 64-byte aligned; the address changes only when it grows.
  char* get(std::size_t bytes) {
    if (bytes > size_) {
      size_ = round_up(bytes);
      ptr_.reset(static_cast<char*>(std::aligned_alloc(kAlign, size_)));
      if (!ptr_) throw std::bad_alloc();
    }
    return ptr_.get();
  }

 private:
  struct free_deleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, free_deleter> ptr_;
  std::size_t size_ = 0;
};

// The caller's tensors a plan reads or writes.
enum role : int { X, W, B, Y, DX, DW, DB, DY, WS, kRoles };
using buffers = std::array<const void*, kRoles>;

struct plan {
  std::vector<std::pair<dnnl::primitive, std::unordered_map<int, memory>>> steps;
  std::array<memory, kRoles> user;
  std::vector<std::pair<memory, std::size_t>> scratch;  // memory, offset in the arena
  std::vector<std::pair<role, memory>> staged;          // inputs reordered into the arena
  std::size_t scratch_bytes = 0;
  char* bound = nullptr;

  memory in_arena(const memory::desc& md) {
    memory m(md, onednn::detail::engine(), DNNL_MEMORY_NONE);
    scratch.emplace_back(m, scratch_bytes);
    scratch_bytes += round_up(md.get_size());
    return m;
  }
  memory user_memory(role r, const memory::desc& md) {
    user[r] = memory(md, onednn::detail::engine(), DNNL_MEMORY_NONE);
    return user[r];
  }
  void add(dnnl::primitive p, std::unordered_map<int, memory> args) {
    steps.emplace_back(std::move(p), std::move(args));
  }
  // The caller's tensor `r` (plain layout `md`) as a primitive wants it
  // (`want`): the caller's buffer itself, or an arena copy a reorder fills.
  // A tensor already staged in the wanted layout is reused.
  memory input(role r, const memory::desc& md, const memory::desc& want) {
    for (auto& [sr, m] : staged)
      if (sr == r && m.get_desc() == want) return m;
    memory u = user[r] ? user[r] : user_memory(r, md);
    if (want == md) return u;
    memory m = in_arena(want);
    add(dnnl::reorder(u, m), {{DNNL_ARG_FROM, u}, {DNNL_ARG_TO, m}});
    staged.emplace_back(r, m);
    return m;
  }
  // A primitive's output `r`: written in place, or into the arena and then
  // reordered (added, with `accumulate`) into the caller's buffer by a step
  // appended to `after`.
  memory output(role r, const memory::desc& md, const memory::desc& want, bool accumulate,
                std::vector<std::pair<dnnl::primitive, std::unordered_map<int, memory>>>& after) {
    memory u = user_memory(r, md);
    if (want == md && !accumulate) return u;
    memory m = in_arena(want);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    after.emplace_back(dnnl::reorder(dnnl::reorder::primitive_desc(m, u, attr)),
                       std::unordered_map<int, memory>{{DNNL_ARG_FROM, m}, {DNNL_ARG_TO, u}});
    return m;
  }

  void run(const buffers& b, scratch_arena& arena) {
    for (int r = 0; r < kRoles; ++r)
      if (user[r]) user[r].set_data_handle(const_cast<void*>(b[r]));
    if (scratch_bytes > 0) {
      char* base = arena.get(scratch_bytes);
      // Rebinding a blocked memory zero-fills its padding: only when the
      // arena moved.
      if (base != bound) {
        for (auto& [m, off] : scratch) m.set_data_handle(base + off);
        bound = base;
      }
    }
    auto& stream = onednn::detail::thread_stream();
    for (auto& [p, args] : steps) p.execute(stream, args);
  }
};

using step_list = std::vector<std::pair<dnnl::primitive, std::unordered_map<int, memory>>>;

// A plan is stored only once complete: a shape oneDNN refuses midway leaves
// nothing half-built behind for the next call.
plan& keep(std::unique_ptr<plan>& slot, std::unique_ptr<plan> p) {
  slot = std::move(p);
  return *slot;
}

// The convolution primitives take the layouts oneDNN prefers (format_tag::
// any: nChw16c activations, blocked weights at AVX-512) behind reorders from
// and to the caller's NCHW. Measured with bench_kernels on the Fashion-MNIST
// convnet, batch 128, 1 thread, AMD EPYC (AVX-512, oneDNN 2.6.3), forward +
// backward of both convolutions: blocked + reorders 16.2-18.2 ms (160-180
// GFLOP/s), plain nchw throughout 28.1-40.5 ms (70-100 GFLOP/s: the 32 -> 64
// layer falls to im2col + GEMM, its backward 2-3x slower). The reorders cost
// ~2.5 ms of the blocked figure.
constexpr bool kConvBlocked = true;

using conv_key = std::array<int64_t, 16>;

conv_key key_of(const conv2d_shape& s) {
  return {s.batch,    s.in_channels, s.in_h,      s.in_w,       s.out_channels, s.kernel_h,
          s.kernel_w, s.stride_h,    s.stride_w,  s.dilation_h, s.dilation_w,   s.pad_top,
          s.pad_left, s.pad_bottom,  s.pad_right, s.groups};
}

void check_conv(const conv2d_shape& s) {
  auto bad = [&](const char* what) {
    throw std::invalid_argument(std::string("conv2d: ") + what + " (batch " +
                                std::to_string(s.batch) + ", " + std::to_string(s.in_channels) +
                                "x" + std::to_string(s.in_h) + "x" + std::to_string(s.in_w) +
                                " -> " + std::to_string(s.out_channels) + ", kernel " +
                                std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) +
                                ", groups " + std::to_string(s.groups) + ")");
  };
  if (s.batch < 0 || s.in_channels <= 0 || s.in_h <= 0 || s.in_w <= 0 || s.out_channels <= 0)
    bad("empty or negative dimension");
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.stride_h <= 0 || s.stride_w <= 0 ||
      s.dilation_h <= 0 || s.dilation_w <= 0)
    bad("kernel, stride and dilation must be >= 1");
  if (s.pad_top < 0 || s.pad_left < 0 || s.pad_bottom < 0 || s.pad_right < 0)
    bad("negative padding");
  if (s.groups <= 0 || s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0)
    bad("channels not divisible by groups");
  if (s.out_h() <= 0 || s.out_w() <= 0) bad("the kernel does not fit the padded image");
}

// One convolution shape on one thread: its forward pd (the backward's hint)
// and the plans made so far.
struct conv_entry {
  memory::dims src, wei, bias, dst, strides, dilates, pad_l, pad_r;
  memory::desc src_md, wei_md, bias_md, dst_md;
  dnnl::algorithm alg;
  dnnl::convolution_forward::primitive_desc hint;
  std::unique_ptr<plan> forward[2];         // [has bias]
  std::unique_ptr<plan> backward[2][2][2];  // [has dx][has bias][accumulate]

  explicit conv_entry(const conv2d_shape& s) {
    check_conv(s);
    const int64_t g = s.groups;
    src = {s.batch, s.in_channels, s.in_h, s.in_w};
    wei = g == 1 ? memory::dims{s.out_channels, s.in_channels, s.kernel_h, s.kernel_w}
                 : memory::dims{g, s.out_channels / g, s.in_channels / g, s.kernel_h, s.kernel_w};
    bias = {s.out_channels};
    dst = {s.batch, s.out_channels, s.out_h(), s.out_w()};
    strides = {s.stride_h, s.stride_w};
    dilates = {s.dilation_h - 1, s.dilation_w - 1};  // oneDNN counts the gaps
    pad_l = {s.pad_top, s.pad_left};
    pad_r = {s.pad_bottom, s.pad_right};
    src_md = memory::desc(src, dt::f32, tag::nchw);
    wei_md = memory::desc(wei, dt::f32, g == 1 ? tag::oihw : tag::goihw);
    bias_md = memory::desc(bias, dt::f32, tag::x);
    dst_md = memory::desc(dst, dt::f32, tag::nchw);
    // oneDNN's Winograd where it applies (3x3, stride 1, full channel
    // blocks) on layers with channels to spare: the convnet's 32 -> 64
    // layer, forward 2.7-3.1 ms against 5.3 direct, backward data 3.0-4.9
    // against 4.8-6.1 (its weights' gradient stays direct). oneDNN's own
    // choice ("auto") takes it for the 1-channel first layer too, where it
    // is 3-5x slower, hence the channel bound.
    alg = s.in_channels / g >= 16 && s.out_channels / g >= 16 ? dnnl::algorithm::convolution_auto
                                                              : dnnl::algorithm::convolution_direct;
  }

  memory::desc prim(const memory::dims& d, const memory::desc& plain) const {
    return kConvBlocked ? memory::desc(d, dt::f32, tag::any) : plain;
  }

  dnnl::convolution_forward::primitive_desc forward_pd(bool with_bias) const {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, alg, prim(src, src_md),
                                      prim(wei, wei_md), with_bias ? bias_md : memory::desc(),
                                      prim(dst, dst_md), strides, dilates, pad_l, pad_r);
    return {d, onednn::detail::engine()};
  }

  const dnnl::convolution_forward::primitive_desc& hint_pd() {
    if (!hint) hint = forward_pd(true);
    return hint;
  }

  plan& forward_plan(bool with_bias) {
    auto& slot = forward[with_bias];
    if (slot) return *slot;
    auto p = std::make_unique<plan>();
    auto pd = forward_pd(with_bias);
    step_list after;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, p->input(X, src_md, pd.src_desc())},
        {DNNL_ARG_WEIGHTS, p->input(W, wei_md, pd.weights_desc())},
        {DNNL_ARG_DST, p->output(Y, dst_md, pd.dst_desc(), false, after)}};
    if (with_bias) args.emplace(DNNL_ARG_BIAS, p->user_memory(B, bias_md));
    p->add(dnnl::convolution_forward(pd), std::move(args));
    for (auto& st : after) p->steps.push_back(std::move(st));
    return keep(slot, std::move(p));
  }

  // One plan for the whole backward: the weights' (and bias') gradient, then
  // the input's, sharing the reordered dy where both want the same layout.
  plan& backward_plan(bool with_dx, bool with_bias, bool accumulate) {
    auto& slot = backward[with_dx][with_bias][accumulate];
    if (slot) return *slot;
    auto p = std::make_unique<plan>();
    const auto& eng = onednn::detail::engine();
    auto wd = with_bias ? dnnl::convolution_backward_weights::desc(
                              alg, prim(src, src_md), prim(wei, wei_md), bias_md, prim(dst, dst_md),
                              strides, dilates, pad_l, pad_r)
                        : dnnl::convolution_backward_weights::desc(
                              alg, prim(src, src_md), prim(wei, wei_md), prim(dst, dst_md), strides,
                              dilates, pad_l, pad_r);
    dnnl::convolution_backward_weights::primitive_desc wpd(wd, eng, hint_pd());
    step_list after;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, p->input(X, src_md, wpd.src_desc())},
        {DNNL_ARG_DIFF_DST, p->input(DY, dst_md, wpd.diff_dst_desc())},
        {DNNL_ARG_DIFF_WEIGHTS, p->output(DW, wei_md, wpd.diff_weights_desc(), accumulate, after)}};
    if (with_bias)
      args.emplace(DNNL_ARG_DIFF_BIAS,
                   p->output(DB, bias_md, wpd.diff_bias_desc(), accumulate, after));
    p->add(dnnl::convolution_backward_weights(wpd), std::move(args));
    for (auto& st : after) p->steps.push_back(std::move(st));
    if (!with_dx) return keep(slot, std::move(p));

    after.clear();
    dnnl::convolution_backward_data::desc dd(alg, prim(src, src_md), prim(wei, wei_md),
                                             prim(dst, dst_md), strides, dilates, pad_l, pad_r);
    dnnl::convolution_backward_data::primitive_desc dpd(dd, eng, hint_pd());
    std::unordered_map<int, memory> dargs{
        {DNNL_ARG_DIFF_DST, p->input(DY, dst_md, dpd.diff_dst_desc())},
        {DNNL_ARG_WEIGHTS, p->input(W, wei_md, dpd.weights_desc())},
        {DNNL_ARG_DIFF_SRC, p->output(DX, src_md, dpd.diff_src_desc(), false, after)}};
    p->add(dnnl::convolution_backward_data(dpd), std::move(dargs));
    for (auto& st : after) p->steps.push_back(std::move(st));
    return keep(slot, std::move(p));
  }
};

using pool_key = std::array<int64_t, 13>;

pool_key key_of(const pool2d_shape& s) {
  return {static_cast<int64_t>(s.kind),
          s.batch,
          s.channels,
          s.in_h,
          s.in_w,
          s.kernel_h,
          s.kernel_w,
          s.stride_h,
          s.stride_w,
          s.pad_top,
          s.pad_left,
          s.pad_bottom,
          s.pad_right};
}

void check_pool(const pool2d_shape& s) {
  auto bad = [&](const char* what) {
    throw std::invalid_argument(
        std::string("pool2d: ") + what + " (batch " + std::to_string(s.batch) + ", " +
        std::to_string(s.channels) + "x" + std::to_string(s.in_h) + "x" + std::to_string(s.in_w) +
        ", kernel " + std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w) + ")");
  };
  if (s.batch < 0 || s.channels <= 0 || s.in_h <= 0 || s.in_w <= 0)
    bad("empty or negative dimension");
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.stride_h <= 0 || s.stride_w <= 0)
    bad("kernel and stride must be >= 1");
  // A window wholly in the padding would have no input to take.
  if (s.pad_top < 0 || s.pad_left < 0 || s.pad_bottom < 0 || s.pad_right < 0 ||
      s.pad_top >= s.kernel_h || s.pad_bottom >= s.kernel_h || s.pad_left >= s.kernel_w ||
      s.pad_right >= s.kernel_w)
    bad("padding must be in [0, kernel)");
  if (s.out_h() <= 0 || s.out_w() <= 0) bad("the window does not fit the padded image");
}

// Pooling runs in oneDNN's blocked layout (channels in blocks of the vector
// width) behind reorders when the channels fill the blocks: oneDNN 2.6
// pools NCHW by transposing it internally. Max 2x2 on 128x32x28x28, 1
// thread (AMD EPYC, AVX-512): forward 1.6-1.7 ms in NCHW against 1.2 ms
// blocked (reorder 0.6 + pool 0.4 + reorder 0.2), backward 1.5-1.7 against
// 1.2. Other channel counts stay NCHW rather than pool padding.
struct pool_entry {
  memory::desc src_md, dst_md;  // the caller's NCHW
  memory::desc in_md, out_md;   // the primitive's
  memory::dims strides, kernel, pad_l, pad_r;
  dnnl::algorithm alg;
  dnnl::pooling_forward::primitive_desc train_pd;
  std::unique_ptr<plan> train, infer, backward, backward_recompute;

  explicit pool_entry(const pool2d_shape& s) {
    check_pool(s);
    const memory::dims in{s.batch, s.channels, s.in_h, s.in_w};
    const memory::dims out{s.batch, s.channels, s.out_h(), s.out_w()};
    src_md = memory::desc(in, dt::f32, tag::nchw);
    dst_md = memory::desc(out, dt::f32, tag::nchw);
    const int64_t block = active_isa() == cpu_isa::avx512 ? 16 : 8;
    const bool blocked = s.channels % block == 0;  // no padded channels to pool
    const tag t = block == 16 ? tag::nChw16c : tag::nChw8c;
    in_md = blocked ? memory::desc(in, dt::f32, t) : src_md;
    out_md = blocked ? memory::desc(out, dt::f32, t) : dst_md;
    strides = {s.stride_h, s.stride_w};
    kernel = {s.kernel_h, s.kernel_w};
    pad_l = {s.pad_top, s.pad_left};
    pad_r = {s.pad_bottom, s.pad_right};
    alg = s.kind == pool_kind::max ? dnnl::algorithm::pooling_max
                                   : dnnl::algorithm::pooling_avg_exclude_padding;
    train_pd = forward_pd(dnnl::prop_kind::forward_training);
  }

  dnnl::pooling_forward::primitive_desc forward_pd(dnnl::prop_kind kind) const {
    dnnl::pooling_forward::desc d(kind, alg, in_md, out_md, strides, kernel, pad_l, pad_r);
    return {d, onednn::detail::engine()};
  }
  bool has_workspace() const { return alg == dnnl::algorithm::pooling_max; }
  std::size_t workspace_bytes() const {
    return has_workspace() ? train_pd.workspace_desc().get_size() : 0;
  }

  plan& forward_plan(bool training) {
    auto& slot = training ? train : infer;
    if (slot) return *slot;
    auto p = std::make_unique<plan>();
    auto pd = training ? train_pd : forward_pd(dnnl::prop_kind::forward_inference);
    step_list after;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, p->input(X, src_md, in_md)},
        {DNNL_ARG_DST, p->output(Y, dst_md, out_md, false, after)}};
    if (training && has_workspace())
      args.emplace(DNNL_ARG_WORKSPACE, p->user_memory(WS, pd.workspace_desc()));
    p->add(dnnl::pooling_forward(pd), std::move(args));
    for (auto& st : after) p->steps.push_back(std::move(st));
    return keep(slot, std::move(p));
  }

  // With `recompute`, max pooling's winners come from a forward into the
  // arena (the caller kept no workspace).
  plan& backward_plan(bool recompute) {
    auto& slot = recompute ? backward_recompute : backward;
    if (slot) return *slot;
    auto p = std::make_unique<plan>();
    dnnl::pooling_backward::desc d(alg, in_md, out_md, strides, kernel, pad_l, pad_r);
    dnnl::pooling_backward::primitive_desc pd(d, onednn::detail::engine(), train_pd);
    memory ws;
    if (has_workspace()) {
      if (recompute) {
        ws = p->in_arena(train_pd.workspace_desc());
        p->add(dnnl::pooling_forward(train_pd), {{DNNL_ARG_SRC, p->input(X, src_md, in_md)},
                                                 {DNNL_ARG_DST, p->in_arena(out_md)},
                                                 {DNNL_ARG_WORKSPACE, ws}});
      } else {
        ws = p->user_memory(WS, train_pd.workspace_desc());
      }
    }
    step_list after;
    std::unordered_map<int, memory> args{
        {DNNL_ARG_DIFF_DST, p->input(DY, dst_md, out_md)},
        {DNNL_ARG_DIFF_SRC, p->output(DX, src_md, in_md, false, after)}};
    if (ws) args.emplace(DNNL_ARG_WORKSPACE, ws);
    p->add(dnnl::pooling_backward(pd), std::move(args));
    for (auto& st : after) p->steps.push_back(std::move(st));
    return keep(slot, std::move(p));
  }
};

// Shapes come from the model and the batch sizes: a handful. The bound only
// keeps a caller that varies them without end from growing the cache.
constexpr std::size_t kMaxCachedShapes = 128;

struct thread_layers {
  scratch_arena arena;
  std::map<conv_key, conv_entry> convs;
  std::map<pool_key, pool_entry> pools;
  // oneDNN sizes a primitive's thread team when it is made: the thread's
  // OpenMP team must be held to one (onednn.cpp's thread state) before the
  // first is, or a device thread whose first oneDNN call is a convolution
  // runs it on two threads, spinning against the other device's.
  thread_layers() { (void)onednn::detail::thread_stream(); }
};

thread_layers& layers() {
  thread_local thread_layers t;
  return t;
}

template <class Map, class Shape>
auto& entry_for(Map& cache, const Shape& s) {
  const auto k = key_of(s);
  auto it = cache.find(k);
  if (it == cache.end()) {
    if (cache.size() >= kMaxCachedShapes) cache.clear();
    it = cache.try_emplace(k, s).first;
  }
  return it->second;
}

// Max pooling over 2x2 windows at stride 2 without padding, on rows of
// even width (the convnets' pooling), runs in these AVX-512 loops on the
// caller's NCHW, one pass each way, the winner of each window kept as a
// byte (0-3, row-major; the first largest wins ties, as the contract
// says). A row's windows go 16 at a time through full-width loads and
// stores that run on into the next row (read and not used, or written
// before that row is): masks only near the buffer's end. Rows of 14 or 7
// windows are the common case: a compiler's scalar remainder loop
// (branches on data) ran 3x slower than oneDNN, and masked loads and stores
// on every row 2x slower. oneDNN 2.6 pools NCHW by transposing it and the
// blocked layout costs two reorders. The convnet at batch 128 on one core
// (AMD EPYC): 5.1k samples/s against 4.6-4.7k with oneDNN's pooling.
// Other shapes and levels stay with oneDNN.
bool is_max_2x2(const pool2d_shape& s) {
  return s.kind == pool_kind::max && s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 &&
         s.stride_w == 2 && s.pad_top == 0 && s.pad_left == 0 && s.pad_bottom == 0 &&
         s.pad_right == 0 && s.in_w % 2 == 0 && active_isa() == cpu_isa::avx512;
}

// The masks of a row's 2n inputs (n <= 16 outputs) as two 16-float loads.
struct pool_masks {
  __mmask16 out, lo, hi;
  bool tail;  // the last windows of the buffer: nothing may be read past them
};
TROUPE_AVX512 __attribute__((always_inline)) inline pool_masks masks_for(std::size_t n, bool tail) {
  auto bits = [](std::size_t k) {
    return static_cast<__mmask16>(k >= 16 ? 0xffffu : (1u << k) - 1u);
  };
  return {bits(n), bits(2 * n), bits(2 * n > 16 ? 2 * n - 16 : 0), tail};
}

// The maxima of 16 windows starting at output j0 of rows r0/r1, and which
// of a, b (row r0), c, d (row r1) won each.
TROUPE_AVX512 __attribute__((always_inline)) inline __m512i window_winners(const float* r0,
                                                                           const float* r1,
                                                                           const pool_masks& mk,
                                                                           __m512& best) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  // Unmasked where reading on stays in the buffer (the next rows' values
  // are loaded and not used); masked near its end.
  __m512 lo0, hi0, lo1, hi1;
  if (mk.tail) {
    lo0 = _mm512_maskz_loadu_ps(mk.lo, r0), hi0 = _mm512_maskz_loadu_ps(mk.hi, r0 + 16);
    lo1 = _mm512_maskz_loadu_ps(mk.lo, r1), hi1 = _mm512_maskz_loadu_ps(mk.hi, r1 + 16);
  } else {
    lo0 = _mm512_loadu_ps(r0), hi0 = _mm512_loadu_ps(r0 + 16);
    lo1 = _mm512_loadu_ps(r1), hi1 = _mm512_loadu_ps(r1 + 16);
  }
  const __m512 cand[3] = {_mm512_permutex2var_ps(lo0, odd, hi0),
                          _mm512_permutex2var_ps(lo1, even, hi1),
                          _mm512_permutex2var_ps(lo1, odd, hi1)};
  __m512 m = _mm512_permutex2var_ps(lo0, even, hi0);
  __m512i k = _mm512_setzero_si512();
  for (int i = 0; i < 3; ++i) {  // strictly greater: the earlier one keeps a tie
    const __mmask16 gt = _mm512_cmp_ps_mask(cand[i], m, _CMP_GT_OQ);
    m = _mm512_mask_mov_ps(m, gt, cand[i]);
    k = _mm512_mask_mov_epi32(k, gt, _mm512_set1_epi32(i + 1));
  }
  best = m;
  return k;
}

TROUPE_AVX512 void max_pool_2x2_avx512(const float* x, float* y, uint8_t* win, int64_t planes,
                                       int64_t h, int64_t w) {
  const std::size_t oh = sz(h / 2), ow = sz(w / 2), iw = sz(w);
  const std::size_t total = sz(planes * h * w);
  for (std::size_t p = 0; p < sz(planes); ++p)
    for (std::size_t i = 0; i < oh; ++i) {
      const float* r0 = x + (p * sz(h) + 2 * i) * iw;
      const std::size_t o = (p * oh + i) * ow;
      for (std::size_t j0 = 0; j0 < ow; j0 += 16) {
        const auto mk = masks_for(std::min<std::size_t>(16, ow - j0),
                                  (p * sz(h) + 2 * i + 1) * iw + 2 * j0 + 32 > total);
        __m512 m;
        const __m512i k = window_winners(r0 + 2 * j0, r0 + iw + 2 * j0, mk, m);
        _mm512_mask_storeu_ps(y + o + j0, mk.out, m);
        if (win) _mm512_mask_cvtepi32_storeu_epi8(win + o + j0, mk.out, k);
      }
    }
}

// dx: dy at each window's winner, 0 elsewhere (the last row, when h is odd,
// included). Without kept winners they are found again from x.
TROUPE_AVX512 void max_pool_2x2_backward_avx512(const float* x, const float* dy, const uint8_t* win,
                                                float* dx, int64_t planes, int64_t h, int64_t w) {
  const std::size_t oh = sz(h / 2), ow = sz(w / 2), iw = sz(w);
  const std::size_t total = sz(planes * h * w), outputs = sz(planes) * oh * ow;
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi_idx =
      _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (std::size_t p = 0; p < sz(planes); ++p) {
    for (std::size_t i = 0; i < oh; ++i) {
      const std::size_t r0 = (p * sz(h) + 2 * i) * iw;  // offset of the pair's first row
      const std::size_t o = (p * oh + i) * ow;
      // Row 0 (a, b) first, then row 1 (c, d): a full-width store of a row's
      // last windows runs on into the next row, which is written after it
      // (masks only where it would leave the buffer).
      for (int row = 0; row < 2; ++row)
        for (std::size_t j0 = 0; j0 < ow; j0 += 16) {
          const std::size_t n = std::min<std::size_t>(16, ow - j0);
          const auto mk = masks_for(n, r0 + iw + 2 * j0 + 32 > total);
          const bool out_tail = o + j0 + 16 > outputs;
          const __m512 g =
              out_tail ? _mm512_maskz_loadu_ps(mk.out, dy + o + j0) : _mm512_loadu_ps(dy + o + j0);
          __m512i k;
          if (win) {
            const __m128i bytes =
                out_tail ? _mm_maskz_loadu_epi8(mk.out, win + o + j0)
                         : _mm_loadu_si128(reinterpret_cast<const __m128i*>(win + o + j0));
            k = _mm512_maskz_cvtepu8_epi32(0xffff, bytes);
          } else {
            __m512 unused;
            k = window_winners(x + r0 + 2 * j0, x + r0 + iw + 2 * j0, mk, unused);
          }
          const __m512 left =
              _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2 * row)), g);
          const __m512 right =
              _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2 * row + 1)), g);
          float* d = dx + r0 + sz(row) * iw + 2 * j0;
          const __m512 lo = _mm512_permutex2var_ps(left, lo_idx, right);
          const __m512 hi = _mm512_permutex2var_ps(left, hi_idx, right);
          if (r0 + sz(row) * iw + 2 * j0 + 32 > total) {
            _mm512_mask_storeu_ps(d, mk.lo, lo);
            _mm512_mask_storeu_ps(d + 16, mk.hi, hi);
          } else {
            _mm512_storeu_ps(d, lo);
            _mm512_storeu_ps(d + 16, hi);
          }
        }
    }
    if (h % 2) zero(dx + (p * sz(h) + sz(h) - 1) * iw, iw);
  }
}

}  // namespace

// ---- convolution and pooling (oneDNN) ---------------------------------------

void conv2d_forward(const conv2d_shape& s, const float* x, const float* w, const float* b,
                    float* y) {
  auto& t = layers();
  auto& e = entry_for(t.convs, s);
  if (s.batch == 0) return;
  buffers buf{};
  buf[X] = x;
  buf[W] = w;
  buf[B] = b;
  buf[Y] = y;
  e.forward_plan(b != nullptr).run(buf, t.arena);
}

void conv2d_backward(const conv2d_shape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, bool accumulate) {
  auto& t = layers();
  auto& e = entry_for(t.convs, s);
  if (s.batch == 0) {  // no examples: no gradient
    if (!accumulate) {
      zero(dw, sz(s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w));
      if (db) zero(db, sz(s.out_channels));
    }
    return;
  }
  buffers buf{};
  buf[X] = x;
  buf[W] = w;
  buf[DY] = dy;
  buf[DX] = dx;
  buf[DW] = dw;
  buf[DB] = db;
  e.backward_plan(dx != nullptr, db != nullptr, accumulate).run(buf, t.arena);
}

std::size_t pool2d_workspace_bytes(const pool2d_shape& s) {
  if (is_max_2x2(s)) {
    check_pool(s);
    return sz(s.batch * s.channels * s.out_h() * s.out_w());  // a winner's byte per output
  }
  auto& t = layers();
  return entry_for(t.pools, s).workspace_bytes();
}

void pool2d_forward(const pool2d_shape& s, const float* x, float* y, void* workspace) {
  if (is_max_2x2(s)) {
    check_pool(s);
    return max_pool_2x2_avx512(x, y, static_cast<uint8_t*>(workspace), s.batch * s.channels, s.in_h,
                               s.in_w);
  }
  auto& t = layers();
  auto& e = entry_for(t.pools, s);
  if (s.batch == 0) return;
  buffers buf{};
  buf[X] = x;
  buf[Y] = y;
  buf[WS] = workspace;
  e.forward_plan(workspace != nullptr).run(buf, t.arena);
}

void pool2d_backward(const pool2d_shape& s, const float* x, const float* dy, float* dx,
                     const void* workspace) {
  if (is_max_2x2(s)) {
    check_pool(s);
    return max_pool_2x2_backward_avx512(x, dy, static_cast<const uint8_t*>(workspace), dx,
                                        s.batch * s.channels, s.in_h, s.in_w);
  }
  auto& t = layers();
  auto& e = entry_for(t.pools, s);
  if (s.batch == 0) return;
  buffers buf{};
  buf[X] = x;
  buf[DY] = dy;
  buf[DX] = dx;
  buf[WS] = workspace;
  e.backward_plan(workspace == nullptr && e.has_workspace()).run(buf, t.arena);
}

std::size_t cached_layer_shapes() {
  auto& t = layers();
  return t.convs.size() + t.pools.size();
}

}  // namespace troupe::kernels::cpu
