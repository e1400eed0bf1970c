#include "runtime/passes/fold_grad_sums.h"

#include <optional>
#include <vector>

#include "runtime/ir/op_registry.h"
#include "runtime/ir/storage_writes.h"
#include "runtime/ops/widening.h"

namespace mix {

namespace {

// A gradient op that can add a gradient's other part to the part it writes
// to `slot` (input Accumulate), and whether that part may be FP16/BF16 beside
// an FP32 output (runtime/ops/accumulate_input.h).
struct Accumulating {
  const char* type;
  const char* slot;
  bool narrower_ok;
};
constexpr Accumulating kAccumulating[] = {{"layer_norm_grad", "X@GRAD", false}, {"lookup_table_grad", "W@GRAD", true}};

const Accumulating* accumulating(const OpDesc& op) {
  for (const Accumulating& a : kAccumulating)
    if (op.type == a.type) return &a;
  return nullptr;
}

// Whether `var` can be dropped from the program: a temporary only the op at
// `reader` reads and one op writes.
bool private_temporary(const Program& p, const std::set<std::string>& keep, const std::string& var, size_t reader) {
  if (keep.count(var) || p.var(var).persistable || p.writer_count(var) != 1) return false;
  const auto reads = p.readers(var);
  return reads.size() == 1 && reads.front().first == reader;
}

// If the cast that widens `part` (an FP16/BF16 gradient cast to FP32) can be
// folded into the op at `at`, which reads `part` as Accumulate: makes the op
// read the cast's input, removes the cast and returns true.
bool fold_widening_cast(Program& p, const std::set<std::string>& keep, const std::string& part, size_t at) {
  const std::optional<size_t> c = p.producer(part, at);
  if (!c) return false;
  const OpDesc& cast = p.ops()[*c];
  if (cast.type != "cast" || !private_temporary(p, keep, part, at)) return false;
  const std::string narrow = cast.in("X");
  if (!widening::allowed(p.var(narrow).dtype, p.var(part).dtype) || p.var(narrow).dtype == p.var(part).dtype)
    return false;
  if (storage_written_between(p, narrow, *c, at)) return false;
  p.ops()[at].inputs["Accumulate"] = {narrow};
  p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(*c));
  return true;
}

// What fold_at removed: the sum, and the other part's widening cast (before it).
struct Folded {
  bool sum = false, cast = false;
};

// Folds the sum at `s` into the op that writes its last part, if it can; then
// the other part's widening cast, if it can.
Folded fold_at(Program& p, const std::set<std::string>& keep, size_t s) {
  const OpDesc& sum = p.ops()[s];
  if (sum.type != "sum" || sum.ins("X").size() != 2) return {};
  const std::string out = sum.out("Out");
  const std::vector<std::string> parts = sum.ins("X");
  if (parts[0] == parts[1] || out == parts[0] || out == parts[1]) return {};
  const std::optional<size_t> w0 = p.producer(parts[0], s), w1 = p.producer(parts[1], s);
  if ((!w0 && !w1) || (w0 && w1 && *w0 == *w1)) return {};
  // The op that writes its part last can read the other (a part no op writes
  // is there from the start).
  const bool second_last = !w0 || (w1 && *w1 > *w0);
  const size_t j = second_last ? *w1 : *w0;
  const std::string& own = parts[second_last ? 1 : 0];
  const std::string& other = parts[second_last ? 0 : 1];
  OpDesc& op = p.ops()[j];
  const Accumulating* a = accumulating(op);
  if (!a || op.out_or_empty(a->slot) != own || !op.in_or_empty("Accumulate").empty()) return {};
  if (!private_temporary(p, keep, own, s)) return {};
  const VarDesc &ov = p.var(own), &tv = p.var(other);
  if (ov.dtype != tv.dtype || ov.shape != tv.shape) return {};
  if (storage_written_between(p, other, j, s) || named_between(p, out, j, s)) return {};
  op.inputs["Accumulate"] = {other};
  op.outputs[a->slot] = {out};
  p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(s));
  return {true, a->narrower_ok && fold_widening_cast(p, keep, other, j)};
}

}  // namespace

FoldedGradSums fold_grad_sums(Program& p, const std::set<std::string>& keep) {
  FoldedGradSums r;
  for (size_t s = 0; s < p.ops().size();) {
    const Folded f = fold_at(p, keep, s);
    if (!f.sum) {
      ++s;
      continue;
    }
    // The sum at s is gone, so s is the next op; one earlier still when the cast before it went too.
    ++r.sums;
    if (f.cast) {
      ++r.casts;
      --s;
    }
  }
  return r;
}

}  // namespace mix
