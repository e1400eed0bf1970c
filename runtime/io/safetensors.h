#pragma once
// safetensors files: 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "string value"}}, then the raw little-endian data.
// This is the format PyTorch users save with the `safetensors` package, so
// checkpoints and user data sets interchange with PyTorch.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/io/atomic_file.h"

namespace mix::io {

struct SafetensorsFile {
  /// Tensors in the file's order of data offsets.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  const Tensor* find(const std::string& name) const;
};

/// Reads a whole file. Errors (missing file, truncated data, bad JSON, an
/// unknown dtype, offsets out of range) throw mix::Error naming the file and problem.
SafetensorsFile read_safetensors(const std::string& path);

/// Writes to `path + ".tmp"`, fsyncs, then renames over `path`, so a crash never
/// leaves a half-written file under the final name. Returns the digest of the
/// bytes written, computed as they were written (no read back).
FileDigest write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Checks now, before the work whose result it will hold, that
/// write_safetensors can write `path` later: it is not a folder and its
/// temporary file can be created beside it. Throws mix::Error naming the
/// path and the reason; creates nothing that stays.
void check_writable(const std::string& path);

}  // namespace mix::io
