// The host side of multi-tensor launches (runtime/kernels/multi_tensor_plan.h):
// every element of every tensor is covered by exactly one block of one launch,
// and no launch exceeds the table the kernel's argument can carry. The CUDA
// kernels trust this plan; their [cuda] tests (test_cuda_overlap) check the
// results, this one checks the bookkeeping on every machine.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "models/model.h"
#include "runtime/kernels/multi_tensor_plan.h"

using mix::multi_tensor::LaunchPlan;
using mix::multi_tensor::plan_launches;

namespace {

// Checks the plan's invariants for these limits; returns, per tensor, the
// number of blocks that worked on each of its chunks.
std::vector<std::map<int64_t, int>> check_plan(const std::vector<LaunchPlan>& plan, const std::vector<int64_t>& numels,
                                               int64_t chunk, int max_tensors, int max_blocks) {
  std::vector<std::map<int64_t, int>> seen(numels.size());
  for (const LaunchPlan& l : plan) {
    REQUIRE(!l.block_chunk.empty());
    REQUIRE(l.block_chunk.size() == l.block_tensor.size());
    REQUIRE(static_cast<int>(l.block_chunk.size()) <= max_blocks);
    REQUIRE(static_cast<int>(l.tensors.size()) <= max_tensors);
    REQUIRE(std::set<size_t>(l.tensors.begin(), l.tensors.end()).size() == l.tensors.size());
    std::set<size_t> used;
    for (size_t b = 0; b < l.block_chunk.size(); ++b) {
      REQUIRE(l.block_tensor[b] < l.tensors.size());
      const size_t t = l.tensors[l.block_tensor[b]];
      REQUIRE(t < numels.size());
      const int64_t c = l.block_chunk[b];
      REQUIRE(c >= 0);
      REQUIRE(c * chunk < numels[t]);  // the chunk starts inside the tensor
      ++seen[t][c];
      used.insert(t);
    }
    CHECK(used.size() == l.tensors.size());  // no table entry without a block
  }
  return seen;
}

// Every chunk of every tensor exactly once.
void check_cover(const std::vector<std::map<int64_t, int>>& seen, const std::vector<int64_t>& numels, int64_t chunk) {
  for (size_t t = 0; t < numels.size(); ++t) {
    INFO("tensor " << t << " of " << numels[t] << " elements");
    const int64_t chunks = (numels[t] + chunk - 1) / chunk;
    CHECK(static_cast<int64_t>(seen[t].size()) == chunks);
    for (auto& [c, count] : seen[t]) {
      CHECK(c < chunks);
      CHECK(count == 1);
    }
  }
}

}  // namespace

TEST_CASE("multi-tensor plan: every chunk of every tensor once, within the table's limits", "[multi_tensor]") {
  struct Limits {
    int64_t chunk;
    int max_tensors, max_blocks;
  };
  // Small limits make every boundary happen on small lists; the last are the
  // kernels' own.
  const Limits limits[] = {{4, 3, 5},
                           {1, 1, 1},
                           {7, 2, 3},
                           {100, 48, 320},
                           {mix::multi_tensor::kChunk, mix::multi_tensor::kMaxTensors, mix::multi_tensor::kMaxBlocks}};
  std::vector<std::vector<int64_t>> lists = {
      {},   {0}, {0, 0, 0}, {1}, {4}, {5}, {3, 0, 17, 4, 1, 0, 8, 9, 100},
      {21},  // more chunks than one launch holds at the smallest limits
  };
  // A ResNet-50-like list: 161 tensors from 64 to 2.4M elements, and one much
  // larger than a launch's blocks can cover at the kernels' chunk.
  std::vector<int64_t> resnet_like;
  for (int i = 0; i < 161; ++i) resnet_like.push_back(i % 3 == 0 ? 64 << (i % 6) : 589824 * (1 + i % 4));
  resnet_like.push_back(int64_t{6} * mix::multi_tensor::kChunk * mix::multi_tensor::kMaxBlocks + 5);
  lists.push_back(resnet_like);
  for (const Limits& lim : limits)
    for (const auto& numels : lists) {
      int64_t chunks = 0;
      for (int64_t n : numels) chunks += (n + lim.chunk - 1) / lim.chunk;
      if (chunks > 100000) continue;  // the ResNet-like list at the small chunks: too slow to check, nothing new
      INFO("chunk " << lim.chunk << ", " << lim.max_tensors << " tensors and " << lim.max_blocks
                    << " blocks per launch, " << numels.size() << " tensors");
      const auto plan = plan_launches(numels, lim.chunk, lim.max_tensors, lim.max_blocks);
      check_cover(check_plan(plan, numels, lim.chunk, lim.max_tensors, lim.max_blocks), numels, lim.chunk);
      // Launches are filled before a new one starts: all but the last are at a limit.
      for (size_t k = 0; k + 1 < plan.size(); ++k) {
        const bool blocks_full = static_cast<int>(plan[k].block_chunk.size()) == lim.max_blocks;
        const bool table_full = static_cast<int>(plan[k].tensors.size()) == lim.max_tensors;
        CHECK((blocks_full || table_full));
      }
    }
}

