#include "runtime/core/allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/core/check.h"

namespace mix {

void Allocator::count_alloc(size_t bytes) {
  const size_t now = live_.fetch_add(bytes) + bytes;
  size_t prev = peak_.load();
  while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
  }
}

namespace {
size_t rounded_size(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

CpuAllocator::~CpuAllocator() { release_cache(); }

void* CpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = rounded_size(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= rounded;
      count_alloc(bytes);
      return p;
    }
  }
  void* p = std::aligned_alloc(64, rounded);
  if (!p) {
    release_cache();
    p = std::aligned_alloc(64, rounded);
  }
  if (!p) MIX_FAIL("out of host memory allocating " << bytes << " bytes (" << live_bytes() << " bytes live)");
  count_alloc(bytes);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  count_free(bytes);
  const size_t rounded = rounded_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_ + rounded > kMaxCachedBytes) {
    std::free(p);
    return;
  }
  try {
    free_[rounded].push_back(p);
    cached_ += rounded;
  } catch (...) {
    std::free(p);  // no memory for the bookkeeping: give the block back instead
  }
}

size_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

void CpuAllocator::release_cache() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : free_)
    for (void* b : blocks) std::free(b);
  free_.clear();
  cached_ = 0;
}

}  // namespace mix
