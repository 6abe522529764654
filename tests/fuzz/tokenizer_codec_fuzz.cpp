// Fuzz entry: encode/decode with the real Qwen3 tokenizer (loaded once).
//
// Byte 0 chooses the mode; the rest is the payload:
//   even: encode the payload as text. Invalid UTF-8 must be refused with
//         qtk::Error; valid text must satisfy encode(decode(encode(t))) ==
//         encode(t) (decode gives the NFC form, and NFC is idempotent).
//   odd:  decode the payload as little-endian int32 ids. Unknown ids must be
//         refused with qtk::Error; known ones give valid UTF-8 (bad byte runs
//         become U+FFFD) that encodes without error.
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace qtk::fuzz {

namespace {

const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file(std::string(QTK_SOURCE_DIR) +
                                                    "/tests/data/tokenizer/qwen3/tokenizer.json");
  return tok;
}

}  // namespace

int tokenizer_codec(const uint8_t* data, size_t size) {
  const Tokenizer& tok = qwen3_tokenizer();
  if (size == 0) return 0;
  const bool decode_mode = data[0] & 1;
  const uint8_t* payload = data + 1;
  const size_t n = size - 1;
  if (!decode_mode) {
    const std::string_view text = as_text(payload, n);
    const bool valid = find_invalid_utf8(text) == std::string_view::npos;
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text);
    } catch (const Error&) {
      fuzz_check(!valid, "encode refused valid UTF-8");
      return 0;
    }
    fuzz_check(valid, "encode accepted invalid UTF-8");
    for (int32_t id : ids) fuzz_check(tok.is_valid_id(id), "encode produced an invalid id");
    const std::string decoded = tok.decode(ids);
    fuzz_check(find_invalid_utf8(decoded) == std::string_view::npos, "decode gave invalid UTF-8");
    fuzz_check(tok.encode(decoded) == ids, "encode(decode(encode(t))) != encode(t)");
    return 0;
  }
  std::vector<int32_t> ids(n / 4);
  if (!ids.empty()) std::memcpy(ids.data(), payload, ids.size() * 4);
  bool all_valid = true;
  for (int32_t id : ids) all_valid = all_valid && tok.is_valid_id(id);
  std::string text;
  try {
    text = tok.decode(ids);
  } catch (const Error&) {
    fuzz_check(!all_valid, "decode refused valid ids");
    return 0;
  }
  fuzz_check(all_valid, "decode accepted an unknown id");
  fuzz_check(find_invalid_utf8(text) == std::string_view::npos, "decode gave invalid UTF-8");
  (void)tok.encode(text);
  return 0;
}

}  // namespace qtk::fuzz
