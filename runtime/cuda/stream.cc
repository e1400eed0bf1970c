#include "runtime/cuda/stream.h"

namespace mix::cuda {

// Non-blocking: the legacy default stream (which other libraries or stray
// cudaMemcpy calls may use) must not serialise against the step's streams.
Stream::Stream() { MIX_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (s_) MIX_CUDA_CHECK_NOTHROW(cudaStreamDestroy(s_));
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) MIX_CUDA_CHECK_NOTHROW(cudaStreamDestroy(s_));
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

void Stream::synchronize() const { MIX_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  MIX_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (e_) MIX_CUDA_CHECK_NOTHROW(cudaEventDestroy(e_));
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) MIX_CUDA_CHECK_NOTHROW(cudaEventDestroy(e_));
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

void Event::record(cudaStream_t stream) { MIX_CUDA_CHECK(cudaEventRecord(e_, stream)); }

void Event::wait(cudaStream_t stream) const { MIX_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0)); }

void Event::synchronize() const { MIX_CUDA_CHECK(cudaEventSynchronize(e_)); }

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.f;
  MIX_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

}  // namespace mix::cuda
