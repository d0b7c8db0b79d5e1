// troupe checkpoint show and diff: a checkpoint's manifest as a table, two
// checkpoints' variables compared.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/format.hpp"

namespace troupe::checkpoint {

using namespace detail;

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::optional<std::string> resolve_or_report(const std::string& path, const char* cmd,
                                             std::ostream& err) {
  auto dir = resolve(path);
  if (!dir)
    err << "troupe checkpoint " << cmd << ": no checkpoint at '" << path
        << "' (expected a checkpoint directory or one holding ckpt-* directories)\n";
  return dir;
}

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

double value_at(const tensor& t, std::size_t i) {
  switch (t.type()) {
    case dtype::f32:
      return static_cast<const float*>(t.raw())[i];
    case dtype::i32:
      return static_cast<const int32_t*>(t.raw())[i];
    case dtype::i64:
      return static_cast<double>(static_cast<const int64_t*>(t.raw())[i]);
  }
  return 0;
}

}  // namespace

int show(const std::string& path, std::ostream& out, std::ostream& err) {
  auto dir = resolve_or_report(path, "show", err);
  if (!dir) return 1;
  try {
    manifest m = read_manifest(*dir);
    uint64_t total = 0;
    for (const auto& e : m.entries) total += e.nbytes;
    out << "checkpoint " << *dir << "\n"
        << "job: " << m.job << "  strategy: " << m.strategy << "  step: " << m.step
        << "  epoch: " << m.epoch << "  batch_in_epoch: " << m.batch_in_epoch << "\n"
        << "format_version: " << m.format_version << "  tensors: " << m.entries.size()
        << "  bytes: " << total << "\n";
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "KIND", "DTYPE", "SHAPE", "BYTES", "CRC32"}};
    for (const auto& e : m.entries)
      rows.push_back({e.name, e.kind, dtype_name(e.type), shape_string(e.shape),
                      std::to_string(e.nbytes), hex32(e.crc32)});
    print_table(out, rows);
    load(*dir);
    out << "verified: " << m.entries.size() << " checksums match\n";
    return 0;
  } catch (const checkpoint_error& e) {
    err << "error: " << e.what() << "\n";
    return 1;
  }
}

int diff(const std::string& a, const std::string& b, std::ostream& out, std::ostream& err) {
  auto da = resolve_or_report(a, "diff", err);
  auto db = resolve_or_report(b, "diff", err);
  if (!da || !db) return 1;
  snapshot sa, sb;
  try {
    sa = load(*da);
    sb = load(*db);
  } catch (const checkpoint_error& e) {
    err << "error: " << e.what() << "\n";
    return 1;
  }
  out << "A: " << *da << " (step " << sa.meta.step << ")\n"
      << "B: " << *db << " (step " << sb.meta.step << ")\n";

  std::map<std::string, const tensor*> in_b;
  for (const auto& v : sb.variables) in_b[v.name] = &v.value;
  std::set<std::string> in_a;
  double all_abs = 0, all_rel = 0;
  int64_t common = 0, only_a = 0, only_b = 0, mismatched = 0;
  std::vector<std::vector<std::string>> rows = {{"VARIABLE", "MAX_ABS", "MAX_REL"}};
  std::vector<std::string> notes;
  for (const auto& v : sa.variables) {
    in_a.insert(v.name);
    auto it = in_b.find(v.name);
    if (it == in_b.end()) {
      notes.push_back("only in A: " + v.name + " " + dtype_name(v.value.type()) + " " +
                      shape_string(v.value.shape()));
      ++only_a;
      continue;
    }
    const tensor& ta = v.value;
    const tensor& tb = *it->second;
    if (ta.shape() != tb.shape() || ta.type() != tb.type()) {
      notes.push_back("shape differs: " + v.name + ": A " + dtype_name(ta.type()) + " " +
                      shape_string(ta.shape()) + ", B " + dtype_name(tb.type()) + " " +
                      shape_string(tb.shape()));
      ++mismatched;
      continue;
    }
    double max_abs = 0, max_rel = 0;
    const auto n = static_cast<std::size_t>(ta.numel());
    for (std::size_t i = 0; i < n; ++i) {
      double x = value_at(ta, i), y = value_at(tb, i);
      if (x == y || (std::isnan(x) && std::isnan(y))) continue;
      double d = std::fabs(x - y);
      if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
      double rel = d / std::max({std::fabs(x), std::fabs(y), 1e-12});
      if (std::isnan(rel)) rel = std::numeric_limits<double>::infinity();
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, rel);
    }
    ++common;
    all_abs = std::max(all_abs, max_abs);
    all_rel = std::max(all_rel, max_rel);
    rows.push_back({v.name, num(max_abs), num(max_rel)});
  }
  for (const auto& v : sb.variables)
    if (!in_a.count(v.name)) {
      notes.push_back("only in B: " + v.name + " " + dtype_name(v.value.type()) + " " +
                      shape_string(v.value.shape()));
      ++only_b;
    }
  print_table(out, rows);
  for (const auto& n : notes) out << n << "\n";
  out << "overall: max_abs " << num(all_abs) << "  max_rel " << num(all_rel) << " over " << common
      << " common variables (" << only_a << " only in A, " << only_b << " only in B, " << mismatched
      << " with different shapes)\n";
  return 0;
}

}  // namespace troupe::checkpoint
