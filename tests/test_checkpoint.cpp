#include <doctest/doctest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "tests/fixtures.hpp"

namespace fs = std::filesystem;
using namespace troupe;
namespace ck = troupe::checkpoint;

namespace {

using test::temp_dir;

ck::snapshot make_snapshot(int64_t step, float scale = 1.0f) {
  ck::snapshot s;
  s.meta.job = "fmnist-mlp";
  s.meta.strategy = "one_device";
  s.meta.step = step;
  s.meta.epoch = 3;
  s.meta.batch_in_epoch = 17;
  s.meta.config = {{"seed", 42}, {"model", {{"hidden", {256, 128}}}}};
  s.meta.extra = {{"note", "hello"}};
  std::vector<float> k(12);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = scale * (static_cast<float>(i) - 5.5f);
  s.variables.push_back({"dense_0/kernel", tensor::from<float>({3, 4}, k)});
  s.variables.push_back({"dense_0/bias", tensor::from<float>({4}, {0.5f, -1.0f, 2.0f, 0.0f})});
  s.slots.push_back(
      {"dense_0/kernel/m", tensor::from<float>({3, 4}, std::vector<float>(12, 0.25f))});
  s.state.push_back(
      {"rng", tensor::from<int64_t>({4}, {int64_t{1} << 62, -3, 0, 0x123456789abcdefLL})});
  s.state.push_back({"counter", tensor::from<int64_t>({}, {7})});
  return s;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ck::checkpoint_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

std::string line_with(const std::string& text, const std::string& part) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (contains(line, part)) return line;
  return "";
}

}  // namespace

TEST_CASE("checkpoint round trip") {
  temp_dir root;
  ck::snapshot s = make_snapshot(100);
  std::string dir = ck::save(root.str(), s, 0);
  CHECK(dir == (root.path / "ckpt-0000000100").string());
  CHECK(fs::exists(fs::path(dir) / "manifest.json"));
  CHECK(fs::exists(fs::path(dir) / "tensors.bin"));
  for (const auto& e : fs::directory_iterator(root.path))
    CHECK(e.path().filename().string().rfind(".ckpt", 0) != 0);  // no temporary left

  ck::snapshot r = ck::load(dir);
  CHECK(r.meta.format_version == 1);
  CHECK(r.meta.job == "fmnist-mlp");
  CHECK(r.meta.strategy == "one_device");
  CHECK(r.meta.step == 100);
  CHECK(r.meta.epoch == 3);
  CHECK(r.meta.batch_in_epoch == 17);
  CHECK(r.meta.config == s.meta.config);
  CHECK(r.meta.extra == s.meta.extra);
  auto same = [](const std::vector<named_tensor>& a, const std::vector<named_tensor>& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].name == b[i].name);
      CHECK(a[i].value == b[i].value);
    }
  };
  same(r.variables, s.variables);
  same(r.slots, s.slots);
  same(r.state, s.state);
  CHECK(r.state[0].value.type() == dtype::i64);
  CHECK(r.state[0].value.data<int64_t>()[0] == int64_t{1} << 62);
  CHECK(r.state[1].value.shape() == shape_t{});

  REQUIRE(r.meta.entries.size() == 5);
  uint64_t end = 0;
  for (const auto& e : r.meta.entries) {
    CHECK(e.offset % 64 == 0);
    CHECK(e.offset >= end);
    end = e.offset + e.nbytes;
  }
  CHECK(r.meta.entries[0].kind == "variable");
  CHECK(r.meta.entries[2].kind == "slot");
  CHECK(r.meta.entries[3].kind == "state");
  CHECK(r.meta.entries[0].nbytes == 48);
  CHECK(fs::file_size(fs::path(dir) / "tensors.bin") == end);

  // Saving the same step again replaces it.
  ck::snapshot s2 = make_snapshot(100, 2.0f);
  CHECK(ck::save(root.str(), s2, 0) == dir);
  CHECK(ck::load(dir).variables[0].value == s2.variables[0].value);

  // Duplicate names of one kind are refused.
  ck::snapshot dup = make_snapshot(5);
  dup.variables.push_back(dup.variables[0]);
  CHECK(contains(error_of([&] { ck::save(root.str(), dup, 0); }), "'dense_0/kernel': duplicate"));
}

