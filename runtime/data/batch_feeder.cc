// The training loop's batches, gathered and uploaded ahead (see batch_feeder.h).
#include "runtime/data/batch_feeder.h"

#include <utility>

#include "runtime/core/check.h"

namespace mix::data {

BatchFeeder::BatchFeeder(const Dataset& ds, Device device, Allocator* host_memory,
                         std::function<BatchRequest(int64_t step)> batch_of, int64_t first, int64_t end, int prefetch)
    : device_(device),
      batch_of_(std::move(batch_of)),
      step_(first),
      end_(end),
      requested_(first),
      prefetcher_(ds, host_memory, prefetch) {
  MIX_CHECK(first <= end, "BatchFeeder: steps [" << first << ", " << end << ") run backwards");
  if (device.kind != DeviceKind::cpu)
    queue_ = require_device_backend(device.kind).make_host_to_device_queue(device.index, 2);
  request_ahead();
}

void BatchFeeder::request_ahead() {
  while (requested_ < end_ && prefetcher_.outstanding() < prefetcher_.depth())
    prefetcher_.request(batch_of_(requested_++));
}

BatchFeeder::~BatchFeeder() {
  if (queue_) queue_->drain();
}

const Batch& BatchFeeder::next() {
  MIX_CHECK(step_ < end_, "BatchFeeder: asked for the batch of step " << step_ << ", past the last step " << end_ - 1);
  const int64_t s = step_++;
  if (!queue_) {
    // The host: the prefetcher's batch itself, which the next request leaves
    // alone until the next take().
    const Batch& batch = prefetcher_.take();
    request_ahead();
    return batch;
  }
  if (ahead_ < 0) {  // the first call: nothing is uploaded yet, so this batch is late once
    upload(prefetcher_.take(), 0);
    ahead_ = 0;
    request_ahead();
  }
  const int current = ahead_;
  queue_->compute_waits(current);
  if (s + 1 < end_) {
    // Step s + 1's batch, gathered during step s - 1, uploads while step s runs.
    upload(prefetcher_.take(), current ^ 1);
    ahead_ = current ^ 1;
    // The next request's gather overwrites the host batch of step s (the
    // prefetcher's slot taken before step s + 1's): its upload must have read
    // it (long since, in a steady loop: it was queued a step ago).
    queue_->host_waits(current);
    request_ahead();
  }
  return on_device_[current];
}

void BatchFeeder::upload(const Batch& host, int k) {
  // Slot k holds the batch before last, which compute work queued so far may
  // still read; a tensor allocated below may be memory that such work frees.
  queue_->wait_for_compute();
  Batch& slot = on_device_[k];
  for (auto [src, dst] : {std::pair{&host.inputs, &slot.inputs}, std::pair{&host.labels, &slot.labels}}) {
    if (!dst->defined() || dst->shape() != src->shape() || dst->dtype() != src->dtype())
      *dst = Tensor::empty(src->shape(), src->dtype(), device_);
    queue_->copy(dst->raw(), src->raw(), src->bytes());
  }
  queue_->record(k);
}

}  // namespace mix::data
