#pragma once
// CLI11 validators shared by mixtrain and mixbench, and the number parsing
// they rest on (the trainer reads checkpoint metadata with it too). CLI11's own PositiveNumber
// prints the whole double range in its message, and its Range lets NaN
// through (NaN compares false both ways) and, for doubles, inf where the
// bound is open: these say the rule plainly and refuse non-finite values.
// Floating flags also stay within FP32's range, since the values they set
// (learning rate, loss scale, decay) end up in FP32 on the device, where
// 1e39 would be inf.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <exception>
#include <sstream>
#include <string>

namespace mix::launch {

/// Parses all of `text` as a number (an integer when `integer`); false when it
/// does not parse or something is left over ("1x", "").
inline bool parse_number(const std::string& text, bool integer, double& out) {
  try {
    size_t used = 0;
    out = integer ? static_cast<double>(std::stoll(text, &used)) : std::stod(text, &used);
    return used == text.size() && !text.empty();
  } catch (const std::exception&) {
    return false;
  }
}

/// CLI11 reads an integer with a leading zero as octal ("010" is 8), where
/// the user almost certainly meant decimal: such text is refused.
inline bool octal_looking(const std::string& text) {
  const size_t i = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  return text.size() > i + 1 && text[i] == '0' && std::isdigit(static_cast<unsigned char>(text[i + 1]));
}

inline std::string leading_zero_message(const std::string& text) {
  return "must be written without leading zeros (it would be read as octal), got '" + text + "'";
}

/// Positive (or, with `allow_zero`, non-negative) numbers; integers when `integer`.
inline CLI::Validator number_check(bool integer, bool allow_zero) {
  const std::string what =
      std::string(allow_zero ? "a non-negative " : "a positive ") + (integer ? "integer" : "number");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (integer && octal_looking(text)) return leading_zero_message(text);
        if (!parse_number(text, integer, v) || !(allow_zero ? v >= 0 : v > 0))
          return "must be " + what + ", got '" + text + "'";
        if (!std::isfinite(static_cast<float>(v)))  // FP32's largest, 3.40282347e38, still passes
          return "must be " + what + " no larger than 3.4e38 (FP32's largest), got '" + text + "'";
        // Below half FP32's smallest subnormal a positive value becomes 0 on
        // the device (an --lr of 1e-50 trained nothing, without a word).
        if (!allow_zero && static_cast<float>(v) == 0)
          return "must be " + what + " no smaller than 1.4e-45 (FP32's smallest; in FP32 it would be 0), got '" +
                 text + "'";
        return "";
      },
      allow_zero ? "NONNEGATIVE" : "POSITIVE");
}

/// A finite number in [lo, hi] (NaN refused, which CLI::Range lets through).
inline CLI::Validator number_in(double lo, double hi) {
  std::ostringstream range;
  range << "[" << lo << ", " << hi << "]";
  return CLI::Validator(
      [=, r = range.str()](std::string& text) -> std::string {
        double v = 0;
        if (parse_number(text, false, v) && std::isfinite(v) && v >= lo && v <= hi) return "";
        return "must be a number in " + r + ", got '" + text + "'";
      },
      "FLOAT in " + range.str());
}

/// Digits only, up to 2^64 - 1, for unsigned 64-bit flags: CLI11 reads "-1"
/// into one as 2^64 - 1, and a larger number as 2^64 - 1 too, without a word
/// (two different seeds would give the same run).
inline CLI::Validator unsigned_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::string max = "18446744073709551615";
        if (octal_looking(text)) return leading_zero_message(text);
        const bool in_range = text.size() < max.size() || (text.size() == max.size() && text <= max);
        if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && in_range) return "";
        return "must be a whole number from 0 to " + max + " (2^64 - 1), got '" + text + "'";
      },
      "UINT");
}

inline const CLI::Validator kPositiveInt = number_check(true, false);
inline const CLI::Validator kNonNegativeInt = number_check(true, true);
inline const CLI::Validator kPositive = number_check(false, false);
inline const CLI::Validator kNonNegative = number_check(false, true);

}  // namespace mix::launch
