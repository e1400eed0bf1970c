// c_allreduce_found_inf's CUDA maps (collective/cuda/found_inf_kernels.cuh),
// their very source, run on the CPU (tests/unit/cuda_emulation.h) in the order
// found_inf_allreduce_op.cu launches them (the mask zeroed, a mark launch per
// bucket, the one-rank all-reduce leaving the mask as it is, then Out), bit
// for bit against the CPU's op on one rank: Out and the whole provenance mask
// (OverflowRanks), with per-gradient flags across several blocks and without
// them, with a mask of two words a row (room for 64 ranks). test_cuda_overlap
// checks the GPU itself where one is lent.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/overflow_mask.h"
#include "tests/unit/cuda_compare.h"
#include "tests/unit/emulated_tensors.h"

// The emulation and its map launches, then the kernels (cuda_emulation.h
// defines CUDA's keywords as macros).
#include "tests/unit/emulated_map_launch.h"

#include "collective/cuda/found_inf_kernels.cuh"

using namespace mix;
using namespace mix::testing;

namespace {

constexpr int64_t kWorld = 64;  // two mask words a row

// A bucket's flags: FoundInfinite, and FoundInfiniteEach (none when `each` is empty).
struct Bucket {
  int32_t flag;
  std::vector<int32_t> each;
};

struct Found {
  std::vector<int32_t> mask;
  int32_t out;
};

// The maps as found_inf_cuda launches them, on rank 0 (the CPU op's one rank).
Found emulated_found_inf(const std::vector<Bucket>& buckets, bool with_each) {
  const int words = collective::overflow_mask_words(static_cast<int>(kWorld));
  int64_t params = 0;
  for (const Bucket& b : buckets) params += with_each ? static_cast<int64_t>(b.each.size()) : 0;
  Found f{std::vector<int32_t>(static_cast<size_t>((1 + params) * words), 0), -1};  // zeroed, as the memset
  int64_t row = 1;
  for (const Bucket& b : buckets) {
    const int64_t n = with_each ? static_cast<int64_t>(b.each.size()) : 0;
    emulated_grid_stride(
        std::max<int64_t>(n, 1),
        collective::FoundInfMarkBucket{&b.flag, n > 0 ? b.each.data() : nullptr, n, f.mask.data(), row, words, 0});
    row += n;
  }
  emulated_grid_stride(1, collective::FoundInfAnyRank{f.mask.data(), words, &f.out});
  return f;
}

Found cpu_found_inf(const std::vector<Bucket>& buckets, bool with_each) {
  std::vector<std::string> flags, each, params;
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (size_t k = 0; k < buckets.size(); ++k) {
    flags.push_back(numbered("found_inf", k));
    feeds.push_back({flags.back(), tensor_of(std::vector<int32_t>{buckets[k].flag}, {1}, DType::i32)});
    if (!with_each) continue;
    each.push_back(numbered("found_inf_each", k));
    feeds.push_back(
        {each.back(), tensor_of(buckets[k].each, {static_cast<int64_t>(buckets[k].each.size())}, DType::i32)});
    for (size_t i = 0; i < buckets[k].each.size(); ++i) params.push_back(numbered("p", params.size()));
  }
  std::map<std::string, std::vector<std::string>> ins{{"FoundInfinite", flags}};
  if (with_each) ins["FoundInfiniteEach"] = each;
  auto comm = collective::make_local_communicator();
  ExecEnv env;
  env.comm = comm.get();
  const auto out = run_ops_on({make_op("c_allreduce_found_inf", ins, {{"Out", {"out"}}, {"OverflowRanks", {"mask"}}},
                                       {{"params", params}, {"world_size", kWorld}})},
                              feeds, cpu_device(), env, {"out", "mask"});
  return {values_of<int32_t>(out.at("mask")), out.at("out").data<int32_t>()[0]};
}

// Flags 1 at every seventh entry from `first` (none when first < 0).
std::vector<int32_t> flags_from(size_t n, int first) {
  std::vector<int32_t> f(n, 0);
  for (size_t i = 0; first >= 0 && i < n; ++i) f[i] = (i >= static_cast<size_t>(first) && (i - first) % 7 == 0);
  return f;
}

}  // namespace

TEST_CASE("emulated found_inf marks give the CPU op's mask and Out", "[emulated][found_inf]") {
  // An empty bucket, one of 600 gradients (3 blocks of the mark launch), a
  // raised bucket flag with no gradient flagged, and a clean bucket.
  const std::vector<Bucket> raised{{0, {}}, {1, flags_from(600, 3)}, {1, flags_from(5, -1)}, {0, flags_from(40, -1)}};
  const std::vector<Bucket> clean{{0, flags_from(600, -1)}, {0, flags_from(5, -1)}};
  for (bool with_each : {true, false})
    for (const auto* buckets : {&raised, &clean}) {
      const std::string what = std::string(buckets == &raised ? "raised" : "clean") +
                               (with_each ? ", with FoundInfiniteEach" : ", without FoundInfiniteEach");
      INFO(what);
      const Found got = emulated_found_inf(*buckets, with_each);
      const Found want = cpu_found_inf(*buckets, with_each);
      CHECK(got.out == want.out);
      CHECK(got.out == (buckets == &raised ? 1 : 0));
      expect_same_bits(got.mask, want.mask, what + ": OverflowRanks");
    }
}
