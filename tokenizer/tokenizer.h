// Hugging Face byte-level BPE tokenizer of the Qwen family (tokenizer.json).
//
// Supports exactly what Qwen3 / Qwen3.5 files use: the NFC normalizer, the
// Sequence[Split(Qwen pattern, Isolated), ByteLevel] pre-tokenizer, BPE (merges
// as ["a","b"] or "a b"), added tokens matched in the raw text, the ByteLevel
// decoder and an optional ByteLevel post-processor. Anything else is refused
// with a qtk::Error naming the component.
//
// Encoding equals HF tokenizers' `encode(text, add_special_tokens=False)`;
// decoding equals `decode(ids, skip_special_tokens=False)`.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qtk {

struct TokenizerModel;

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names it in error messages.
  // Throws qtk::Error on malformed or unsupported files.
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source);
  static Tokenizer from_file(const std::string& path);

  // Token ids of `text` (valid UTF-8, else qtk::Error), with no special
  // tokens inserted. Thread-safe: each thread keeps its own word cache.
  std::vector<int32_t> encode(std::string_view text) const;

  // Text of `ids`, special tokens kept. Invalid UTF-8 in the concatenated
  // token bytes becomes U+FFFD as in HF. Throws qtk::Error for an unknown id.
  std::string decode(std::span<const int32_t> ids) const;

  // encode() of every text on up to `threads` threads (<= 0: all cores).
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts,
                                                 int threads) const;

  // Max id + 1 over the vocabulary and the added tokens.
  int64_t vocab_size() const;
  bool is_valid_id(int32_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerModel> model);
  std::shared_ptr<const TokenizerModel> model_;
};

}  // namespace qtk
