// Command-line flags for the qtk programs (convert, inspect, generate,
// tokenize, compare): every flag problem becomes ONE qtk::Error that names the
// flag, what was expected and what was found, e.g.
//   --max-num-seqs: expected a positive integer, found "abc"
//   --max-num-seq: unknown flag (did you mean --max-num-seqs?; see --help)
//   --model: expected a value after the flag, found the end of the arguments
// The programs print it as one stderr line and exit 1.
//
// Why not cxxopts' own errors: they do not name the flag ("Argument 'abc'
// failed to parse"). So the programs declare every numeric or enum flag as a
// string (their --help text stays the same: cxxopts prints "arg" and the
// default either way), check the argument list here before cxxopts parses
// it, and read the values with the parse_* functions below.
//
// Header-only: every program already links cxxopts and fmt; nothing else
// needs it.
#pragma once

#include <fmt/format.h>
#include <cxxopts.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qtk::cli {

// A user-given text made safe for a one-line message: double quotes and
// backslashes escaped, control bytes written as every message writes them
// (append_control_escape, core/error.h), cut after 60 bytes.
inline std::string escape_text(std::string_view text) {
  constexpr size_t kShown = 60;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (is_control_byte(c)) {
      append_control_escape(out, c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > kShown) out += "...";
  return out;
}

// A user-given text as it appears in a message: escaped, in double quotes.
inline std::string quote_text(std::string_view text) { return "\"" + escape_text(text) + "\""; }

// An integer flag value: decimal digits (or 0x and hex digits, as cxxopts
// took them) after an optional '-', in [min, max]. `expected` says what the
// flag takes ("a positive integer", "0 (all CPUs) or a positive integer").
inline int64_t parse_int_flag(std::string_view flag, std::string_view text, int64_t min,
                              int64_t max, std::string_view expected) {
  auto bad = [&] { fail("{}: expected {}, found {}", flag, expected, quote_text(text)); };
  auto too_large = [&] {
    // (an `expected` that states its bound already, "from 1 to 64", is not repeated)
    if (expected.find(fmt::format("to {}", max)) != std::string_view::npos ||
        expected.find(fmt::format("..{}", max)) != std::string_view::npos)
      fail("{}: expected {}, found {}", flag, expected, quote_text(text));
    fail("{}: expected {} no larger than {}, found {}", flag, expected, max, quote_text(text));
  };
  std::string_view digits = text;
  const bool negative = !digits.empty() && digits.front() == '-';
  if (negative) digits.remove_prefix(1);
  int base = 10;
  if (digits.size() > 2 && digits[0] == '0' && digits[1] == 'x') {
    base = 16;
    digits.remove_prefix(2);
  }
  if (digits.empty()) bad();
  // note: accumulate the magnitude in unsigned 64 bits; anything past it is
  // out of range whatever the sign.
  uint64_t magnitude = 0;
  bool overflow = false;
  for (const char ch : digits) {
    int d = -1;
    if (ch >= '0' && ch <= '9') d = ch - '0';
    if (base == 16 && ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    if (base == 16 && ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
    if (d < 0) bad();
    const auto ud = static_cast<uint64_t>(d);
    if (magnitude > (std::numeric_limits<uint64_t>::max() - ud) / static_cast<uint64_t>(base))
      overflow = true;
    else
      magnitude = magnitude * static_cast<uint64_t>(base) + ud;
  }
  if (negative) {
    // A negative value is below every minimum the programs use (0 or 1).
    if (overflow || magnitude > uint64_t{1} << 63) bad();
    const int64_t v = magnitude == uint64_t{1} << 63 ? std::numeric_limits<int64_t>::min()
                                                     : -static_cast<int64_t>(magnitude);
    if (v < min) bad();
    if (v > max) too_large();
    return v;
  }
  if (overflow || magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    too_large();
  const auto v = static_cast<int64_t>(magnitude);
  if (v < min) bad();
  if (v > max) too_large();
  return v;
}

// A real-number flag value: the whole text a finite number in [min, max].
inline double parse_real_flag(std::string_view flag, const std::string& text, double min,
                              double max, std::string_view expected) {
  auto bad = [&] { fail("{}: expected {}, found {}", flag, expected, quote_text(text)); };
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) bad();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) bad();
  if (v < min || v > max) bad();
  return v;
}

// A byte or entry count: decimal digits with an optional K/M/G/T suffix
// (powers of 1024, either case), at least `min`.
inline uint64_t parse_size_flag(std::string_view flag, std::string_view text, uint64_t min = 0) {
  auto bad = [&] {
    fail("{}: expected a count such as 100000 or 256G (K/M/G/T suffixes), found {}", flag,
         quote_text(text));
  };
  auto too_large = [&] {
    fail("{}: expected a count below 2^64 (16777216T), found {}", flag, quote_text(text));
  };
  size_t n = 0;
  uint64_t v = 0;
  for (; n < text.size() && text[n] >= '0' && text[n] <= '9'; ++n) {
    const auto d = static_cast<uint64_t>(text[n] - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) too_large();
    v = v * 10 + d;
  }
  if (n == 0) bad();
  const std::string_view suffix = text.substr(n);
  int shift = 0;
  if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (suffix == "T" || suffix == "t")
    shift = 40;
  else if (!suffix.empty())
    bad();
  if (shift && v > (std::numeric_limits<uint64_t>::max() >> shift)) too_large();
  v <<= shift;
  if (v < min) fail("{}: expected at least {}, found {}", flag, min, quote_text(text));
  return v;
}

// One of a fixed set of words: "--device: expected cpu or cuda, found "gpu"".
inline const std::string& parse_choice_flag(std::string_view flag, const std::string& text,
                                            std::initializer_list<std::string_view> choices) {
  for (std::string_view c : choices)
    if (text == c) return text;
  std::string list;
  size_t i = 0;
  for (std::string_view c : choices) {
    if (i > 0) list += i + 1 == choices.size() ? " or " : ", ";
    list += c;
    ++i;
  }
  fail("{}: expected {}, found {}", flag, list, quote_text(text));
}

namespace detail {

struct FlagSpec {
  bool takes_value = false;  // false: a switch
  std::string name;          // its long name (for a short flag too), for messages
};

inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

[[noreturn]] inline void unknown_flag(std::string_view shown, std::string_view name,
                                      const std::map<std::string, FlagSpec>& longs) {
  std::string best;
  size_t best_distance = 3;  // suggest only near misses (at most 2 edits)
  for (const auto& [l, spec] : longs) {
    const size_t d = edit_distance(name, l);
    if (d < best_distance) best_distance = d, best = l;
  }
  if (!best.empty())
    fail("{}: unknown flag (did you mean --{}?; see --help)", escape_text(shown), best);
  fail("{}: unknown flag (see --help)", escape_text(shown));
}

}  // namespace detail

// Checks argv against the options declared in `options`, then parses it.
// Every problem cxxopts would refuse (or would name badly) is a qtk::Error
// naming the flag: an unknown flag, a flag without its value (at the end, or
// followed by another known flag), a value given to a switch (--force=yes).
// Values are not checked here; read them with the parse_* functions.
inline cxxopts::ParseResult parse_flags(cxxopts::Options& options, int argc, char** argv) {
  std::map<std::string, detail::FlagSpec> longs;
  std::map<char, detail::FlagSpec> shorts;
  for (const std::string& group : options.groups()) {
    for (const cxxopts::HelpOptionDetails& o : options.group_help(group).options) {
      detail::FlagSpec spec;
      spec.takes_value = !o.is_boolean && !o.has_implicit;
      spec.name = o.l.empty() ? std::string(1, o.s.empty() ? '?' : o.s[0]) : o.l.front();
      for (const std::string& l : o.l) longs[l] = spec;
      if (o.s.size() == 1) shorts[o.s[0]] = spec;
    }
  }
  // "--name" or "--name=value" -> "name" (empty for anything else)
  auto long_name = [](std::string_view arg) {
    if (arg.size() < 3 || arg.substr(0, 2) != "--") return std::string();
    const size_t eq = arg.find('=');
    return std::string(arg.substr(2, eq == std::string_view::npos ? eq : eq - 2));
  };
  auto check_value_follows = [&](std::string_view shown, int i) {
    if (i + 1 >= argc)
      fail("{}: expected a value after the flag, found the end of the arguments", shown);
    // note: cxxopts would take the next word as the value even when it is
    // another flag; "--model --batch p.jsonl" is a forgotten value, and
    // saying so beats a later "missing --batch". Values that merely start
    // with '-' (a negative number, a file named -x) still pass.
    const std::string next = long_name(argv[i + 1]);
    if (!next.empty() && longs.count(next) > 0)
      fail("{}: expected a value after the flag, found the flag --{}", shown, next);
  };
  // note: cxxopts keeps the last of two values (--out a.jsonl ... --out
  // b.jsonl ran into b.jsonl without a word); the same text twice is fine
  // (values are compared as written, not as what they mean).
  std::map<std::string, std::string> values;
  auto note_value = [&](const detail::FlagSpec& spec, std::string_view shown,
                        std::string_view value) {
    auto [it, fresh] = values.emplace(spec.name, std::string(value));
    if (!fresh && it->second != value)
      fail("{}: given twice, as {} and {}; expected one value", shown, quote_text(it->second),
           quote_text(value));
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;                         // the rest are positional arguments
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument (or "-")
    if (arg[1] == '-') {
      const size_t eq = arg.find('=');
      const std::string name = long_name(arg);
      const std::string shown = "--" + name;
      const auto it = longs.find(name);
      if (it == longs.end()) detail::unknown_flag(shown, name, longs);
      const detail::FlagSpec& spec = it->second;
      if (eq != std::string_view::npos) {
        // note: cxxopts would take --switch=false, yet the programs test
        // switches by count, so it meant ON; a switch takes no value at all.
        if (!spec.takes_value)
          fail("{}: takes no value, found {}", shown, quote_text(arg.substr(eq + 1)));
        note_value(spec, shown, arg.substr(eq + 1));
        continue;
      }
      if (spec.takes_value) {
        check_value_follows(shown, i);
        ++i;  // skip the value
        note_value(spec, shown, argv[i]);
      }
      continue;
    }
    // -abc: short flags, each a known letter; a letter that takes a value
    // takes the rest of the word or, last, the next word.
    for (size_t k = 1; k < arg.size(); ++k) {
      const char c = arg[k];
      const std::string shown = std::string("-") + c;
      const auto it = shorts.find(c);
      // note: a word whose first letter is no short flag is most likely a
      // long flag with one dash (-max-tokens): named whole, with the long
      // flag it is nearest to, rather than as "-m".
      if (it == shorts.end() && k == 1 && arg.size() > 2) {
        const std::string_view word = arg.substr(0, arg.find('='));
        detail::unknown_flag(word, word.substr(1), longs);
      }
      if (it == shorts.end()) detail::unknown_flag(shown, std::string(1, c), longs);
      if (!it->second.takes_value) continue;
      if (k + 1 == arg.size()) {
        check_value_follows(shown, i);
        ++i;
        note_value(it->second, shown, argv[i]);
      } else {
        note_value(it->second, shown, arg.substr(k + 1));
      }
      break;
    }
  }
  try {
    return options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    // note: only argument lists the checks above missed get here.
    fail("{} (see --help)", e.what());
  }
}

// Throws unless flag --`name` was given: "--model: required flag missing
// (the .pack file; see --help)", the part in parentheses being its help text.
inline void require_flag(const cxxopts::Options& options, const cxxopts::ParseResult& args,
                         const std::string& name) {
  if (args.count(name) > 0) return;
  for (const std::string& group : options.groups())
    for (const cxxopts::HelpOptionDetails& o : options.group_help(group).options)
      if (std::find(o.l.begin(), o.l.end(), name) != o.l.end() && !o.desc.empty())
        fail("--{}: required flag missing ({}; see --help)", name, o.desc);
  fail("--{}: required flag missing (see --help)", name);
}

// Throws when words were left over that no flag or positional slot took.
inline void no_extra_arguments(const cxxopts::ParseResult& args) {
  if (!args.unmatched().empty())
    fail("unexpected argument {} (see --help)", quote_text(args.unmatched().front()));
}

}  // namespace qtk::cli
