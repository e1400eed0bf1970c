// The background batch gatherer (see batch_prefetcher.h).
#include "runtime/data/batch_prefetcher.h"

#include "runtime/core/check.h"

namespace mix::data {

BatchPrefetcher::BatchPrefetcher(const Dataset& ds, Allocator* host_memory, int depth)
    : ds_(ds), memory_(host_memory), depth_(depth) {
  MIX_CHECK(depth >= 1, "BatchPrefetcher: depth " << depth << " (--prefetch) must be at least 1");
  slots_.resize(static_cast<size_t>(depth) + 1);
}

BatchPrefetcher::~BatchPrefetcher() {
  for (const Pending& p : pending_) p.done.wait();
}

void BatchPrefetcher::request(BatchRequest r) {
  MIX_CHECK(outstanding() < depth_, "BatchPrefetcher: " << depth_ << " batch(es) already requested; take() one "
                                                        << "before the next request");
  MIX_CHECK(r.indices != nullptr, "BatchPrefetcher: a request without indices");
  const size_t k = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots_.size();
  Batch& slot = slots_[k];
  // A thread per batch rather than a resident worker: starting one costs tens
  // of microseconds, against milliseconds of gathering, and the future carries
  // the gather's exception to take() with no queue to get wrong. Each gather
  // first waits for the one requested before it (only for it to end: its
  // error is take()'s), so batches are gathered one at a time, in order, and
  // a data set's worker pool serves one batch at a time.
  std::shared_future<void> before = pending_.empty() ? std::shared_future<void>() : pending_.back().done;
  std::shared_future<void> done =
      std::async(std::launch::async, [this, &slot, before, r = std::move(r)] {
        if (before.valid()) before.wait();
        gather_batch(ds_, *r.indices, r.begin, r.count, slot.inputs, slot.labels, memory_, r.epoch);
      }).share();
  pending_.push_back({k, std::move(done)});
}

const Batch& BatchPrefetcher::take() {
  MIX_CHECK(!pending_.empty(), "BatchPrefetcher: take() without a request");
  const Pending oldest = pending_.front();
  pending_.pop_front();  // consumed even when the gather failed: the prefetcher goes on
  oldest.done.get();     // rethrows the gather's error
  return slots_[oldest.slot];
}

}  // namespace mix::data
