#include "runtime/ir/program.h"

#include <sstream>

#include "runtime/core/check.h"

namespace mix {

std::string_view op_role_name(OpRole r) {
  switch (r) {
    case OpRole::forward: return "forward";
    case OpRole::loss: return "loss";
    case OpRole::backward: return "backward";
    case OpRole::collective: return "collective";
    case OpRole::optimize: return "optimize";
  }
  return "?";
}

namespace {
const std::vector<std::string>& slot_of(const std::map<std::string, std::vector<std::string>>& m,
                                        const std::string& slot, const OpDesc& op, const char* kind) {
  auto it = m.find(slot);
  MIX_CHECK(it != m.end(), "op " << op.type << " has no " << kind << " slot '" << slot << "'");
  return it->second;
}
}  // namespace

const std::vector<std::string>& OpDesc::ins(const std::string& slot) const {
  return slot_of(inputs, slot, *this, "input");
}
const std::vector<std::string>& OpDesc::outs(const std::string& slot) const {
  return slot_of(outputs, slot, *this, "output");
}
const std::string& OpDesc::in(const std::string& slot) const {
  const auto& v = ins(slot);
  MIX_CHECK(v.size() == 1, "op " << type << " input '" << slot << "' holds " << v.size() << " variables, expected 1");
  return v[0];
}
const std::string& OpDesc::out(const std::string& slot) const {
  const auto& v = outs(slot);
  MIX_CHECK(v.size() == 1, "op " << type << " output '" << slot << "' holds " << v.size() << " variables, expected 1");
  return v[0];
}
std::string OpDesc::in_or_empty(const std::string& slot) const {
  auto it = inputs.find(slot);
  return it == inputs.end() || it->second.empty() ? std::string() : it->second[0];
}
std::string OpDesc::out_or_empty(const std::string& slot) const {
  auto it = outputs.find(slot);
  return it == outputs.end() || it->second.empty() ? std::string() : it->second[0];
}
void OpDesc::throw_bad_attr(const std::string& name) const {
  MIX_FAIL("op " << type << ": attribute '" << name << "' has the wrong type");
}

std::vector<std::string> OpDesc::all_inputs() const {
  std::vector<std::string> r;
  for (auto& [slot, names] : inputs)
    for (auto& n : names)
      if (!n.empty()) r.push_back(n);
  return r;
}
std::vector<std::string> OpDesc::all_outputs() const {
  std::vector<std::string> r;
  for (auto& [slot, names] : outputs)
    for (auto& n : names)
      if (!n.empty()) r.push_back(n);
  return r;
}

VarDesc& Program::add_var(VarDesc v) {
  MIX_CHECK(!v.name.empty(), "variable without a name");
  auto it = index_.find(v.name);
  if (it != index_.end()) {
    vars_[it->second] = std::move(v);
    return vars_[it->second];
  }
  index_[v.name] = vars_.size();
  vars_.push_back(std::move(v));
  return vars_.back();
}

std::string Program::unique_name(const std::string& base) const {
  if (!has_var(base)) return base;
  for (int i = 1;; ++i) {
    std::string n = base + "_" + std::to_string(i);
    if (!has_var(n)) return n;
  }
}

VarDesc& Program::var(const std::string& name) {
  auto it = index_.find(name);
  MIX_CHECK(it != index_.end(), "program has no variable '" << name << "'");
  return vars_[it->second];
}
const VarDesc& Program::var(const std::string& name) const {
  auto it = index_.find(name);
  MIX_CHECK(it != index_.end(), "program has no variable '" << name << "'");
  return vars_[it->second];
}

std::vector<std::string> Program::parameters() const {
  std::vector<std::string> r;
  for (auto& v : vars_)
    if (v.is_parameter) r.push_back(v.name);
  return r;
}

OpDesc& Program::append_op(OpDesc op) { return insert_op(ops_.size(), std::move(op)); }

OpDesc& Program::insert_op(size_t pos, OpDesc op) {
  MIX_CHECK(pos <= ops_.size(), "insert position " << pos << " past the end");
  infer_op(*this, op);
  return *ops_.insert(ops_.begin() + static_cast<std::ptrdiff_t>(pos), std::move(op));
}

std::optional<size_t> Program::producer(const std::string& name, size_t before) const {
  const size_t end = std::min(before, ops_.size());
  for (size_t i = end; i-- > 0;) {
    for (auto& [slot, outs] : ops_[i].outputs)
      for (auto& o : outs)
        if (o == name) return i;
  }
  return std::nullopt;
}

std::vector<std::pair<size_t, std::string>> Program::readers(const std::string& var) const {
  std::vector<std::pair<size_t, std::string>> found;
  for (size_t j = 0; j < ops_.size(); ++j)
    for (const auto& [slot, names] : ops_[j].inputs)
      for (const auto& n : names)
        if (n == var) found.emplace_back(j, slot);
  return found;
}

size_t Program::writer_count(const std::string& var) const {
  size_t count = 0;
  for (const OpDesc& op : ops_)
    for (const auto& [slot, names] : op.outputs)
      for (const auto& n : names) count += n == var;
  return count;
}

namespace {
std::string attr_str(const Attr& a) {
  std::ostringstream o;
  std::visit(
      [&](auto&& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          o << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          o << '"' << v << '"';
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<std::string>> ||
                             std::is_same_v<T, std::vector<double>>) {
          o << '[';
          for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
          o << ']';
        } else {
          o << v;
        }
      },
      a);
  return o.str();
}
}  // namespace

std::string Program::str() const {
  std::ostringstream o;
  auto var_str = [&](const std::string& n) {
    if (!has_var(n)) return n;
    const VarDesc& v = var(n);
    return n + ":" + std::string(dtype_name(v.dtype)) + shape_str(v.shape);
  };
  o << "parameters:\n";
  for (auto& v : vars_)
    if (v.is_parameter) o << "  " << var_str(v.name) << "\n";
  std::optional<OpRole> role;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const OpDesc& op = ops_[i];
    if (!role || *role != op.role) {
      role = op.role;
      o << op_role_name(op.role) << ":\n";
    }
    o << "  " << i << ": ";
    bool first = true;
    for (auto& [slot, outs] : op.outputs)
      for (auto& n : outs) {
        if (n.empty()) continue;
        o << (first ? "" : ", ") << var_str(n);
        first = false;
      }
    o << " = " << op.type << "(";
    first = true;
    for (auto& [slot, ins] : op.inputs) {
      if (ins.empty()) continue;
      o << (first ? "" : ", ") << slot << "=";
      if (ins.size() > 1) o << "[";
      for (size_t k = 0; k < ins.size(); ++k) o << (k ? ", " : "") << ins[k];
      if (ins.size() > 1) o << "]";
      first = false;
    }
    o << ")";
    if (!op.attrs.empty()) {
      o << " {";
      first = true;
      for (auto& [k, v] : op.attrs) {
        o << (first ? "" : ", ") << k << "=" << attr_str(v);
        first = false;
      }
      o << "}";
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace mix
