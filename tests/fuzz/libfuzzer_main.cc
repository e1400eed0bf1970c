// libFuzzer's entry into a fuzz target (clang, -DMIX_FUZZ=ON; scripts/fuzz.sh).
// An exception that escapes run_one aborts, which libFuzzer reports as a crash
// with the input that caused it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mix::fuzz::run_one(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
