#pragma once
// CSV tables (RFC 4180: comma-separated, fields optionally in double quotes,
// "" for a quote inside them, commas and line breaks allowed inside quotes,
// LF or CRLF line ends): a header row naming the columns, then one example
// per row. One column is the label; every other one is a numeric feature.
#include <cstdint>
#include <string>
#include <vector>

#include "data/idx.hpp"  // data_error

namespace troupe::data {

struct csv_table {
  std::vector<std::string> columns;        // the header, the label column included
  std::vector<std::string> feature_names;  // the header without the label column
  int64_t rows = 0;
  std::vector<float> features;       // [rows, feature_names.size()], row-major
  std::vector<std::string> labels;   // each row's label cell, unquoted
  std::vector<int64_t> label_lines;  // the line each row starts on, for messages
};

// Larger CSV files are refused (they are read whole; a data set this large
// belongs in .npy files, which are memory-mapped).
constexpr uint64_t kMaxCsvBytes = uint64_t{1} << 30;

// Reads `path`, with `label` the label column's name. Throws data_error
// naming the file, and the line and column where it applies, for: an empty
// file, a duplicate column name, no column `label`, no feature column, a row
// with another number of fields than the header, an unterminated quoted
// field or text after a closing quote, and a feature cell that is not a
// finite number (`data/train.csv: line 17, column "petal_width": expected a
// number, got "abc"`). Blank lines are skipped; a UTF-8 byte-order mark is
// ignored.
csv_table read_csv(const std::string& path, const std::string& label);

}  // namespace troupe::data
