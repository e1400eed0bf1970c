#include "runtime/core/device_backend.h"

#include <cstring>

#include "runtime/core/check.h"

namespace mix {

namespace {
DeviceBackend*& slot(DeviceKind kind) {
  static DeviceBackend* cuda = nullptr;
  MIX_CHECK(kind == DeviceKind::cuda, "the host needs no device backend");
  return cuda;
}
}  // namespace

void register_device_backend(DeviceKind kind, DeviceBackend* backend) { slot(kind) = backend; }

DeviceBackend* device_backend(DeviceKind kind) { return kind == DeviceKind::cpu ? nullptr : slot(kind); }

DeviceBackend& require_device_backend(DeviceKind kind) {
  DeviceBackend* b = device_backend(kind);
  if (!b)
    MIX_FAIL("this build of mixtrain has no CUDA backend (configure with -DMIX_WITH_CUDA=ON on a machine with the "
             "CUDA toolkit), or use --device cpu");
  return *b;
}

Allocator& allocator_for(Device d) {
  // Never destroyed, like the device contexts: a tensor held by some other
  // static object (a test's cache of loaded files) is freed at exit after a
  // function-local static allocator would be gone (found by UBSan).
  static CpuAllocator& cpu = *new CpuAllocator;
  if (d.kind == DeviceKind::cpu) return cpu;
  return require_device_backend(d.kind).allocator(d.index);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.kind == DeviceKind::cpu && src_device.kind == DeviceKind::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const DeviceKind kind = dst_device.kind != DeviceKind::cpu ? dst_device.kind : src_device.kind;
  require_device_backend(kind).copy(dst, dst_device, src, src_device, bytes);
}

}  // namespace mix
