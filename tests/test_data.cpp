#include <doctest/doctest.h>
#include <zlib.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/csv.hpp"
#include "data/dataset.hpp"
#include "data/idx.hpp"
#include "data/npy.hpp"
#include "tests/fixtures.hpp"
#include "tests/fuzz/mutate.hpp"
#include "tests/fuzz/targets.hpp"
#include "tests/skip.hpp"

namespace fs = std::filesystem;
using namespace troupe;
using namespace troupe::data;

namespace {

using test::temp_dir;

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_gz_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  REQUIRE(gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

// The message of the data_error that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const data_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<uint8_t> iota_bytes(std::size_t n, int mul = 1) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<uint8_t>(i * static_cast<std::size_t>(mul));
  return v;
}

}  // namespace

TEST_CASE("IDX round trip, plain and gzip") {
  temp_dir dir;
  const std::vector<int64_t> dims = {3, 2, 5};
  const auto bytes = iota_bytes(30, 7);
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string path = dir / (gz ? "a.idx.gz" : "a.idx");
    write_idx(path, dims, bytes, gz);
    auto raw = read_raw(path);
    REQUIRE(raw.size() >= 2);
    CHECK((raw[0] == 0x1f && raw[1] == 0x8b) == gz);
    idx_array a = read_idx(path);
    CHECK(a.dims == dims);
    CHECK(a.bytes == bytes);
  }
  // Plain layout: magic 00 00 08 03 and big-endian dims.
  auto raw = read_raw(dir / "a.idx");
  CHECK(raw.size() == 4 + 12 + 30);
  CHECK(std::vector<uint8_t>(raw.begin(), raw.begin() + 8) ==
        std::vector<uint8_t>{0, 0, 8, 3, 0, 0, 0, 3});
  // A mismatched write is refused.
  CHECK(contains(error_of([&] {
                   write_idx(dir / "b.idx", {2, 2}, iota_bytes(5), false);
                 }),
                 "4 elements"));
}

TEST_CASE("IDX: truncated files are reported") {
  temp_dir dir;
  SUBCASE("plain, short data") {
    const std::string path = dir / "t.idx";
    write_idx(path, {4, 3}, iota_bytes(12), false);
    fs::resize_file(path, fs::file_size(path) - 5);
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, path));
    CHECK(contains(msg, "truncated"));
    CHECK(contains(msg, "expected 12 bytes of data, file has 7"));
  }
  SUBCASE("plain, short header") {
    const std::string path = dir / "h.idx";
    write_raw(path, {0, 0, 8, 3, 0, 0, 0, 1, 0, 0});
    CHECK(contains(error_of([&] { read_idx(path); }), "truncated"));
    write_raw(path, {0, 0});
    CHECK(contains(error_of([&] { read_idx(path); }), "truncated"));
    write_raw(path, {});
    CHECK(contains(error_of([&] { read_idx(path); }), "truncated"));
  }
  SUBCASE("gzip, valid stream with short data") {
    const std::string path = dir / "t.idx.gz";
    write_gz_raw(path, {0, 0, 8, 1, 0, 0, 0, 10, 1, 2, 3, 4});
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, "truncated"));
    CHECK(contains(msg, "expected 10 bytes of data"));
    CHECK(contains(msg, "has 4"));
  }
  SUBCASE("gzip, cut-off compressed stream") {
    const std::string path = dir / "c.idx.gz";
    std::vector<uint8_t> noise(20000);
    uint32_t s = 12345;
    for (auto& b : noise) b = static_cast<uint8_t>((s = s * 1103515245u + 12345u) >> 24);
    write_idx(path, {20000}, noise, true);
    fs::resize_file(path, fs::file_size(path) / 2);
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, path));
    CHECK(contains(msg, "truncated"));
  }
}

TEST_CASE("IDX: bad magic, element type, trailing garbage, corrupt gzip, missing file") {
  temp_dir dir;
  SUBCASE("wrong magic shows the bytes found and expected") {
    const std::string path = dir / "zip.idx";
    write_raw(path, {0x50, 0x4b, 0x03, 0x04, 1, 2, 3, 4});
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, path));
    CHECK(contains(msg, "not an IDX file"));
    CHECK(contains(msg, "50 4b 03 04"));
    CHECK(contains(msg, "00 00 08"));
  }
  SUBCASE("unsupported element type") {
    const std::string path = dir / "f.idx";
    write_raw(path, {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0});
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, "unsupported"));
    CHECK(contains(msg, "0x0d"));
  }
  SUBCASE("trailing garbage") {
    const std::string path = dir / "g.idx";
    write_raw(path, {0, 0, 8, 1, 0, 0, 0, 2, 7, 7, 9, 9, 9});
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, "trailing garbage"));
    CHECK(contains(msg, "3 bytes"));
  }
  SUBCASE("corrupt gzip") {
    const std::string path = dir / "x.idx.gz";
    write_idx(path, {4000}, iota_bytes(4000, 3), true);
    auto raw = read_raw(path);
    REQUIRE(raw.size() > 40);
    for (std::size_t i = 12; i < raw.size() - 8; i += 3) raw[i] ^= 0x5a;
    write_raw(path, raw);
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, path));
    CHECK((contains(msg, "corrupt gzip") || contains(msg, "truncated")));
  }
  SUBCASE("missing file") {
    const std::string path = dir / "nope.idx";
    std::string msg = error_of([&] { read_idx(path); });
    CHECK(contains(msg, path));
    CHECK(contains(msg, "cannot open"));
  }
}

namespace {

// Writes a tiny Fashion-MNIST-shaped data set (2x2 images).
struct tiny_set {
  temp_dir dir;
  std::vector<uint8_t> train_px, test_px, train_lab, test_lab;
  tiny_set(bool gz = true) {
    train_px = {0, 10, 20, 30, 255, 255, 0,  0,  100, 110, 120, 130,
                5, 6,  7,  8,  200, 0,   50, 60, 1,   2,   3,   4};
    train_lab = {0, 1, 2, 9, 4, 5};
    test_px = {9, 8, 7, 6, 50, 50, 50, 50, 255, 0, 255, 0};
    test_lab = {3, 9, 0};
    write("train", train_px, train_lab, gz);
    write("t10k", test_px, test_lab, gz);
  }
  void write(const std::string& prefix, const std::vector<uint8_t>& px,
             const std::vector<uint8_t>& lab, bool gz) {
    const std::string ext = gz ? ".gz" : "";
    for (const auto& name : {prefix + "-images-idx3-ubyte", prefix + "-labels-idx1-ubyte"}) {
      std::error_code ec;
      fs::remove(dir / name, ec);
      fs::remove(dir / (name + ".gz"), ec);
    }
    write_idx(dir / (prefix + "-images-idx3-ubyte" + ext), {static_cast<int64_t>(lab.size()), 2, 2},
              px, gz);
    write_idx(dir / (prefix + "-labels-idx1-ubyte" + ext), {static_cast<int64_t>(lab.size())}, lab,
              gz);
  }
  data_config config() const {
    data_config c;
    c.path = dir.path.string();
    return c;
  }
};

void stats(const std::vector<uint8_t>& px, std::size_t n, double& mean, double& sd) {
  double s = 0, s2 = 0;
  for (std::size_t i = 0; i < n; ++i) s += px[i] / 255.0;
  mean = s / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) s2 += (px[i] / 255.0 - mean) * (px[i] / 255.0 - mean);
  sd = std::sqrt(s2 / static_cast<double>(n));
}

}  // namespace

