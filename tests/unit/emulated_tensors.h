#pragma once
// What the tests of emulated CUDA kernels (test_*_emulated.cc) share on the
// host side: a tensor's elements as the kernels' storage type and back,
// placed as device memory holds them, and a comparison bit for bit. No CUDA
// here; the emulation is cuda_emulation.h, emulated_row_launch.h launches the
// row kernels and emulated_map_launch.h the elementwise maps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace mix::testing {

/// The elements of t as its storage type T (float, half_t, bf16_t, an integer).
template <typename T>
std::vector<T> values_of(const Tensor& t) {
  const T* p = t.data<T>();
  return std::vector<T>(p, p + t.numel());
}

/// A tensor of `shape` and dtype dt (whose storage type is T) holding v.
template <typename T>
Tensor tensor_of(const std::vector<T>& v, const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));  // an empty one may have no storage
  return t;
}

/// Values of T placed `offset` elements past a 64-byte boundary (the CPU
/// allocator's): offset 0 is aligned as a tensor in device memory is, offset 1
/// as a view into the middle of a buffer, which the maps must take unpacked.
template <typename T>
struct Placed {
  Tensor storage;
  T* p;
  Placed(const std::vector<T>& v, int offset, DType dt)
      : storage(Tensor::empty({static_cast<int64_t>(v.size()) + offset}, dt)), p(storage.data<T>() + offset) {
    std::copy(v.begin(), v.end(), p);
  }
  std::vector<T> values(size_t n) const { return std::vector<T>(p, p + n); }
};

/// a and b hold the same bits, element for element.
template <typename T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  CHECK(differing == 0);
}

}  // namespace mix::testing
