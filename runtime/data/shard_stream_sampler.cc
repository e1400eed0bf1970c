#include "runtime/data/shard_stream_sampler.h"

#include <numeric>

#include "runtime/core/check.h"
#include "runtime/core/random.h"

namespace mix::data {

ShardStreamSampler::ShardStreamSampler(std::vector<int64_t> shard_sizes, int rank, int world, bool shuffle,
                                       uint64_t seed, int64_t shuffle_buffer)
    : sizes_(std::move(shard_sizes)), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed),
      buffer_(shuffle_buffer) {
  MIX_CHECK(world >= 1 && rank >= 0 && rank < world, "rank " << rank << " is not in [0, " << world << ")");
  MIX_CHECK(shuffle_buffer >= 0, "--shuffle-buffer " << shuffle_buffer << " is negative");
  MIX_CHECK(static_cast<int64_t>(sizes_.size()) >= world,
            sizes_.size() << " training shard(s) for " << world
                          << " ranks: --shard-order stream gives each rank shards of its own, so it needs at least as "
                             "many shards as ranks: write smaller shards (scripts/make_image_shards.py --per-shard), "
                             "or read them as one pool (--shard-order global)");
  starts_.resize(sizes_.size());
  int64_t total = 0;
  for (size_t k = 0; k < sizes_.size(); ++k) {
    MIX_CHECK(sizes_[k] >= 0, "shard " << k << " has a negative size");
    starts_[k] = total;
    total += sizes_[k];
  }
  MIX_CHECK(total > 0, "the training shards hold no example");
  per_rank_ = (total + world - 1) / world;
}

std::vector<int64_t> shuffle_through_buffer(const std::vector<int64_t>& stream, int64_t size, Rng& rng) {
  if (size < 1) return stream;  // no slot: the examples pass straight through
  std::vector<int64_t> out, buf;
  out.reserve(stream.size());
  buf.reserve(static_cast<size_t>(std::max<int64_t>(size, 0)));
  for (int64_t x : stream) {
    if (static_cast<int64_t>(buf.size()) < size) {
      buf.push_back(x);
      continue;
    }
    const size_t k = static_cast<size_t>(rng.below(buf.size()));
    out.push_back(buf[k]);
    buf[k] = x;
  }
  while (!buf.empty()) {
    const size_t k = static_cast<size_t>(rng.below(buf.size()));
    out.push_back(buf[k]);
    buf[k] = buf.back();
    buf.pop_back();
  }
  return out;
}

std::vector<int64_t> ShardStreamSampler::indices(int64_t epoch) const {
  std::vector<size_t> order(sizes_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  Rng epoch_rng = Rng::for_stream(seed_, static_cast<uint64_t>(epoch));
  if (shuffle_) {
    // Fisher-Yates on the shards, the same draws on every rank.
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[static_cast<size_t>(epoch_rng.below(i + 1))]);
  }
  std::vector<int64_t> stream;
  for (size_t p = static_cast<size_t>(rank_); p < order.size(); p += static_cast<size_t>(world_))
    for (int64_t j = 0; j < sizes_[order[p]]; ++j) stream.push_back(starts_[order[p]] + j);
  if (shuffle_ && buffer_ > 1) {
    Rng rank_rng = Rng::for_stream(epoch_rng.next_u64(), static_cast<uint64_t>(rank_));
    stream = shuffle_through_buffer(stream, buffer_, rank_rng);
  }
  MIX_CHECK(!stream.empty(), "rank " << rank_ << " was dealt only empty shards in epoch " << epoch);
  // An equal share on every rank: the shards dealt out differ in size, so a
  // rank's stream is cut, or repeated from its start (as DistributedSampler pads).
  std::vector<int64_t> mine(static_cast<size_t>(per_rank_));
  for (int64_t p = 0; p < per_rank_; ++p) mine[static_cast<size_t>(p)] = stream[static_cast<size_t>(p) % stream.size()];
  return mine;
}

}  // namespace mix::data
