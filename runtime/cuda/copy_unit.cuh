#pragma once
// Copies of raw bytes in the widest unit memory allows (lookup_table's rows,
// transpose2's runs): the unsigned type of each unit's size, and the step from
// a unit chosen at run time to a kernel template over its type. It needs no
// CUDA header (uint2 and uint4 are CUDA's vector types, or
// tests/unit/cuda_emulation.h's), so the *_emulated tests dispatch the same way.
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mix::cuda {

/// The unsigned type of kBytes bytes (1, 2, 4, 8 or 16), as one load or store.
template <int kBytes>
struct CopyUnit {
  static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "a unit of 1 to 16 bytes");
  using type = std::conditional_t<
      kBytes == 1, uint8_t,
      std::conditional_t<kBytes == 2, uint16_t,
                         std::conditional_t<kBytes == 4, uint32_t, std::conditional_t<kBytes == 8, uint2, uint4>>>>;
};

/// The widest unit of 16, 8, 4 or 2 bytes that divides `bytes`, aligns both
/// a and b, and that fits(unit) accepts; 1 when none does.
template <typename Fits>
size_t widest_copy_unit(size_t bytes, const void* a, const void* b, Fits&& fits) {
  for (size_t u : {size_t{16}, size_t{8}, size_t{4}, size_t{2}})
    if (bytes % u == 0 && reinterpret_cast<uintptr_t>(a) % u == 0 && reinterpret_cast<uintptr_t>(b) % u == 0 && fits(u))
      return u;
  return 1;
}

/// f(CopyUnit<bytes>{}) for bytes of 1, 2, 4, 8 or 16; false (nothing run) for any other size.
template <typename F>
bool with_copy_unit(size_t bytes, F&& f) {
  const auto run_if = [&](auto unit) {
    if (bytes != sizeof(typename decltype(unit)::type)) return false;
    f(unit);
    return true;
  };
  return run_if(CopyUnit<1>{}) || run_if(CopyUnit<2>{}) || run_if(CopyUnit<4>{}) || run_if(CopyUnit<8>{}) ||
         run_if(CopyUnit<16>{});
}

}  // namespace mix::cuda
