// safetensors files (--init-from, --resume, data sets saved from PyTorch).
#include "runtime/io/safetensors.h"
#include "tests/fuzz/fuzz_files.h"

namespace mix::fuzz {

const char* const kTargetName = "safetensors";

Outcome run_one(const std::string& bytes) {
  const std::string path = write_input("input.safetensors", bytes);
  return refused_naming(path, [&] {
    const io::SafetensorsFile file = io::read_safetensors(path);
    // Every byte each tensor says it holds is read: a size the reader got
    // wrong is an out-of-bounds read under ASan.
    unsigned sum = 0;
    for (const auto& [name, t] : file.tensors) {
      const auto* p = static_cast<const unsigned char*>(t.raw());
      for (size_t i = 0; i < t.bytes(); ++i) sum += p[i];
    }
    (void)sum;
  });
}

}  // namespace mix::fuzz
