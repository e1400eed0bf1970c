#include "runtime/allocator.h"

#include <cstdlib>
#include <new>

#include "runtime/check.h"

namespace mix {

void Allocator::count_alloc(size_t bytes) {
  const size_t now = live_.fetch_add(bytes) + bytes;
  size_t prev = peak_.load();
  while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
  }
}

void* CpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) MIX_FAIL("out of host memory allocating " << bytes << " bytes (" << live_bytes() << " bytes live)");
  count_alloc(bytes);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  std::free(p);
  count_free(bytes);
}

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  MIX_CHECK(d.kind == DeviceKind::cpu, "no allocator for device " << d.str() << " in this build");
  return cpu;
}

}  // namespace mix
