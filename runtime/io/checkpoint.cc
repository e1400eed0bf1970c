#include "runtime/io/checkpoint.h"

#include <cstring>

#include "runtime/check.h"
#include "runtime/io/safetensors.h"
#include "runtime/ops/gemm.h"

namespace mix::io {

namespace {

bool saved_as_tensor(const VarDesc& v) {
  // The loss scaler's state goes into the metadata, as DESIGN.md puts it; the
  // learning rate is recomputed from the schedule.
  return v.persistable && v.name.rfind("loss_scaling", 0) != 0 && v.name != "learning_rate";
}

void copy_into(const std::string& path, const std::string& name, const Tensor& src, Tensor& dst) {
  MIX_CHECK(src.shape() == dst.shape(), "checkpoint " << path << ": tensor '" << name << "' has shape "
                                                      << shape_str(src.shape()) << " but the model expects "
                                                      << shape_str(dst.shape()));
  if (src.dtype() == dst.dtype()) {
    if (src.bytes()) std::memcpy(dst.raw(), src.raw(), src.bytes());
    return;
  }
  MIX_CHECK(is_floating(src.dtype()) && is_floating(dst.dtype()),
            "checkpoint " << path << ": tensor '" << name << "' is " << dtype_name(src.dtype()) << ", the model needs "
                          << dtype_name(dst.dtype()));
  cpu::store_f32(cpu::as_f32(src, 3), dst);
}

}  // namespace

void save_checkpoint(const std::string& path, const Program& p, const Scope& scope, const Metadata& meta) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const VarDesc& v : p.vars())
    if (saved_as_tensor(v)) tensors.emplace_back(v.name, scope.get(v.name).to(cpu_device()));
  write_safetensors(path, tensors, meta);
}

int load_parameters(const std::string& path, const Program& p, Scope& scope, int* ignored,
                    std::vector<std::string>* missing_buffers) {
  SafetensorsFile f = read_safetensors(path);
  int loaded = 0;
  std::string missing;
  for (const std::string& name : p.parameters()) {
    const Tensor* src = f.find(name);
    if (!src) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    copy_into(path, name, *src, scope.get(name));
    ++loaded;
  }
  if (!missing.empty())
    MIX_FAIL("--init-from " << path << " lacks the model's parameters: " << missing
                            << " (names and layouts are PyTorch's state_dict ones; `mixtrain --steps 0 --save FILE` "
                               "writes a file with every name)");
  for (const VarDesc& v : p.vars()) {
    if (!v.is_buffer) continue;
    if (const Tensor* src = f.find(v.name)) {
      copy_into(path, v.name, *src, scope.get(v.name));
      ++loaded;
    } else if (missing_buffers) {
      missing_buffers->push_back(v.name);
    }
  }
  if (ignored) *ignored = static_cast<int>(f.tensors.size()) - loaded;
  return loaded;
}

Metadata load_checkpoint(const std::string& path, const Program& p, Scope& scope) {
  SafetensorsFile f = read_safetensors(path);
  for (const VarDesc& v : p.vars()) {
    if (!saved_as_tensor(v)) continue;
    const Tensor* src = f.find(v.name);
    if (!src)
      MIX_FAIL("--resume " << path << " has no tensor '" << v.name
                           << "': it was saved by another model or optimizer (use --init-from to load parameters only)");
    copy_into(path, v.name, *src, scope.get(v.name));
  }
  return f.metadata;
}

}  // namespace mix::io
