#include "runtime/io/checkpoint.h"

#include <cmath>
#include <cstring>

#include "runtime/core/check.h"
#include "runtime/core/float_convert.h"
#include "runtime/io/safetensors.h"
#include "runtime/ops/grad_accumulate.h"

namespace mix::io {

namespace {

bool saved_as_tensor(const VarDesc& v) {
  // The loss scaler's state goes into the metadata, as docs/design.md ("Checkpoints") says; the
  // learning rate is recomputed from the schedule; gradient accumulators are
  // zero between optimizer steps, where checkpoints are written.
  return v.persistable && v.name.rfind("loss_scaling", 0) != 0 && v.name != "learning_rate" &&
         v.name.rfind(kGradAccumPrefix, 0) != 0;
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

// A NaN or inf loaded into a parameter or optimizer state would only show
// later: as every AMP step overflowing, an FP32 loss of NaN, or a parameter
// that never moves again (AdamW's exp_avg_sq at inf makes its update 0 for
// good). Stop here and name the tensor instead.
void check_values(const std::string& path, const VarDesc& var, const Tensor& t) {
  const DType d = t.dtype();
  if ((d != DType::f32 && d != DType::f16 && d != DType::bf16) || t.numel() == 0) return;
  const float* v = cpu::as_f32(t, 3);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(v[i]))
      MIX_FAIL("checkpoint " << path << ": "
                             << (var.is_parameter ? "parameter" : var.is_buffer ? "buffer" : "optimizer state") << " '"
                             << var.name
                             << "' holds " << v[i] << " at element " << i
                             << "; it was saved from a run that had diverged, or the file is corrupt (mixtrain does "
                                "not start from non-finite values; --init-from FILE takes the parameters alone)");
}

// The same rule before a save: a checkpoint mixtrain would refuse to resume
// must not replace the last good one.
void check_before_save(const std::string& path, const Metadata& meta, const std::string& name, const Tensor& t) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return;
  const float* v = cpu::as_f32(t, 3);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(v[i])) {
      const auto step = meta.find("step");
      MIX_FAIL("not saving " << path << (step != meta.end() ? " at step " + step->second : std::string())
                             << ": '" << name << "' holds " << v[i] << " at element " << i
                             << ", so the run has diverged; the checkpoint already there is kept. Resume from it "
                                "with a lower --lr (or --clip-grad-norm)");
    }
}

// Copies a tensor of the file into the model's variable `v`, then checks its values.
void load_into(const std::string& path, const VarDesc& v, const Tensor& src, Tensor& dst) {
  copy_into(path, v.name, src, dst);
  check_values(path, v, dst);
}

// --init-from of a parameter padded along dim 0 (VarDesc::unpadded_rows)
// from a file holding only its unpadded rows (a PyTorch GPT-2 state_dict's
// 50,257-row wte into the 50,304-row model): those rows load, the padding is
// zeroed. Any other shape goes through copy_into and its shape check.
void load_unpadded_into(const std::string& path, const VarDesc& v, const Tensor& src, Tensor& dst) {
  Shape unpadded = dst.shape();
  unpadded[0] = v.unpadded_rows;
  MIX_CHECK(src.shape() == unpadded, "checkpoint " << path << ": tensor '" << v.name << "' has shape "
                                                   << shape_str(src.shape()) << " but the model expects "
                                                   << shape_str(dst.shape()) << " (or " << shape_str(unpadded)
                                                   << " without the vocabulary's padding rows)");
  Tensor rows = Tensor::zeros(unpadded, dst.dtype());
  copy_into(path, v.name, src, rows);
  std::memset(dst.raw(), 0, dst.bytes());
  std::memcpy(dst.raw(), rows.raw(), rows.bytes());
  check_values(path, v, dst);
}

}  // namespace

FileDigest save_checkpoint(const std::string& path, const Program& p, const Scope& scope, const Metadata& meta) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const VarDesc& v : p.vars())
    if (saved_as_tensor(v)) tensors.emplace_back(v.name, scope.get(v.name).to(cpu_device()));
  for (const auto& [name, t] : tensors) check_before_save(path, meta, name, t);
  return write_safetensors(path, tensors, meta);
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
    const VarDesc& v = p.var(name);
    if (v.unpadded_rows > 0 && src->shape() != scope.get(name).shape())
      load_unpadded_into(path, v, *src, scope.get(name));
    else
      load_into(path, v, *src, scope.get(name));
    ++loaded;
  }
  if (!missing.empty())
    MIX_FAIL("--init-from " << path << " lacks the model's parameters: " << missing
                            << " (names and layouts are PyTorch's state_dict ones; `mixtrain --steps 0 --save FILE` "
                               "writes a file with every name)");
  for (const VarDesc& v : p.vars()) {
    if (!v.is_buffer) continue;
    if (const Tensor* src = f.find(v.name)) {
      load_into(path, v, *src, scope.get(v.name));
      ++loaded;
    } else if (missing_buffers) {
      missing_buffers->push_back(v.name);
    }
  }
  if (ignored) *ignored = static_cast<int>(f.tensors.size()) - loaded;
  return loaded;
}

Metadata load_checkpoint(const std::string& path, const Program& p, Scope& scope,
                         const std::function<void(const Metadata&)>& check_metadata) {
  SafetensorsFile f = read_safetensors(path);
  if (check_metadata) check_metadata(f.metadata);
  for (const VarDesc& v : p.vars()) {
    if (!saved_as_tensor(v)) continue;
    const Tensor* src = f.find(v.name);
    if (!src)
      MIX_FAIL("--resume " << path << " has no tensor '" << v.name
                           << "': it was saved by another model or optimizer (use --init-from to load parameters only)");
    load_into(path, v, *src, scope.get(v.name));
  }
  return f.metadata;
}

}  // namespace mix::io
