#pragma once
// Allocators with live and peak byte counters. The peak is the figure the
// metrics summary reports as peak_bytes.
#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/core/device.h"

namespace mix {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  /// Starts a new peak window at the current live bytes (e.g. after warm-up).
  void reset_peak() { peak_.store(live_.load()); }

 protected:
  void count_alloc(size_t bytes);
  void count_free(size_t bytes) noexcept { live_.fetch_sub(bytes); }

 private:
  std::atomic<size_t> live_{0};
  std::atomic<size_t> peak_{0};
};

/// 64-byte aligned host memory (cache lines, and AVX-512 loads).
///
/// Freed blocks are kept by exact (rounded) size and handed out again: a
/// training step allocates the same sizes every step, and returning them to
/// the OS would cost page faults on every first touch. live/peak count the
/// bytes handed out, not the cache; the cache is bounded by kMaxCachedBytes.
class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return cpu_device(); }
  size_t cached_bytes() const;
  /// Returns every cached block to the system.
  void release_cache() noexcept;

  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

 private:
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // rounded size -> blocks
  size_t cached_ = 0;
};

}  // namespace mix
