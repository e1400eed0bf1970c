// --shard-order stream (runtime/data/shard_stream_sampler.h): each rank reads
// only shards of its own, in shard order up to the shuffle buffer's reach,
// an equal share, repeatably; the buffer alone keeps every example once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>

#include "runtime/core/check.h"
#include "runtime/data/shard_stream_sampler.h"

using namespace mix;
using namespace mix::data;

namespace {

// The shard that example i belongs to, for shards of `sizes`.
int64_t shard_of(const std::vector<int64_t>& sizes, int64_t i) {
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (i < sizes[k]) return static_cast<int64_t>(k);
    i -= sizes[k];
  }
  return -1;
}

}  // namespace

TEST_CASE("the shuffle buffer emits every example once, none earlier than the buffer allows", "[shard_stream]") {
  std::vector<int64_t> stream(1000);
  std::iota(stream.begin(), stream.end(), int64_t{0});
  for (int64_t size : {0, 1, 2, 10, 100, 5000}) {
    INFO("buffer " << size);
    Rng rng(3);
    const std::vector<int64_t> out = shuffle_through_buffer(stream, size, rng);
    std::vector<int64_t> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == stream);
    // Example i enters the buffer when output i - size is drawn, so it can
    // leave at i - size + 1 at the earliest (no buffer: at i).
    const int64_t slots = std::max<int64_t>(size, 1);
    bool in_reach = true;
    for (size_t p = 0; p < out.size(); ++p) in_reach &= static_cast<int64_t>(p) >= out[p] - slots + 1;
    CHECK(in_reach);
    if (size >= 10) CHECK(out != stream);  // it does shuffle
    if (size <= 1) CHECK(out == stream);   // a buffer of one slot keeps the order
  }
}

TEST_CASE("stream order: each rank its own shards, equal shares, repeatable", "[shard_stream]") {
  const std::vector<int64_t> sizes = {50, 70, 60, 40, 55, 65, 0, 30};  // an empty shard too
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  for (int world : {1, 2, 3, 4}) {
    for (int64_t buffer : {0, 16}) {
      INFO("world " << world << ", buffer " << buffer);
      std::vector<std::set<int64_t>> shards_of_rank(world);
      for (int64_t epoch : {0, 1}) {
        std::vector<int64_t> seen_shard(sizes.size(), -1);
        for (int r = 0; r < world; ++r) {
          const ShardStreamSampler s(sizes, r, world, /*shuffle=*/true, 7, buffer);
          CHECK(s.per_rank() == (total + world - 1) / world);
          const std::vector<int64_t> idx = s.indices(epoch);
          CHECK(static_cast<int64_t>(idx.size()) == s.per_rank());
          CHECK(idx == ShardStreamSampler(sizes, r, world, true, 7, buffer).indices(epoch));  // repeatable
          for (int64_t i : idx) {
            const int64_t k = shard_of(sizes, i);
            REQUIRE(k >= 0);
            // A shard is one rank's in an epoch.
            CHECK((seen_shard[static_cast<size_t>(k)] == -1 || seen_shard[static_cast<size_t>(k)] == r));
            seen_shard[static_cast<size_t>(k)] = r;
          }
        }
      }
    }
  }
  // Epochs deal the shards out differently (shuffle), the same ones in order without.
  const ShardStreamSampler a(sizes, 0, 2, true, 7, 0);
  CHECK(a.indices(0) != a.indices(1));
  const ShardStreamSampler b(sizes, 1, 2, /*shuffle=*/false, 7, 16);
  // Without shuffle rank 1 of 2 reads shards 1, 3, 5 and 7 front to back:
  // 70 + 40 + 65 + 30 = 205 examples, cut to its share of 370 / 2 = 185.
  std::vector<int64_t> plain;
  for (size_t k : {1, 3, 5, 7})
    for (int64_t j = 0; j < sizes[k]; ++j) plain.push_back(std::accumulate(sizes.begin(), sizes.begin() + k, 0) + j);
  REQUIRE(b.per_rank() == 185);
  plain.resize(185);
  CHECK(b.indices(0) == plain);
  CHECK(b.indices(0) == b.indices(1));
  // Rank 0 gets shards 0, 2, 4, 6: 50 + 60 + 55 + 0 = 165, wrapped around to 185.
  const std::vector<int64_t> r0 = ShardStreamSampler(sizes, 0, 2, false, 7, 16).indices(0);
  REQUIRE(r0.size() == 185);
  CHECK(std::equal(r0.begin() + 165, r0.end(), r0.begin()));
}

TEST_CASE("stream order needs a shard for every rank", "[shard_stream]") {
  CHECK_THROWS_WITH(ShardStreamSampler({10, 10}, 0, 3, true, 1, 8),
                    Catch::Contains("2 training shard(s) for 3 ranks") && Catch::Contains("--shard-order global"));
  CHECK_THROWS_WITH(ShardStreamSampler({10, 10}, 0, 1, true, 1, -1), Catch::Contains("--shuffle-buffer"));
}
