// Unit tests of the pieces: split scanner, ByteLevel mapping, lossy UTF-8,
// added-token matching rules, and the public API's edge cases.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/tokenizer/test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/split_scanner.h"
#include "tokenizer/tokenizer_model.h"

namespace qtk {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> pieces;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = split_piece_end(text, begin);
    EXPECT_GT(end, begin);
    pieces.emplace_back(text.substr(begin, end - begin));
    begin = end;
  }
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(SplitScanner, FollowsQwenPattern) {
  // Expected pieces worked out from the regex alternatives by hand.
  EXPECT_EQ(split("  hello"), (Pieces{" ", " hello"}));          // \s+(?!\S) backs off one space
  EXPECT_EQ(split("a  \n\n b"), (Pieces{"a", "  \n\n", " b"}));  // \s*[\r\n]+
  EXPECT_EQ(split("a \n  b"), (Pieces{"a", " \n", " ", " b"}));
  EXPECT_EQ(split("x   "), (Pieces{"x", "   "}));  // whitespace at the end
  EXPECT_EQ(split("it's"), (Pieces{"it", "'s"}));
  EXPECT_EQ(split("IT'LL"), (Pieces{"IT", "'LL"}));  // (?i)
  EXPECT_EQ(split("'re're"), (Pieces{"'re", "'re"}));
  EXPECT_EQ(split(" 's"), (Pieces{" '", "s"}));  // contraction only at the apostrophe
  EXPECT_EQ(split("'x"), (Pieces{"'x"}));
  EXPECT_EQ(split("don't!"), (Pieces{"don", "'t", "!"}));
  EXPECT_EQ(split("?!\n\nx"), (Pieces{"?!\n\n", "x"}));    // punctuation takes trailing newlines
  EXPECT_EQ(split("1234"), (Pieces{"1", "2", "3", "4"}));  // one digit per piece
  EXPECT_EQ(split("\t\tx"), (Pieces{"\t", "\tx"}));
  EXPECT_EQ(split(" \u3000x"), (Pieces{" ", "\u3000x"}));
  EXPECT_EQ(split("a\u0301"), (Pieces{"a", "\u0301"}));  // marks are not letters
  EXPECT_EQ(split(" ..."), (Pieces{" ..."}));
  EXPECT_EQ(split("(x)"), (Pieces{"(x", ")"}));
  EXPECT_EQ(split("x\r\n\r\ny"), (Pieces{"x", "\r\n\r\n", "y"}));
  EXPECT_EQ(split("  \t  "), (Pieces{"  \t  "}));
  EXPECT_EQ(split("\u00e9t\u00e9 \u4e2d\u6587"), (Pieces{"\u00e9t\u00e9", " \u4e2d\u6587"}));
}

