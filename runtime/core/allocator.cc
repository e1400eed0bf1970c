#include "runtime/core/allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/core/asan.h"
#include "runtime/core/check.h"

// Under AddressSanitizer (scripts/sanitize.sh) a block's rounding tail and a
// cached block are closed, so that a read or write past a tensor's bytes,
// or into a freed tensor whose block waits in the cache for reuse, is
// reported as it would be for malloc's own blocks.

namespace mix {

void Allocator::count_alloc(size_t bytes) {
  const size_t now = live_.fetch_add(bytes) + bytes;
  size_t prev = peak_.load();
  while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
  }
}

namespace {
size_t rounded_size(size_t bytes) { return (bytes + 63) / 64 * 64; }

// p's first `bytes` open, the rest of its rounded block closed.
void open_block(void* p, size_t bytes) {
  asan_mark(p, bytes, true);
  asan_mark(static_cast<char*>(p) + bytes, rounded_size(bytes) - bytes, false);
}
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
      open_block(p, bytes);
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
  open_block(p, bytes);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  count_free(bytes);
  const size_t rounded = rounded_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_ + rounded > kMaxCachedBytes) {
    asan_mark(p, rounded, true);
    std::free(p);
    return;
  }
  try {
    free_[rounded].push_back(p);
    cached_ += rounded;
    asan_mark(p, rounded, false);  // cached: closed until handed out again
  } catch (...) {
    asan_mark(p, rounded, true);
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
    for (void* b : blocks) {
      asan_mark(b, size, true);
      std::free(b);
    }
  free_.clear();
  cached_ = 0;
}

}  // namespace mix
