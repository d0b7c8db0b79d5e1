#include <doctest/doctest.h>
#include <zlib.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.hpp"
#include "data/idx.hpp"
#include "tests/fixtures.hpp"
#include "tests/fuzz/mutate.hpp"
#include "tests/fuzz/targets.hpp"

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
    MESSAGE("skipped: Fashion-MNIST not found in " << dir << " (install dataset-fashion-mnist)");
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
