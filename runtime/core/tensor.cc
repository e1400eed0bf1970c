#include "runtime/core/tensor.h"

#include <cstring>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/core/device_backend.h"

namespace mix {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << (s[i] < 0 ? std::string("?") : std::to_string(s[i]));
  o << ']';
  return o.str();
}

Storage::Storage(Allocator& alloc, size_t bytes) : alloc_(alloc), bytes_(bytes), data_(alloc.allocate(bytes)) {}
Storage::~Storage() { alloc_.deallocate(data_, bytes_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return empty(shape, dtype, allocator_for(device));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& allocator) {
  for (int64_t d : shape) MIX_CHECK(d >= 0, "negative dimension in shape " << shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(allocator, t.bytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, const std::vector<float>& values) {
  MIX_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
            "shape " << shape_str(shape) << " does not hold " << values.size() << " values");
  Tensor t = empty(shape, DType::f32);
  if (!values.empty()) std::memcpy(t.raw(), values.data(), t.bytes());
  return t;
}

Tensor Tensor::reshaped(const Shape& shape) const {
  MIX_CHECK(shape_numel(shape) == numel(), "cannot reshape " << shape_str(shape_) << " to " << shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

bool Tensor::storage_holds(const Shape& shape) const {
  for (int64_t d : shape)
    if (d < 0) return false;
  const size_t wanted = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype_);
  return wanted == 0 || (storage_ && offset_ + wanted <= storage_->bytes());
}

Tensor Tensor::viewed_as(const Shape& shape) const {
  MIX_CHECK(storage_holds(shape), "cannot view " << shape_str(shape_) << " as " << shape_str(shape)
                                                 << ": its memory holds fewer " << dtype_name(dtype_) << " elements");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  Tensor t = empty(shape_, dtype_, d);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MIX_CHECK(src.numel() == numel() && src.dtype() == dtype(),
            "copy of " << dtype_name(src.dtype()) << shape_str(src.shape()) << " into " << dtype_name(dtype())
                       << shape_str(shape_));
  copy_bytes(raw(), device(), src.raw(), src.device(), bytes());
}

float Tensor::item_float(int64_t i) const {
  MIX_CHECK(i >= 0 && i < numel(), "index " << i << " out of range for " << shape_str(shape_));
  if (device().kind != DeviceKind::cpu) return to(cpu_device()).item_float(i);
  switch (dtype_) {
    case DType::f32: return data<float>()[i];
    case DType::f16: return half_bits_to_float(data<uint16_t>()[i]);
    case DType::bf16: return bf16_bits_to_float(data<uint16_t>()[i]);
    case DType::i32: return static_cast<float>(data<int32_t>()[i]);
    case DType::i64: return static_cast<float>(data<int64_t>()[i]);
    case DType::u8: return static_cast<float>(data<uint8_t>()[i]);
  }
  return 0.f;
}

void Tensor::set_float(int64_t i, float v) {
  MIX_CHECK(i >= 0 && i < numel(), "index " << i << " out of range for " << shape_str(shape_));
  MIX_CHECK(device().kind == DeviceKind::cpu, "set_float on a " << device().str() << " tensor (host tensors only)");
  switch (dtype_) {
    case DType::f32: data<float>()[i] = v; return;
    case DType::f16: data<uint16_t>()[i] = float_to_half_bits(v); return;
    case DType::bf16: data<uint16_t>()[i] = float_to_bf16_bits(v); return;
    default: MIX_FAIL("set_float on a " << dtype_name(dtype_) << " tensor (floating dtypes only)");
  }
}

std::vector<float> Tensor::to_floats() const {
  if (device().kind != DeviceKind::cpu) return to(cpu_device()).to_floats();
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::f32) {
    if (!out.empty()) std::memcpy(out.data(), raw(), bytes());
  } else if (dtype_ == DType::f16) {
    half_bulk::f16_to_f32(data<uint16_t>(), out.data(), out.size());
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = item_float(static_cast<int64_t>(i));
  }
  return out;
}

void Tensor::fill_zero() {
  if (!bytes()) return;
  if (device().kind == DeviceKind::cpu) {
    std::memset(raw(), 0, bytes());
  } else {
    require_device_backend(device().kind).zero(raw(), bytes(), device().index);
  }
}

}  // namespace mix