TEST_CASE("multi-tensor plan: exact launches for a small list", "[multi_tensor]") {
  // Chunks of 4, at most 2 tensors and 3 blocks a launch. Tensor 0 (10
  // elements: chunks 0-2) fills the first launch; tensor 1 is empty; tensor 2
  // (5: chunks 0-1) and tensor 3 (3: chunk 0) share the second.
  const auto plan = plan_launches({10, 0, 5, 3}, 4, 2, 3);
  REQUIRE(plan.size() == 2);
  CHECK(plan[0].tensors == std::vector<size_t>{0});
  CHECK(plan[0].block_tensor == std::vector<uint8_t>{0, 0, 0});
  CHECK(plan[0].block_chunk == std::vector<int32_t>{0, 1, 2});
  CHECK(plan[1].tensors == std::vector<size_t>{2, 3});
  CHECK(plan[1].block_tensor == std::vector<uint8_t>{0, 0, 1});
  CHECK(plan[1].block_chunk == std::vector<int32_t>{0, 1, 0});
  // A full table starts a new launch even with blocks to spare; a tensor that
  // does not fit the blocks left continues in the next launch.
  const auto split = plan_launches({1, 1, 13}, 4, 2, 3);
  REQUIRE(split.size() == 3);
  CHECK(split[0].tensors == std::vector<size_t>{0, 1});
  CHECK(split[1].tensors == std::vector<size_t>{2});
  CHECK(split[1].block_chunk == std::vector<int32_t>{0, 1, 2});
  CHECK(split[2].tensors == std::vector<size_t>{2});
  CHECK(split[2].block_chunk == std::vector<int32_t>{3});
}

TEST_CASE("multi-tensor plan: a ResNet-50's gradients take two launches a pass", "[multi_tensor]") {
  // The figure runtime/kernels/multi_tensor_plan.h and the optimizer, unscale
  // and bucket-copy launchers rely on: with 4 KiB tables the same list took ~40.
  const mix::models::Model m = mix::models::build_resnet(mix::models::resnet_preset("resnet50"), "resnet50");
  std::vector<int64_t> numels;
  for (const auto& v : m.program.vars()) {
    if (!v.is_parameter) continue;
    int64_t n = 1;
    for (int64_t d : v.shape) n *= d;
    numels.push_back(n);
  }
  REQUIRE(numels.size() == 161);
  std::vector<int64_t> shared;
  int alone = 0;
  for (int64_t n : numels) {
    alone += mix::multi_tensor::launched_alone(n) ? 1 : 0;
    shared.push_back(mix::multi_tensor::launched_alone(n) ? 0 : n);
  }
  CHECK(alone == 0);
  CHECK(plan_launches(shared).size() == 2);
}
