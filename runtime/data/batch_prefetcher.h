#pragma once
// Gathers the next training batches on background threads while the current
// step runs: the job of a DataLoader's workers and its prefetch queue.
//
// On a GPU the step is queued work and the host would otherwise idle the device
// while it copies the next batch's examples (tens of megabytes for ImageNet-
// shaped images); with the copy done in the background, the host only starts
// the DMA upload between steps. The batches are exactly gather_batch's, so a
// run gives the same bits with or without the prefetcher.
#include <deque>
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
  /// it is used from the background threads. `depth`: batches that may be
  /// requested and not yet taken (--prefetch), gathered one after another in
  /// request order; depth + 1 batches of memory, the one last taken included.
  explicit BatchPrefetcher(const Dataset& ds, Allocator* host_memory = nullptr, int depth = 1);
  /// Waits for the gathers in flight (they only read the data set).
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  /// Starts gathering `r` in the background, after the requests before it.
  /// At most depth() requests outstanding: take() one before the next. A
  /// request never writes the batch the last take() returned.
  void request(BatchRequest r);

  /// Waits for the oldest requested batch and returns it; rethrows its
  /// gather's error (a bad index, say). The batch stays valid and unchanged
  /// until the next take(), whatever is requested meanwhile.
  const Batch& take();

  int depth() const { return depth_; }
  /// Requests not yet taken.
  int outstanding() const { return static_cast<int>(pending_.size()); }

 private:
  struct Pending {
    size_t slot;
    std::shared_future<void> done;
  };
  const Dataset& ds_;
  Allocator* memory_;
  int depth_;
  // depth + 1 batches, written in turn: a request's slot is the one taken
  // longest ago, never the last taken one nor one still requested.
  std::vector<Batch> slots_;
  size_t next_slot_ = 0;
  std::deque<Pending> pending_;  // oldest first
};

}  // namespace mix::data
