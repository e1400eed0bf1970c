#include "runtime/exec/init.h"

#include <cstring>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/float_convert.h"
#include "runtime/core/hash.h"
#include "runtime/core/random.h"

namespace mix {

void initialize_persistables(const Program& p, Scope& scope, uint64_t seed) {
  for (const VarDesc& v : p.vars()) {
    if (!v.persistable || scope.has(v.name)) continue;
    for (int64_t d : v.shape)
      MIX_CHECK(d >= 0, "persistable variable " << v.name << " has an unknown dimension " << shape_str(v.shape));
    Tensor t = Tensor::zeros(v.shape, v.dtype);
    const size_t n = static_cast<size_t>(t.numel());
    if (v.init.kind != VarInit::Kind::zeros) {
      std::vector<double> values(n);
      Rng rng = Rng::for_stream(seed, fnv1a(v.name));
      for (auto& x : values) {
        switch (v.init.kind) {
          case VarInit::Kind::constant: x = v.init.a; break;
          case VarInit::Kind::uniform: x = (2.0 * rng.uniform() - 1.0) * v.init.a; break;
          case VarInit::Kind::normal: x = rng.normal() * v.init.a; break;
          case VarInit::Kind::zeros: x = 0; break;
        }
      }
      switch (v.dtype) {
        case DType::i64:
          for (size_t i = 0; i < n; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(values[i]);
          break;
        case DType::i32:
          for (size_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
          break;
        case DType::u8:
          for (size_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(values[i]);
          break;
        default: {
          std::vector<float> f(values.begin(), values.end());
          cpu::store_f32(f.data(), t);
        }
      }
      // Padding rows start (and, never reaching the loss, stay) zero. The rows
      // before them hold the values an unpadded variable of the same name gets.
      if (v.unpadded_rows > 0) {
        MIX_CHECK(!v.shape.empty() && v.unpadded_rows <= v.shape[0],
                  v.name << ": " << v.unpadded_rows << " unpadded rows of " << shape_str(v.shape));
        const size_t row_bytes = t.bytes() / static_cast<size_t>(v.shape[0]);
        std::memset(static_cast<char*>(t.raw()) + static_cast<size_t>(v.unpadded_rows) * row_bytes, 0,
                    t.bytes() - static_cast<size_t>(v.unpadded_rows) * row_bytes);
      }
    }
    scope.set(v.name, std::move(t));
  }
}

}  // namespace mix
