#pragma once
// Gathers the next training batch on a background thread while the current
// step runs: the job of a DataLoader with one worker and one batch ahead.
//
// On a GPU the step is queued work and the host would otherwise idle the device
// while it copies the next batch's examples (tens of megabytes for ImageNet-
// shaped images); with the copy done in the background, the host only starts
// the DMA upload between steps. The batches are exactly gather_batch's, so a
// run gives the same bits with or without the prefetcher.
#include <array>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "runtime/data/dataset.h"

namespace mix::data {

/// One batch: examples `indices[begin, begin + count)` of a data set. The
/// indices are shared so that the caller may move on to the next epoch's order
/// while the previous one is still being read.
struct BatchRequest {
  std::shared_ptr<const std::vector<int64_t>> indices;
  int64_t begin = 0;
  int64_t count = 0;
  int64_t epoch = 0;  // seeds a source's augmentation (ExampleSource::read)
};

struct Batch {
  Tensor inputs;
  Tensor labels;
};

class BatchPrefetcher {
 public:
  /// `ds` must outlive the prefetcher. `host_memory`: as for gather_batch
  /// (page-locked memory on a GPU run; nullptr: the ordinary host allocator);
  /// it is used from the background thread.
  explicit BatchPrefetcher(const Dataset& ds, Allocator* host_memory = nullptr) : ds_(ds), memory_(host_memory) {}
  /// Waits for a gather in flight (it only reads the data set).
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  /// Starts gathering `r` in the background. One request at a time: take()
  /// it before the next. It never writes the batch the last take() returned.
  void request(BatchRequest r);

  /// Waits for the requested batch and returns it; rethrows the gather's error
  /// (a bad index, say). The batch stays valid and unchanged until the next
  /// take(), whatever is requested meanwhile.
  const Batch& take();

 private:
  const Dataset& ds_;
  Allocator* memory_;
  // Two batches: the one the step reads and the one being gathered.
  std::array<Batch, 2> slots_;
  int filling_ = 0;  // the slot the pending request writes
  std::future<void> pending_;
};

}  // namespace mix::data
