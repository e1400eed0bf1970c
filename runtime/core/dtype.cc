#include "runtime/core/dtype.h"

#include <stdexcept>

namespace mix {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    if (name == dtype_name(t) || name == dtype_safetensors_name(t)) return t;
  }
  if (name == "float" || name == "float32") return DType::f32;
  if (name == "half" || name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  throw std::invalid_argument("unknown dtype '" + std::string(name) + "' (expected f32, f16, bf16, i32, i64 or u8)");
}

}  // namespace mix
