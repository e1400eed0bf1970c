#pragma once
// Where tensors live and kernels run: the host, or a GPU by index.
#include <string>

#include "runtime/core/enum_names.h"

namespace mix {

enum class DeviceKind { cpu, cuda };

/// The --device values.
inline constexpr NamedValue<DeviceKind> kDeviceKindNames[] = {{DeviceKind::cpu, "cpu"}, {DeviceKind::cuda, "cuda"}};

inline std::string_view to_string(DeviceKind k) { return name_of(k, kDeviceKindNames); }

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

inline Device cpu_device() { return {DeviceKind::cpu, 0}; }

}  // namespace mix
