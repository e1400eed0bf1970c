#pragma once
// The training loop's input batches, one per step, on the step's device: each
// gathered on a background thread (BatchPrefetcher) and, on a GPU, uploaded a
// step ahead on a copy queue of its own (HostToDeviceQueue), so that neither
// the gather nor the upload stands between two steps.
//
// On a GPU, next() for step s queues the upload of step s + 1's batch (gathered
// during step s - 1) and returns step s's (uploaded during step s - 1): the
// upload overlaps step s's kernels, and the compute stream waits for it on the
// device only, at the start of step s + 1. On the host the batches are the
// prefetcher's own, with no copy. Either way the batches are exactly
// gather_batch's, so a run gives the same bits with or without the feeder.
#include <cstdint>
#include <functional>
#include <memory>

#include "runtime/core/device_backend.h"
#include "runtime/data/batch_prefetcher.h"

namespace mix::data {

class BatchFeeder {
 public:
  /// The batches of steps [first, end): `batch_of(step)` says which examples
  /// each one holds. `ds` must outlive the feeder; `host_memory` is
  /// BatchPrefetcher's (page-locked memory for a GPU's uploads). The gather of
  /// the first batches start here: `prefetch` of them are gathered ahead
  /// (--prefetch; the prefetcher's depth).
  BatchFeeder(const Dataset& ds, Device device, Allocator* host_memory,
              std::function<BatchRequest(int64_t step)> batch_of, int64_t first, int64_t end, int prefetch = 1);
  /// Waits for uploads in flight, which write device memory the feeder frees.
  ~BatchFeeder();
  BatchFeeder(const BatchFeeder&) = delete;
  BatchFeeder& operator=(const BatchFeeder&) = delete;

  /// The next step's batch, on the device. Device work queued after this call
  /// sees the batch's bytes; they stay unchanged for the work queued before
  /// the next call (the next-but-one batch is uploaded into the same memory,
  /// once the work queued so far on the compute stream has run). Rethrows a
  /// gather's error (a bad index, say).
  const Batch& next();

 private:
  /// Queues the upload of `host` into device slot `k`, then records fence k.
  void upload(const Batch& host, int k);
  /// Requests the steps after the last requested one, up to the prefetcher's depth.
  void request_ahead();

  Device device_;
  std::function<BatchRequest(int64_t)> batch_of_;
  int64_t step_, end_;  // the step next() returns a batch for, and the end
  int64_t requested_;   // the next step to request from the prefetcher
  BatchPrefetcher prefetcher_;
  // A device only (null on the host): the copy queue, and two device batches with a fence each: the
  // one the current step reads and the one being uploaded for the next step.
  std::unique_ptr<HostToDeviceQueue> queue_;
  Batch on_device_[2];
  int ahead_ = -1;  // the slot holding the next step's upload; -1: none queued yet
};

}  // namespace mix::data
