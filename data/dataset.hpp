#pragma once
// In-memory data sets (Fashion-MNIST) and the deterministic batch order every
// data pipeline shares.
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
  tensor labels;  // [N] int32
  int64_t classes = 10;
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
};

struct train_test {
  dataset train, test;
  float mean = 0, stddev = 1;  // the normalization applied (0 / 1 when none)
};

// Reads <cfg.path>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, preferring the
// .gz name and falling back to the plain one. Pixels are scaled to [0,1]; with
// cfg.normalize, then (x - mean) / stddev, the statistics taken over the
// (limited) training set and applied to both sets. cfg.train_limit and
// cfg.test_limit > 0 keep the first N examples. Throws data_error.
train_test load_fashion_mnist(const troupe::data_config& cfg);

// The order of examples in an epoch: a permutation of [0, n) that depends only
// on (seed, epoch) and is the same on every platform (xoshiro256** seeded by
// splitmix64, own Fisher-Yates); the identity when !shuffle.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// Copies rows idx[0..k) of d into x [k, F] float32 and y [k] int32 (decoding
// d.codes when d has them); x and y are reallocated only when their shape or
// type differs. Throws data_error for an index out of range, before writing.
void gather_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y);

// gather_batch in pieces: `prepare` checks the indices and (re)allocates x and
// y for all of them; `gather_rows` then fills rows [begin, end) of x and y.
void prepare_batch(const dataset& d, std::span<const int64_t> idx, tensor& x, tensor& y);
void gather_rows(const dataset& d, std::span<const int64_t> idx, int64_t begin, int64_t end,
                 tensor& x, tensor& y);

}  // namespace troupe::data
