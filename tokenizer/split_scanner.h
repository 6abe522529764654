// Qwen's pre-tokenizer split pattern as a hand-written scanner.
//
// The pattern (Split pre-tokenizer, behaviour Isolated) is
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Every character is matched by some alternative, so the pieces tile the text
// and each match starts where the previous one ended.
#pragma once

#include <cstddef>
#include <string_view>

namespace qtk {

// The exact pattern string that tokenizer.json must carry.
inline constexpr std::string_view kQwenSplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// End (exclusive byte offset) of the piece that starts at `begin` < text.size().
// `text` must be valid UTF-8.
size_t split_piece_end(std::string_view text, size_t begin);

}  // namespace qtk
