// The background batch gatherer (see batch_prefetcher.h).
#include "runtime/data/batch_prefetcher.h"

#include "runtime/core/check.h"

namespace mix::data {

BatchPrefetcher::~BatchPrefetcher() {
  if (pending_.valid()) pending_.wait();
}

void BatchPrefetcher::request(BatchRequest r) {
  MIX_CHECK(!pending_.valid(), "BatchPrefetcher: a batch is already requested; take() it before the next request");
  MIX_CHECK(r.indices != nullptr, "BatchPrefetcher: a request without indices");
  Batch& slot = slots_[static_cast<size_t>(filling_)];
  // A thread per batch rather than a resident worker: starting one costs tens
  // of microseconds, against milliseconds of copying, and std::async's future
  // carries the gather's exception to take() with no queue to get wrong.
  pending_ = std::async(std::launch::async, [this, &slot, r = std::move(r)] {
    gather_batch(ds_, *r.indices, r.begin, r.count, slot.inputs, slot.labels, memory_, r.epoch);
  });
}

const Batch& BatchPrefetcher::take() {
  MIX_CHECK(pending_.valid(), "BatchPrefetcher: take() without a request");
  std::future<void> done = std::move(pending_);
  done.get();  // rethrows the gather's error; pending_ is already empty for the next request
  const Batch& batch = slots_[static_cast<size_t>(filling_)];
  filling_ ^= 1;  // the next request writes the other slot, leaving this one to the caller
  return batch;
}

}  // namespace mix::data
