// CRC-32 as zip uses it (ISO-HDLC: reflected polynomial 0xEDB88320, initial
// and final value inverted), the same function as zlib's crc32(): a running
// value is passed back in, crc32_update(crc32_update(0, a), b) is the CRC of
// a followed by b.
//
// Every STORED zip entry carries the CRC-32 of its data, and libzip computes
// it with zlib's crc32() as the data passes through. zlib 1.2.13 (Debian 12)
// has no carry-less-multiply path.
// note: bench/convert/crc32_bench on the 2-vCPU Zen 4 dev box, 8 KiB calls
// (libzip's buffer size) on cache-resident data: zlib 1.2.13 crc32 6.1 GB/s
// (13 % of convert's CPU samples on a Qwen3-30B-A3B-shaped checkpoint),
// table (slicing-by-8) 2.5 GB/s, pclmulqdq (4 x 128-bit folds) 15.8 GB/s,
// vpclmulqdq (4 x 512-bit folds) 56 GB/s. pack_writer.cpp makes libzip use
// this function.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qtk {

// The CRC-32 of `data` continued from `crc` (0 for a new message).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

// The implementations crc32_update picks from (the first available of
// vpclmulqdq, pclmulqdq, table), for tests and benchmarks; crc32_update_with
// needs one that crc32_available() reports on this machine.
enum class Crc32Impl { kTable, kPclmul, kVpclmul };
bool crc32_available(Crc32Impl impl);
uint32_t crc32_update_with(Crc32Impl impl, uint32_t crc, const void* data, size_t size);
// The one crc32_update uses on this machine.
Crc32Impl crc32_selected();
const char* crc32_name(Crc32Impl impl);

}  // namespace qtk