TEST_CASE("load_fashion_mnist on a tiny generated set") {
  tiny_set t;
  SUBCASE("normalized with training statistics") {
    train_test r = load_fashion_mnist(t.config());
    CHECK(r.train.size() == 6);
    CHECK(r.train.features() == 4);
    CHECK(r.test.size() == 3);
    CHECK(r.train.images.shape() == shape_t{6, 4});
    CHECK(r.train.labels.type() == dtype::i32);
    CHECK(r.train.classes == 10);
    double mean = 0, sd = 0;
    stats(t.train_px, t.train_px.size(), mean, sd);
    CHECK(r.mean == doctest::Approx(mean).epsilon(1e-6));
    CHECK(r.stddev == doctest::Approx(sd).epsilon(1e-6));
    for (std::size_t i = 0; i < t.train_px.size(); ++i)
      CHECK(r.train.images.f32()[i] == doctest::Approx((t.train_px[i] / 255.0 - mean) / sd));
    for (std::size_t i = 0; i < t.test_px.size(); ++i)
      CHECK(r.test.images.f32()[i] == doctest::Approx((t.test_px[i] / 255.0 - mean) / sd));
    // The normalized training set has mean 0 and stddev 1.
    double s = 0, s2 = 0;
    for (float v : r.train.images.span<float>()) s += v, s2 += double{v} * v;
    CHECK(s / 24 == doctest::Approx(0).epsilon(1e-5));
    CHECK(s2 / 24 == doctest::Approx(1).epsilon(1e-5));
    auto labels = r.train.labels.span<int32_t>();
    CHECK(std::vector<int32_t>(labels.begin(), labels.end()) ==
          std::vector<int32_t>{0, 1, 2, 9, 4, 5});
    auto test_labels = r.test.labels.span<int32_t>();
    CHECK(std::vector<int32_t>(test_labels.begin(), test_labels.end()) ==
          std::vector<int32_t>{3, 9, 0});
  }
  SUBCASE("without normalization, plain files") {
    t.write("train", t.train_px, t.train_lab, false);
    t.write("t10k", t.test_px, t.test_lab, false);
    auto c = t.config();
    c.normalize = false;
    train_test r = load_fashion_mnist(c);
    CHECK(r.mean == 0.0f);
    CHECK(r.stddev == 1.0f);
    CHECK(r.train.images.f32()[4] == doctest::Approx(1.0));
    CHECK(r.train.images.f32()[1] == doctest::Approx(10 / 255.0));
    CHECK(r.test.images.f32()[0] == doctest::Approx(9 / 255.0));
  }
  SUBCASE(".gz is preferred over the plain name") {
    auto other = t.train_lab;
    other[0] = 7;
    write_idx(t.dir / "train-labels-idx1-ubyte", {6}, other, false);
    train_test r = load_fashion_mnist(t.config());
    CHECK(r.train.labels.data<int32_t>()[0] == 0);
    fs::remove(t.dir / "train-labels-idx1-ubyte.gz");
    r = load_fashion_mnist(t.config());
    CHECK(r.train.labels.data<int32_t>()[0] == 7);
  }
  SUBCASE("limits keep the first N and statistics follow the limited set") {
    auto c = t.config();
    c.train_limit = 2;
    c.test_limit = 1;
    train_test r = load_fashion_mnist(c);
    CHECK(r.train.size() == 2);
    CHECK(r.test.size() == 1);
    double mean = 0, sd = 0;
    stats(t.train_px, 8, mean, sd);
    CHECK(r.mean == doctest::Approx(mean).epsilon(1e-6));
    CHECK(r.stddev == doctest::Approx(sd).epsilon(1e-6));
    CHECK(r.test.labels.data<int32_t>()[0] == 3);
    c.train_limit = 100;  // more than there is: all
    CHECK(load_fashion_mnist(c).train.size() == 6);
  }
  SUBCASE("a label out of range is an error naming the file and index") {
    auto lab = t.train_lab;
    lab[3] = 12;
    t.write("train", t.train_px, lab, true);
    std::string msg = error_of([&] { load_fashion_mnist(t.config()); });
    CHECK(contains(msg, "train-labels-idx1-ubyte.gz"));
    CHECK(contains(msg, "label 12"));
    CHECK(contains(msg, "index 3"));
  }
  SUBCASE("image and label counts must match") {
    write_idx(t.dir / "t10k-labels-idx1-ubyte.gz", {2}, {1, 2}, true);
    std::string msg = error_of([&] { load_fashion_mnist(t.config()); });
    CHECK(contains(msg, "3 images"));
    CHECK(contains(msg, "2 labels"));
  }
  SUBCASE("a missing file names the path and the Debian package") {
    fs::remove(t.dir / "t10k-images-idx3-ubyte.gz");
    std::string msg = error_of([&] { load_fashion_mnist(t.config()); });
    CHECK(contains(msg, t.dir / "t10k-images-idx3-ubyte.gz"));
    CHECK(contains(msg, "dataset-fashion-mnist"));
  }
}

TEST_CASE("epoch_order") {
  auto is_perm = [](std::vector<int64_t> v, int64_t n) {
    std::sort(v.begin(), v.end());
    std::vector<int64_t> id(static_cast<std::size_t>(n));
    std::iota(id.begin(), id.end(), 0);
    return v == id;
  };
  const int64_t n = 1000;
  auto a = epoch_order(n, 42, 0, true);
  CHECK(a.size() == 1000);
  CHECK(is_perm(a, n));
  CHECK(a == epoch_order(n, 42, 0, true));
  auto b = epoch_order(n, 42, 1, true);
  CHECK(is_perm(b, n));
  CHECK(a != b);
  CHECK(a != epoch_order(n, 43, 0, true));
  std::vector<int64_t> id(n);
  std::iota(id.begin(), id.end(), 0);
  CHECK(a != id);
  CHECK(epoch_order(n, 42, 0, false) == id);
  CHECK(epoch_order(n, 42, 5, false) == id);
  CHECK(epoch_order(0, 1, 0, true).empty());
  CHECK(epoch_order(1, 1, 0, true) == std::vector<int64_t>{0});
  // Pinned so that the order never silently changes (it must be the same on
  // every platform and across versions, or resumed runs would diverge).
  CHECK(epoch_order(10, 42, 0, true) == std::vector<int64_t>{6, 2, 8, 4, 0, 5, 1, 7, 9, 3});
  CHECK(epoch_order(10, 7, 3, true) == std::vector<int64_t>{7, 2, 5, 4, 1, 9, 0, 8, 6, 3});
  // Roughly uniform: every position sees many different values over epochs.
  std::set<int64_t> first;
  for (int64_t e = 0; e < 200; ++e) first.insert(epoch_order(10, 1, e, true)[0]);
  CHECK(first.size() == 10);
}

TEST_CASE("gather_batch") {
  dataset d;
  d.images = tensor::from<float>({4, 3}, {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32});
  d.labels = tensor::from<int32_t>({4}, {5, 6, 7, 8});
  tensor x, y;
  std::vector<int64_t> idx = {2, 0, 3};
  gather_batch(d, idx, x, y);
  CHECK(x.shape() == shape_t{3, 3});
  CHECK(y.shape() == shape_t{3});
  CHECK(x == tensor::from<float>({3, 3}, {20, 21, 22, 0, 1, 2, 30, 31, 32}));
  CHECK(y == tensor::from<int32_t>({3}, {7, 5, 8}));
  // Same shape: the buffers are reused.
  tensor keep_x = x, keep_y = y;
  std::vector<int64_t> idx2 = {1, 1, 1};
  gather_batch(d, idx2, x, y);
  CHECK(x.shares_buffer_with(keep_x));
  CHECK(y.shares_buffer_with(keep_y));
  CHECK(x == tensor::from<float>({3, 3}, {10, 11, 12, 10, 11, 12, 10, 11, 12}));
  // A smaller (last) batch reallocates.
  std::vector<int64_t> idx3 = {3};
  gather_batch(d, std::span<const int64_t>(idx3), x, y);
  CHECK(x.shape() == shape_t{1, 3});
  CHECK(x == tensor::from<float>({1, 3}, {30, 31, 32}));
  CHECK(y == tensor::from<int32_t>({1}, {8}));
  std::vector<int64_t> bad = {0, 4};
  CHECK(contains(error_of([&] { gather_batch(d, bad, x, y); }), "index 4 out of range"));
}

