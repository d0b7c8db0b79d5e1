#include "data/dataset.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>

#include "kernels/cpu_kernels.hpp"

namespace troupe::data {

namespace {

namespace fs = std::filesystem;

std::string find_file(const std::string& dir, const std::string& base) {
  fs::path gz = fs::path(dir) / (base + ".gz");
  fs::path plain = fs::path(dir) / base;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  throw data_error(gz.string() + ": missing file (neither it nor " + plain.string() +
                   " exists); the Debian package dataset-fashion-mnist provides it, or set "
                   "data.path to a directory holding the Fashion-MNIST IDX files");
}

struct split_paths {
  std::string images, labels;
};

split_paths locate(const std::string& dir, const std::string& prefix) {
  return {find_file(dir, prefix + "-images-idx3-ubyte"),
          find_file(dir, prefix + "-labels-idx1-ubyte")};
}

struct raw_split {
  split_paths paths;
  idx_array images, labels;
  int64_t n = 0, features = 0;
};

int64_t features_of(const std::vector<int64_t>& dims) {
  int64_t f = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) f *= dims[i];
  return f;
}

int64_t limited(int64_t n, int64_t limit) {
  return limit > 0 && limit < n ? limit : n;
}

raw_split read_split(const split_paths& paths, int64_t limit, int64_t classes) {
  raw_split s;
  s.paths = paths;
  s.images = read_idx(paths.images);
  s.labels = read_idx(paths.labels);
  if (s.images.dims.size() < 2)
    throw data_error(paths.images + ": expected images of rank >= 2 ([N, rows, cols]), got " +
                     shape_string(s.images.dims));
  if (s.labels.dims.size() != 1)
    throw data_error(paths.labels + ": expected labels of rank 1 ([N]), got " +
                     shape_string(s.labels.dims));
  if (s.images.dims[0] != s.labels.dims[0])
    throw data_error(paths.images + ": holds " + std::to_string(s.images.dims[0]) + " images but " +
                     paths.labels + " holds " + std::to_string(s.labels.dims[0]) + " labels");
  s.n = limited(s.images.dims[0], limit);
  s.features = features_of(s.images.dims);
  for (int64_t i = 0; i < s.n; ++i) {
    uint8_t l = s.labels.bytes[static_cast<std::size_t>(i)];
    if (l >= classes)
      throw data_error(paths.labels + ": label " + std::to_string(l) + " at index " +
                       std::to_string(i) + " is out of range (expected 0.." +
                       std::to_string(classes - 1) + ")");
  }
  return s;
}

// Converts into d, reusing d's tensors when they already have the right shape
// (allocated ahead of time on another thread). keep_codes: whether d keeps
// the bytes for gather_batch; the test split is evaluated whole from its
// floats, so its bytes would only take memory.
void convert(const raw_split& s, const std::array<float, 256>& lut, int64_t classes, dataset& d,
             bool keep_codes) {
  d.classes = classes;
  if (d.images.type() != dtype::f32 || d.images.shape() != shape_t{s.n, s.features})
    d.images = tensor({s.n, s.features}, dtype::f32);
  if (d.labels.type() != dtype::i32 || d.labels.shape() != shape_t{s.n})
    d.labels = tensor({s.n}, dtype::i32);
  if (s.n == 0) return;
  float* x = d.images.f32();
  const uint8_t* src = s.images.bytes.data();
  const std::size_t count = static_cast<std::size_t>(s.n * s.features);
  kernels::decode_bytes(src, lut.data(), x, count);
  if (keep_codes) {
    d.codes.assign(src, src + count);
    d.decode = lut;
  }
  int32_t* y = d.labels.data<int32_t>();
  for (int64_t i = 0; i < s.n; ++i) y[i] = s.labels.bytes[static_cast<std::size_t>(i)];
}

// Exact mean and (population) stddev of bytes/255, from a histogram.
void byte_stats(const uint8_t* p, std::size_t n, double& mean, double& sd) {
  std::array<std::array<uint64_t, 256>, 4> h{};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h[0][p[i]];
    ++h[1][p[i + 1]];
    ++h[2][p[i + 2]];
    ++h[3][p[i + 3]];
  }
  for (; i < n; ++i) ++h[0][p[i]];
  double sum = 0, sumsq = 0;
  for (std::size_t v = 0; v < 256; ++v) {
    double c = static_cast<double>(h[0][v] + h[1][v] + h[2][v] + h[3][v]);
    double x = static_cast<double>(v) / 255.0;
    sum += c * x;
    sumsq += c * x * x;
  }
  mean = n ? sum / static_cast<double>(n) : 0.0;
  double var = n ? sumsq / static_cast<double>(n) - mean * mean : 0.0;
  sd = var > 1e-12 ? std::sqrt(var) : 1.0;
}

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

