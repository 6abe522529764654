// The loaded tables behind qtk::Tokenizer (internal to tokenizer/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"

namespace qtk {

struct TokenizerModel {
  bool nfc = false;            // normalizer: NFC, or none
  bool ignore_merges = false;  // BPE: a pre-token found in the vocabulary is one token
  bpe::MergeTable merges;
  int32_t byte_ids[256] = {};  // id of the single-byte token for each byte
  // Raw bytes -> id of every vocabulary token; filled only when ignore_merges.
  std::unordered_map<std::string, int32_t> bytes_to_id;
  AddedTokenMatcher raw_added;         // added tokens with normalized: false
  AddedTokenMatcher normalized_added;  // added tokens with normalized: true (NFC form)

  // Decoding: the bytes of id i are decode_bytes[decode_offsets[i], decode_offsets[i+1]).
  std::string decode_bytes;
  std::vector<uint32_t> decode_offsets;  // vocab_size + 1 entries
  std::vector<uint8_t> id_known;         // vocab_size entries: 1 when the id exists
  int64_t vocab_size = 0;

  uint64_t instance = 0;  // unique per loaded model; keys the per-thread word cache
};

// Parses and validates tokenizer.json text (see tokenizer.h for what is accepted).
TokenizerModel load_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace qtk
