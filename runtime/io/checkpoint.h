#pragma once
// Checkpoints: safetensors files whose tensors are the parameters under their
// PyTorch state_dict names and layouts, the optimizer state as
// `optimizer.<slot>.<param>` (and `optimizer.step`), and whose header metadata
// holds the loss scaler, the step, the data position and what fixes the data
// order (launch/trainer.cc's resume settings).
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/program.h"
#include "runtime/io/safetensors.h"

namespace mix::io {

using Metadata = std::map<std::string, std::string>;

/// Writes parameters and optimizer state (every persistable variable whose name
/// is not in `metadata_vars`) and `meta`. Atomic: temporary file, then rename.
/// A non-finite value in any of them throws before anything is written.
/// Returns the file's digest (write_safetensors).
FileDigest save_checkpoint(const std::string& path, const Program& p, const Scope& scope, const Metadata& meta);

/// --init-from: loads every parameter of `p` from `path` (F32, F16 or BF16
/// tensors; shapes must match, except that a parameter padded along dim 0,
/// VarDesc::unpadded_rows, also takes a tensor of its unpadded rows alone,
/// the padding then zero), and the model buffers (batch_norm's running
/// statistics) the file has; buffers it lacks keep their initial values and are
/// listed in `missing_buffers`. A missing parameter or a shape mismatch throws
/// naming the tensor; tensors the model does not have are ignored (counted in
/// `ignored`). Returns the number of tensors loaded.
int load_parameters(const std::string& path, const Program& p, Scope& scope, int* ignored = nullptr,
                    std::vector<std::string>* missing_buffers = nullptr);

/// --resume: loads every persistable variable saved by save_checkpoint and
/// returns the metadata. `check_metadata`, when given, sees the metadata
/// first and may throw: a run the checkpoint does not fit is then named by
/// its settings rather than by the first tensor it lacks, and nothing is loaded.
Metadata load_checkpoint(const std::string& path, const Program& p, Scope& scope,
                         const std::function<void(const Metadata&)>& check_metadata = {});

}  // namespace mix::io
