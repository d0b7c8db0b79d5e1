#pragma once
// Data sets (Fashion-MNIST's IDX files, NumPy .npy/.npz, CSV tables) and the
// deterministic batch order every data pipeline shares.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/job_config.hpp"
#include "data/idx.hpp"
#include "messages/tensor.hpp"

namespace troupe::data {

struct dataset {
  tensor images;  // [N, F] float32
  // [N] int32 class labels, or [N, K] float32 targets (regression, binary
  // losses): see convert_labels.
  tensor labels;
  int64_t classes = 10;  // class labels: every label is < classes; 0 for float targets
  // The logical shape of one example, whose product is F: batches stay flat
  // [k, F] and a model reshapes them with it. IDX images {1, rows, cols}
  // (channels first); an .npy array [N, a, b, ...] {a, b, ...}, [N] {1}; a
  // CSV row {features}.
  std::vector<int64_t> example_shape;
  // When the examples came from bytes (Fashion-MNIST's pixels): the same rows
  // as [N, F] bytes, each standing for decode[byte], so that decoding gives
  // `images` bit for bit. gather_batch reads these instead of the floats:
  // batches are random rows of a dataset far larger than the caches, and a
  // quarter of the bytes to fetch halves the gather (0.58 -> 0.29 ms for
  // 1024 rows), which in mirrored training competes with the replicas for
  // the cores. Empty for float-only datasets and for the test split (it is
  // evaluated whole, from its floats).
  std::vector<uint8_t> codes;
  std::array<float, 256> decode{};

  int64_t size() const { return images.rank() > 0 ? images.dim(0) : 0; }
  int64_t features() const { return images.rank() > 1 ? images.dim(1) : 0; }
  bool float_targets() const { return labels.type() == dtype::f32; }
  // K of float targets [N, K]; 0 for class labels.
  int64_t targets() const { return float_targets() && labels.rank() > 1 ? labels.dim(1) : 0; }
};

struct train_test {
  dataset train, test;
  float mean = 0, stddev = 1;  // the normalization applied (0 / 1 when none)
  // data.standardize: feature j became (x - feature_mean[j]) / feature_std[j]
  // in both splits, the statistics fitted on the (limited) training split; a
  // model serving new inputs must apply the same. Empty when not asked.
  std::vector<float> feature_mean, feature_std;
  // CSV labels that are not numbers: class i is class_names[i] (sorted, over
  // both splits). Empty otherwise.
  std::vector<std::string> class_names;
};

// Whether every file cfg names (for the npy, npz and csv formats) exists,
// before any is read: throws config_error naming the JSON path
// ("data.train.x: file not found: x_train.npy"). load_data calls it first.
void check_data_files(const troupe::data_config& cfg);

// The data set cfg describes, by cfg.format: idx (load_fashion_mnist), npy,
// npz or csv. Integer labels become int32 class labels (refused when
// negative or >= 2^31, or >= cfg.classes when given), float labels float32
// targets [N, K] (K = 1 for [N]); CSV labels that are all integers are
// class labels, all numbers float targets, else class names. uint8 examples
// are scaled and normalized as IDX pixels are (cfg.normalize) and keep their
// bytes for gather_batch; float32 .npy examples at an aligned offset are
// memory-mapped, not copied (unless standardized). train_limit/test_limit
// keep the first N. With cfg.standardize, then standardize(). A float
// example or target of .npy/.npz that is NaN, infinite or beyond float32's
// range is refused as in CSV, naming the array, row and column. Throws
// data_error naming the file and the problem.
train_test load_data(const troupe::data_config& cfg);

// Where cfg's data comes from, for log lines: the IDX directory or the files.
std::string data_source(const troupe::data_config& cfg);

// Per-feature standardisation: the mean and (population) standard deviation
// of every feature over the training split (1 for a constant feature),
// applied to both splits and kept in feature_mean / feature_std. The byte
// codes are dropped (they would decode to the unstandardised values).
void standardize(train_test& tt);

// What a loss needs: `classes`, int32 [N] class labels (from float targets
// [N, 1] only when every value is a whole number >= 0 and < 2^31; else
// data_error naming the split and row); `targets`, float32 [N, 1] holding the
// class index; `one_hot`, float32 [N, classes]. classes > 0 sets
// dataset.classes (a label >= it is an error), else max label + 1 over both
// splits; it is 0 for targets. Both splits are converted.
enum class label_kind { classes, targets, one_hot };
void convert_labels(train_test& tt, label_kind kind, int64_t classes = 0);

// Every int32 class label of `d` below `classes`, else data_error naming
// `name` and the row (its CSV line, when `lines` gives them). Float targets
// pass.
void check_classes(const dataset& d, int64_t classes, const std::string& name,
                   const std::vector<int64_t>* lines = nullptr);

// Reads <cfg.path>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, preferring the
// .gz name and falling back to the plain one. Pixels are scaled to [0,1]; with
// cfg.normalize, then (x - mean) / stddev, the statistics taken over the
// (limited) training set and applied to both sets. cfg.train_limit and
// cfg.test_limit > 0 keep the first N examples. Labels must be below
// cfg.classes (10 when 0). Throws data_error.
train_test load_fashion_mnist(const troupe::data_config& cfg);

// The order of examples in an epoch: a permutation of [0, n) that depends only
// on (seed, epoch) and is the same on every platform (xoshiro256** seeded by
// splitmix64, own Fisher-Yates); the identity when !shuffle.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// Copies rows idx[0..k) of d into x [k, F] float32 and y [k] int32 (or
// [k, K] float32 for float targets; decoding d.codes when d has them); x and y are reallocated only
// when their shape or type differs. Throws data_error for an index out of range, before writing.
void gather_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y);

// gather_batch in pieces: `prepare` checks the indices and (re)allocates x and
// y for all of them; `gather_rows` then fills rows [begin, end) of x and y.
void prepare_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y);
void gather_rows(const dataset& d, std::span<const int64_t> idx, int64_t begin, int64_t end,
                 tensor& x, tensor& y);

}  // namespace troupe::data
