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

// Whether an op strictly between `from` and `to` reads or writes `var` by name.
bool named_between(const Program& p, const std::string& var, size_t from, size_t to) {
  for (size_t k = from + 1; k < to; ++k) {
    const OpDesc& op = p.ops()[k];
    for (const auto& v : op.all_inputs())
      if (v == var) return true;
    for (const auto& v : op.all_outputs())
      if (v == var) return true;
  }
  return false;
}

// Whether `var` can be dropped from the program: a temporary only the op at
// `reader` reads and one op writes.
bool private_temporary(const Program& p, const std::set<std::string>& keep, const std::string& var, size_t reader) {
  if (keep.count(var) || p.var(var).persistable || p.writer_count(var) != 1) return false;
  const auto reads = p.readers(var);
  return reads.size() == 1 && reads.front().first == reader;
}

// If the cast that widens `part` (an FP16/BF16 gradient cast to FP32) can be
// folded into the op at `at`, which now reads `part` as Accumulate: makes the
// op read the cast's input and returns the cast's index.
std::optional<size_t> foldable_cast(Program& p, const std::set<std::string>& keep, const std::string& part, size_t at) {
  const std::optional<size_t> c = p.producer(part, at);
  if (!c) return std::nullopt;
  const OpDesc& cast = p.ops()[*c];
  if (cast.type != "cast" || !private_temporary(p, keep, part, at)) return std::nullopt;
  const std::string narrow = cast.in("X");
  if (!widening::allowed(p.var(narrow).dtype, p.var(part).dtype) || p.var(narrow).dtype == p.var(part).dtype)
    return std::nullopt;
  if (storage_written_between(p, narrow, *c, at)) return std::nullopt;
  p.ops()[at].inputs["Accumulate"] = {narrow};
  return c;
}

// Folds the sum at `s` into the op that writes its last part, if it can; then
// the other part's widening cast, if it can. Returns the cast's index when
// one was folded; sets `folded`.
std::optional<size_t> fold_at(Program& p, const std::set<std::string>& keep, size_t s, bool& folded) {
  folded = false;
  const OpDesc& sum = p.ops()[s];
  if (sum.type != "sum" || sum.ins("X").size() != 2) return std::nullopt;
  const std::string out = sum.out("Out");
  const std::vector<std::string> parts = sum.ins("X");
  if (parts[0] == parts[1] || out == parts[0] || out == parts[1]) return std::nullopt;
  const std::optional<size_t> w0 = p.producer(parts[0], s), w1 = p.producer(parts[1], s);
  if (!w0 && !w1) return std::nullopt;
  // The op that writes its part last can read the other (a part no op writes
  // is there from the start).
  const bool second_last = !w0 || (w1 && *w1 > *w0);
  const size_t j = second_last ? *w1 : *w0;
  if (w0 && w1 && *w0 == *w1) return std::nullopt;
  const std::string& own = parts[second_last ? 1 : 0];
  const std::string& other = parts[second_last ? 0 : 1];
  OpDesc& op = p.ops()[j];
  const Accumulating* a = accumulating(op);
  if (!a || op.out_or_empty(a->slot) != own || !op.in_or_empty("Accumulate").empty()) return std::nullopt;
  if (!private_temporary(p, keep, own, s)) return std::nullopt;
  const VarDesc &ov = p.var(own), &tv = p.var(other);
  if (ov.dtype != tv.dtype || ov.shape != tv.shape) return std::nullopt;
  if (storage_written_between(p, other, j, s) || named_between(p, out, j, s)) return std::nullopt;
  op.inputs["Accumulate"] = {other};
  op.outputs[a->slot] = {out};
  p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(s));
  folded = true;
  return a->narrower_ok ? foldable_cast(p, keep, other, j) : std::nullopt;
}

}  // namespace

FoldedGradSums fold_grad_sums(Program& p, const std::set<std::string>& keep) {
  FoldedGradSums r;
  for (size_t s = 0; s < p.ops().size();) {
    bool folded = false;
    const std::optional<size_t> cast = fold_at(p, keep, s, folded);
    if (!folded) {
      ++s;
      continue;
    }
    ++r.sums;  // the sum at s is gone: s is the next op, or the one after it once the cast goes
    if (cast) {
      p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(*cast));
      ++r.casts;
      --s;
    }
  }
  return r;
}

}  // namespace mix
