#pragma once
// Names of enum values, written once per enum as a table: what flags accept,
// what messages, metrics and checkpoints print, and what is parsed back.
//
//   enum class Precision { fp32, amp };
//   inline constexpr NamedValue<Precision> kPrecisionNames[] = {{Precision::fp32, "fp32"}, {Precision::amp, "amp"}};
//   name_of(Precision::amp, kPrecisionNames) == "amp"
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mix {

template <typename E>
struct NamedValue {
  E value;
  std::string_view name;
};

/// The name of `value` in `table`; "?" when the table lacks it.
template <typename E, size_t N>
constexpr std::string_view name_of(E value, const NamedValue<E> (&table)[N]) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

/// The value named `name` in `table`, if any.
template <typename E, size_t N>
constexpr std::optional<E> value_named(std::string_view name, const NamedValue<E> (&table)[N]) {
  for (const auto& entry : table)
    if (entry.name == name) return entry.value;
  return std::nullopt;
}

/// "a, b or c": the names of `table`, for messages.
template <typename E, size_t N>
std::string names_of(const NamedValue<E> (&table)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i)
    s += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(table[i].name);
  return s;
}

}  // namespace mix
