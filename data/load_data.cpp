// Loading a job's data (data/dataset.hpp): load_data and its checks, from
// IDX (Fashion-MNIST), .npy, .npz or CSV files, into datasets of floats and
// labels.
#include "data/dataset.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>

#include <sys/mman.h>

#include "data/csv.hpp"
#include "data/npy.hpp"
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
      throw data_error(
          paths.labels + ": label " + std::to_string(l) + " at index " + std::to_string(i) +
          " is out of range (expected 0.." + std::to_string(classes - 1) +
          (classes != 10 ? ", data.classes is " + std::to_string(classes) : std::string()) + ")");
  }
  return s;
}

// d.codes = bytes [src, src + count), its memory advised into transparent
// huge pages first (where the kernel takes advice): the gathers fetch rows
// at random, one 4 KB page each, and a page walk per row is a large part of
// a row's fetch.
void keep_codes_of(dataset& d, const uint8_t* src, std::size_t count) {
  d.codes.clear();
  d.codes.shrink_to_fit();
  d.codes.reserve(count);  // allocated, not yet touched
#ifdef MADV_HUGEPAGE
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(d.codes.data());
  const std::uintptr_t first = (begin + huge - 1) & ~(huge - 1),
                       last = (begin + count) & ~(huge - 1);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
  d.codes.assign(src, src + count);
}

// Converts into d, reusing d's tensors when they already have the right shape
// (allocated ahead of time on another thread). keep_codes: whether d keeps
// the bytes for gather_batch; the test split is evaluated whole from its
// floats, so its bytes would only take memory.
void convert(const raw_split& s, const std::array<float, 256>& lut, int64_t classes, dataset& d,
             bool keep_codes) {
  d.classes = classes;
  // Images [N, rows, cols] have one channel, written first.
  const auto& dims = s.images.dims;
  d.example_shape.assign(dims.begin() + 1, dims.end());
  if (dims.size() == 3) d.example_shape.insert(d.example_shape.begin(), 1);
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
    keep_codes_of(d, src, count);
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

}  // namespace

