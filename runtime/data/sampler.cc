// PyTorch DistributedSampler semantics, and batch gathering.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"
#include "runtime/core/random.h"
#include "runtime/data/dataset.h"

namespace mix::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : size_(dataset_size), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  MIX_CHECK(world >= 1, "world size must be >= 1, got " << world);
  MIX_CHECK(rank >= 0 && rank < world, "rank " << rank << " is not in [0, " << world << ")");
  MIX_CHECK(dataset_size >= 0, "negative data set size " << dataset_size);
  // As torch.utils.data.DistributedSampler: drop_last rounds the epoch down to a
  // multiple of world, otherwise up (the order wraps around to pad it).
  per_rank_ = drop_last ? size_ / world : (size_ + world - 1) / world;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_ && size_ > 1) {
    // Fisher-Yates, seeded by (seed, epoch) only: identical on every rank.
    Rng rng = Rng::for_stream(seed_, static_cast<uint64_t>(epoch));
    for (size_t i = order.size() - 1; i > 0; --i) {
      const size_t j = static_cast<size_t>(rng.below(i + 1));
      std::swap(order[i], order[j]);
    }
  }
  const int64_t total = per_rank_ * world_;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  // Position p of the padded order is order[p % size]: padding repeats the order
  // from its start, as PyTorch does. A truncated order needs no wrapping.
  for (int64_t p = rank_; p < total; p += world_)
    mine.push_back(order[static_cast<size_t>(drop_last_ ? p : p % size_)]);
  return mine;
}

namespace {

// Where a gather writes a batch of `shape`: `last`'s memory (the tensor a
// previous gather wrote) viewed as `shape` when it holds that many `dtype`
// elements, else new memory from `memory`. An epoch's short last batch
// therefore reuses the full batches' memory, and the next full batch gets it
// back, instead of page-locked memory being freed and allocated again.
// Both synchronize with the device (CUDA's programming guide lists
// page-locked allocation among the implicit synchronizations; HIP documents
// its free as a device synchronize): on the prefetcher's thread that would
// stall the step running meanwhile, and break one being recorded as a CUDA
// graph (--cuda-graph).
Tensor batch_target(const Tensor& last, const Shape& shape, DType dtype, Allocator& memory) {
  if (last.defined() && last.dtype() == dtype && last.device() == memory.device() && last.storage_holds(shape))
    return last.viewed_as(shape);
  return Tensor::empty(shape, dtype, memory);
}

}  // namespace

void gather_batch(const Dataset& ds, const std::vector<int64_t>& idx, int64_t begin, int64_t count, Tensor& inputs,
                  Tensor& labels, Allocator* host_memory, int64_t epoch) {
  Allocator& memory = host_memory ? *host_memory : allocator_for(cpu_device());
  MIX_CHECK(memory.device().kind == DeviceKind::cpu, "gather_batch fills host tensors, not " << memory.device().str());
  MIX_CHECK(begin >= 0 && count >= 0 && begin + count <= static_cast<int64_t>(idx.size()),
            "batch [" << begin << ", " << begin + count << ") is outside the " << idx.size() << " indices");
  if (ds.source) {
    Shape shape = ds.source->example_shape();
    shape.insert(shape.begin(), count);
    inputs = batch_target(inputs, shape, ds.source->input_dtype(), memory);
    Shape label_shape = ds.source->label_shape();
    label_shape.insert(label_shape.begin(), count);
    labels = batch_target(labels, label_shape, DType::i64, memory);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = idx[static_cast<size_t>(begin + i)];
      MIX_CHECK(e >= 0 && e < ds.size(), "example index " << e << " is outside data set '" << ds.name << "' of "
                                                          << ds.size());
    }
    ds.source->read(idx, begin, count, epoch, inputs, labels);
    return;
  }
  MIX_CHECK(ds.labels.defined() && ds.labels.dtype() == DType::i64, "data set '" << ds.name << "' has no i64 labels");
  const int64_t n = ds.size();
  Shape shape = ds.inputs.shape();
  MIX_CHECK(!shape.empty(), "data set '" << ds.name << "' has no inputs");
  shape[0] = count;
  inputs = batch_target(inputs, shape, ds.inputs.dtype(), memory);
  Shape label_shape = ds.labels.shape();
  MIX_CHECK(!label_shape.empty() && label_shape[0] == n,
            "data set '" << ds.name << "' has " << n << " inputs but labels " << shape_str(label_shape));
  label_shape[0] = count;
  const int64_t label_row = n > 0 ? ds.labels.numel() / n : 0;  // labels per example
  labels = batch_target(labels, label_shape, DType::i64, memory);
  MIX_CHECK(inputs.device().kind == DeviceKind::cpu && labels.device().kind == DeviceKind::cpu,
            "gather_batch fills host tensors");

  const size_t row_bytes = static_cast<size_t>(shape_numel(ds.example_shape())) * dtype_size(ds.inputs.dtype());
  const char* src = static_cast<const char*>(ds.inputs.raw());
  char* dst = static_cast<char*>(inputs.raw());
  const int64_t* src_labels = ds.labels.data<int64_t>();
  int64_t* dst_labels = labels.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t e = idx[static_cast<size_t>(begin + i)];
    MIX_CHECK(e >= 0 && e < n, "example index " << e << " is outside data set '" << ds.name << "' of " << n);
    if (row_bytes) std::memcpy(dst + static_cast<size_t>(i) * row_bytes, src + static_cast<size_t>(e) * row_bytes, row_bytes);
    std::copy(src_labels + e * label_row, src_labels + (e + 1) * label_row, dst_labels + i * label_row);
  }
}

}  // namespace mix::data
