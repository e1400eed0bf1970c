#include "amp/fuse_param_casts.h"

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/storage_writes.h"

namespace mix::amp {

namespace {

// The forward casts of parameters that go into one fused_cast op.
struct Group {
  size_t first = 0;           // where the fused op goes: the first cast's place
  std::vector<size_t> casts;  // the casts, in program order
};

}  // namespace

int fuse_param_casts(Program& p) {
  std::map<std::pair<DType, DType>, Group> groups;  // (from, to) -> its casts
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpDesc& op = p.ops()[i];
    if (op.type != "cast" || op.role != OpRole::forward) continue;
    const std::string& x = op.in("X");
    if (!p.has_var(x) || !p.var(x).is_parameter) continue;
    const DType from = p.var(x).dtype, to = parse_dtype(op.attr<std::string>("out_dtype", "f32"));
    if (from == to || !is_floating(from) || !is_floating(to)) continue;
    if (p.writer_count(op.out("Out")) != 1) continue;
    Group& g = groups[{from, to}];
    if (g.casts.empty()) g.first = i;
    // The fused op reads X at the group's first cast: nothing in between may
    // write it, by its name or through a view of it (for the first cast
    // itself, every writer comes before).
    if (storage_written_between(p, x, g.first, i)) continue;
    g.casts.push_back(i);
  }
  std::map<size_t, OpDesc> fused_at;  // the fused ops, by the index they take
  std::set<size_t> removed;
  int fused = 0;
  for (auto& [dtypes, g] : groups) {
    if (g.casts.size() < 2) continue;
    std::vector<std::string> xs, outs;
    for (size_t i : g.casts) {
      xs.push_back(p.ops()[i].in("X"));
      outs.push_back(p.ops()[i].out("Out"));
      removed.insert(i);
    }
    OpDesc op =
        make_op("fused_cast", {{"X", xs}}, {{"Out", outs}}, {{"out_dtype", std::string(dtype_name(dtypes.second))}});
    op.role = OpRole::forward;
    fused_at.emplace(g.first, std::move(op));
    fused += static_cast<int>(g.casts.size());
  }
  if (fused_at.empty()) return 0;
  std::vector<OpDesc> ops;
  ops.reserve(p.ops().size());
  for (size_t i = 0; i < p.ops().size(); ++i) {
    if (auto it = fused_at.find(i); it != fused_at.end()) {
      infer_op(p, it->second);  // the outputs keep the casts' shapes and dtype
      ops.push_back(std::move(it->second));
    }
    if (!removed.count(i)) ops.push_back(std::move(p.ops()[i]));
  }
  p.ops() = std::move(ops);
  return fused;
}

}  // namespace mix::amp