TEST_CASE("gather_batch decodes byte-coded rows bit for bit") {
  tiny_set t;
  for (int64_t limit : {0, 5}) {
    CAPTURE(limit);
    auto c = t.config();
    c.train_limit = limit;
    train_test r = load_fashion_mnist(c);
    const dataset& coded = r.train;
    REQUIRE(static_cast<int64_t>(coded.codes.size()) == coded.size() * coded.features());
    dataset plain = coded;  // the same examples without the byte path
    plain.codes.clear();
    // More rows than the prefetch distance, repeats and every row.
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < 3 * coded.size(); ++i) idx.push_back((i * 5 + 2) % coded.size());
    tensor xc, yc, xp, yp;
    gather_batch(coded, idx, xc, yc);
    gather_batch(plain, idx, xp, yp);
    CHECK(xc == xp);  // operator== compares bytes
    CHECK(yc == yp);
    for (std::size_t r0 = 0; r0 < idx.size(); ++r0)
      for (int64_t j = 0; j < coded.features(); ++j)
        CHECK(xc.f32()[static_cast<int64_t>(r0) * coded.features() + j] ==
              coded.images.f32()[idx[r0] * coded.features() + j]);
    std::vector<int64_t> bad = {0, coded.size()};
    CHECK(contains(error_of([&] { gather_batch(coded, bad, xc, yc); }), "out of range"));
  }
  // The test split is evaluated whole from its floats: no bytes kept for it.
  const auto both = load_fashion_mnist(t.config());
  CHECK(!both.train.codes.empty());
  CHECK(both.test.codes.empty());
  CHECK(both.test.images.numel() > 0);
}

TEST_CASE("the real Fashion-MNIST") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(fs::path(dir) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(dir) / "train-images-idx3-ubyte")) {
    test::skip_case("Fashion-MNIST not found in " + dir + " (install dataset-fashion-mnist)");
    return;
  }
  data_config c;
  c.path = dir;
  auto t0 = std::chrono::steady_clock::now();
  train_test r = load_fashion_mnist(c);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("loaded Fashion-MNIST in " << secs << " s");
  CHECK(r.train.images.shape() == shape_t{60000, 784});
  CHECK(r.train.labels.shape() == shape_t{60000});
  CHECK(r.test.images.shape() == shape_t{10000, 784});
  CHECK(r.test.labels.shape() == shape_t{10000});
  std::vector<int> train_counts(10), test_counts(10);
  bool in_range = true;
  for (int32_t l : r.train.labels.span<int32_t>()) {
    in_range = in_range && l >= 0 && l < 10;
    if (l >= 0 && l < 10) ++train_counts[static_cast<std::size_t>(l)];
  }
  for (int32_t l : r.test.labels.span<int32_t>()) {
    in_range = in_range && l >= 0 && l < 10;
    if (l >= 0 && l < 10) ++test_counts[static_cast<std::size_t>(l)];
  }
  CHECK(in_range);
  CHECK(train_counts == std::vector<int>(10, 6000));
  CHECK(test_counts == std::vector<int>(10, 1000));
  // The well-known statistics of the training pixels.
  CHECK(r.mean == doctest::Approx(0.2860).epsilon(0.001));
  CHECK(r.stddev == doctest::Approx(0.3530).epsilon(0.001));
}

TEST_CASE("IDX: a corrupt dimension is refused before anything is allocated") {
  temp_dir dir;
  // One flipped bit in the image count: 2^23 + 2 images of 28 x 28, 6.6 GB
  // (Fashion-MNIST's 60000 would become 8448608, 6.6 GB too).
  std::vector<uint8_t> img(2 * 28 * 28, 7);
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string path = dir / (gz ? "i.idx.gz" : "i.idx");
    write_idx(path, {2, 28, 28}, img, gz);
    auto raw = read_raw(path);
    if (gz) {
      const uint8_t head[] = {0, 0, 8, 3, 0, 0x80, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28};
      std::vector<uint8_t> plain(sizeof head + img.size(), 7);
      std::copy(std::begin(head), std::end(head), plain.begin());
      write_gz_raw(path, plain);
    } else {
      raw[5] ^= 0x80;
      write_raw(path, raw);
    }
    for (int which = 0; which < 2; ++which) {
      std::string msg = error_of([&] {
        if (which == 0)
          read_idx_dims(path);
        else
          read_idx(path);
      });
      CAPTURE(msg);
      CHECK(contains(msg, path));
      CHECK(contains(msg, "the header declares 8388610 x 28 x 28 = 6576670240 bytes"));
      CHECK((contains(msg, "file has 1568") || contains(msg, "gzip file of") ||
             contains(msg, "decompressed data has 1568")));
    }
  }
}

TEST_CASE("mutated IDX files: accepted or a data_error, nothing else") {
  temp_dir dir;
  const std::string path = dir / "v.idx";
  write_idx(path, {3, 4, 5}, iota_bytes(60), false);
  auto plain = read_raw(path);
  write_idx(path, {3, 4, 5}, iota_bytes(60), true);
  auto gz = read_raw(path);
  fuzz::mutator mutate(7);
  int accepted = 0;
  for (const auto& valid : {plain, gz}) {
    const std::string seed(valid.begin(), valid.end());
    REQUIRE(fuzz::idx_file(seed));
    for (int i = 0; i < 1500; ++i) {
      const std::string m = mutate(seed);
      bool ok = false;
      CHECK_NOTHROW(ok = fuzz::idx_file(m));
      accepted += ok;
    }
  }
  MESSAGE(accepted << " of 3000 IDX mutants accepted");
}

// ------------------------------------------------------------ npy, npz, csv

namespace {

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <class T>
std::string npy_of(npy_dtype t, const std::vector<int64_t>& dims, const std::vector<T>& v,
                   int version = 1) {
  const std::string b = bytes_of(v);
  return npy_bytes(t, dims, b.data(), b.size(), version);
}

// A .npy file with the header dict as given (padded like numpy's) and `data`.
std::string raw_npy(const std::string& dict, const std::string& data, int version = 1) {
  std::string h = dict;
  const std::size_t pre = version == 1 ? 10 : 12;
  std::size_t total = (pre + h.size() + 1 + 63) / 64 * 64;
  h.append(total - pre - h.size() - 1, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  if (version > 1) out += std::string(2, '\0');
  return out + h + data;
}

std::vector<float> floats_of(const tensor& t) {
  auto s = t.span<float>();
  return {s.begin(), s.end()};
}
std::vector<int32_t> ints_of(const tensor& t) {
  auto s = t.span<int32_t>();
  return {s.begin(), s.end()};
}

// A data set of .npy files in a temporary directory.
struct npy_set {
  temp_dir dir;
  data_config cfg;
  npy_set() {
    cfg.format = "npy";
    cfg.train = {"", dir / "x_train.npy", dir / "y_train.npy"};
    cfg.test = {"", dir / "x_test.npy", dir / "y_test.npy"};
  }
  void write(const std::string& name, const std::string& bytes) { write_file(dir / name, bytes); }
};

// Whether `path` is mapped into this process (its line in /proc/self/maps).
bool is_mapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.ends_with(path)) return true;
  return false;
}

}  // namespace

