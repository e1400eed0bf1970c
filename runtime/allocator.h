#pragma once
// Allocators with live and peak byte counters. The peak is the figure the
// metrics summary reports as peak_bytes.
#include <atomic>
#include <cstddef>

#include "runtime/device.h"

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
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return cpu_device(); }
};

/// The process-wide allocator of a device.
Allocator& allocator_for(Device d);

}  // namespace mix
