#include "runtime/cuda/device_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_check.h"

namespace mix::cuda {

namespace {

// "1073741824 bytes (1.00 GiB)": the exact figure to grep for, and one to read.
std::string bytes_str(size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes (%.2f %s)", bytes, v, kUnits[u]);
  return buf;
}

size_t round_up(size_t n, size_t granularity) {
  if (n > std::numeric_limits<size_t>::max() - granularity) return std::numeric_limits<size_t>::max();
  return (n + granularity - 1) / granularity * granularity;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  MIX_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != device) {
    MIX_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(prev_));
}

size_t CudaCachingAllocator::round_size(size_t bytes) {
  return bytes <= kSmallLimit ? round_up(bytes, kSmallGranularity) : round_up(bytes, kLargeGranularity);
}

CudaCachingAllocator::CudaCachingAllocator(int device) : device_(device) {}

CudaCachingAllocator::~CudaCachingAllocator() { empty_cache(); }

CudaCachingAllocator::FreeList::iterator CudaCachingAllocator::best_fit(FreeList& list, size_t rounded) {
  // Best fit among the cached blocks, if it wastes less than half of itself.
  // Equal sizes come out last-freed first (see deallocate), which keeps the
  // most recently touched memory in the caches.
  auto it = list.lower_bound(rounded);
  return it != list.end() && it->first / 2 < rounded ? it : list.end();
}

void* CudaCachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  FreeList& list = active_pool_ == 0 ? free_ : pools_.at(active_pool_);
  if (auto it = best_fit(list, rounded); it != list.end()) {
    void* p = it->second;
    const size_t size = it->first;
    handed_out_.emplace(p, Block{size, bytes, active_pool_});  // first: if it throws, the block stays cached
    list.erase(it);
    if (active_pool_ == 0) cached_ -= size;
    count_alloc(bytes);
    return p;
  }
  void* p = malloc_with_retry(rounded, bytes);
  try {
    handed_out_.emplace(p, Block{rounded, bytes, active_pool_});
  } catch (...) {
    MIX_CUDA_CHECK_NOTHROW(cudaFree(p));
    reserved_ -= rounded;
    throw;
  }
  count_alloc(bytes);
  return p;
}

void* CudaCachingAllocator::malloc_with_retry(size_t rounded, size_t requested) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  // Past set_limit's cap the device counts as full (no CUDA call made, so no
  // CUDA error to clear); written so that it cannot wrap around.
  bool refused_by_limit = false;
  auto device_malloc = [&] {
    refused_by_limit = rounded > limit_ - std::min(reserved_, limit_);
    return refused_by_limit ? cudaErrorMemoryAllocation : cudaMalloc(&p, rounded);
  };
  cudaError_t err = device_malloc();
  const size_t cached_before = cached_;
  if (err == cudaErrorMemoryAllocation && active_pool_ == 0) {
    // Out of memory is not sticky; do not let a later launch check report it.
    if (!refused_by_limit) (void)cudaGetLastError();
    // Returning the cache waits for the whole device (cudaDeviceSynchronize,
    // cudaFree). Work that never finishes, a collective waiting for a dead
    // peer, would hang that forever: wait under the hang timeout first.
    if (!free_.empty() && !wait_for_streams(device_))
      MIX_FAIL("CUDA out of memory on device "
               << device_ << " allocating " << bytes_str(requested) << ", and the cached "
               << bytes_str(cached_before) << " could not be returned to the driver: the device's queued work did not "
               << "finish within " << hang_timeout() << " s (MIX_NCCL_TIMEOUT_S); a collective may be waiting for a "
               << "rank that died (see the other ranks' logs) [" << process_identity() << "]");
    empty_cache_locked();
    err = device_malloc();
  }
  if (err == cudaErrorMemoryAllocation) {
    if (!refused_by_limit) (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    std::string info;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      info = "device free " + bytes_str(free_b) + " of total " + bytes_str(total_b);
    } else {
      (void)cudaGetLastError();
      info = "device free/total unknown";
    }
    if (limit_ != std::numeric_limits<size_t>::max()) info += ", this process's limit " + bytes_str(limit_);
    if (active_pool_ != 0)
      info +=
          "; while recording a device graph, so the cache was kept (returning it waits for the device, which "
          "recording forbids); a single process goes on without the recording, several ranks stop: run without "
          "--cuda-graph, or with a smaller batch";
    throw OutOfMemoryError(MIX_STR_CAT("CUDA out of memory on device "
                                       << device_ << " allocating " << bytes_str(requested) << " (rounded to "
                                       << rounded << " bytes; live " << bytes_str(live_bytes()) << ", cached "
                                       << bytes_str(cached_before) << " returned to the driver before retrying, "
                                       << info << ") [" << process_identity() << "]"));
  }
  if (err != cudaSuccess)  // not a lack of memory: a sticky error from earlier work, or a broken device
    ::mix::throw_check_failure("cudaMalloc(&p, rounded)", __FILE__, __LINE__,
                               std::string("CUDA error: ") + cudaGetErrorString(err));
  reserved_ += rounded;
  return p;
}

void CudaCachingAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handed_out_.find(p);
  if (it == handed_out_.end()) {
    std::fprintf(stderr, "CudaCachingAllocator(cuda:%d): free of %p (%zu bytes), which it did not allocate (%s)\n",
                 device_, p, bytes, process_identity().c_str());
    return;
  }
  const Block b = it->second;
  handed_out_.erase(it);
  count_free(b.requested);
  if (b.pool != 0) {
    if (auto pool = pools_.find(b.pool); pool != pools_.end()) {
      try {
        pool->second.emplace_hint(pool->second.lower_bound(b.size), b.size, p);
        return;
      } catch (...) {
        // No memory for the bookkeeping: the block cannot be kept for its
        // recording, and a replay may still write it. Keep it out of every
        // cache (leaked) rather than hand it to someone else.
        std::fprintf(stderr, "CudaCachingAllocator(cuda:%d): %zu bytes of a recording's pool leaked (%s)\n", device_,
                     b.size, process_identity().c_str());
        return;
      }
    }
    // Its pool was released: the block joins the shared cache.
  }
  try {
    // Hint = first block of this size: the new one goes in front of it (LIFO).
    free_.emplace_hint(free_.lower_bound(b.size), b.size, p);
    cached_ += b.size;
  } catch (...) {
    // No memory for the bookkeeping: give the block back instead (cudaFree
    // waits for the device, so no queued kernel still uses it).
    MIX_CUDA_CHECK_NOTHROW(cudaFree(p));
    reserved_ -= b.size;
  }
}

int CudaCachingAllocator::new_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_pool_++;
  pools_.emplace(id, FreeList{});
  return id;
}

void CudaCachingAllocator::use_pool(int pool) {
  std::lock_guard<std::mutex> lock(mu_);
  MIX_CHECK(pool == 0 || pools_.count(pool), "CUDA allocator of device " << device_ << ": no pool " << pool);
  active_pool_ = pool;
}

void CudaCachingAllocator::release_pool(int pool) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  if (active_pool_ == pool) active_pool_ = 0;
  for (auto& [size, p] : it->second) {
    try {
      free_.emplace_hint(free_.lower_bound(size), size, p);
      cached_ += size;
    } catch (...) {
      MIX_CUDA_CHECK_NOTHROW(cudaFree(p));  // no queued work uses it (see the header)
      reserved_ -= size;
    }
  }
  pools_.erase(it);
}

void CudaCachingAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

size_t CudaCachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

size_t CudaCachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

size_t CudaCachingAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

void CudaCachingAllocator::empty_cache() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void CudaCachingAllocator::empty_cache_locked() noexcept {
  if (free_.empty()) return;
  int prev = -1;
  const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
  MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
  // A cached block may still be read by work queued before it was freed (on
  // the compute stream, or on another stream ordered onto it): wait for it all.
  MIX_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
  for (auto& [size, p] : free_) {
    MIX_CUDA_CHECK_NOTHROW(cudaFree(p));
    reserved_ -= size;
  }
  free_.clear();
  cached_ = 0;
  if (have_prev && prev != device_) MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(prev));
}

namespace {

std::mutex g_capture_mu;
int g_captures = 0;                               // CaptureInProgress marks alive
std::vector<std::pair<int, void*>> g_held_frees;  // (device, pointer) freed during a capture

void free_pinned(int device, void* p) noexcept {
  MIX_CUDA_CHECK_NOTHROW(cudaSetDevice(device));  // and left current: see PinnedHostAllocator
  MIX_CUDA_CHECK_NOTHROW(cudaFreeHost(p));
}

}  // namespace

CaptureInProgress::CaptureInProgress() {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  ++g_captures;
}

CaptureInProgress::~CaptureInProgress() {
  std::vector<std::pair<int, void*>> due;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    if (--g_captures == 0) due.swap(g_held_frees);
  }
  for (const auto& [device, p] : due) free_pinned(device, p);
}

void* PinnedHostAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  MIX_CUDA_CHECK(cudaSetDevice(device_));  // and left current: see the class comment
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    MIX_FAIL("could not allocate " << bytes_str(bytes) << " of pinned host memory: " << cudaGetErrorString(err)
                                   << " [" << process_identity() << "]");
  }
  count_alloc(bytes);
  return p;
}

void PinnedHostAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  count_free(bytes);
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    if (g_captures > 0) {
      try {
        g_held_frees.emplace_back(device_, p);
        return;
      } catch (const std::bad_alloc&) {
        // No room to hold it: free it now, as before the capture marks.
      }
    }
  }
  free_pinned(device_, p);
}

}  // namespace mix::cuda