TEST_CASE("npy: every supported dtype loads with exact values and shapes") {
  npy_set s;
  // float32 examples [3, 2, 2]: mapped, not copied.
  const std::vector<float> x = {0, 1.5f, -2, 3, 4, 5, 6, 7.25f, -8, 9, 10, 1e-3f};
  s.write("x_train.npy", npy_of(npy_dtype::f4, {3, 2, 2}, x));
  s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {3}, {0, 4, 2}));
  s.write("x_test.npy", npy_of<double>(npy_dtype::f8, {1, 2, 2}, {0.5, -1, 2, 1e10}, 2));
  s.write("y_test.npy", npy_of<int32_t>(npy_dtype::i4, {1}, {1}, 3));
  {
    train_test r = load_data(s.cfg);
    CHECK(r.train.images.shape() == shape_t{3, 4});
    CHECK(floats_of(r.train.images) == x);
    CHECK(r.train.example_shape == std::vector<int64_t>{2, 2});
    CHECK(r.test.example_shape == std::vector<int64_t>{2, 2});
    CHECK(floats_of(r.test.images) == std::vector<float>{0.5f, -1, 2, 1e10f});
    CHECK(ints_of(r.train.labels) == std::vector<int32_t>{0, 4, 2});
    CHECK(ints_of(r.test.labels) == std::vector<int32_t>{1});
    CHECK(r.train.classes == 5);
    CHECK(r.test.classes == 5);
    CHECK(r.train.codes.empty());
    CHECK(r.mean == 0.0f);
    CHECK(r.stddev == 1.0f);
    // The float32 file is mapped and stays mapped while a tensor over it
    // lives, after the dataset is gone; writing through the tensor changes
    // neither the file nor a fresh load.
    CHECK(is_mapped(s.cfg.train.x));
    tensor keep = r.train.images;
    r = train_test{};
    CHECK(is_mapped(s.cfg.train.x));
    keep.f32()[0] = 42;
    CHECK(floats_of(load_data(s.cfg).train.images) == x);
    keep = tensor{};
    CHECK_FALSE(is_mapped(s.cfg.train.x));
  }
  SUBCASE("uint8 examples are scaled and normalized like IDX pixels, bytes kept for batches") {
    const std::vector<uint8_t> px = {0, 51, 102, 255, 255, 0};
    s.write("x_train.npy", npy_of(npy_dtype::u1, {3, 2}, px));
    s.write("x_test.npy", npy_of<uint8_t>(npy_dtype::u1, {1, 2}, {51, 0}));
    s.write("y_test.npy", npy_of<uint8_t>(npy_dtype::u1, {1}, {1}));
    for (bool normalize : {false, true}) {
      CAPTURE(normalize);
      s.cfg.normalize = normalize;
      train_test r = load_data(s.cfg);
      double mean = 0, sd = 1;
      if (normalize) stats(px, px.size(), mean, sd);
      CHECK(r.mean == doctest::Approx(normalize ? mean : 0));
      for (std::size_t i = 0; i < px.size(); ++i)
        CHECK(r.train.images.f32()[i] == static_cast<float>((px[i] / 255.0 - mean) / sd));
      CHECK(r.test.images.f32()[0] == static_cast<float>((51 / 255.0 - mean) / sd));
      CHECK(r.train.codes == px);
      CHECK(r.test.codes.empty());
      CHECK(r.train.example_shape == std::vector<int64_t>{2});
    }
  }
  SUBCASE("a 1-d array is one feature per example; limits keep the first rows") {
    s.write("x_train.npy", npy_of<int32_t>(npy_dtype::i4, {3}, {7, -8, 9}));
    s.write("x_test.npy", npy_of<int64_t>(npy_dtype::i8, {1}, {-1}));
    s.cfg.train_limit = 2;
    train_test r = load_data(s.cfg);
    CHECK(r.train.example_shape == std::vector<int64_t>{1});
    CHECK(r.train.images.shape() == shape_t{2, 1});
    CHECK(floats_of(r.train.images) == std::vector<float>{7, -8});
    CHECK(ints_of(r.train.labels) == std::vector<int32_t>{0, 4});
    CHECK(floats_of(r.test.images) == std::vector<float>{-1});
  }
  SUBCASE("data.classes sets the class count; a label at or above it names the file and row") {
    s.cfg.classes = 10;
    CHECK(load_data(s.cfg).train.classes == 10);
    s.cfg.classes = 4;
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.y + ": label 4 at row 1 is out of range (data.classes is 4)");
  }
}

TEST_CASE("npy: float labels are float targets [N, K]") {
  npy_set s;
  s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {2, 1}, {1, 2}));
  s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 1}, {3}));
  SUBCASE("1-d y: K = 1") {
    s.write("y_train.npy", npy_of<float>(npy_dtype::f4, {2}, {0.25f, -1}));
    s.write("y_test.npy", npy_of<double>(npy_dtype::f8, {1}, {2.5}));
    train_test r = load_data(s.cfg);
    CHECK(r.train.labels.type() == dtype::f32);
    CHECK(r.train.labels.shape() == shape_t{2, 1});
    CHECK(floats_of(r.train.labels) == std::vector<float>{0.25f, -1});
    CHECK(floats_of(r.test.labels) == std::vector<float>{2.5f});
    CHECK(r.train.classes == 0);
    CHECK(r.train.float_targets());
    CHECK(r.train.targets() == 1);
  }
  SUBCASE("2-d y: K columns; batches gather [k, K]") {
    s.write("y_train.npy", npy_of<double>(npy_dtype::f8, {2, 3}, {1, 2, 3, 4, 5, 6}));
    s.write("y_test.npy", npy_of<float>(npy_dtype::f4, {1, 3}, {7, 8, 9}));
    train_test r = load_data(s.cfg);
    CHECK(r.train.labels.shape() == shape_t{2, 3});
    CHECK(r.train.targets() == 3);
    tensor x, y;
    std::vector<int64_t> idx = {1, 0, 1};
    gather_batch(r.train, idx, x, y);
    CHECK(x == tensor::from<float>({3, 1}, {2, 1, 2}));
    CHECK(y == tensor::from<float>({3, 3}, {4, 5, 6, 1, 2, 3, 4, 5, 6}));
    tensor keep = y;
    std::vector<int64_t> idx2 = {0, 0, 0};
    gather_batch(r.train, idx2, x, y);
    CHECK(y.shares_buffer_with(keep));
    CHECK(y == tensor::from<float>({3, 3}, {1, 2, 3, 1, 2, 3, 1, 2, 3}));
  }
  SUBCASE("class labels in one split and targets in the other are refused") {
    s.write("y_train.npy", npy_of<float>(npy_dtype::f4, {2}, {0, 1}));
    s.write("y_test.npy", npy_of<int32_t>(npy_dtype::i4, {1}, {1}));
    std::string msg = error_of([&] { load_data(s.cfg); });
    CHECK(msg.starts_with(s.cfg.test.y + ": labels of dtype '<i4'"));
    CHECK(contains(msg, "both must be class labels or float targets"));
  }
}

TEST_CASE("npy: refusals name the file and the problem") {
  temp_dir dir;
  const std::string path = dir / "a.npy";
  const std::string four_floats = bytes_of(std::vector<float>{1, 2, 3, 4});
  auto refused = [&](const std::string& bytes) {
    write_file(path, bytes);
    std::string msg = error_of([&] { read_npy(path); });
    CAPTURE(msg);
    CHECK(msg.starts_with(path + ": "));
    return msg.substr(path.size() + 2);
  };
  CHECK(
      refused(raw_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four_floats)) ==
      "Fortran-order arrays (fortran_order: True) are not supported; save a C-order array "
      "(numpy.ascontiguousarray)");
  CHECK(refused(raw_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }", four_floats))
            .starts_with("big-endian dtype '>f4' is not supported"));
  CHECK(refused(raw_npy("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
                        std::string(16, 'x')))
            .starts_with("object arrays ('|O') need pickle and are refused"));
  CHECK(refused(raw_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }",
                        std::string(8, 'x'))) ==
        "unsupported dtype '<f2' (supported: '<f4', '<f8', '|u1', '<i4', '<i8')");
  CHECK(refused(raw_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }",
                        four_floats)) == "structured dtypes (a list descr) are not supported");
  CHECK(refused(raw_npy("{'descr': '<f4', 'shape': (4,), }", four_floats)) ==
        "header lacks the key 'fortran_order' (expected exactly 'descr', 'fortran_order', "
        "'shape')");
  CHECK(refused(
            raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", four_floats))
            .starts_with("header is not a valid Python dict literal"));
  CHECK(refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': True}",
                        four_floats)) ==
        "header has an unknown key 'x' (expected exactly 'descr', 'fortran_order', 'shape')");
  CHECK(refused(raw_npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                        "'shape': (4,)}",
                        four_floats))
            .starts_with("header is not a valid Python dict literal (duplicate key 'descr'"));
  CHECK(
      refused(raw_npy("dict(descr='<f4')", four_floats))
          .starts_with("header is not a valid Python dict literal (expected '{' at character 0)"));
  CHECK(refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4), }", four_floats))
            .starts_with("header is not a valid Python dict literal ('(n)' is not a tuple"));
  CHECK(refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
                        four_floats.substr(0, 12))) ==
        "truncated: shape (2, 2) of '<f4' is 16 bytes of data, the file has 12");
  CHECK(
      refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", four_floats)) ==
      "trailing bytes: shape (3,) of '<f4' is 12 bytes of data, the file has 16 (4 more)");
  CHECK(refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627777,), }",
                        four_floats)) == "implausible dimension in the shape (more than 2^40)");
  CHECK(refused(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048577), }",
                        four_floats)) ==
        "implausible shape (1048576, 1048577) (more than 2^40 elements)");
  CHECK(refused("PK\x03\x04 not numpy") ==
        "not a .npy file: the first bytes are 'PK\\x03\\x04 n', expected '\\x93NUMPY'");
  std::string v4 = npy_of(npy_dtype::f4, {4}, std::vector<float>{1, 2, 3, 4});
  v4[6] = 4;
  CHECK(refused(v4) == "unsupported .npy format version 4.0 (supported: 1, 2, 3)");
  std::string lying = npy_of(npy_dtype::f4, {4}, std::vector<float>{1, 2, 3, 4});
  lying[8] = '\xff';
  lying[9] = '\x7f';
  CHECK(refused(lying).starts_with("truncated: the header declares 32767 bytes"));
  CHECK(refused("") == "truncated: 0 bytes, shorter than a .npy header");
  CHECK(contains(error_of([&] { read_npy(dir / "none.npy"); }), "cannot open"));
  CHECK(contains(error_of([&] { read_npy(dir.str()); }), "is a directory"));
}

