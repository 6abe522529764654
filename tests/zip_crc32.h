// CRC-32 as zip stores it, computed bit by bit: the tests' own reference,
// independent of the pack code's (pack/crc32.h), for zips and packs they
// build or edit by hand.
#pragma once

#include <cstdint>
#include <string>

namespace qtk::testing {

inline uint32_t zip_crc32(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace qtk::testing
