#pragma once
// Datasets of (input, label) examples and the per-rank sampler.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/data/example_source.h"

namespace mix::data {

/// A labelled data set: held in memory, inputs f32 [N, ...] (or i64 tokens
/// [N, context] for language models) and labels i64 [N] (or [N, context]);
/// or read on demand from `source` (then `inputs` and `labels` are empty).
struct Dataset {
  std::string name;
  Tensor inputs;  // f32 [N, ...feature dims], or i64 [N, context]
  Tensor labels;  // i64 [N], or i64 [N, context]: the next token of each position
  int64_t num_classes = 0;  // classes, or the vocabulary
  std::shared_ptr<const ExampleSource> source;  // examples on disk, read a batch at a time
  /// Examples in each shard, in order, when the source reads tar shards
  /// (ShardStreamSampler deals them out to the ranks); empty otherwise.
  std::vector<int64_t> shard_sizes;

  int64_t size() const {
    if (source) return source->size();
    return inputs.defined() && inputs.ndim() > 0 ? inputs.dim(0) : 0;
  }
  /// Shape of one example, e.g. [784] or [1, 28, 28].
  Shape example_shape() const;
  /// The inputs' dtype (f32, i64 tokens, or what the source gives).
  DType input_dtype() const { return source ? source->input_dtype() : inputs.dtype(); }
  /// Whether the examples are in memory (`inputs`, `labels`), not read from a source.
  bool in_memory() const { return !source; }
};

struct TrainTest {
  Dataset train;
  Dataset test;
};

/// Fashion-MNIST from the Debian package dataset-fashion-mnist's IDX .gz files
/// (train-images-idx3-ubyte.gz, ...). Pixels scaled to [0, 1] and normalised with
/// the data set's mean 0.2860 and std 0.3530; inputs are [N, 784].
/// A missing directory or file throws mix::Error naming it and saying
/// `apt-get install dataset-fashion-mnist` or --data-dir; a damaged file (cut
/// short, a failed gzip CRC-32, a bad IDX header) names the file and the damage,
/// and says to reinstall the package (its directory) or to replace the file
/// (any other directory).
TrainTest load_fashion_mnist(const std::string& dir = "/usr/share/datasets/fashion-mnist");

/// A user's data: a safetensors file with `inputs` (F32 [N, ...]) and `labels`
/// (I64 [N]); optional `test_inputs` / `test_labels`. Without test tensors the
/// test split is empty. Errors name the file and the missing or mis-typed tensor.
TrainTest load_safetensors_dataset(const std::string& path);

/// Deterministic random data: inputs ~ N(0,1) [N, features], labels from a fixed
/// random linear teacher so that the task is learnable.
TrainTest make_synthetic(int64_t train_size, int64_t test_size, int64_t features, int64_t classes, uint64_t seed);

/// Deterministic random images [N, channels, size, size] for image models and
/// benchmarks (ImageNet-shaped with 3 x 224 x 224): noise plus a fixed pattern
/// per class, so the task is learnable; labels uniform over the classes.
TrainTest make_synthetic_images(int64_t train_size, int64_t test_size, int64_t channels, int64_t size, int64_t classes,
                                uint64_t seed);

/// Byte-level language-modelling text: every regular file of `dir` (sorted by
/// name; fortune's index files *.dat and the *.u8 links are skipped), read as
/// bytes. Files are cut into entries at lines holding a single `%` (fortune's
/// separator; a file without any is one entry) and every 20th entry goes to the
/// validation split, so both splits sample every file. Each split is one
/// stream of bytes cut into non-overlapping windows of `context + 1` bytes
/// (stride `context`): inputs [N, context] are a window's first `context`
/// bytes and labels [N, context] its last (the next byte at every position).
/// Vocabulary 256. A missing directory, or too little text for one window of
/// each split, throws naming the directory and `apt-get install fortunes`.
TrainTest load_byte_text(const std::string& dir, int64_t context, const std::string& name = "fortunes");

/// Random token sequences for language-model benchmarks and tests: each
/// sequence follows next = (a * prev + b) mod vocab with a fixed (a, b) and a
/// random token in one position out of eight, so a model can learn most of it.
TrainTest make_synthetic_tokens(int64_t train_size, int64_t test_size, int64_t context, int64_t vocab, uint64_t seed);

/// PyTorch DistributedSampler semantics: each epoch's order is a permutation
/// seeded by (seed, epoch), identical on every rank; rank r takes indices
/// r, r+world, r+2*world, ... of the (padded to a multiple of world) order.
/// With drop_last the epoch is truncated to a multiple of world instead.
/// Which examples a rank trains on in each epoch, and in what order.
class RankSampler {
 public:
  virtual ~RankSampler() = default;
  /// This rank's indices for `epoch`: per_rank() of them.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  /// Examples a rank reads an epoch: the same on every rank.
  virtual int64_t per_rank() const = 0;
};

class DistributedSampler final : public RankSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world, bool shuffle, uint64_t seed, bool drop_last = false);
  /// This rank's indices for `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t per_rank() const override { return per_rank_; }

 private:
  int64_t size_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t per_rank_;
};

/// Copies examples `idx[begin, begin+count)` into a batch (or has the data
/// set's source read them, with `epoch` seeding their augmentation): inputs [count, ...],
/// labels [count] (or [count, ...] for labels with more than one entry per example).
/// `inputs` and `labels` (an earlier call's) are written in place when their
/// memory holds the batch, whatever their shape (a short last batch in a full
/// batch's memory, and the next full batch back in it), else made from
/// `host_memory` (a host allocator, e.g. page-locked memory for a GPU's DMA;
/// nullptr: the ordinary host allocator).
void gather_batch(const Dataset& ds, const std::vector<int64_t>& idx, int64_t begin, int64_t count, Tensor& inputs,
                  Tensor& labels, Allocator* host_memory = nullptr, int64_t epoch = 0);

}  // namespace mix::data
