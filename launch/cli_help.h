#pragma once
// The command lines of mixtrain and mixbench as a user meets them: --help
// with the flags grouped by topic, each with its values and default and none
// of CLI11's own notation; an unknown flag answered with the nearest known
// one; --version with what the build was compiled against; and choice flags
// parsed straight into their enums (runtime/core/enum_names.h).
#include <CLI/CLI.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/enum_names.h"

namespace mix::launch {

/// --help's layout: one section per group, "--flag VALUES  description [default: D]".
std::shared_ptr<CLI::Formatter> help_formatter();

/// "a|b|c": a choice flag's values, as --help shows them.
template <typename E, size_t N>
std::string choice_names(const NamedValue<E> (&table)[N]) {
  std::string s;
  for (const auto& entry : table) {
    if (!s.empty()) s += '|';
    s.append(entry.name.data(), entry.name.size());
  }
  return s;
}

/// A validator that accepts exactly the names in `names`, saying which it
/// takes when it refuses one.
CLI::Validator one_of(std::vector<std::string> names);

/// --FLAG NAME, read into `target` through `table`; the default shown is
/// `target`'s name as it is when the flag is added.
template <typename E, size_t N>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, E& target, const NamedValue<E> (&table)[N],
                        const std::string& help) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.emplace_back(entry.name);
  CLI::Option* o = app.add_option_function<std::string>(
      flag, [&target, &table](const std::string& name) { target = *value_named(name, table); }, help);
  o->check(one_of(names))->type_name(choice_names(table))->default_str(std::string(name_of(target, table)));
  return o;
}

/// The same for a choice with no default of its own (`target` stays unset
/// unless the flag is given); `default_text` says what applies then.
template <typename E, size_t N>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, std::optional<E>& target,
                        const NamedValue<E> (&table)[N], const std::string& help, const std::string& default_text) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.emplace_back(entry.name);
  CLI::Option* o = app.add_option_function<std::string>(
      flag, [&target, &table](const std::string& name) { target = *value_named(name, table); }, help);
  o->check(one_of(names))->type_name(choice_names(table))->default_str(default_text);
  return o;
}

/// The long flag of `app` (or of its subcommands) nearest to `given`
/// ("--grad-acum" -> "--grad-accum"), or "" when none is near.
std::string nearest_flag(const CLI::App& app, const std::string& given);

/// Parses the command line with `app`. Returns the exit code to stop with:
/// 0 after --help or --version (printed), 2 after a refused flag or value,
/// printed with the flag nearest to an unknown one and where to look.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv);

/// --version's text: the program, mixtrain's version and commit, and the
/// libraries this build was compiled against (CUDA, cuDNN, NCCL, MPI, ...).
std::string version_text(const std::string& program);

}  // namespace mix::launch