train_test load_fashion_mnist(const troupe::data_config& cfg) {
  const int64_t classes = cfg.classes > 0 ? cfg.classes : 10;
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

namespace {

// One split's arrays, whatever the format, with the names errors use.
struct split_arrays {
  npy_array x, y;
  std::string x_name, y_name;
};

std::string dims_text(const std::vector<int64_t>& dims) {
  return shape_string(dims);
}

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // unaligned inside an inflated member; little-endian host
  return v;
}

double element(const npy_array& a, std::size_t i) {
  const uint8_t* p = a.data + i * npy_itemsize(a.type);
  switch (a.type) {
    case npy_dtype::f4:
      return load_le<float>(p);
    case npy_dtype::f8:
      return load_le<double>(p);
    case npy_dtype::u1:
      return *p;
    case npy_dtype::i4:
      return load_le<int32_t>(p);
    case npy_dtype::i8:
      return static_cast<double>(load_le<int64_t>(p));
  }
  return 0;
}

int64_t int_element(const npy_array& a, std::size_t i) {
  const uint8_t* p = a.data + i * npy_itemsize(a.type);
  switch (a.type) {
    case npy_dtype::u1:
      return *p;
    case npy_dtype::i4:
      return load_le<int32_t>(p);
    case npy_dtype::i8:
      return load_le<int64_t>(p);
    default:
      return 0;
  }
}

// "nan", "-inf", "1e+39": a value as the user would print it.
std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// As the CSV reader does: a value of a float array that is not finite or
// is beyond float32's range is refused, naming the array, its row and its
// column (the flat position within the row). `count` values, `per_row` a row.
void check_finite(const npy_array& a, std::size_t count, int64_t per_row, const std::string& name) {
  if (!npy_is_float(a.type)) return;
  for (std::size_t i = 0; i < count; ++i) {
    const double v = element(a, i);
    if (std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max()) continue;
    const auto row = static_cast<int64_t>(i) / per_row, column = static_cast<int64_t>(i) % per_row;
    throw data_error(name + ": row " + std::to_string(row) + ", column " + std::to_string(column) +
                     ": expected a finite number within float32's range, got " + fmt_double(v));
  }
}

// x's shape: [N, ...] with at least one feature.
void check_examples(const npy_array& x, const std::string& name) {
  if (x.dims.empty())
    throw data_error(name + ": expected an array of examples [N, ...], got a scalar (shape ())");
  if (x.dims.size() > 1 && features_of(x.dims) == 0)
    throw data_error(name + ": examples of shape " + dims_text(x.dims) + " have no features");
}

std::vector<int64_t> example_shape_of(const std::vector<int64_t>& dims) {
  if (dims.size() <= 1) return {1};
  return {dims.begin() + 1, dims.end()};
}

// The examples of s (its first n) into d.images, and d.codes when asked.
void set_examples(const split_arrays& s, int64_t n, bool may_map, const std::array<float, 256>& lut,
                  bool keep_codes, dataset& d) {
  const npy_array& x = s.x;
  const int64_t f = x.dims.size() <= 1 ? 1 : features_of(x.dims);
  d.example_shape = example_shape_of(x.dims);
  const auto count = static_cast<std::size_t>(n * f);
  check_finite(x, count, f, s.x_name);
  if (may_map && x.type == npy_dtype::f4 && reinterpret_cast<std::uintptr_t>(x.data) % 64 == 0) {
    // The tensor keeps the mapping alive: it is unmapped when the last
    // tensor (or batch sharing it) is gone.
    d.images = tensor::wrap({n, f}, dtype::f32,
                            std::shared_ptr<void>(x.owner, const_cast<uint8_t*>(x.data)));
    return;
  }
  d.images = tensor::uninitialized({n, f}, dtype::f32);
  float* out = d.images.f32();
  if (count == 0) return;
  switch (x.type) {
    case npy_dtype::f4:
      std::memcpy(out, x.data, count * sizeof(float));
      break;
    case npy_dtype::u1:
      kernels::decode_bytes(x.data, lut.data(), out, count);
      if (keep_codes) {
        keep_codes_of(d, x.data, count);
        d.decode = lut;
      }
      break;
    default:
      for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<float>(element(x, i));
  }
}

struct label_range {
  bool any = false;
  int64_t max = -1;
};

// The labels of s (its first n) into d.labels: int32 classes or float32
// targets by y's dtype.
void set_labels(const split_arrays& s, int64_t n, dataset& d, label_range& range) {
  const npy_array& y = s.y;
  if (y.dims.empty())
    throw data_error(s.y_name + ": expected labels [N] or [N, K], got a scalar (shape ())");
  if (y.dims[0] != s.x.dims[0])
    throw data_error(s.x_name + ": holds " + std::to_string(s.x.dims[0]) + " examples but " +
                     s.y_name + " holds " + std::to_string(y.dims[0]) + " labels");
  if (npy_is_float(y.type)) {
    if (y.dims.size() > 2)
      throw data_error(s.y_name + ": expected float targets of shape [N] or [N, K], got " +
                       dims_text(y.dims));
    const int64_t k = y.dims.size() == 2 ? y.dims[1] : 1;
    if (k == 0)
      throw data_error(s.y_name + ": float targets of shape " + dims_text(y.dims) +
                       " have no values per example");
    d.labels = tensor::uninitialized({n, k}, dtype::f32);
    float* out = d.labels.f32();
    const auto count = static_cast<std::size_t>(n * k);
    check_finite(y, count, k, s.y_name);
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<float>(element(y, i));
    d.classes = 0;
    return;
  }
  if (y.dims.size() > 2 || (y.dims.size() == 2 && y.dims[1] != 1))
    throw data_error(s.y_name + ": expected integer class labels of shape [N] or [N, 1], got " +
                     dims_text(y.dims) + " (float targets [N, K] need a float dtype)");
  d.labels = tensor::uninitialized({n}, dtype::i32);
  int32_t* out = d.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = int_element(y, static_cast<std::size_t>(i));
    if (v < 0)
      throw data_error(s.y_name + ": label " + std::to_string(v) + " at row " + std::to_string(i) +
                       " is negative (class labels are 0, 1, ...)");
    if (v > std::numeric_limits<int32_t>::max())
      throw data_error(s.y_name + ": label " + std::to_string(v) + " at row " + std::to_string(i) +
                       " is too large (class labels must be < 2^31)");
    out[i] = static_cast<int32_t>(v);
    range.any = true;
    range.max = std::max(range.max, v);
  }
}

