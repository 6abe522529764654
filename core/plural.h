// Counts in messages: "1 line", "2 lines".
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

}  // namespace qtk
