#include "data/csv.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "data/npy.hpp"  // map_file

namespace troupe::data {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw data_error(path + ": " + problem);
}

// A cell as the user wrote it, quoted, short and printable.
std::string shown(std::string_view s) {
  std::string r = "\"";
  std::size_t i = 0;
  for (; i < s.size() && i < 40; ++i) {
    auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7f && u != '"' && u != '\\') {
      r += s[i];
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      r += buf;
    }
  }
  if (i < s.size()) r += "...";
  return r + "\"";
}

class reader {
 public:
  reader(const std::string& path, const uint8_t* p, std::size_t n) : path_(path), p_(p), n_(n) {
    if (n_ >= 3 && p_[0] == 0xef && p_[1] == 0xbb && p_[2] == 0xbf) pos_ = 3;
  }

  // The next non-blank record into `fields`; false at the end of the file.
  bool next(std::vector<std::string>& fields) {
    for (;;) {
      if (pos_ >= n_) return false;
      record_line_ = line_;
      bool quoted = read_record(fields);
      if (fields.size() == 1 && fields[0].empty() && !quoted) continue;  // a blank line
      return true;
    }
  }
  int64_t record_line() const { return record_line_; }

 private:
  // Returns whether any field was quoted.
  bool read_record(std::vector<std::string>& fields) {
    fields.clear();
    bool any_quoted = false;
    for (;;) {
      std::string f;
      if (pos_ < n_ && p_[pos_] == '"') {
        any_quoted = true;
        const int64_t opened = line_;
        ++pos_;
        for (;;) {
          if (pos_ >= n_)
            fail(path_, "line " + std::to_string(opened) + ": unterminated quoted field (field " +
                            std::to_string(fields.size() + 1) + ")");
          const char c = static_cast<char>(p_[pos_]);
          if (c == '"') {
            if (pos_ + 1 < n_ && p_[pos_ + 1] == '"') {
              f += '"';
              pos_ += 2;
              continue;
            }
            ++pos_;
            break;
          }
          if (c == '\n') ++line_;
          f += c;
          ++pos_;
        }
        if (pos_ < n_ && p_[pos_] != ',' && p_[pos_] != '\n' && p_[pos_] != '\r')
          fail(path_, "line " + std::to_string(line_) + ": text after the closing quote of field " +
                          std::to_string(fields.size() + 1) +
                          " (a quote inside a quoted field "
                          "is written \"\")");
      } else {
        const std::size_t start = pos_;
        while (pos_ < n_ && p_[pos_] != ',' && p_[pos_] != '\n' && p_[pos_] != '\r') ++pos_;
        f.assign(reinterpret_cast<const char*>(p_ + start), pos_ - start);
      }
      fields.push_back(std::move(f));
      if (pos_ >= n_) return any_quoted;
      const uint8_t c = p_[pos_++];
      if (c == ',') continue;
      if (c == '\r' && pos_ < n_ && p_[pos_] == '\n') ++pos_;
      ++line_;
      return any_quoted;
    }
  }

  const std::string& path_;
  const uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
  int64_t line_ = 1;
  int64_t record_line_ = 1;
};

bool parse_number(std::string_view s, double& out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty() || s.front() == '+' || s.front() == ' ') return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

csv_table read_csv(const std::string& path, const std::string& label) {
  auto m = map_file(path);
  if (m->size > kMaxCsvBytes)
    fail(path, "too large for a CSV data set (" + std::to_string(m->size) +
                   " bytes, at most 1 GiB); store it as .npy files");
  reader rd(path, m->data, m->size);
  csv_table t;
  if (!rd.next(t.columns)) fail(path, "empty: expected a header row naming the columns");
  std::size_t label_at = t.columns.size();
  // A map, not a scan of the columns so far: a header of a million commas
  // would make that a trillion comparisons.
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < t.columns.size(); ++i) {
    auto [at, fresh] = seen.emplace(t.columns[i], i);
    if (!fresh)
      fail(path, "line " + std::to_string(rd.record_line()) + ": duplicate column " +
                     shown(t.columns[i]) + " (columns " + std::to_string(at->second + 1) + " and " +
                     std::to_string(i + 1) + ")");
    if (t.columns[i] == label) label_at = i;
  }
  if (label_at == t.columns.size()) {
    std::string have;
    for (std::size_t i = 0; i < t.columns.size() && i < 20; ++i)
      have += (i ? ", " : "") + shown(t.columns[i]);
    if (t.columns.size() > 20) have += ", ...";
    fail(path, "no label column " + shown(label) + " in the header (columns: " + have + ")");
  }
  if (t.columns.size() < 2)
    fail(path, "no feature columns: the header has only the label column " + shown(label));
  for (std::size_t i = 0; i < t.columns.size(); ++i)
    if (i != label_at) t.feature_names.push_back(t.columns[i]);

  std::vector<std::string> fields;
  while (rd.next(fields)) {
    const int64_t line = rd.record_line();
    if (fields.size() != t.columns.size())
      fail(path, "line " + std::to_string(line) + ": " + std::to_string(fields.size()) +
                     (fields.size() == 1 ? " field" : " fields") + ", the header has " +
                     std::to_string(t.columns.size()) + " (ragged rows are refused)");
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (i == label_at) continue;
      double v = 0;
      if (!parse_number(fields[i], v))
        fail(path, "line " + std::to_string(line) + ", column " + shown(t.columns[i]) +
                       ": expected a number, got " + shown(fields[i]));
      if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
        fail(path, "line " + std::to_string(line) + ", column " + shown(t.columns[i]) +
                       ": expected a finite number within float32's range, got " +
                       shown(fields[i]));
      t.features.push_back(static_cast<float>(v));
    }
    t.labels.push_back(std::move(fields[label_at]));
    t.label_lines.push_back(line);
    ++t.rows;
  }
  return t;
}

}  // namespace troupe::data
