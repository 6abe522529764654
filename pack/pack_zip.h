// Zip constants shared by the pack writer (pack/pack_writer.cpp) and the
// pack reader (pack/pack.cpp). Values from PKWARE's APPNOTE.TXT 6.3.
#pragma once

#include <cstdint>

namespace qtk {

inline constexpr const char* kPackFormatName = "qtk-pack";

// note: 64 bytes is one cache line and a multiple of every element size and
// of the widest vector load (AVX-512), so every tensor can be read in place
// from the mapping with aligned loads.
inline constexpr uint64_t kPackAlignment = 64;

namespace zipfmt {
inline constexpr uint32_t kLocalSig = 0x04034b50;
inline constexpr uint32_t kCentralSig = 0x02014b50;
inline constexpr uint32_t kEocdSig = 0x06054b50;
inline constexpr uint32_t kZip64EocdSig = 0x06064b50;
inline constexpr uint32_t kZip64LocatorSig = 0x07064b50;
inline constexpr uint64_t kLocalHeaderSize = 30;
inline constexpr uint64_t kCentralHeaderSize = 46;
inline constexpr uint64_t kEocdSize = 22;
inline constexpr uint64_t kZip64EocdSize = 56;
inline constexpr uint64_t kZip64LocatorSize = 20;
inline constexpr uint64_t kMaxComment = 0xFFFF;
inline constexpr uint16_t kZip64ExtraId = 0x0001;
inline constexpr uint16_t kFlagEncrypted = 1u << 0;
inline constexpr uint16_t kFlagDataDescriptor = 1u << 3;
inline constexpr uint16_t kFlagStrongEncryption = 1u << 6;
// The extra field the writer pads local headers with (an unregistered id;
// readers skip extra fields they do not know).
inline constexpr uint16_t kPaddingExtraId = 0x7174;  // "tq" little-endian
}  // namespace zipfmt

}  // namespace qtk
