#pragma once
#include <string>

namespace mix {

enum class DeviceKind { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
};

inline Device cpu_device() { return {DeviceKind::cpu, 0}; }

}  // namespace mix
