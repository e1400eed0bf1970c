#pragma once
// AddressSanitizer's view of memory that mixtrain hands out itself (the CPU
// allocator's cached blocks, the CUDA emulation's shared memory): MIX_ASAN is
// defined in a build under ASan (scripts/sanitize.sh), and asan_mark closes
// what may not be touched. Without ASan, asan_mark does nothing.
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define MIX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MIX_ASAN 1
#endif
#endif
#ifdef MIX_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace mix {

/// [p, p + n) open to reads and writes, or closed: an access there is then
/// reported as one into freed memory would be.
inline void asan_mark(void* p, size_t n, bool open) {
#ifdef MIX_ASAN
  if (open)
    ASAN_UNPOISON_MEMORY_REGION(p, n);
  else
    ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n, (void)open;
#endif
}

}  // namespace mix
