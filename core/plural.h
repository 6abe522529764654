// Counts and sizes in messages: "1 line", "2 lines", "1.5 GiB".
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace qtk {

// `n` and `noun`, with an "s" unless n is 1 (nouns of this code base only:
// line, case, error, shard...).
inline std::string count_of(int64_t n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// A byte count in the largest binary unit that keeps it at 1 or more, to
// one decimal: "512 B", "293.0 KiB", "1.5 GiB".
inline std::string size_of(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace qtk
