// What is done with a loaded dataset (data/dataset.hpp): standardization,
// label conversion, each epoch's order and the batches. Loading:
// data/load_data.cpp.
#include "data/dataset.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_kernels.hpp"

namespace troupe::data {

namespace {

// splitmix64: seeds the generator and mixes (seed, epoch).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class xoshiro256ss {
 public:
  explicit xoshiro256ss(uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound), bound > 0, by rejection (no modulo bias).
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_{};
};

}  // namespace

void check_classes(const dataset& d, int64_t classes, const std::string& name,
                   const std::vector<int64_t>* lines) {
  if (d.float_targets()) return;
  const auto labels = d.labels.span<int32_t>();
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      throw data_error(
          name + ": label " + std::to_string(labels[i]) +
          (lines ? " on line " + std::to_string((*lines)[i]) : " at row " + std::to_string(i)) +
          " is out of range (data.classes is " + std::to_string(classes) + ")");
}

std::string data_source(const troupe::data_config& cfg) {
  if (cfg.format == "idx") return cfg.path;
  if (cfg.format == "npy")
    return cfg.train.x + ", " + cfg.train.y + ", " + cfg.test.x + ", " + cfg.test.y;
  return cfg.train.file + ", " + cfg.test.file;
}

void standardize(train_test& tt) {
  const int64_t f = tt.train.features();
  const int64_t n = tt.train.size();
  const auto uf = static_cast<std::size_t>(f);
  std::vector<double> sum(uf, 0.0), dev(uf, 0.0);
  std::vector<float> lo(uf, 0.f), hi(uf, 0.f);
  const float* x = n > 0 ? tt.train.images.f32() : nullptr;
  for (int64_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < uf; ++j) {
      const float v = x[static_cast<std::size_t>(i) * uf + j];
      sum[j] += v;
      lo[j] = i == 0 ? v : std::min(lo[j], v);
      hi[j] = i == 0 ? v : std::max(hi[j], v);
    }
  std::vector<double> mean(uf, 0.0);
  for (std::size_t j = 0; j < uf; ++j) mean[j] = n > 0 ? sum[j] / static_cast<double>(n) : 0.0;
  for (int64_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < uf; ++j) {
      const double d = x[static_cast<std::size_t>(i) * uf + j] - mean[j];
      dev[j] += d * d;
    }
  tt.feature_mean.assign(uf, 0.f);
  tt.feature_std.assign(uf, 1.f);
  for (std::size_t j = 0; j < uf; ++j) {
    tt.feature_mean[j] = static_cast<float>(mean[j]);
    // A constant feature (min == max: exactly, where a computed variance
    // would leave rounding noise) keeps its scale.
    if (n > 0 && lo[j] != hi[j])
      tt.feature_std[j] = static_cast<float>(std::sqrt(dev[j] / static_cast<double>(n)));
  }
  for (dataset* d : {&tt.train, &tt.test}) {
    d->codes.clear();
    if (d->images.numel() == 0) continue;
    float* p = d->images.f32();
    const auto rows = static_cast<std::size_t>(d->size());
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < uf; ++j)
        p[i * uf + j] = (p[i * uf + j] - tt.feature_mean[j]) / tt.feature_std[j];
  }
}

