#pragma once
// Element types and their sizes. FP16 and BF16 are stored as raw 16-bit
// patterns (see half.h); every device interprets them identically.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mix {

// u8: byte masks (dropout's Mask); not a floating type and not a gradient type.
enum class DType : uint8_t { f32, f16, bf16, i32, i64, u8 };

inline constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

inline constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

/// Short name used in programs and logs: "f32", "f16", ...
std::string_view dtype_name(DType t);
/// Name used by safetensors headers: "F32", "F16", "BF16", "I32", "I64", "U8".
std::string_view dtype_safetensors_name(DType t);
/// Parses either spelling; throws std::invalid_argument naming the text.
DType parse_dtype(std::string_view name);

}  // namespace mix
