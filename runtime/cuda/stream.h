#pragma once
// RAII CUDA streams and events (move-only; destructors never throw).
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"

namespace mix::cuda {

class Stream {
 public:
  /// A new non-blocking stream on the current device.
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  /// Timing disabled: events only order streams (cheaper).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  /// Marks the point in `stream` that wait() orders after.
  void record(cudaStream_t stream);
  /// Makes `stream` wait (on the device, no host sync) for the recorded point.
  void wait(cudaStream_t stream) const;
  void synchronize() const;
  /// Milliseconds between two recorded timing events.
  float elapsed_ms_since(const Event& start) const;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace mix::cuda