TEST_CASE("checkpoint corruption is detected with clear messages") {
  temp_dir root;
  const std::string dir = ck::save(root.str(), make_snapshot(100), 0);
  const fs::path bin = fs::path(dir) / "tensors.bin";
  const fs::path man = fs::path(dir) / "manifest.json";

  SUBCASE("a flipped byte names the variable") {
    ck::manifest m = ck::read_manifest(dir);
    REQUIRE(m.entries[1].name == "dense_0/bias");
    std::string bytes = slurp(bin);
    bytes[m.entries[1].offset + 5] ^= 0x01;
    spit(bin, bytes);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "checkpoint " + dir));
    CHECK(contains(msg, "variable 'dense_0/bias'"));
    CHECK(contains(msg, "checksum mismatch"));
    char stored[16];
    std::snprintf(stored, sizeof stored, "0x%08x", m.entries[1].crc32);
    CHECK(contains(msg, std::string("stored ") + stored));
    CHECK(contains(msg, "computed 0x"));
  }
  SUBCASE("truncated tensors.bin") {
    fs::resize_file(bin, fs::file_size(bin) - 10);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "tensors.bin"));
    CHECK(contains(msg, "truncated"));
  }
  SUBCASE("missing tensors.bin") {
    fs::remove(bin);
    CHECK(contains(error_of([&] { ck::load(dir); }), "tensors.bin is missing"));
  }
  SUBCASE("deleted manifest") {
    fs::remove(man);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, dir));
    CHECK(contains(msg, "manifest.json is missing"));
  }
  SUBCASE("garbage manifest") {
    spit(man, "{\"format_version\": 1, \"job\": ");
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "manifest.json"));
    CHECK(contains(msg, "invalid JSON"));
    spit(man, "[1, 2, 3]");
    CHECK(contains(error_of([&] { ck::load(dir); }), "expected a JSON object"));
  }
  SUBCASE("unknown format_version") {
    auto j = nlohmann::json::parse(slurp(man));
    j["format_version"] = 99;
    spit(man, j.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "unsupported format_version 99"));
  }
  SUBCASE("bad fields and ranges") {
    auto j = nlohmann::json::parse(slurp(man));
    auto k = j;
    k.erase("step");
    spit(man, k.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "field 'step': missing"));
    k = j;
    k["tensors"][0]["offset"] = 1u << 20;
    spit(man, k.dump());
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "variable 'dense_0/kernel'"));
    CHECK(contains(msg, "outside tensors.bin"));
    k = j;
    k["tensors"][0]["dtype"] = "float16";
    spit(man, k.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "unknown dtype 'float16'"));
    k = j;
    k["tensors"][0]["shape"] = {5, 5};
    spit(man, k.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "needs 100"));
  }
  SUBCASE("not a directory at all") {
    CHECK(
        contains(error_of([&] { ck::load((root.path / "nope").string()); }), "no such directory"));
  }
}

TEST_CASE("resolve picks the highest step and ignores temporaries") {
  temp_dir root;
  CHECK_FALSE(ck::resolve(root.str()).has_value());
  CHECK_FALSE(ck::resolve((root.path / "missing").string()).has_value());
  ck::save(root.str(), make_snapshot(100), 0);
  ck::save(root.str(), make_snapshot(2000), 0);
  ck::save(root.str(), make_snapshot(50), 0);
  // A crashed write of a later step, and unrelated directories.
  fs::create_directories(root.path / ".ckpt-0000009999.tmp-4242");
  spit(root.path / ".ckpt-0000009999.tmp-4242" / "manifest.json", "{}");
  fs::create_directories(root.path / "ckpt-latest");
  fs::create_directories(root.path / "other");
  auto r = ck::resolve(root.str());
  REQUIRE(r.has_value());
  CHECK(*r == (root.path / "ckpt-0000002000").string());
  // A checkpoint directory resolves to itself.
  const std::string one = (root.path / "ckpt-0000000050").string();
  CHECK(ck::resolve(one) == one);
  CHECK(ck::load(*r).meta.step == 2000);
}

TEST_CASE("keep prunes the oldest checkpoints") {
  temp_dir root;
  for (int64_t step = 1; step <= 5; ++step) ck::save(root.str(), make_snapshot(step * 10), 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root.path))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"ckpt-0000000040", "ckpt-0000000050"});

  temp_dir all;
  for (int64_t step = 1; step <= 4; ++step) ck::save(all.str(), make_snapshot(step), 0);
  CHECK(std::distance(fs::directory_iterator(all.path), fs::directory_iterator()) == 4);
  // Saving an older step with keep=1 keeps the one just written.
  ck::save(all.str(), make_snapshot(2), 1);
  CHECK(std::distance(fs::directory_iterator(all.path), fs::directory_iterator()) == 1);
  CHECK(fs::exists(all.path / "ckpt-0000000002"));
}

