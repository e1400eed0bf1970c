#pragma once
// Scope: the tensors of one training process by variable name.
#include <string>
#include <unordered_map>

#include "runtime/core/tensor.h"

namespace mix {

/// Named tensors of one training process: parameters, optimizer state and the
/// temporaries of the step that is running.
class Scope {
 public:
  Tensor* find(const std::string& name);
  const Tensor* find(const std::string& name) const;
  /// Throws naming the variable when it is absent.
  Tensor& get(const std::string& name);
  const Tensor& get(const std::string& name) const;
  void set(const std::string& name, Tensor t) { vars_[name] = std::move(t); }
  void erase(const std::string& name) { vars_.erase(name); }
  bool has(const std::string& name) const { return vars_.count(name) > 0; }
  const std::unordered_map<std::string, Tensor>& all() const { return vars_; }

 private:
  std::unordered_map<std::string, Tensor> vars_;
};

}  // namespace mix