void convert_labels(train_test& tt, label_kind kind, int64_t classes) {
  dataset* splits[] = {&tt.train, &tt.test};
  const char* names[] = {"train", "test"};
  if (kind == label_kind::classes || kind == label_kind::one_hot) {
    int64_t max_label = -1;
    for (int s = 0; s < 2; ++s) {
      dataset& d = *splits[s];
      if (!d.float_targets()) {
        for (int32_t l : d.labels.span<int32_t>()) max_label = std::max<int64_t>(max_label, l);
        continue;
      }
      if (d.targets() != 1)
        throw data_error(std::string("data: the ") + names[s] + " split has " +
                         std::to_string(d.targets()) +
                         " float targets per example; class labels need exactly 1");
      const auto v = d.labels.span<float>();
      tensor out = tensor::uninitialized({d.size()}, dtype::i32);
      int32_t* y = out.data<int32_t>();
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!(v[i] >= 0) || v[i] != std::floor(v[i]) || v[i] >= 2147483648.0f)
          throw data_error(std::string("data: the ") + names[s] + " split's target " +
                           std::to_string(v[i]) + " at row " + std::to_string(i) +
                           " is not a class label (a whole number >= 0 and < 2^31)");
        y[i] = static_cast<int32_t>(v[i]);
        max_label = std::max<int64_t>(max_label, y[i]);
      }
      d.labels = std::move(out);
    }
    const int64_t c = classes > 0 ? classes : max_label + 1;
    for (int s = 0; s < 2; ++s) {
      check_classes(*splits[s], c, std::string("data: the ") + names[s] + " split");
      splits[s]->classes = c;
    }
    if (kind == label_kind::classes) return;
    for (dataset* d : splits) {
      tensor out({d->size(), c}, dtype::f32);
      const auto y = d->labels.span<int32_t>();
      float* p = out.f32();
      for (std::size_t i = 0; i < y.size(); ++i) p[i * static_cast<std::size_t>(c) + y[i]] = 1.f;
      d->labels = std::move(out);
    }
    return;
  }
  for (dataset* d : splits) {
    if (d->float_targets()) {
      d->classes = 0;
      continue;
    }
    const auto y = d->labels.span<int32_t>();
    tensor out = tensor::uninitialized({d->size(), 1}, dtype::f32);
    float* p = out.f32();
    for (std::size_t i = 0; i < y.size(); ++i) p[i] = static_cast<float>(y[i]);
    d->labels = std::move(out);
    d->classes = 0;
  }
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (n < 0) throw std::invalid_argument("epoch_order: negative size " + std::to_string(n));
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  if (!shuffle || n < 2) return order;
  uint64_t mix = seed;
  uint64_t a = splitmix64(mix);
  uint64_t e = static_cast<uint64_t>(epoch) ^ 0x5851f42d4c957f2dULL;
  uint64_t b = splitmix64(e);
  xoshiro256ss rng(a ^ (b * 0xd1342543de82ef95ULL));
  for (std::size_t i = order.size() - 1; i > 0; --i) {
    auto j = static_cast<std::size_t>(rng.below(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

void prepare_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y) {
  const int64_t k = static_cast<int64_t>(idx.size());
  const int64_t f = d.features();
  const int64_t n = d.size();
  for (int64_t i : idx)
    if (i < 0 || i >= n)
      throw data_error("gather_batch: index " + std::to_string(i) +
                       " out of range for a dataset of " + std::to_string(n) + " examples");
  // Every element is written by gather_rows: no zero-fill (it cost as much as
  // the copy).
  if (x.type() != dtype::f32 || x.shape() != shape_t{k, f})
    x = tensor::uninitialized({k, f}, dtype::f32);
  if (d.float_targets()) {
    const int64_t targets = d.targets();
    if (y.type() != dtype::f32 || y.shape() != shape_t{k, targets})
      y = tensor::uninitialized({k, targets}, dtype::f32);
  } else if (y.type() != dtype::i32 || y.shape() != shape_t{k}) {
    y = tensor::uninitialized({k}, dtype::i32);
  }
}

void gather_rows(const dataset& d, std::span<const int64_t> idx, int64_t begin, int64_t end,
                 tensor& x, tensor& y) {
  const auto uf = static_cast<std::size_t>(d.features());
  float* xd = x.f32();
  const auto row = [&](int64_t r) {
    return static_cast<std::size_t>(idx[static_cast<std::size_t>(r)]);
  };
  if (d.float_targets()) {
    // Float targets [N, K]: rows like the examples'.
    const auto uk = static_cast<std::size_t>(d.targets());
    const float* targets = d.labels.f32();
    float* yd = y.f32();
    for (int64_t r = begin; r < end; ++r)
      std::memcpy(yd + static_cast<std::size_t>(r) * uk, targets + row(r) * uk, uk * sizeof(float));
  }
  // Class labels: copied with the rows below; for float targets, a scratch
  // pointer the loops never dereference.
  const bool ints = !d.float_targets();
  const int32_t* labels = ints ? d.labels.data<int32_t>() : nullptr;
  int32_t* yd = ints ? y.data<int32_t>() : nullptr;
  if (!d.codes.empty()) {
    // Rows are random: fetch a few rows ahead, the hardware prefetcher
    // cannot guess the next one.
    constexpr int64_t ahead = 4;
    const int64_t k = static_cast<int64_t>(idx.size());
    const uint8_t* codes = d.codes.data();
    const float* decode = d.decode.data();
    for (int64_t r = begin; r < end; ++r) {
      if (r + ahead < k) {
        const uint8_t* next = codes + row(r + ahead) * uf;
        for (std::size_t c = 0; c < uf; c += 64) __builtin_prefetch(next + c);
        if (ints) __builtin_prefetch(labels + row(r + ahead));
      }
      const uint8_t* src = codes + row(r) * uf;
      float* out = xd + static_cast<std::size_t>(r) * uf;
      kernels::decode_bytes(src, decode, out, uf);
      if (ints) yd[r] = labels[row(r)];
    }
    return;
  }
  const float* src = d.images.f32();
  for (int64_t r = begin; r < end; ++r) {
    if (uf)
      std::memcpy(xd + static_cast<std::size_t>(r) * uf, src + row(r) * uf, uf * sizeof(float));
    if (ints) yd[r] = labels[row(r)];
  }
}

void gather_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y) {
  prepare_batch(d, idx, x, y);
  gather_rows(d, idx, 0, static_cast<int64_t>(idx.size()), x, y);
}

}  // namespace troupe::data
