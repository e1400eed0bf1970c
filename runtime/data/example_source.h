#pragma once
// Examples read on demand instead of held in memory: a data set larger than
// memory (an image folder, token shards) gives one to Dataset::source, and
// gather_batch asks it for each batch's examples. The sampler, the prefetcher
// and the feeder stay the same for both kinds of data set.
#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"

namespace mix::data {

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  /// Examples in the split.
  virtual int64_t size() const = 0;
  /// One example's input: shape (e.g. [3, 224, 224], [context]) and dtype.
  virtual Shape example_shape() const = 0;
  virtual DType input_dtype() const = 0;
  /// One example's labels: [] for a class index, [context] for next tokens (always i64).
  virtual Shape label_shape() const = 0;
  /// Writes examples idx[begin, begin + count) into rows 0..count of `inputs`
  /// ([count, example_shape...]) and `labels` ([count, label_shape...]),
  /// already shaped and allocated on the host. `epoch` seeds what is random
  /// per epoch (an image's crop), so a batch is the same bits on every run.
  /// Called from the prefetcher's thread: must not change the source.
  virtual void read(const std::vector<int64_t>& idx, int64_t begin, int64_t count, int64_t epoch, Tensor& inputs,
                    Tensor& labels) const = 0;
  /// Reads so far that met an unreadable example and took the next good one
  /// instead (--skip-bad-images); 0 for sources that never skip.
  virtual int64_t replaced_reads() const { return 0; }
};

}  // namespace mix::data
