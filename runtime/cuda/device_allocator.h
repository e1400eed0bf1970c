#pragma once
// The caching device allocator and pinned host buffers.
#include <cuda_runtime.h>

#include <cstddef>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/core/allocator.h"

namespace mix::cuda {

/// Makes `device` current for the lifetime of the guard and restores the
/// previous device after (the destructor never throws).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

/// A caching allocator of one GPU's memory.
///
/// Sizes are rounded up to 512 bytes up to 1 MiB and to 2 MiB above, so the
/// sizes a training step asks for every step fall into a few classes. Freed
/// blocks are kept in a free list ordered by size and handed out again by best
/// fit; a cached block is used only when it is less than twice the rounded
/// request (small requests never pin down large blocks). Blocks are never split.
///
/// Stream-ordered reuse: every block belongs to the device's compute stream. A
/// block freed on the host may be handed out again at once, because whatever the
/// next owner queues on the compute stream runs after the last use by the
/// previous owner. A block used on another stream (e.g. the communication stream
/// for NCCL) must be ordered back onto the compute stream before it is freed:
/// record an Event on that stream after its last use there and make the compute
/// stream wait for it (`ev.record(comm); ev.wait(compute)`).
///
/// live/peak count the requested bytes handed out (the metrics' peak_bytes);
/// cached_bytes() is what is held in the free list, reserved_bytes() all that is
/// held from cudaMalloc. When cudaMalloc fails the cache is returned to the
/// driver and the allocation retried once; if it fails again a
/// mix::OutOfMemoryError names the device, the request, live/cached bytes and
/// the device's free/total memory.
class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device);
  /// Returns the cached blocks to the driver; blocks still handed out are leaked.
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  void* allocate(size_t bytes) override;
  /// Never throws; `bytes` must be what was passed to allocate().
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return {DeviceKind::cuda, device_}; }

  size_t cached_bytes() const;
  size_t reserved_bytes() const;
  /// Returns every cached block to the driver (waits for the device first).
  void empty_cache() noexcept;

  /// Caps reserved_bytes() (PyTorch's per-process memory fraction, in bytes):
  /// a cudaMalloc that would pass the cap fails as the device running out
  /// would, cache returned and retried first. For sharing a GPU, and for tests
  /// of what runs out of memory. Blocks already held are kept.
  void set_limit(size_t bytes);
  size_t limit() const;

  /// Pools of recordings (DeviceGraph). While a pool is active (use_pool),
  /// every allocation is served from that pool's cached blocks or a new
  /// cudaMalloc, never from the shared cache, and a block allocated from a
  /// pool returns to that pool when freed, active or not. So a recording's
  /// memory is never handed to anyone else, and blocks freed while recording
  /// are reused by later allocations of the same recording: the step's
  /// stream-ordered reuse, replayed in the same order. While a pool is active,
  /// running out of memory does not return the cache first (that waits for
  /// the device, which recording forbids).
  int new_pool();
  /// Makes `pool` (from new_pool) the one allocations come from; 0: the shared cache.
  void use_pool(int pool);
  /// The pool's cached blocks join the shared cache, and its blocks still
  /// handed out will when freed. Only once no queued work uses them.
  void release_pool(int pool) noexcept;

  /// The size class of a request (exposed for tests).
  static size_t round_size(size_t bytes);

  static constexpr size_t kSmallGranularity = 512;
  static constexpr size_t kSmallLimit = size_t{1} << 20;
  static constexpr size_t kLargeGranularity = size_t{2} << 20;

 private:
  struct Block {
    size_t size;       // rounded size of the cudaMalloc'd block
    size_t requested;  // what the caller asked for (counted in live bytes)
    int pool;          // 0: the shared cache; else the recording pool it returns to
  };
  using FreeList = std::multimap<size_t, void*>;  // block size -> block
  /// The cached block of `list` to hand out for `rounded` bytes, or list.end().
  static FreeList::iterator best_fit(FreeList& list, size_t rounded);
  void* malloc_with_retry(size_t rounded, size_t requested);
  void empty_cache_locked() noexcept;

  int device_;
  mutable std::mutex mu_;
  FreeList free_;                                // the shared cache
  std::unordered_map<void*, Block> handed_out_;  // every block now handed out
  std::unordered_map<int, FreeList> pools_;      // live recording pools' cached blocks
  int active_pool_ = 0;
  int next_pool_ = 1;
  size_t cached_ = 0;
  size_t reserved_ = 0;
  size_t limit_ = std::numeric_limits<size_t>::max();
};

/// Page-locked host memory (cudaMallocHost) as an Allocator, so that tensors
/// can live in it: the trainer gathers input batches there (through
/// DeviceBackend::pinned_host_allocator), and their host->device copies are DMA
/// with no staging copy. Its tensors are host tensors. No cache: a batch buffer
/// is reallocated only when the batch shape changes (the last, partial batch).
///
/// Bound to one GPU: allocation and release make it the calling thread's
/// current device, and leave it so. A thread that never chose a device (the
/// batch prefetcher's) would otherwise start a context on GPU 0, costing memory
/// there for every rank of the node; so would switching such a thread back to
/// its "previous" device 0 as DeviceGuard does, because since CUDA 12
/// cudaSetDevice initialises the device's context.
///
/// Frees wait while a CUDA graph is being recorded (CaptureInProgress):
/// cudaFreeHost synchronises the device, which a stream capture does not
/// allow, and the batch prefetcher's thread may free a buffer (the batch
/// shape changed) while the main thread records.
class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(int device) : device_(device) {}
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return cpu_device(); }

 private:
  int device_;
};

/// Marks a stream capture in progress (CudaGraph::record) for its lifetime:
/// pinned host frees from any thread are held back until the last mark ends,
/// and run then.
class CaptureInProgress {
 public:
  CaptureInProgress();
  ~CaptureInProgress();
  CaptureInProgress(const CaptureInProgress&) = delete;
  CaptureInProgress& operator=(const CaptureInProgress&) = delete;
};

}  // namespace mix::cuda
