#include "runtime/ir/scope.h"

#include "runtime/core/check.h"

namespace mix {

Tensor* Scope::find(const std::string& name) {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : &it->second;
}
const Tensor* Scope::find(const std::string& name) const {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : &it->second;
}
Tensor& Scope::get(const std::string& name) {
  Tensor* t = find(name);
  MIX_CHECK(t, "variable '" << name << "' has no value (not fed, not initialised, or already released)");
  return *t;
}
const Tensor& Scope::get(const std::string& name) const {
  const Tensor* t = find(name);
  MIX_CHECK(t, "variable '" << name << "' has no value (not fed, not initialised, or already released)");
  return *t;
}

}  // namespace mix