TEST_CASE("npy: label and shape refusals in a data set") {
  npy_set s;
  s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {3, 1}, {1, 2, 3}));
  s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 1}, {1}));
  s.write("y_test.npy", npy_of<int64_t>(npy_dtype::i8, {1}, {0}));
  SUBCASE("negative") {
    s.write("y_train.npy", npy_of<int32_t>(npy_dtype::i4, {3}, {0, -3, 1}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.y + ": label -3 at row 1 is negative (class labels are 0, 1, ...)");
  }
  SUBCASE(">= 2^31") {
    s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {3}, {0, 1, int64_t{1} << 31}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.y + ": label 2147483648 at row 2 is too large (class labels must be < 2^31)");
  }
  SUBCASE("counts differ") {
    s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {2}, {0, 1}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.x + ": holds 3 examples but " + s.cfg.train.y + " holds 2 labels");
  }
  SUBCASE("integer labels of two columns") {
    s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {3, 2}, {0, 1, 0, 1, 0, 1}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.y +
              ": expected integer class labels of shape [N] or [N, 1], got [3, 2] "
              "(float targets [N, K] need a float dtype)");
  }
  SUBCASE("example shapes differ between the splits") {
    s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {3}, {0, 1, 0}));
    s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 2}, {1, 2}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.test.x + ": examples of shape [2], the training examples (" + s.cfg.train.x +
              ") are [1]");
  }
  SUBCASE("a scalar") {
    s.write("y_train.npy", npy_of<int64_t>(npy_dtype::i8, {3}, {0, 1, 0}));
    s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {}, {1}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.x + ": expected an array of examples [N, ...], got a scalar (shape ())");
  }
}

TEST_CASE("check_data_files: a missing file names its JSON path") {
  npy_set s;
  s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {1}, {1}));
  auto config_error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const config_error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(config_error_of([&] { load_data(s.cfg); }) ==
        "data.train.y: file not found: " + s.cfg.train.y);
  data_config c;
  c.format = "csv";
  c.train.file = s.dir.str();
  c.test.file = s.dir / "t.csv";
  // A std::string, not a literal: g++ 12 warns (-Wrestrict, a false
  // positive) on assigning this literal.
  c.label = std::string("y");
  std::string want = "data.train: expected a file, got a directory: ";
  want += c.train.file;
  CHECK(config_error_of([&] { check_data_files(c); }) == want);
  c.train.file = s.cfg.train.x;
  CHECK(config_error_of([&] { check_data_files(c); }) ==
        "data.test: file not found: " + c.test.file);
}

namespace {

// An .npz data set: train.npz and test.npz holding x and y.
struct npz_set {
  temp_dir dir;
  data_config cfg;
  std::string x_train, y_train, x_test, y_test;
  npz_set() {
    cfg.format = "npz";
    cfg.train.file = dir / "train.npz";
    cfg.test.file = dir / "test.npz";
    x_train = npy_of<float>(npy_dtype::f4, {2, 3}, {1, 2, 3, 4, 5, 6});
    y_train = npy_of<uint8_t>(npy_dtype::u1, {2}, {3, 0});
    x_test = npy_of<double>(npy_dtype::f8, {1, 3}, {-1, 0.5, 2});
    y_test = npy_of<int64_t>(npy_dtype::i8, {1}, {1});
  }
  void write(bool deflate, const std::string& xk = "x", const std::string& yk = "y") {
    write_file(cfg.train.file,
               zip_bytes({{xk + ".npy", x_train}, {yk + ".npy", y_train}}, deflate));
    write_file(cfg.test.file, zip_bytes({{yk + ".npy", y_test}, {xk + ".npy", x_test}}, deflate));
  }
};

void put32_at(std::string& s, std::size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
}

}  // namespace

TEST_CASE("npz: stored and deflated archives load with exact values") {
  npz_set s;
  for (bool deflate : {false, true}) {
    CAPTURE(deflate);
    s.write(deflate);
    train_test r = load_data(s.cfg);
    CHECK(floats_of(r.train.images) == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(r.train.example_shape == std::vector<int64_t>{3});
    CHECK(ints_of(r.train.labels) == std::vector<int32_t>{3, 0});
    CHECK(floats_of(r.test.images) == std::vector<float>{-1, 0.5f, 2});
    CHECK(ints_of(r.test.labels) == std::vector<int32_t>{1});
    CHECK(r.train.classes == 4);
  }
  SUBCASE("configurable keys") {
    s.write(true, "images", "targets");
    s.cfg.x_key = "images";
    s.cfg.y_key = "targets";
    CHECK(load_data(s.cfg).train.size() == 2);
    s.cfg.y_key = "labels";
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.file +
              ": no member 'labels.npy' (the array 'labels'); the archive holds 'images.npy', "
              "'targets.npy'");
  }
}

