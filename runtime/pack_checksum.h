// The checksum recorded for every pack entry: XXH64 (seed 0), the 64-bit
// xxHash of Yann Collet, implemented here from its published specification
// (github.com/Cyan4973/xxHash, doc/xxhash_spec.md).
//
// note: chosen over SHA-256 because the pack checksums guard against
// corruption, not tampering, and XXH64 runs at memory speed (several GB/s on
// one core), so `convert` stays disk-bound; it is a fixed, well-known
// function, so other tools can recompute it (`xxhsum -H1`). Written by hand
// instead of depending on libxxhash-dev to keep the dependency list as is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtk {

// Streaming XXH64: update() any number of times, then digest().
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) { reset(seed); }
  void reset(uint64_t seed = 0);
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  uint64_t acc_[4];
  uint64_t seed_ = 0;
  uint64_t total_ = 0;
  uint8_t buf_[32];
  size_t buf_len_ = 0;
};

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

// The manifest's spelling of a checksum: 16 lower-case hex digits.
std::string checksum_hex(uint64_t value);
// Parses 16 hex digits; returns false on anything else.
bool parse_checksum_hex(std::string_view text, uint64_t* value);

inline constexpr const char* kChecksumAlgorithm = "xxh64";

}  // namespace qtk