train_test from_arrays(const data_config& cfg, split_arrays train, split_arrays test) {
  check_examples(train.x, train.x_name);
  check_examples(test.x, test.x_name);
  if (example_shape_of(train.x.dims) != example_shape_of(test.x.dims))
    throw data_error(test.x_name + ": examples of shape " +
                     dims_text(example_shape_of(test.x.dims)) + ", the training examples (" +
                     train.x_name + ") are " + dims_text(example_shape_of(train.x.dims)));
  const bool train_bytes = train.x.type == npy_dtype::u1, test_bytes = test.x.type == npy_dtype::u1;
  if (train_bytes != test_bytes)
    throw data_error(test.x_name + ": examples of dtype '" + npy_descr(test.x.type) +
                     "', the training examples (" + train.x_name + ") are '" +
                     npy_descr(train.x.type) + "'; bytes are scaled to [0,1], other types are not");
  if (npy_is_float(train.y.type) != npy_is_float(test.y.type))
    throw data_error(test.y_name + ": labels of dtype '" + npy_descr(test.y.type) +
                     "', the training labels (" + train.y_name + ") are '" +
                     npy_descr(train.y.type) + "': both must be class labels or float targets");
  const int64_t n_train = limited(train.x.dims[0], cfg.train_limit);
  const int64_t n_test = limited(test.x.dims[0], cfg.test_limit);

  train_test r;
  std::array<float, 256> lut{};
  double mean = 0, sd = 1;
  if (train_bytes && cfg.normalize) {
    const int64_t f = train.x.dims.size() <= 1 ? 1 : features_of(train.x.dims);
    byte_stats(train.x.data, static_cast<std::size_t>(n_train * f), mean, sd);
    r.mean = static_cast<float>(mean);
    r.stddev = static_cast<float>(sd);
  }
  for (std::size_t v = 0; v < 256; ++v)
    lut[v] = static_cast<float>((static_cast<double>(v) / 255.0 - mean) / sd);
  const bool may_map = !cfg.standardize;
  set_examples(train, n_train, may_map, lut, true, r.train);
  set_examples(test, n_test, may_map, lut, false, r.test);
  label_range range;
  set_labels(train, n_train, r.train, range);
  set_labels(test, n_test, r.test, range);
  if (!r.train.float_targets()) {
    const int64_t classes = cfg.classes > 0 ? cfg.classes : range.max + 1;
    check_classes(r.train, classes, train.y_name);
    check_classes(r.test, classes, test.y_name);
    r.train.classes = r.test.classes = classes;
  }
  return r;
}

split_arrays npy_split(const data_split_files& f) {
  split_arrays s;
  s.x_name = f.x;
  s.y_name = f.y;
  s.x = read_npy(f.x);
  s.y = read_npy(f.y);
  return s;
}