TEST_CASE("npz: refusals name the file and the problem") {
  temp_dir dir;
  const std::string path = dir / "a.npz";
  const std::string x = npy_of<float>(npy_dtype::f4, {2}, {1, 2});
  const std::string y = npy_of<int32_t>(npy_dtype::i4, {2}, {0, 1});
  const std::string good = zip_bytes({{"x.npy", x}, {"y.npy", y}}, false);
  auto refused = [&](const std::string& bytes) {
    write_file(path, bytes);
    std::string msg = error_of([&] { read_npz(path, {"x", "y"}); });
    CAPTURE(msg);
    CHECK(msg.starts_with(path));
    return msg.substr(path.size());
  };
  write_file(path, good);
  REQUIRE(read_npz(path, {"x", "y"}).size() == 2);
  const std::size_t end = good.size() - 22;  // the end record
  const std::size_t cd = static_cast<uint8_t>(good[end + 16]) |
                         (static_cast<std::size_t>(static_cast<uint8_t>(good[end + 17])) << 8);
  SUBCASE("ZIP64") {
    std::string z = good;
    put32_at(z, end + 16, 0xffffffff);
    CHECK(refused(z) ==
          ": ZIP64 archives are not supported (numpy writes them for members over 4 GiB)");
    z = good;
    put32_at(z, cd + 20, 0xffffffff);  // the first member's compressed size
    CHECK(refused(z) ==
          ": member 'x.npy': ZIP64 archives are not supported (numpy writes them "
          "for members over 4 GiB)");
  }
  SUBCASE("CRC") {
    std::string z = good;
    z[30 + 5 + 130] ^= 1;  // a byte of x's data
    CHECK(refused(z) == ": member x.npy: CRC mismatch: the data is corrupt");
  }
  SUBCASE("compression method") {
    std::string z = good;
    z[cd + 10] = 12;  // bzip2
    CHECK(refused(z) ==
          ": member x.npy: unsupported compression method 12 (supported: 0 stored, 8 deflate)");
  }
  SUBCASE("encrypted") {
    std::string z = good;
    z[cd + 8] = 1;
    CHECK(refused(z) == ": member x.npy: encrypted members are not supported");
  }
  SUBCASE("not a zip, truncated") {
    CHECK(refused("hello") == ": not a zip (.npz) archive: 5 bytes, shorter than a zip end record");
    CHECK(refused(good.substr(0, good.size() - 3)) ==
          ": not a zip (.npz) archive: no end-of-central-directory record");
  }
  SUBCASE("a central directory out of bounds") {
    std::string z = good;
    put32_at(z, end + 12, 0x7fffffff);
    CHECK(refused(z).starts_with(": corrupt zip: the central directory (2147483647 bytes at"));
    z = good;
    z[end + 8] = z[end + 10] = 100;  // 100 entries in a directory of 2
    CHECK(refused(z).starts_with(": corrupt zip: 100 entries cannot fit"));
  }
  SUBCASE("a member's data out of bounds") {
    std::string z = good;
    put32_at(z, cd + 20, 100000);
    put32_at(z, cd + 24, 100000);
    CHECK(refused(z).starts_with(": member x.npy: corrupt zip: its 100000 bytes at offset 35"));
  }
  SUBCASE("a deflated member lying about its size") {
    std::string z = zip_bytes({{"x.npy", x}, {"y.npy", y}}, true);
    const std::size_t e = z.size() - 22;
    const std::size_t c = static_cast<uint8_t>(z[e + 16]) |
                          (static_cast<std::size_t>(static_cast<uint8_t>(z[e + 17])) << 8);
    put32_at(z, c + 24, 1u << 30);  // 1 GiB from a few dozen bytes
    CHECK(contains(refused(z), "cannot inflate to the declared 1073741824"));
    // Its .npy header says how large it is: another size is refused
    // before the data is inflated.
    for (const auto declared : {x.size() + 1, x.size() - 1}) {
      put32_at(z, c + 24, static_cast<uint32_t>(declared));
      CHECK(refused(z) ==
            ": member x.npy: corrupt zip: its .npy header's shape (2,) of '<f4' is 8 "
            "bytes of data (" +
                std::to_string(x.size()) + " bytes with the header), its directory entry says " +
                std::to_string(declared));
    }
  }
  SUBCASE("a deflated stream longer or shorter than its header and directory say") {
    // The directory and the header agree on x's size; the stream does not.
    auto with_stream = [&](const std::string& stream) {
      std::string z = zip_bytes({{"x.npy", stream}, {"y.npy", y}}, true);
      const std::size_t e = z.size() - 22;
      const std::size_t c = static_cast<uint8_t>(z[e + 16]) |
                            (static_cast<std::size_t>(static_cast<uint8_t>(z[e + 17])) << 8);
      put32_at(z, c + 24, static_cast<uint32_t>(x.size()));
      return z;
    };
    CHECK(refused(with_stream(x + "junk")) ==
          ": member x.npy: corrupt zip: the member inflates to more than its declared " +
              std::to_string(x.size()) + " bytes");
    CHECK(refused(with_stream(x.substr(0, x.size() - 4))) ==
          ": member x.npy: corrupt zip: the member inflates to " + std::to_string(x.size() - 4) +
              " bytes, its directory entry says " + std::to_string(x.size()));
  }
  SUBCASE("a deflated member whose .npy header is declared shorter than its preamble") {
    // Version 1.0, header length 0: the 12 bytes inflated first run past
    // the header it declares (once a write past the buffer; found by fuzz_npz).
    const std::string stream = std::string("\x93NUMPY\x01\x00\x00\x00", 10) + "ab";
    const std::string msg = refused(zip_bytes({{"x.npy", stream}, {"y.npy", y}}, true));
    CAPTURE(msg);
    CHECK(contains(msg, ": member x.npy: "));
    CHECK(msg == refused(zip_bytes({{"x.npy", stream}, {"y.npy", y}}, false)));
  }
  SUBCASE("corrupt deflate data") {
    std::string z = zip_bytes({{"x.npy", x}, {"y.npy", y}}, true);
    for (std::size_t i = 36; i < 60; ++i) z[i] = '\xff';
    std::string msg = refused(z);
    CAPTURE(msg);
    // Which check catches it depends on what the garbage decodes to (the
    // header is read before the CRC can be checked).
    CHECK((contains(msg, ": member x.npy: corrupt deflate data") ||
           contains(msg, ": member x.npy: not a .npy file") ||
           contains(msg, ": member x.npy: CRC mismatch") ||
           contains(msg, ": member x.npy: corrupt zip: the member inflates to")));
  }
  SUBCASE("a member that is not a .npy file names the member") {
    CHECK(refused(zip_bytes({{"x.npy", "junk!junk!junk"}, {"y.npy", y}}, true)) ==
          ": member x.npy: not a .npy file: the first bytes are 'junk!j', expected '\\x93NUMPY'");
  }
  SUBCASE("duplicate member") {
    CHECK(refused(zip_bytes({{"x.npy", x}, {"x.npy", x}}, false)) == ": duplicate member 'x.npy'");
    // The most entries a zip without ZIP64 has (65535 means ZIP64), checked in
    // linear time.
    std::vector<std::pair<std::string, std::string>> many;
    for (int i = 0; i < 65533; ++i)
      many.emplace_back(std::string("m").append(std::to_string(i)), "");
    many.emplace_back("m0", "");
    CHECK(refused(zip_bytes(many, false)) == ": duplicate member 'm0'");
  }
}

namespace {

struct csv_set {
  temp_dir dir;
  data_config cfg;
  csv_set() {
    cfg.format = "csv";
    cfg.train.file = dir / "train.csv";
    cfg.test.file = dir / "test.csv";
    cfg.label = "species";
  }
  void write(const std::string& train, const std::string& test) {
    write_file(cfg.train.file, train);
    write_file(cfg.test.file, test);
  }
};

}  // namespace

TEST_CASE("npz: a decompression bomb is refused before it is inflated, naming file and member") {
  temp_dir dir;
  const std::string path = dir / "bomb.npz";
  const std::string y = npy_of<int32_t>(npy_dtype::i4, {1}, {0});
  auto error_reading = [&](const std::string& x, bool deflate) {
    write_file(path, zip_bytes({{"x.npy", x}, {"y.npy", y}}, deflate));
    return error_of([&] { read_npz(path, {"x", "y"}); });
  };
  SUBCASE("the shape in its header bounds what it inflates to") {
    // 4 floats declared, 8 MiB of zeros after them (under the ratio check's
    // floor): refused on the header, not after inflating 8 MiB.
    const std::string small = npy_of<float>(npy_dtype::f4, {4}, {1, 2, 3, 4});
    const std::string x = small + std::string(8 << 20, '\0');
    CHECK(error_reading(x, true) ==
          path +
              ": member x.npy: corrupt zip: its .npy header's shape (4,) of '<f4' is 16 bytes "
              "of data (" +
              std::to_string(small.size()) + " bytes with the header), its directory entry says " +
              std::to_string(x.size()));
  }
  SUBCASE("a compression ratio over 100:1 is refused; stored, the same array loads") {
    const std::vector<float> zeros(5 << 20, 0.0f);  // 20 MiB, deflating ~1000:1
    const std::string x = npy_of<float>(npy_dtype::f4, {5 << 20}, zeros);
    const std::string msg = error_reading(x, true);
    CHECK_MESSAGE(msg.starts_with(path + ": member x.npy: "), msg);
    CHECK_MESSAGE(contains(msg, " compressed bytes declare " + std::to_string(x.size()) +
                                    " inflated, more than 100 times as many (a decompression "
                                    "bomb?); save it uncompressed (numpy.savez)"),
                  msg);
    CHECK(error_reading(x, false) == "");
    CHECK(read_npz(path, {"x", "y"})[0].numel() == 5 << 20);
  }
}