TEST_CASE("show prints the header and every tensor") {
  temp_dir root;
  const std::string dir = ck::save(root.str(), make_snapshot(100), 0);
  ck::manifest m = ck::read_manifest(dir);
  std::ostringstream out, err;
  CHECK(ck::show(root.str(), out, err) == 0);  // a root resolves to its latest
  const std::string text = out.str();
  CHECK(err.str().empty());
  CHECK(contains(text, dir));
  CHECK(contains(text, "job: fmnist-mlp"));
  CHECK(contains(text, "strategy: one_device"));
  CHECK(contains(text, "step: 100"));
  CHECK(contains(text, "epoch: 3"));
  std::string kernel = line_with(text, "dense_0/kernel ");
  CHECK(contains(kernel, "variable"));
  CHECK(contains(kernel, "float32"));
  CHECK(contains(kernel, "[3, 4]"));
  CHECK(contains(kernel, " 48 "));
  char crc[16];
  std::snprintf(crc, sizeof crc, "0x%08x", m.entries[0].crc32);
  CHECK(contains(kernel, crc));
  std::string rng = line_with(text, "rng");
  CHECK(contains(rng, "state"));
  CHECK(contains(rng, "int64"));
  CHECK(contains(rng, "32"));
  CHECK(contains(line_with(text, "dense_0/kernel/m"), "slot"));
  CHECK(contains(text, "verified: 5 checksums match"));

  // Corrupt: the table still shows, the verification fails.
  std::string bytes = slurp(fs::path(dir) / "tensors.bin");
  bytes[0] ^= 0x40;
  spit(fs::path(dir) / "tensors.bin", bytes);
  std::ostringstream out2, err2;
  CHECK(ck::show(dir, out2, err2) == 1);
  CHECK(contains(out2.str(), "dense_0/bias"));
  CHECK(contains(err2.str(), "variable 'dense_0/kernel': checksum mismatch"));

  std::ostringstream out3, err3;
  CHECK(ck::show((root.path / "nothing").string(), out3, err3) == 1);
  CHECK(contains(err3.str(), "no checkpoint"));
}

TEST_CASE("diff reports per-variable differences") {
  temp_dir ra, rb;
  ck::snapshot a = make_snapshot(100);
  ck::snapshot b = make_snapshot(200);
  b.variables[0].value.f32()[3] += 0.5f;       // -2.5 -> -2.0: rel 0.5 / 2.5 = 0.2
  b.variables.erase(b.variables.begin() + 1);  // dense_0/bias only in A
  b.variables.push_back({"dense_1/kernel", tensor({2, 2})});
  a.variables.push_back({"head/w", tensor({2, 3})});
  b.variables.push_back({"head/w", tensor({3, 2})});
  a.variables.push_back({"same", tensor::from<float>({2}, {1, 2})});
  b.variables.push_back({"same", tensor::from<float>({2}, {1, 2})});
  const std::string da = ck::save(ra.str(), a, 0);
  const std::string db = ck::save(rb.str(), b, 0);

  std::ostringstream out, err;
  CHECK(ck::diff(da, db, out, err) == 0);
  const std::string text = out.str();
  MESSAGE(text);
  std::string kernel = line_with(text, "dense_0/kernel");
  CHECK(contains(kernel, "0.5"));
  CHECK(contains(kernel, "0.2"));
  CHECK(contains(line_with(text, "same"), "0  "));
  CHECK(contains(text, "only in A: dense_0/bias"));
  CHECK(contains(text, "only in B: dense_1/kernel"));
  CHECK(contains(text, "shape differs: head/w"));
  CHECK(contains(text, "[2, 3]"));
  std::string overall = line_with(text, "overall");
  CHECK(contains(overall, "max_abs 0.5"));
  CHECK(contains(overall, "max_rel 0.2"));
  CHECK(contains(overall, "2 common"));

  // Identical checkpoints: all zero.
  std::ostringstream same;
  CHECK(ck::diff(da, da, same, err) == 0);
  CHECK(contains(line_with(same.str(), "overall"), "max_abs 0  max_rel 0"));

  // Unreadable: non-zero.
  std::ostringstream out2, err2;
  CHECK(ck::diff(da, (ra.path / "nope").string(), out2, err2) != 0);
  CHECK(contains(err2.str(), "no checkpoint"));
  fs::remove(fs::path(db) / "manifest.json");
  std::ostringstream out3, err3;
  CHECK(ck::diff(da, rb.str(), out3, err3) != 0);  // the root resolves to the damaged one
  CHECK(contains(err3.str(), "manifest.json is missing"));
}
