#include <doctest/doctest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "config/json_limits.hpp"
#include "tests/fixtures.hpp"
#include "tests/fuzz/mutate.hpp"
#include "tests/fuzz/targets.hpp"

namespace fs = std::filesystem;
using namespace troupe;
namespace ck = troupe::checkpoint;

namespace {

using test::read_file;
using test::temp_dir;

ck::snapshot make_snapshot(int64_t step, float scale = 1.0f) {
  ck::snapshot s;
  s.meta.job = "fmnist-mlp";
  s.meta.strategy = "one_device";
  s.meta.step = step;
  s.meta.epoch = step / 30;  // 30 steps per epoch
  s.meta.batch_in_epoch = step % 30;
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

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A manifest edited as a bug or an attacker who knows the format would: with
// its checksum recomputed, so the checks behind the checksum are reached.
void spit_sealed(const fs::path& p, nlohmann::json j) {
  j["manifest_sha256"] = ck::manifest_checksum(j);
  spit(p, j.dump(2));
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
  CHECK(r.meta.format_version == ck::kFormatVersion);
  CHECK(r.meta.job == "fmnist-mlp");
  CHECK(r.meta.strategy == "one_device");
  CHECK(r.meta.step == 100);
  CHECK(r.meta.epoch == 3);
  CHECK(r.meta.batch_in_epoch == 10);
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
    std::string bytes = read_file(bin);
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
    auto j = nlohmann::json::parse(read_file(man));
    j["format_version"] = 99;
    spit(man, j.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "unsupported format_version 99"));
  }
  SUBCASE("bad fields and ranges") {
    auto j = nlohmann::json::parse(read_file(man));
    auto k = j;
    k.erase("step");
    spit_sealed(man, k);
    CHECK(contains(error_of([&] { ck::load(dir); }), "field 'step': missing"));
    k = j;
    k["tensors"][0]["offset"] = 1u << 20;
    spit_sealed(man, k);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "variable 'dense_0/kernel'"));
    CHECK(contains(msg, "outside tensors.bin"));
    k = j;
    k["tensors"][0]["dtype"] = "float16";
    spit_sealed(man, k);
    CHECK(contains(error_of([&] { ck::load(dir); }), "unknown dtype 'float16'"));
    k = j;
    k["tensors"][0]["shape"] = {5, 5};
    spit_sealed(man, k);
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
  std::string bytes = read_file(fs::path(dir) / "tensors.bin");
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

TEST_CASE("manifest checksums: the same digests as the checkpoints written before") {
  // SHA-256 of the compact dump without the checksum field: known bytes, and
  // the value the hand-written SHA-256 of earlier builds gave for them.
  const auto known = nlohmann::json::parse(R"({"step": 40, "format_version": 2,
                                               "manifest_sha256": "ignored"})");
  CHECK(ck::manifest_checksum(known) ==
        "2447eebfd0b948a7f4c6ef84c9d87e839f3932146389f1f8045c5b75b0e4ffa4");
  // A whole manifest an earlier build wrote (the fuzz seed) still verifies.
  const auto written = nlohmann::json::parse(
      read_file(fs::path(TROUPE_SOURCE_DIR) / "tests/fuzz/corpus/manifest/cli_small_step40.json"));
  CHECK(written.at("manifest_sha256") ==
        "d5f7146f5e6fd3cc8f90c40d016d9e5b85ef54004d1e2395accad2466b7aa0d6");
  CHECK(ck::manifest_checksum(written) == written.at("manifest_sha256"));
}

