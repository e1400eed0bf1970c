#include "runtime/ir/storage_writes.h"

#include <map>

#include "runtime/ir/op_registry.h"

namespace mix {

namespace {

// The input `op`'s output `out` is a view of; empty when it has storage of its own.
std::string viewed_by(const OpDesc& op, const std::string& out) {
  const ViewFn& view = OpRegistry::instance().get(op.type).viewed_input;
  return view ? view(op, out) : std::string();
}

}  // namespace

bool storage_written_between(const Program& p, const std::string& var, size_t from, size_t to) {
  // Each view's variable -> the variable it views, from the ops that make views.
  std::map<std::string, std::string> viewed;
  for (const OpDesc& op : p.ops())
    for (const std::string& out : op.all_outputs())
      if (const std::string base = viewed_by(op, out); !base.empty() && base != out) viewed.emplace(out, base);
  // The storage's owner, up the chain of views (bounded: a malformed cycle ends it).
  auto root_of = [&](std::string v) {
    for (size_t hops = 0; hops <= viewed.size(); ++hops) {
      const auto it = viewed.find(v);
      if (it == viewed.end()) break;
      v = it->second;
    }
    return v;
  };
  const std::string root = root_of(var);
  for (size_t k = from + 1; k < to && k < p.ops().size(); ++k) {
    const OpDesc& op = p.ops()[k];
    for (const std::string& out : op.all_outputs())
      if (viewed_by(op, out).empty() && root_of(out) == root) return true;
  }
  return false;
}

bool named_between(const Program& p, const std::string& var, size_t from, size_t to) {
  for (size_t k = from + 1; k < to; ++k) {
    const OpDesc& op = p.ops()[k];
    for (const auto& names : {op.all_inputs(), op.all_outputs()})
      for (const auto& v : names)
        if (v == var) return true;
  }
  return false;
}

}  // namespace mix
