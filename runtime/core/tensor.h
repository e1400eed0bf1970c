#pragma once
// Tensor: a shape, a dtype, a device, and storage shared between views.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"

namespace mix {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

/// Owns one allocation; freed through the allocator that made it.
class Storage {
 public:
  Storage(Allocator& alloc, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return alloc_.device(); }

 private:
  Allocator& alloc_;
  size_t bytes_;
  void* data_;
};

class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised tensor on `device`.
  static Tensor empty(const Shape& shape, DType dtype, Device device = cpu_device());
  /// Uninitialised tensor in memory from `allocator`, on its device (page-locked
  /// host memory for input batches: DeviceBackend::pinned_host_allocator).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& allocator);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = cpu_device());
  /// f32 tensor from values (tests and small constants).
  static Tensor from_floats(const Shape& shape, const std::vector<float>& values);

  bool defined() const { return storage_ != nullptr || numel() == 0; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : cpu_device(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  /// Same storage, new shape of equal element count.
  Tensor reshaped(const Shape& shape) const;
  /// Whether the storage holds `shape`'s elements of this dtype from this
  /// tensor's start (a full batch's memory holds a short last batch, and
  /// still holds the next full one after it is viewed as the short one).
  bool storage_holds(const Shape& shape) const;
  /// Same storage and dtype viewed as `shape`, whose element count may differ
  /// from this view's as long as storage_holds(shape).
  Tensor viewed_as(const Shape& shape) const;
  /// A deep copy on the same device.
  Tensor clone() const;
  /// A copy on `device` (this tensor itself when it is already there).
  Tensor to(Device device) const;
  /// Copies every byte of `src` (same shape and dtype, any device) into this tensor.
  void copy_from(const Tensor& src);
  /// Element i widened to float (any dtype, any device: a device tensor is copied); for tests and checks.
  float item_float(int64_t i = 0) const;
  /// Element i of a floating host tensor set to v, rounded to the dtype as a
  /// store would be (round to nearest even for f16/bf16): item_float's inverse.
  void set_float(int64_t i, float v);
  /// Copies every element, converted to float (tests, checkpoints, hashing).
  std::vector<float> to_floats() const;
  void fill_zero();
  bool shares_storage(const Tensor& o) const { return storage_ == o.storage_; }

 private:
  Shape shape_;
  DType dtype_ = DType::f32;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
};

}  // namespace mix