TEST_CASE("a manifest cannot lie: its checksum and cross-checks") {
  temp_dir root;
  ck::snapshot snap = make_snapshot(100);
  snap.slots.push_back({"optimizer/step", tensor::from<int64_t>({1}, {100})});
  const std::string dir = ck::save(root.str(), snap, 0);
  const fs::path man = fs::path(dir) / "manifest.json";
  const auto good = nlohmann::json::parse(read_file(man));
  CHECK(good.at("format_version") == 2);
  CHECK(good.at("manifest_sha256") == ck::manifest_checksum(good));

  SUBCASE("one changed digit of step breaks the manifest checksum") {
    std::string text = read_file(man);
    auto at = text.find("\"step\": 100");
    REQUIRE(at != std::string::npos);
    text[at + 10] = '2';  // 100 -> 102
    spit(man, text);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "checkpoint " + dir));
    CHECK(contains(msg, "manifest checksum mismatch"));
    CHECK(contains(error_of([&] { ck::read_manifest(dir); }), "manifest checksum mismatch"));
  }
  SUBCASE("a missing checksum in a format 2 manifest") {
    auto j = good;
    j.erase("manifest_sha256");
    spit(man, j.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "manifest_sha256"));
  }
  SUBCASE("step against the directory name") {
    auto j = good;
    j["step"] = 101;
    j["batch_in_epoch"] = 11;
    spit_sealed(man, j);
    std::string msg = error_of([&] { ck::load(dir); });
    CHECK(contains(msg, "checkpoint " + dir));
    CHECK(contains(msg, "manifest field \"step\" is 101 but the directory name says 100"));
  }
  SUBCASE("step against optimizer/step (a copy under another name)") {
    const fs::path copy = root.path / "best";
    fs::copy(dir, copy);
    auto j = good;
    j["step"] = 101;
    j["batch_in_epoch"] = 11;
    spit_sealed(copy / "manifest.json", j);
    std::string msg = error_of([&] { ck::load(copy.string()); });
    CHECK(contains(msg, "checkpoint " + copy.string()));
    CHECK(contains(msg, "manifest field \"step\" is 101 but the slot 'optimizer/step' is 100"));
  }
  SUBCASE("epoch and position out of range or inconsistent") {
    for (auto [field, value, expect] : std::vector<std::tuple<std::string, int64_t, std::string>>{
             {"epoch", int64_t{1} << 62, "but the step is only 100"},
             {"epoch", -1, "cannot be negative"},
             {"epoch", 7, "not a position of any epoch length"},
             {"batch_in_epoch", -5, "cannot be negative"},
             {"batch_in_epoch", 101, "lies beyond the step"},
             {"step", -100, "cannot be negative"}}) {
      CAPTURE(field);
      auto j = good;
      j[field] = value;
      spit_sealed(man, j);
      std::string msg = error_of([&] { ck::load(dir); });
      CHECK(contains(msg, "checkpoint " + dir));
      CHECK(contains(msg, "manifest field \"" + field + "\" is " + std::to_string(value)));
      CHECK(contains(msg, expect));
    }
  }
  SUBCASE("shapes: overflowing element count or bytes, negative dimensions") {
    for (auto [shape, expect] : std::vector<std::pair<nlohmann::json, std::string>>{
             {{4294967296LL, 4294967296LL, 4}, "element count"},
             {{uint64_t{1} << 62}, "byte size"},
             {{3, -4}, "negative dimension -4"},
             {{uint64_t{1} << 63}, "does not fit an int64"},
             {{0, uint64_t{1} << 62, 8}, "needs 0"}}) {
      auto j = good;
      j["tensors"][0]["shape"] = shape;
      spit_sealed(man, j);
      std::string msg = error_of([&] { ck::read_manifest(dir); });
      CHECK(contains(msg, "checkpoint " + dir));
      CHECK(contains(msg, expect));
      std::ostringstream out, err;
      CHECK(ck::show(dir, out, err) == 1);
      CHECK_FALSE(contains(out.str(), "verified"));
    }
  }
  SUBCASE("deep nesting is refused before parsing (show, diff, load)") {
    for (const char* field : {"config", "step"}) {
      std::string deep = "{\"format_version\": 2, \"" + std::string(field) +
                         "\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
      spit(man, deep);
      std::string msg = error_of([&] { ck::load(dir); });
      CHECK(contains(msg, "checkpoint " + dir));
      CHECK(contains(msg, "nested too deeply"));
      std::ostringstream out, err;
      CHECK(ck::show(dir, out, err) == 1);
      CHECK(contains(err.str(), "nested too deeply"));
      CHECK(ck::diff(dir, dir, out, err) == 1);
    }
  }
  SUBCASE("format 1 (older troupe): read when the cross-checks agree") {
    auto j = good;
    j.erase("manifest_sha256");
    j["format_version"] = 1;
    spit(man, j.dump());
    CHECK(ck::load(dir).meta.step == 100);
    j["step"] = 101;
    j["batch_in_epoch"] = 11;
    spit(man, j.dump());
    CHECK(contains(error_of([&] { ck::load(dir); }), "the directory name says 100"));
  }
}

