// Fuzz entry: tokenizer.json loading. An accepted tokenizer must then encode
// and decode without anything but qtk::Error.
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/fuzz/fuzz_entries.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace qtk::fuzz {

int tokenizer_json(const uint8_t* data, size_t size) {
  std::optional<Tokenizer> tok;
  try {
    tok.emplace(Tokenizer::from_json_text(as_text(data, size), "tokenizer.json"));
  } catch (const Error&) {
    return 0;
  }
  const int64_t vocab = tok->vocab_size();
  fuzz_check(vocab >= 0, "negative vocab_size");
  static const char* const kTexts[] = {"Hello, world! It's 2024.", "  def f(x):\n\treturn x  \n\n",
                                       "\xc3\xa9t\xc3\xa9 e\xcc\x81", "<|endoftext|>a<|im_start|>",
                                       "\xf0\x9f\x98\x80\xe4\xb8\xad\xe6\x96\x87 123456"};
  for (const char* text : kTexts) {
    std::vector<int32_t> ids;
    try {
      ids = tok->encode(text);
    } catch (const Error&) {
      continue;  // e.g. a byte with no token: reported by name
    }
    for (int32_t id : ids) fuzz_check(tok->is_valid_id(id), "encode produced an invalid id");
    try {
      (void)tok->decode(ids);
    } catch (const Error&) {
    }
  }
  // Decode each of the first ids alone (valid or not).
  for (int32_t id = -1; id < 300 && id <= vocab; ++id) {
    try {
      const std::string s = tok->decode(std::vector<int32_t>{id});
      fuzz_check(tok->is_valid_id(id), "decode accepted an invalid id");
    } catch (const Error&) {
    }
  }
  return 0;
}

}  // namespace qtk::fuzz