TEST_CASE("npy and npz: NaN and infinite values are refused as the CSV reader refuses them") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  npy_set s;
  s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {2, 3}, {1, 2, 3, 4, 5, 6}));
  s.write("y_train.npy", npy_of<int32_t>(npy_dtype::i4, {2}, {0, 1}));
  s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 3}, {1, 2, 3}));
  s.write("y_test.npy", npy_of<int32_t>(npy_dtype::i4, {1}, {1}));
  REQUIRE(error_of([&] { load_data(s.cfg); }) == "");
  const std::string want = ": expected a finite number within float32's range, got ";
  SUBCASE("a NaN example") {
    s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {2, 3}, {1, 2, 3, 4, 5, nan}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.x + ": row 1, column 2" + want + "nan");
  }
  SUBCASE("an infinite example in the test split") {
    s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 3}, {1, -inf, 3}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.test.x + ": row 0, column 1" + want + "-inf");
  }
  SUBCASE("a float64 value beyond float32's range") {
    s.write("x_train.npy", npy_of<double>(npy_dtype::f8, {2, 3}, {1, 2, 3, 1e39, 5, 6}));
    s.write("x_test.npy", npy_of<double>(npy_dtype::f8, {1, 3}, {1, 2, 3}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.x + ": row 1, column 0" + want + "1e+39");
  }
  SUBCASE("a NaN float target") {
    s.write("y_train.npy", npy_of<float>(npy_dtype::f4, {2}, {0.5f, nan}));
    s.write("y_test.npy", npy_of<float>(npy_dtype::f4, {1}, {1}));
    CHECK(error_of([&] { load_data(s.cfg); }) ==
          s.cfg.train.y + ": row 1, column 0" + want + "nan");
  }
  SUBCASE("in an .npz, the array is named") {
    npz_set z;
    z.x_train = npy_of<float>(npy_dtype::f4, {2, 3}, {1, 2, inf, 4, 5, 6});
    z.write(true);
    CHECK(error_of([&] { load_data(z.cfg); }) ==
          z.cfg.train.file + ": array 'x': row 0, column 2" + want + "inf");
  }
}

TEST_CASE("csv: a table loads with exact values; quotes per RFC 4180") {
  csv_set s;
  s.write(
      "\xef\xbb\xbfsepal_length,\"petal, width\",species\r\n"
      "5.1, 0.2 ,\"setosa\"\r\n"
      "\r\n"
      "\"6.5\",+2.0,\"virginica, \"\"tall\"\"\"\n"
      "-1e-3,3,setosa",
      "sepal_length,\"petal, width\",species\n7,1.5,versicolor\n");
  train_test r = load_data(s.cfg);
  CHECK(r.train.images.shape() == shape_t{3, 2});
  CHECK(floats_of(r.train.images) == std::vector<float>{5.1f, 0.2f, 6.5f, 2.0f, -1e-3f, 3});
  CHECK(r.train.example_shape == std::vector<int64_t>{2});
  CHECK(r.class_names == std::vector<std::string>{"setosa", "versicolor", "virginica, \"tall\""});
  CHECK(ints_of(r.train.labels) == std::vector<int32_t>{0, 2, 0});
  CHECK(ints_of(r.test.labels) == std::vector<int32_t>{1});
  CHECK(r.train.classes == 3);
  CHECK(floats_of(r.test.images) == std::vector<float>{7, 1.5f});
  SUBCASE("integer labels are classes; the label column anywhere") {
    s.write("species,a\n3,1\n0,2\n", "species,a\n1,3\n");
    train_test t = load_data(s.cfg);
    CHECK(ints_of(t.train.labels) == std::vector<int32_t>{3, 0});
    CHECK(floats_of(t.train.images) == std::vector<float>{1, 2});
    CHECK(t.train.classes == 4);
    CHECK(t.class_names.empty());
  }
  SUBCASE("numeric labels with a fraction are float targets") {
    s.write("a,species\n1,0.5\n2,1\n", "a,species\n3,-2\n");
    train_test t = load_data(s.cfg);
    CHECK(t.train.labels.shape() == shape_t{2, 1});
    CHECK(floats_of(t.train.labels) == std::vector<float>{0.5f, 1});
    CHECK(floats_of(t.test.labels) == std::vector<float>{-2});
    CHECK(t.train.classes == 0);
  }
  SUBCASE("the generated flower table") {
    const std::string script = TROUPE_SOURCE_DIR "/scripts/fashion_mnist_to_npz.py";
    if (std::system("python3 --version > /dev/null 2>&1") != 0) return;
    REQUIRE(std::system(
                ("python3 " + script + " --csv --out " + s.dir.str() + " > /dev/null").c_str()) ==
            0);
    train_test t = load_data(s.cfg);
    CHECK(t.train.size() == 120);
    CHECK(t.test.size() == 30);
    CHECK(t.train.features() == 4);
    CHECK(t.class_names == std::vector<std::string>{"setosa", "versicolor", "virginica"});
  }
}

TEST_CASE("csv: refusals name the file, line and column") {
  csv_set s;
  const std::string& p = s.cfg.train.file;
  const std::string test = "a,b,species\n1,2,x\n";
  auto refused = [&](const std::string& train) {
    s.write(train, test);
    return error_of([&] { load_data(s.cfg); });
  };
  CHECK(refused("a,b,species\n1,2,x\n3,abc,y\n") ==
        p + ": line 3, column \"b\": expected a number, got \"abc\"");
  CHECK(refused("a,b,species\n1,,x\n") ==
        p + ": line 2, column \"b\": expected a number, got \"\"");
  CHECK(refused("a,b,species\n1,inf,x\n") ==
        p + ": line 2, column \"b\": expected a finite number within float32's range, got \"inf\"");
  CHECK(
      refused("a,b,species\n1,1e39,x\n") ==
      p + ": line 2, column \"b\": expected a finite number within float32's range, got \"1e39\"");
  CHECK(refused("a,b,species\n1,2,x\n1,2\n") ==
        p + ": line 3: 2 fields, the header has 3 (ragged rows are refused)");
  CHECK(refused("a,b,species\n1,2,x,4\n") ==
        p + ": line 2: 4 fields, the header has 3 (ragged rows are refused)");
  CHECK(refused("a,b,species\n1,2,\"x\n") == p + ": line 2: unterminated quoted field (field 3)");
  CHECK(refused("a,b,species\n1,\"2\"3,x\n") ==
        p + ": line 2: text after the closing quote of field 2 (a quote inside a quoted field is "
            "written \"\")");
  CHECK(refused("a,b,label\n1,2,x\n") ==
        p + ": no label column \"species\" in the header (columns: \"a\", \"b\", \"label\")");
  CHECK(refused("a,a,species\n") == p + ": line 1: duplicate column \"a\" (columns 1 and 2)");
  {
    // Wide headers are checked in linear time (a duplicate column at the end
    // of 300000).
    std::string wide;
    for (int i = 0; i < 300000; ++i) {
      wide += 'c';
      wide += std::to_string(i);
      wide += ',';
    }
    wide += "c0,species\n";
    CHECK(refused(wide) == p + ": line 1: duplicate column \"c0\" (columns 1 and 300001)");
  }
  CHECK(refused("species\nx\n") ==
        p + ": no feature columns: the header has only the label column \"species\"");
  CHECK(refused("") == p + ": empty: expected a header row naming the columns");
  CHECK(refused("a,b,species\n1,2, \n") == p + ": line 2, column \"species\": empty label");
  CHECK(refused("b,a,species\n1,2,x\n") ==
        s.cfg.test.file + ": its feature columns differ from those of " + p +
            " (2 and 2 columns; both need the same columns in the same order)");
  // A quoted line break: the error names the line the bad field is on.
  CHECK(refused("a,b,species\n1,2,\"x\ny\"\n3,zz,q\n") ==
        p + ": line 4, column \"b\": expected a number, got \"zz\"");
  s.cfg.classes = 2;
  CHECK(refused("a,b,species\n1,2,x\n1,2,y\n1,2,z\n") ==
        p + ": the label column \"species\" names 3 classes over both splits, data.classes is 2");
  // Integer labels in both splits.
  write_file(s.cfg.test.file, "a,b,species\n1,2,0\n");
  auto integer_refused = [&](const std::string& train) {
    write_file(p, train);
    return error_of([&] { load_data(s.cfg); });
  };
  CHECK(integer_refused("a,b,species\n1,2,1\n1,2,5\n") ==
        p + ": label 5 on line 3 is out of range (data.classes is 2)");
  CHECK(integer_refused("a,b,species\n1,2,-1\n") ==
        p + ": line 2, column \"species\": label -1 is negative (class labels are 0, 1, ...)");
  CHECK(integer_refused("a,b,species\n1,2,2147483648\n") ==
        p + ": line 2, column \"species\": label 2147483648 is too large (class labels must be < "
            "2^31)");
}

