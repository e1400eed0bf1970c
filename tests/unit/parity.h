#pragma once
// Helpers shared by the whole-model parity tests against PyTorch
// (test_mlp_parity.cc, test_resnet_parity.cc): running a reference script of
// tests/python/ with Debian's /usr/bin/python3, and the elementwise comparison
// |got - want| <= abs + of_max * max|want| + rel * |want_i|, whose of_max part
// serves elements that are sums of terms of either sign (they lose relative
// accuracy, never accuracy against the size of their terms).
// MIX_PARITY_VERBOSE=1 prints the error of every check next to its tolerance.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <map>
#include <set>

#include "collective/communicator.h"
#include "launch/train_program.h"
#include "models/model.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/executor.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/optimizer.h"

namespace mix::testing {

namespace fs = std::filesystem;

inline constexpr const char* kPython = "/usr/bin/python3";

/// "784,64,10" -> {784, 64, 10} (the reference files' list metadata).
inline std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) v.push_back(std::stoll(part));
  return v;
}

inline std::string source_dir() {
  if (const char* s = std::getenv("MIX_SOURCE_DIR"); s && *s) return s;
  // Run by hand outside CTest: this file is <source>/tests/unit/parity.h.
  return fs::path(__FILE__).parent_path().parent_path().parent_path().string();
}

/// Runs tests/python/<script> OUT ARGS and reads the safetensors file it writes; FAILs with the reason.
inline io::SafetensorsFile run_reference_script(const std::string& script, const std::string& args = "") {
  if (std::system((std::string(kPython) + " -c 'import numpy, torch' >/dev/null 2>&1").c_str()) != 0)
    FAIL(kPython << " cannot import numpy and torch, which the PyTorch parity tests need: run scripts/setup.sh "
                    "(it installs Debian's python3-numpy and python3-torch)");
  const std::string path = source_dir() + "/tests/python/" + script;
  if (!fs::exists(path)) FAIL("no reference script at " << path << " (set MIX_SOURCE_DIR to the source tree; CTest does)");
  const fs::path out = fs::temp_directory_path() / ("mix_parity_" + std::to_string(getpid()) + ".safetensors");
  const std::string cmd = std::string(kPython) + " '" + path + "' '" + out.string() + "' " + args;
  const int rc = std::system(cmd.c_str());
  if (rc != 0) FAIL("the reference script failed (status " << rc << "): " << cmd);
  io::SafetensorsFile f = io::read_safetensors(out.string());
  fs::remove(out);
  return f;
}

struct Tol {
  double abs = 0;     // absolute floor
  double of_max = 0;  // times max |want| over the tensor, added to the floor
  double rel = 0;     // times |want_i|
};

inline bool verbose() {
  const char* v = std::getenv("MIX_PARITY_VERBOSE");
  return v && *v && std::string(v) != "0";
}

/// Elementwise |got - want| <= tol; on failure reports the count and the worst element.
inline void check_close(const std::string& what, const Tensor& got, const Tensor& want, Tol tol) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const std::vector<float> g = got.to_floats(), w = want.to_floats();
  double max_abs_want = 0;
  for (float v : w) max_abs_want = std::max(max_abs_want, std::fabs(static_cast<double>(v)));
  const double floor = tol.abs + tol.of_max * max_abs_want;
  size_t bad = 0, worst = 0;
  double worst_ratio = -1, max_diff = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(g[i]) - static_cast<double>(w[i]));
    const double allowed = floor + tol.rel * std::fabs(static_cast<double>(w[i]));
    const double ratio = std::isnan(diff) ? INFINITY : diff / std::max(allowed, 1e-300);
    max_diff = std::max(max_diff, diff);
    if (!(diff <= allowed)) ++bad;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  const double worst_allowed = floor + tol.rel * std::fabs(static_cast<double>(w[worst]));
  std::ostringstream msg;
  msg << what << ": " << bad << " of " << w.size() << " elements out of tolerance (abs " << tol.abs << " + "
      << tol.of_max << " * max|want| " << max_abs_want << " + rel " << tol.rel << "); max |diff| " << max_diff
      << "; worst element " << worst << ": got " << g[worst] << ", want " << w[worst] << ", |diff| "
      << std::fabs(static_cast<double>(g[worst]) - w[worst]) << " vs allowed " << worst_allowed << " ("
      << worst_ratio << " of the tolerance)";
  if (verbose())
    std::fprintf(stderr, "[parity] %-70s max|diff| %.3g, worst at %.3g of its tolerance\n", what.c_str(), max_diff,
                 worst_ratio);
  if (bad) FAIL_CHECK(msg.str());
}

/// A network of a parity test: its name in messages and its reference script's arguments.
struct ReferenceNet {
  const char* label;
  const char* args;
};

/// The reference file `script ARGS` writes, made once per process and argument set.
inline const io::SafetensorsFile& cached_reference(const std::string& script, const std::string& args) {
  static std::map<std::string, io::SafetensorsFile> cache;
  const std::string key = script + " " + args;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run_reference_script(script, args)).first;
  return it->second;
}

/// Tensor `name` of a reference file; FAILs naming it when absent.
inline const Tensor& reference_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  if (!t) FAIL("the reference file has no tensor '" << name << "' (is its script in tests/python/ current?)");
  return *t;
}

/// Replaces every parameter and buffer of `program` in `scope` by the
/// reference's `init.<name>` (same shape and dtype required) and checks that
/// the file's state_dict holds nothing else: torch's names are exactly ours.
inline void load_reference_state(const io::SafetensorsFile& ref, const Program& program, Scope& scope) {
  int loaded = 0, in_file = 0;
  for (const VarDesc& v : program.vars()) {
    if (!v.is_parameter && !v.is_buffer) continue;
    const Tensor& init = reference_tensor(ref, "init." + v.name);
    INFO("state " << v.name);
    REQUIRE(init.shape() == scope.get(v.name).shape());
    REQUIRE(init.dtype() == scope.get(v.name).dtype());
    scope.set(v.name, init.clone());
    ++loaded;
  }
  for (auto& [name, t] : ref.tensors) in_file += name.rfind("init.", 0) == 0;
  CHECK(loaded == in_file);
}

/// Runs one training step of `model` (trained by `train`) on the reference's
/// batch `x`, `label` with a single-process communicator. Keeps the loss, the
/// gradients, found_inf and `extra`; returns the loss.
inline float run_reference_step(const io::SafetensorsFile& ref, const models::Model& model,
                                const launch::TrainProgram& train, Scope& scope, std::set<std::string> extra = {}) {
  auto comm = collective::make_local_communicator();
  ExecEnv env;
  env.comm = comm.get();
  env.step = 1;
  std::set<std::string> keep = std::move(extra);
  keep.insert(model.loss);
  for (auto& [param, grad] : train.param_grads) keep.insert(grad);
  if (!train.found_inf.empty()) keep.insert(train.found_inf);
  scope.set(model.input, reference_tensor(ref, "x").clone());
  scope.set(model.label, reference_tensor(ref, "label").clone());
  Executor(model.program, keep).run(scope, env);
  return scope.get(model.loss).item_float();
}

}  // namespace mix::testing