split_arrays npz_split(const data_config& cfg, const data_split_files& f) {
  split_arrays s;
  auto arrays = read_npz(f.file, {cfg.x_key, cfg.y_key});
  s.x = std::move(arrays[0]);
  s.y = std::move(arrays[1]);
  s.x_name = f.file + ": array '" + cfg.x_key + "'";
  s.y_name = f.file + ": array '" + cfg.y_key + "'";
  return s;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool as_integer(std::string_view s, int64_t& v) {
  s = trimmed(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

bool as_number(std::string_view s, double& v) {
  s = trimmed(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size() && std::isfinite(v);
}

train_test load_csv(const data_config& cfg) {
  const std::string& train_path = cfg.train.file;
  const std::string& test_path = cfg.test.file;
  csv_table train = read_csv(train_path, cfg.label);
  csv_table test = read_csv(test_path, cfg.label);
  if (test.feature_names != train.feature_names)
    throw data_error(test_path + ": its feature columns differ from those of " + train_path + " (" +
                     std::to_string(test.feature_names.size()) + " and " +
                     std::to_string(train.feature_names.size()) +
                     " columns; both need the same columns in the same order)");
  const int64_t n_train = limited(train.rows, cfg.train_limit);
  const int64_t n_test = limited(test.rows, cfg.test_limit);
  const auto f = static_cast<int64_t>(train.feature_names.size());
  const std::pair<csv_table*, const std::string*> splits[] = {{&train, &train_path},
                                                              {&test, &test_path}};
  // The label column's kind, over the rows used of both splits.
  bool integers = true, numbers = true;
  for (const auto& [t, path] : splits) {
    const int64_t n = t == &train ? n_train : n_test;
    for (int64_t i = 0; i < n; ++i) {
      const std::string& cell = t->labels[static_cast<std::size_t>(i)];
      if (trimmed(cell).empty())
        throw data_error(*path + ": line " +
                         std::to_string(t->label_lines[static_cast<std::size_t>(i)]) +
                         ", column \"" + cfg.label + "\": empty label");
      int64_t iv = 0;
      double dv = 0;
      if (integers && !as_integer(cell, iv)) integers = false;
      if (numbers && !as_number(cell, dv)) numbers = false;
    }
  }
  train_test r;
  std::vector<std::string> names;
  if (!numbers) {
    for (const auto& [t, path] : splits)
      for (int64_t i = 0; i < (t == &train ? n_train : n_test); ++i)
        names.push_back(t->labels[static_cast<std::size_t>(i)]);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
  }
  int64_t max_label = -1;
  for (const auto& [t, path] : splits) {
    const bool is_train = t == &train;
    const int64_t n = is_train ? n_train : n_test;
    dataset& d = is_train ? r.train : r.test;
    d.example_shape = {f};
    d.images = tensor::uninitialized({n, f}, dtype::f32);
    if (n * f > 0)
      std::memcpy(d.images.f32(), t->features.data(),
                  static_cast<std::size_t>(n * f) * sizeof(float));
    if (integers || !numbers) {
      d.labels = tensor::uninitialized({n}, dtype::i32);
      int32_t* y = d.labels.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) {
        const std::string& cell = t->labels[static_cast<std::size_t>(i)];
        int64_t v = 0;
        if (integers) {
          as_integer(cell, v);
          const std::string where = *path + ": line " +
                                    std::to_string(t->label_lines[static_cast<std::size_t>(i)]) +
                                    ", column \"" + cfg.label + "\": label " + std::to_string(v);
          if (v < 0) throw data_error(where + " is negative (class labels are 0, 1, ...)");
          if (v > std::numeric_limits<int32_t>::max())
            throw data_error(where + " is too large (class labels must be < 2^31)");
        } else {
          v = std::lower_bound(names.begin(), names.end(), cell) - names.begin();
        }
        y[i] = static_cast<int32_t>(v);
        max_label = std::max(max_label, v);
      }
    } else {
      d.labels = tensor::uninitialized({n, 1}, dtype::f32);
      float* y = d.labels.f32();
      for (int64_t i = 0; i < n; ++i) {
        double v = 0;
        as_number(t->labels[static_cast<std::size_t>(i)], v);
        y[i] = static_cast<float>(v);
      }
      d.classes = 0;
    }
  }
  if (!r.train.float_targets()) {
    const int64_t classes = cfg.classes > 0 ? cfg.classes : max_label + 1;
    if (!names.empty() && classes < static_cast<int64_t>(names.size()))
      throw data_error(train_path + ": the label column \"" + cfg.label + "\" names " +
                       std::to_string(names.size()) +
                       " classes over both splits, data.classes is " + std::to_string(classes));
    std::vector<int64_t> train_lines(train.label_lines.begin(),
                                     train.label_lines.begin() + n_train);
    std::vector<int64_t> test_lines(test.label_lines.begin(), test.label_lines.begin() + n_test);
    check_classes(r.train, classes, train_path, &train_lines);
    check_classes(r.test, classes, test_path, &test_lines);
    r.train.classes = r.test.classes = classes;
  }
  r.class_names = std::move(names);
  return r;
}

}  // namespace

void check_data_files(const troupe::data_config& cfg) {
  if (cfg.format == "idx") return;  // load_fashion_mnist names its missing files
  auto check = [](const std::string& path, const std::string& key) {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) throw config_error(key, "file not found: " + path);
    if (fs::is_directory(st)) throw config_error(key, "expected a file, got a directory: " + path);
  };
  for (const auto& [files, key] : {std::pair{&cfg.train, std::string("data.train")},
                                   std::pair{&cfg.test, std::string("data.test")}}) {
    if (cfg.format == "npy") {
      check(files->x, key + ".x");
      check(files->y, key + ".y");
    } else {
      check(files->file, key);
    }
  }
}

train_test load_data(const troupe::data_config& cfg) {
  check_data_files(cfg);
  train_test r;
  if (cfg.format == "idx") {
    r = load_fashion_mnist(cfg);
  } else if (cfg.format == "npy") {
    // In sequence, so that the training files' errors come first.
    split_arrays train = npy_split(cfg.train);
    split_arrays test = npy_split(cfg.test);
    r = from_arrays(cfg, std::move(train), std::move(test));
  } else if (cfg.format == "npz") {
    split_arrays train = npz_split(cfg, cfg.train);
    split_arrays test = npz_split(cfg, cfg.test);
    r = from_arrays(cfg, std::move(train), std::move(test));
  } else if (cfg.format == "csv") {
    r = load_csv(cfg);
  } else {
    throw config_error("data.format", "expected one of \"idx\", \"npy\", \"npz\", \"csv\", got \"" +
                                          cfg.format + "\"");
  }
  if (cfg.standardize) standardize(r);
  return r;
}

}  // namespace troupe::data
