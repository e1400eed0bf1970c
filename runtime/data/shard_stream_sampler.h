#pragma once
// WebDataset's way through tar shards, as a sampler: each rank reads its own
// shards, front to back, through a shuffle buffer, instead of every rank
// picking examples from a global permutation (DistributedSampler). Reads then
// go forward through a few files at a time, which is what network file
// systems and disks serve fast; the order is still a pure function of (seed,
// epoch, rank, world), so runs and resumed runs repeat their batches.
#include <cstdint>
#include <vector>

#include "runtime/core/random.h"
#include "runtime/data/dataset.h"

namespace mix::data {

class ShardStreamSampler final : public RankSampler {
 public:
  /// `shard_sizes`: examples in each shard, in the data set's order (shard
  /// k's examples follow shard k-1's). Throws mix::Error when there are fewer
  /// shards than ranks (a rank would have none) or the buffer is negative.
  ShardStreamSampler(std::vector<int64_t> shard_sizes, int rank, int world, bool shuffle, uint64_t seed,
                     int64_t shuffle_buffer);

  /// Epoch `epoch`: the shards in an order drawn from (seed, epoch) (the same
  /// on every rank; sorted without shuffle), dealt out round robin (rank r
  /// takes the r-th, r+world-th, ...); the rank's examples in shard order,
  /// through a shuffle buffer of `shuffle_buffer` examples seeded by (seed,
  /// epoch, rank) (none without shuffle or with a buffer under 2); then cut
  /// to per_rank(), or wrapped around to it when the rank's shards hold fewer.
  std::vector<int64_t> indices(int64_t epoch) const override;
  /// ceil(examples / world): every rank reads as many, as DistributedSampler.
  int64_t per_rank() const override { return per_rank_; }

 private:
  std::vector<int64_t> sizes_, starts_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  int64_t buffer_;
  int64_t per_rank_ = 0;
};

/// The shuffle buffer alone: `stream` through a buffer of `size` slots
/// (WebDataset's shuffle): fill it, then for each further example emit a
/// random slot's and put the new one there; finally empty it in random
/// order. An example at stream position i comes out at position i - size + 1
/// or later. Exposed for tests.
std::vector<int64_t> shuffle_through_buffer(const std::vector<int64_t>& stream, int64_t size, Rng& rng);

}  // namespace mix::data
