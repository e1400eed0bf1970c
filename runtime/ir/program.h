#pragma once
// The program IR: variables and a list of ops with Paddle op type names, named
// input/output slots and attributes. Model code builds the forward program;
// passes (amp::rewrite, autodiff, the gradient all-reduce pass, loss scaling,
// the optimizer) append to and rewrite it; the Executor runs it.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/tensor.h"

namespace mix {

/// Suffix of gradient variables: the gradient of `w` is `w@GRAD`.
inline constexpr const char* kGradSuffix = "@GRAD";
inline std::string grad_name(const std::string& var) { return var + kGradSuffix; }

/// How a persistable variable gets its first value (before any broadcast or checkpoint load).
struct VarInit {
  enum class Kind { zeros, constant, uniform, normal };
  Kind kind = Kind::zeros;
  double a = 0;  // constant: the value; uniform: the bound (U(-a, a)); normal: the std
};

struct VarDesc {
  std::string name;
  Shape shape;  // -1 marks the batch dimension
  DType dtype = DType::f32;
  bool persistable = false;   // lives across steps (parameters, optimizer state, scaler state)
  bool is_parameter = false;  // a trainable FP32 master
  bool stop_gradient = false; // data, labels, constants
  VarInit init;               // persistable variables only
  bool is_buffer = false;     // model state that is not trained (batch_norm's running statistics):
                              // saved, loaded by --init-from and kept equal on every rank
  /// Parameters padded along dim 0 (a vocabulary padded for the GEMMs): when
  /// above 0, rows [unpadded_rows, shape[0]) are padding, zero at
  /// initialisation, and a checkpoint tensor of only the unpadded rows loads
  /// into the first rows with the padding zero. Whatever reads the padding
  /// must mask it (softmax_with_cross_entropy's attr valid_classes).
  int64_t unpadded_rows = 0;
};

/// Op attributes; std::vector<double> holds per-channel constants (image_normalize's mean and std).
using Attr = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<std::string>,
                          std::vector<double>>;

/// What part of the step an op belongs to; the executor can run a subset
/// (evaluation runs only the forward ops).
enum class OpRole { forward, loss, backward, collective, optimize };
std::string_view op_role_name(OpRole r);

struct OpDesc {
  std::string type;
  std::map<std::string, std::vector<std::string>> inputs;
  std::map<std::string, std::vector<std::string>> outputs;
  std::map<std::string, Attr> attrs;
  OpRole role = OpRole::forward;

  /// The single variable of a slot; throws if the slot is missing or holds several.
  const std::string& in(const std::string& slot) const;
  const std::string& out(const std::string& slot) const;
  /// Empty string when the slot is absent or empty (optional inputs and grads).
  std::string in_or_empty(const std::string& slot) const;
  std::string out_or_empty(const std::string& slot) const;
  const std::vector<std::string>& ins(const std::string& slot) const;
  const std::vector<std::string>& outs(const std::string& slot) const;

  bool has_attr(const std::string& name) const { return attrs.count(name) > 0; }
  template <typename T>
  T attr(const std::string& name, T fallback) const {
    auto it = attrs.find(name);
    if (it == attrs.end()) return fallback;
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
      if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<T>(*i);
      if (auto* d = std::get_if<double>(&it->second)) return static_cast<T>(*d);
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<T>(*i);
    } else {
      if (auto* v = std::get_if<T>(&it->second)) return *v;
    }
    throw_bad_attr(name);
  }
  /// Throws mix::Error: attribute `name` has another type than the op asked for.
  [[noreturn]] void throw_bad_attr(const std::string& name) const;
  /// All variable names read / written, in slot order.
  std::vector<std::string> all_inputs() const;
  std::vector<std::string> all_outputs() const;
};

class Program {
 public:
  VarDesc& add_var(VarDesc v);
  /// A fresh name based on `base` that no variable uses yet.
  std::string unique_name(const std::string& base) const;
  bool has_var(const std::string& name) const { return index_.count(name) > 0; }
  /// The reference stays valid while other variables are added.
  VarDesc& var(const std::string& name);
  const VarDesc& var(const std::string& name) const;
  const std::deque<VarDesc>& vars() const { return vars_; }
  /// Trainable parameters in creation order.
  std::vector<std::string> parameters() const;

  std::vector<OpDesc>& ops() { return ops_; }
  const std::vector<OpDesc>& ops() const { return ops_; }
  /// Appends an op after running its shape/dtype inference (declares outputs).
  OpDesc& append_op(OpDesc op);
  /// Inserts at position `pos`, with inference.
  OpDesc& insert_op(size_t pos, OpDesc op);
  /// Index of the op that writes `var` last before position `before` (or any), nullopt for feeds/params.
  std::optional<size_t> producer(const std::string& var, size_t before = SIZE_MAX) const;
  /// Every (op index, input slot) that reads `var`, in program order.
  std::vector<std::pair<size_t, std::string>> readers(const std::string& var) const;
  /// How many ops write `var` (an op writing it in place counts).
  size_t writer_count(const std::string& var) const;

  /// Human-readable listing: one line per op, `out:dtype[shape] = type(in, ...) {attrs}`,
  /// grouped by role. This is what `mixtrain --print-program` prints.
  std::string str() const;

 private:
  // A deque: adding a variable leaves references to the others valid. Shape
  // inference holds its inputs' VarDescs while it declares outputs (found by
  // AddressSanitizer: with a vector, split's second output read a freed X).
  std::deque<VarDesc> vars_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<OpDesc> ops_;
};

/// Runs an op type's inference: declares/updates its output VarDescs. Defined
/// by the op registry (runtime/ir/op_registry.cc), which holds each type's rule.
void infer_op(Program& p, OpDesc& op);

}  // namespace mix
