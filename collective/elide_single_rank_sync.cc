#include "collective/elide_single_rank_sync.h"

#include <optional>
#include <string>

namespace mix::collective {

namespace {

bool is_gradient(const OpDesc& op, const char* type) {
  return op.type == type && op.attr<std::string>("traffic", "") == "gradients";
}

// The wait of the start at `i`: the c_allreduce_wait after it reading its Buffer.
std::optional<size_t> wait_of(const Program& p, size_t i) {
  const std::string& buffer = p.ops()[i].out("Buffer");
  for (size_t j = i + 1; j < p.ops().size(); ++j)
    if (is_gradient(p.ops()[j], "c_allreduce_wait") && p.ops()[j].in("Buffer") == buffer) return j;
  return std::nullopt;
}

// Whether the pair leaves its bucket as it found it: scales of exactly 1 and
// the reduced values written back where the bucket lies.
bool is_identity(const OpDesc& start, const OpDesc& wait) {
  return start.attr<double>("prescale", 1.0) == 1.0 && wait.attr<double>("postscale", 1.0) == 1.0 &&
         start.ins("X") == wait.outs("Out");
}

}  // namespace

int elide_single_rank_sync(Program& p) {
  int removed = 0;
  for (size_t i = 0; i < p.ops().size();) {
    const std::optional<size_t> wait = is_gradient(p.ops()[i], "c_allreduce_start") ? wait_of(p, i) : std::nullopt;
    if (!wait || !is_identity(p.ops()[i], p.ops()[*wait])) {
      ++i;
      continue;
    }
    p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(*wait));  // the later one first
    p.ops().erase(p.ops().begin() + static_cast<std::ptrdiff_t>(i));
    ++removed;
  }
  return removed;
}

}  // namespace mix::collective