train_test load_fashion_mnist(const troupe::data_config& cfg) {
  constexpr int64_t classes = 10;
  // Locate all four files first, so a missing one is reported before any work.
  const split_paths train_paths = locate(cfg.path, "train");
  const split_paths test_paths = locate(cfg.path, "t10k");

  // The training images are most of the work (inflating ~47 MB). While this
  // thread does that, a helper reads the test set and allocates (page-faults)
  // the training tensors.
  struct side_work {
    raw_split test;
    dataset train;
  };
  auto helper = std::async(std::launch::async, [&] {
    side_work w;
    std::vector<int64_t> dims = read_idx_dims(train_paths.images);
    if (dims.size() >= 2) {
      int64_t n = limited(dims[0], cfg.train_limit);
      w.train.images = tensor({n, features_of(dims)}, dtype::f32);
      w.train.labels = tensor({n}, dtype::i32);
    }
    w.test = read_split(test_paths, cfg.test_limit, classes);
    return w;
  });
  raw_split train = read_split(train_paths, cfg.train_limit, classes);
  side_work side = helper.get();
  const raw_split& test = side.test;
  if (train.features != test.features)
    throw data_error(test.paths.images + ": images have " + std::to_string(test.features) +
                     " features, the training images (" + train.paths.images + ") have " +
                     std::to_string(train.features));

  train_test r;
  std::array<float, 256> lut{};
  double mean = 0, sd = 1;
  if (cfg.normalize) {
    byte_stats(train.images.bytes.data(), static_cast<std::size_t>(train.n * train.features), mean,
               sd);
    r.mean = static_cast<float>(mean);
    r.stddev = static_cast<float>(sd);
  }
  for (std::size_t v = 0; v < 256; ++v)
    lut[v] = static_cast<float>((static_cast<double>(v) / 255.0 - mean) / sd);
  r.train = std::move(side.train);
  convert(train, lut, classes, r.train, true);
  convert(test, lut, classes, r.test, false);
  return r;
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
  if (y.type() != dtype::i32 || y.shape() != shape_t{k}) y = tensor::uninitialized({k}, dtype::i32);
}

void gather_rows(const dataset& d, std::span<const int64_t> idx, int64_t begin, int64_t end,
                 tensor& x, tensor& y) {
  const auto uf = static_cast<std::size_t>(d.features());
  const int32_t* labels = d.labels.data<int32_t>();
  float* xd = x.f32();
  int32_t* yd = y.data<int32_t>();
  const auto row = [&](int64_t r) {
    return static_cast<std::size_t>(idx[static_cast<std::size_t>(r)]);
  };
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
      }
      const uint8_t* src = codes + row(r) * uf;
      float* out = xd + static_cast<std::size_t>(r) * uf;
      kernels::decode_bytes(src, decode, out, uf);
      yd[r] = labels[row(r)];
    }
    return;
  }
  const float* src = d.images.f32();
  for (int64_t r = begin; r < end; ++r) {
    if (uf)
      std::memcpy(xd + static_cast<std::size_t>(r) * uf, src + row(r) * uf, uf * sizeof(float));
    yd[r] = labels[row(r)];
  }
}

void gather_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y) {
  prepare_batch(d, idx, x, y);
  gather_rows(d, idx, 0, static_cast<int64_t>(idx.size()), x, y);
}

}  // namespace troupe::data