TEST(ByteLevel, MappingMatchesGpt2Alphabet) {
  EXPECT_EQ(byte_level::byte_to_char('a'), uint32_t{'a'});
  EXPECT_EQ(byte_level::byte_to_char(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_level::byte_to_char('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_level::byte_to_char(0x00), 0x100u);
  EXPECT_EQ(byte_level::byte_to_char(0x7F), 0x121u);
  EXPECT_EQ(byte_level::byte_to_char(0xA0), 0x142u);
  EXPECT_EQ(byte_level::byte_to_char(0xAD), 0x143u);
  EXPECT_EQ(byte_level::byte_to_char(0xFF), 0xFFu);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(byte_level::char_to_byte(byte_level::byte_to_char(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(byte_level::char_to_byte(0x144), std::nullopt);
  EXPECT_EQ(byte_level::token_bytes("\u0120hello\u010a"), " hello\n");
  EXPECT_EQ(byte_level::token_bytes("<think>"), "<think>");
  EXPECT_EQ(byte_level::token_bytes("a\u4e2d"), "a\u4e2d");  // not all in the alphabet: kept as is
}

std::string lossy(std::string_view bytes) {
  std::string out;
  byte_level::append_utf8_lossy(out, bytes);
  return out;
}

TEST(ByteLevel, LossyUtf8ReplacesMaximalSubparts) {
  // The example of Unicode 15 ch. 3, "U+FFFD Substitution of Maximal Subparts".
  EXPECT_EQ(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(lossy("\xE4\xB8"), "\uFFFD");  // truncated at the end
  EXPECT_EQ(lossy("\xE4\xB8"
                  "A"),
            "\uFFFD"
            "A");
  EXPECT_EQ(lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // surrogate
  EXPECT_EQ(lossy("\xC0\xAF"), "\uFFFD\uFFFD");                      // overlong
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(lossy("\xF0\x9F\x91\x8D"), "\U0001F44D");                // valid stays
  EXPECT_EQ(lossy("\xFF"), "\uFFFD");
}

TEST(Api, DecodeOfPartialBytesGivesReplacementCharacter) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  // "中" is E4 B8 AD; its first byte alone and its first two bytes.
  const std::vector<int32_t> whole = tok.encode("\u4e2d");
  const TokenizerModel m = load_tokenizer_json(
      test::read_text(test::data_path("tests/data/tokenizer/qwen3/tokenizer.json")), "qwen3");
  const std::vector<int32_t> e4_b8 = {m.byte_ids[0xE4], m.byte_ids[0xB8]};
  EXPECT_EQ(tok.decode(e4_b8), "\uFFFD");
  std::vector<int32_t> e4_b8_a = e4_b8;
  e4_b8_a.push_back(tok.encode("A")[0]);
  EXPECT_EQ(tok.decode(e4_b8_a),
            "\uFFFD"
            "A");
  std::vector<int32_t> split_then_whole = {m.byte_ids[0xE4]};
  split_then_whole.insert(split_then_whole.end(), whole.begin(), whole.end());
  EXPECT_EQ(tok.decode(split_then_whole), "\uFFFD\u4e2d");
}

TEST(Api, VocabSizeAndValidIds) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 151669);  // 151643 vocabulary ids + 26 added tokens
  EXPECT_TRUE(tok.is_valid_id(0));
  EXPECT_TRUE(tok.is_valid_id(151668));
  EXPECT_FALSE(tok.is_valid_id(151669));
  EXPECT_FALSE(tok.is_valid_id(-1));
  try {
    tok.decode(std::vector<int32_t>{9707, 151669});
    FAIL() << "decode of an unknown id must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("151669"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-5}), Error);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Api, EncodeRejectsInvalidUtf8) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  try {
    tok.encode("abc\xFF");
    FAIL() << "invalid UTF-8 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok.encode("\xE4\xB8"), Error);
  std::vector<std::string> texts = {"fine", "bad \xC0\xAF"};
  EXPECT_THROW(tok.encode_batch(texts, 2), Error);
}

// The sample tokenizer with extra added tokens appended (ids follow the vocabulary).
Tokenizer sample_with_added(const std::vector<nlohmann::json>& extra) {
  nlohmann::json file = nlohmann::json::parse(test::sample_tokenizer_text());
  for (const auto& t : extra) file["added_tokens"].push_back(t);
  return Tokenizer::from_json_text(file.dump(), "sample+added");
}

nlohmann::json added(int id, const std::string& content, bool special, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

TEST(AddedTokens, LongestMatchWinsAtTheLeftmostPosition) {
  const Tokenizer tok =
      sample_with_added({added(4096, "<x>", true, false), added(4097, "<x>y", false, false),
                         added(4098, "x>y", false, false)});
  EXPECT_EQ(tok.encode("<x>y"), (std::vector<int32_t>{4097}));
  EXPECT_EQ(tok.encode("<x>z")[0], 4096);
  // Leftmost first: "<x>" starts before "x>y" could.
  EXPECT_EQ(tok.encode("<x>y")[0], 4097);
  const std::vector<int32_t> ids = tok.encode("a x>y");
  EXPECT_EQ(ids.back(), 4098);
  EXPECT_EQ(tok.vocab_size(), 4099);
}

TEST(AddedTokens, NormalizedTokensMatchAfterNfc) {
  // normalized: true tokens are matched in the NFC text, so both spellings match.
  const Tokenizer tok = sample_with_added({added(4096, "e\u0301t\u00e9", false, true)});
  EXPECT_EQ(tok.encode("\u00e9t\u00e9"), (std::vector<int32_t>{4096}));
  EXPECT_EQ(tok.encode("e\u0301te\u0301"), (std::vector<int32_t>{4096}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{4096}),
            "e\u0301t\u00e9");  // decodes its content as written
}

}  // namespace
}  // namespace qtk