TEST_CASE("standardize: per-feature statistics of the training split, applied to both") {
  npy_set s;
  // Feature 0: 1, 2, 3, 6 (mean 3, population std sqrt(3.5)); feature 1
  // constant 5 (std 0 -> 1).
  s.write("x_train.npy", npy_of<float>(npy_dtype::f4, {4, 2}, {1, 5, 2, 5, 3, 5, 6, 5}));
  s.write("y_train.npy", npy_of<int32_t>(npy_dtype::i4, {4}, {0, 1, 0, 1}));
  s.write("x_test.npy", npy_of<float>(npy_dtype::f4, {1, 2}, {10, 4}));
  s.write("y_test.npy", npy_of<int32_t>(npy_dtype::i4, {1}, {1}));
  s.cfg.standardize = true;
  train_test r = load_data(s.cfg);
  const float sd = std::sqrt(3.5f);
  CHECK(r.feature_mean == std::vector<float>{3, 5});
  CHECK(r.feature_std[0] == doctest::Approx(1.8708287));
  CHECK(r.feature_std[1] == 1.0f);
  const auto x = floats_of(r.train.images);
  CHECK(x[0] == doctest::Approx(-2 / sd));
  CHECK(x[2] == doctest::Approx(-1 / sd));
  CHECK(x[4] == doctest::Approx(0));
  CHECK(x[6] == doctest::Approx(3 / sd));
  CHECK(x[1] == 0.0f);
  CHECK(floats_of(r.test.images)[0] == doctest::Approx(7 / sd));
  CHECK(floats_of(r.test.images)[1] == -1.0f);
  // Standardized data is a copy: the file is not mapped.
  CHECK_FALSE(is_mapped(s.cfg.train.x));
  SUBCASE("byte examples drop their codes") {
    s.write("x_train.npy", npy_of<uint8_t>(npy_dtype::u1, {4, 2}, {0, 9, 255, 9, 0, 9, 255, 9}));
    s.write("x_test.npy", npy_of<uint8_t>(npy_dtype::u1, {1, 2}, {255, 0}));
    s.cfg.normalize = false;
    train_test b = load_data(s.cfg);
    CHECK(b.train.codes.empty());
    CHECK(b.feature_mean[0] == doctest::Approx(0.5));
    CHECK(b.feature_std[0] == doctest::Approx(0.5));
    CHECK(floats_of(b.train.images) == std::vector<float>{-1, 0, 1, 0, -1, 0, 1, 0});
    CHECK(floats_of(b.test.images)[0] == 1.0f);
  }
  s.cfg.standardize = false;
  CHECK(load_data(s.cfg).feature_mean.empty());
}

TEST_CASE("convert_labels: classes, float targets, one-hot") {
  train_test t;
  t.train.images = tensor({3, 1}, dtype::f32);
  t.test.images = tensor({1, 1}, dtype::f32);
  t.train.labels = tensor::from<float>({3, 1}, {2, 0, 1});
  t.test.labels = tensor::from<float>({1, 1}, {4});
  t.train.classes = t.test.classes = 0;
  convert_labels(t, label_kind::classes);
  CHECK(t.train.labels == tensor::from<int32_t>({3}, {2, 0, 1}));
  CHECK(t.test.labels == tensor::from<int32_t>({1}, {4}));
  CHECK(t.train.classes == 5);
  convert_labels(t, label_kind::targets);
  CHECK(t.train.labels == tensor::from<float>({3, 1}, {2, 0, 1}));
  CHECK(t.train.classes == 0);
  convert_labels(t, label_kind::one_hot, 6);
  CHECK(t.test.labels == tensor::from<float>({1, 6}, {0, 0, 0, 0, 1, 0}));
  CHECK(t.train.labels.shape() == shape_t{3, 6});
  CHECK(t.train.labels.f32()[2] == 1.0f);
  CHECK(t.train.classes == 6);
  CHECK(error_of([&] { convert_labels(t, label_kind::classes); }) ==
        "data: the train split has 6 float targets per example; class labels need exactly 1");
  t.test.labels = tensor::from<float>({1, 1}, {0.5f});
  t.train.labels = tensor::from<float>({3, 1}, {0, 1, 2});
  CHECK(error_of([&] { convert_labels(t, label_kind::classes); }) ==
        "data: the test split's target 0.500000 at row 0 is not a class label (a whole number >= 0 "
        "and < 2^31)");
  t.test.labels = tensor::from<float>({1, 1}, {-1});
  CHECK(contains(error_of([&] { convert_labels(t, label_kind::classes); }),
                 "test split's target -1"));
  t.test.labels = tensor::from<float>({1, 1}, {3});
  CHECK(error_of([&] { convert_labels(t, label_kind::classes, 3); }) ==
        "data: the test split: label 3 at row 0 is out of range (data.classes is 3)");
}

TEST_CASE("load_data: the idx format is load_fashion_mnist, with the example shape") {
  tiny_set t;
  auto c = t.config();
  train_test a = load_data(c);
  train_test b = load_fashion_mnist(c);
  CHECK(a.train.images == b.train.images);
  CHECK(a.test.labels == b.test.labels);
  CHECK(a.train.example_shape == std::vector<int64_t>{1, 2, 2});
  CHECK(a.test.example_shape == std::vector<int64_t>{1, 2, 2});
  c.classes = 12;
  CHECK(load_data(c).train.classes == 12);
  CHECK(data_source(c) == c.path);
}

TEST_CASE("npz written by scripts/fashion_mnist_to_npz.py equals the IDX files") {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) {
    test::skip_case("no python3");
    return;
  }
  tiny_set t;
  const std::string script = TROUPE_SOURCE_DIR "/scripts/fashion_mnist_to_npz.py";
  for (std::string flags : {"", " --stored --labels uint8", " --float"}) {
    CAPTURE(flags);
    temp_dir out;
    REQUIRE(std::system(("python3 " + script + " " + t.dir.str() + " --out " + out.str() + flags +
                         " > /dev/null")
                            .c_str()) == 0);
    data_config c;
    c.format = "npz";
    c.train.file = out / "train.npz";
    c.test.file = out / "test.npz";
    c.normalize = flags != " --float";
    train_test a = load_data(c);
    c = t.config();
    c.normalize = flags != " --float";
    train_test b = load_data(c);
    CHECK(a.train.example_shape == std::vector<int64_t>{1, 2, 2});
    CHECK(a.train.labels == b.train.labels);
    CHECK(a.test.labels == b.test.labels);
    CHECK(a.train.classes == 10);
    CHECK(a.mean == b.mean);
    for (std::size_t i = 0; i < 24; ++i)
      CHECK(a.train.images.f32()[i] == doctest::Approx(b.train.images.f32()[i]).epsilon(1e-6));
    CHECK(a.train.codes.empty() == (flags == " --float"));
  }
}

TEST_CASE("mutated npy, npz and csv files: accepted or a data_error, nothing else") {
  const std::string x = npy_of<float>(npy_dtype::f4, {2, 3}, {0, 1, 2, 3, 4, 5});
  const std::string y = npy_of<int64_t>(npy_dtype::i8, {2}, {1, 0}, 2);
  const std::vector<std::pair<bool (*)(std::string_view), std::string>> seeds = {
      {fuzz::npy_file, x},
      {fuzz::npy_file, y},
      {fuzz::npy_file, npy_of<uint8_t>(npy_dtype::u1, {2, 2}, {1, 2, 3, 4}, 3)},
      {fuzz::npz_file, zip_bytes({{"x.npy", x}, {"y.npy", y}}, false)},
      {fuzz::npz_file, zip_bytes({{"x.npy", x}, {"y.npy", y}}, true)},
      {fuzz::csv_file, "a,\"b, c\",label\n1,2.5,x\n-3,\"4\",\"y\"\"z\"\n"},
      {fuzz::csv_file, "label,f\r\n0,1e3\r\n1,2\r\n"},
  };
  fuzz::mutator mutate(11);
  int accepted = 0, total = 0;
  for (const auto& [target, seed] : seeds) {
    REQUIRE(target(seed));
    for (int i = 0; i < 700; ++i) {
      const std::string m = mutate(seed);
      bool ok = false;
      CHECK_NOTHROW(ok = target(m));
      accepted += ok;
      ++total;
    }
  }
  MESSAGE(accepted << " of " << total << " npy/npz/csv mutants accepted");
}
