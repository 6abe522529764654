// The checksum recorded for every pack entry: XXH64 (seed 0), the 64-bit
// xxHash of Yann Collet, from Debian's libxxhash-dev.
//
// note: chosen over SHA-256 because the pack checksums guard against
// corruption, not tampering, and XXH64 runs at memory speed (several GB/s on
// one core), so `convert` stays disk-bound and generate can check every
// tensor at load; it is a fixed, well-known function, so other tools can
// recompute it (`xxhsum -H1`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

struct XXH64_state_s;  // <xxhash.h>

namespace qtk {

// Streaming XXH64: update() any number of times, then digest().
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void reset(uint64_t seed = 0);
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  struct StateDeleter {
    void operator()(XXH64_state_s* s) const;
  };
  std::unique_ptr<XXH64_state_s, StateDeleter> state_;
};

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

// The manifest's spelling of a checksum: 16 lower-case hex digits.
std::string checksum_hex(uint64_t value);
// Parses 16 hex digits; returns false on anything else.
bool parse_checksum_hex(std::string_view text, uint64_t* value);

inline constexpr const char* kChecksumAlgorithm = "xxh64";

}  // namespace qtk