TEST_CASE("the saver says whose steps the optimizer slots count; the format names no strategy") {
  temp_dir root;
  // Slots of one worker that took 60 of the 100 steps (elastic_average's).
  auto share = [](std::optional<bool> own_steps, const std::string& strategy) {
    ck::snapshot snap = make_snapshot(100);
    snap.meta.strategy = strategy;
    snap.meta.slots_count_own_steps = own_steps;
    snap.slots.push_back({"optimizer/step", tensor::from<int64_t>({1}, {60})});
    return snap;
  };
  SUBCASE("said by the saver: at most the step") {
    const std::string dir = ck::save(root.str(), share(true, "any_strategy"), 0);
    CHECK(nlohmann::json::parse(read_file(fs::path(dir) / "manifest.json"))
              .at("slots_count_own_steps") == true);
    auto back = ck::load(dir);
    CHECK(back.meta.slots_count_own_steps == std::optional<bool>(true));
    CHECK(back.meta.step == 100);
  }
  SUBCASE("not said: every step, whatever the strategy's name") {
    const std::string dir = ck::save(root.str(), share(std::nullopt, "elastic_average"), 0);
    CHECK(nlohmann::json::parse(read_file(fs::path(dir) / "manifest.json"))
              .at("slots_count_own_steps") == false);
    CHECK(contains(error_of([&] { ck::load(dir); }),
                   "manifest field \"step\" is 100 but the slot 'optimizer/step' is 60"));
  }
  SUBCASE("a share beyond the step is refused") {
    auto snap = share(true, "elastic_average");
    snap.slots.back() = {"optimizer/step", tensor::from<int64_t>({1}, {101})};
    const std::string dir = ck::save(root.str(), snap, 0);
    CHECK(contains(error_of([&] { ck::load(dir); }), "the slot 'optimizer/step' is 101"));
  }
  SUBCASE("a manifest from before the field (an older troupe's elastic_average) still loads") {
    const std::string dir = ck::save(root.str(), share(true, "elastic_average"), 0);
    const fs::path man = fs::path(dir) / "manifest.json";
    auto j = nlohmann::json::parse(read_file(man));
    j.erase("slots_count_own_steps");
    spit_sealed(man, j);
    auto back = ck::load(dir);
    CHECK_FALSE(back.meta.slots_count_own_steps.has_value());
    CHECK(back.meta.step == 100);
  }
}

TEST_CASE("a save removes the temporaries of crashed saves, not its own") {
  temp_dir root;
  const fs::path stale_tmp = root.path / ".ckpt-0000000005.tmp-999999999";
  const fs::path stale_old = root.path / ".ckpt-0000000005.old-999999999";
  const fs::path own = root.path / (".ckpt-0000000007.tmp-" + std::to_string(::getpid()));
  const fs::path other = root.path / ".keep-me.tmp-1";
  for (const auto& p : {stale_tmp, stale_old, own, other}) {
    fs::create_directories(p);
    spit(p / "tensors.bin", "half");
  }
  ck::save(root.str(), make_snapshot(10), 0);
  CHECK_FALSE(fs::exists(stale_tmp));
  CHECK_FALSE(fs::exists(stale_old));
  CHECK(fs::exists(own));
  CHECK(fs::exists(other));
  CHECK(fs::exists(root.path / "ckpt-0000000010"));
}

TEST_CASE("a save never writes through links planted at its temporary or final names") {
  temp_dir root, elsewhere;
  const std::string pid = std::to_string(::getpid());
  // The temporary name (predictable: step and pid), the final name and the
  // name an earlier checkpoint of the same step is moved aside to, each a
  // link to a directory outside the checkpoint root.
  for (const std::string& name : {".ckpt-0000000010.tmp-" + pid, std::string("ckpt-0000000010"),
                                  ".ckpt-0000000010.old-" + pid})
    fs::create_directory_symlink(elsewhere.path, root.path / name);
  const std::string dir = ck::save(root.str(), make_snapshot(10), 0);
  CHECK(dir == (root.path / "ckpt-0000000010").string());
  CHECK(fs::is_directory(fs::symlink_status(dir)));  // a real directory now, not the link
  CHECK(ck::load(dir).meta.step == 10);
  CHECK(fs::is_empty(elsewhere.path));  // nothing written through any link
}

TEST_CASE("mutated manifests: accepted or a checkpoint_error, nothing else") {
  temp_dir root;
  ck::snapshot snap = make_snapshot(100);
  snap.slots.push_back({"optimizer/step", tensor::from<int64_t>({1}, {100})});
  const std::string dir = ck::save(root.str(), snap, 0);
  const std::string valid = read_file(fs::path(dir) / "manifest.json");
  REQUIRE(fuzz::manifest_text(valid));
  // Unsealed mutants mostly stop at the checksum; resealed ones reach every
  // check behind it.
  fuzz::mutator mutate(20261124);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string m = mutate(valid);
    if (i % 2) {
      auto j = nlohmann::json::parse(m, nullptr, false);
      if (!j.is_discarded() && j.is_object() && fuzz::manifest_text(m) == false &&
          troupe::json_nesting_depth(m, false) <= troupe::kMaxJsonDepth) {
        j["manifest_sha256"] = ck::manifest_checksum(j);
        m = j.dump();
      }
    }
    CAPTURE(m);
    bool ok = false;
    CHECK_NOTHROW(ok = fuzz::manifest_text(m));
    (ok ? accepted : refused) += 1;
  }
  CHECK(refused > 0);
  MESSAGE("mutated manifests: " << accepted << " accepted, " << refused << " refused");
}
