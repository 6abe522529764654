// The ByteLevel mapping of GPT-2/Qwen tokenizers and the ByteLevel decoder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qtk::byte_level {

// The printable code point that stands for `byte` in vocabulary strings:
// '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF stand for themselves, the other
// 68 bytes map in order to U+0100, U+0101, ...
uint32_t byte_to_char(uint8_t byte);

// Inverse of byte_to_char; nullopt for a code point outside the alphabet.
std::optional<uint8_t> char_to_byte(uint32_t cp);

// Bytes of one token string as the ByteLevel decoder sees them: when every
// character is in the alphabet, the bytes they stand for; otherwise the
// token's own UTF-8 bytes unchanged. `token` must be valid UTF-8.
std::string token_bytes(std::string_view token);
void append_token_bytes(std::string& out, std::string_view token);

// ByteLevel string of raw bytes (the inverse of token_bytes for the alphabet).
std::string to_token_string(std::string_view bytes);

// Appends `bytes` to `out` as UTF-8, replacing every maximal ill-formed
// subsequence with U+FFFD, exactly like Rust's String::from_utf8_lossy (which
// the HF ByteLevel decoder applies to the concatenated bytes).
void append_utf8_lossy(std::string& out, std::string_view bytes);

}  // namespace qtk::byte_level
