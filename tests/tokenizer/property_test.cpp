// Property tests: round trips on random text, added tokens, and agreement of
// every fast path with its slow reference.
#include <gtest/gtest.h>

#include <random>

#include "tests/tokenizer/test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode_classes.h"

namespace qtk {
namespace {

using test::data_path;

// Random valid UTF-8 mixing many scripts, combining marks (so that NFC has
// work to do), emoji sequences, whitespace runs, contractions and random
// scalar values from every plane.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {
      "a", "Z", "hello", " world", "'s", "'LL", "'re", "'", "don't", "1", "2024", "3.14", ".", ",", "!?", "(", "}",
      " ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2029", "\u200b",
      "é", "e\u0301", "A\u030a", "\u212b", "q\u0323\u0307", "q\u0307\u0323", "\uac00\u11a7", "\u11a7\u0301", "\u1100\u1161", "\u1100\u1161\u11a8",
      "한국어", "\u1112\u1161\u11ab", "中文", "日本語のテキスト", "ﾊﾝｶｸ", "Привет", "Ελληνικά", "עברית", "مرحبا",
      "\u0627\u0644\u0644\u064f\u0651", "हिन्दी", "\u0915\u093c", "ไทย", "Tiếng Việt", "ﬁ", "Ａ", "½", "Ⅻ", "١٢٣",
      "😀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "1️⃣", "🇺🇸", "\ufeff", "\ue000", "\x01", "\x7f", "\U000f0000",
      "<", ">", "<|", "|>", "<think", "ſ", "'ſ", "\U0001d400", "\u0301", "\u0345", "\u0f73", "\u0344"};
  std::uniform_int_distribution<int> count(0, 24);
  std::uniform_int_distribution<size_t> piece(0, kPieces.size() - 1);
  std::uniform_int_distribution<int> coin(0, 9);
  std::uniform_int_distribution<uint32_t> plane0(0x20, 0xFFFF);
  std::uniform_int_distribution<uint32_t> any(0, 0x10FFFF);
  std::string s;
  const int n = count(rng);
  for (int i = 0; i < n; ++i) {
    const int c = coin(rng);
    if (c < 7) {
      s += kPieces[piece(rng)];
    } else {
      uint32_t cp = c < 9 ? plane0(rng) : any(rng);
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // surrogates are not scalar values
      unicode::append_utf8(s, cp);
    }
  }
  return s;
}

TEST(Property, DecodeOfEncodeIsNfcOnRandomText) {
  std::mt19937 rng(12345);
  const Tokenizer& qwen3 = test::qwen3_tokenizer();
  const Tokenizer sample = Tokenizer::from_json_text(test::sample_tokenizer_text(), "sample");
  int failures = 0;
  for (int i = 0; i < 4000 && failures < 10; ++i) {
    const std::string s = random_text(rng);
    const std::string expected = unicode::nfc_reference(s);
    for (const Tokenizer* tok : {&qwen3, &sample}) {
      const std::string back = tok->decode(tok->encode(s));
      if (back != expected) {
        ++failures;
        ADD_FAILURE() << "text " << nlohmann::json(s).dump() << " came back as " << nlohmann::json(back).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(Property, BatchEncodeEqualsSequentialEncode) {
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 500; ++i) texts.push_back(random_text(rng));
  const Tokenizer& tok = test::qwen3_tokenizer();
  const auto batch = tok.encode_batch(texts, 4);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], tok.encode(texts[i])) << i;
  EXPECT_TRUE(tok.encode_batch(std::span<const std::string>(), 4).empty());
  EXPECT_EQ(tok.encode_batch(texts, 0).size(), texts.size());  // 0 = all cores
}

TEST(Property, EveryAddedTokenRoundTripsAloneAndInText) {
  const nlohmann::json file =
      nlohmann::json::parse(test::read_text(data_path("tests/data/tokenizer/qwen3/tokenizer.json")));
  const Tokenizer& tok = test::qwen3_tokenizer();
  ASSERT_EQ(file["added_tokens"].size(), 26u);
  for (const auto& added : file["added_tokens"]) {
    const std::string content = added["content"];
    const int32_t id = added["id"];
    SCOPED_TRACE(content);
    EXPECT_EQ(tok.encode(content), std::vector<int32_t>{id});
    EXPECT_EQ(tok.decode(std::vector<int32_t>{id}), content);
    for (const std::string& prefix : {std::string("Hello "), std::string("x"), std::string("\n\n"), std::string("中")}) {
      for (const std::string& suffix : {std::string(" world"), std::string("y"), std::string(""), std::string("\u0301a")}) {
        const std::string text = prefix + content + suffix;
        std::vector<int32_t> expected = tok.encode(prefix);
        expected.push_back(id);
        const std::vector<int32_t> tail = tok.encode(suffix);
        expected.insert(expected.end(), tail.begin(), tail.end());
        EXPECT_EQ(tok.encode(text), expected) << nlohmann::json(text).dump();
        EXPECT_EQ(tok.decode(tok.encode(text)), unicode::nfc_reference(prefix) + content + unicode::nfc_reference(suffix));
      }
    }
    // Two in a row, and a near miss that must not match.
    EXPECT_EQ(tok.encode(content + content), (std::vector<int32_t>{id, id}));
    const std::string near_miss = content.substr(0, content.size() - 1);
    const std::vector<int32_t> near_ids = tok.encode(near_miss);
    EXPECT_EQ(std::count(near_ids.begin(), near_ids.end(), id), 0);
  }
}

TEST(Property, NfcFastPathAgreesWithUtf8proc) {
  std::mt19937 rng(99);
  std::string buffer;
  for (int i = 0; i < 20000; ++i) {
    const std::string s = random_text(rng);
    EXPECT_EQ(std::string(unicode::nfc(s, buffer)), unicode::nfc_reference(s)) << nlohmann::json(s).dump();
  }
}

TEST(Property, InertCodePointsAreTheirOwnNfc) {
  // Every code point the fast path skips must be unchanged by NFC alone and
  // after a starter it could otherwise compose with.
  size_t inert = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (!unicode::is_nfc_inert(cp)) continue;
    ++inert;
    std::string s;
    unicode::append_utf8(s, cp);
    ASSERT_EQ(unicode::nfc_reference(s), s) << "U+" << std::hex << cp;
    for (const char* starter : {"e", "\u1100", "\uac00", "\u0b47"}) {
      const std::string pair = std::string(starter) + s;
      ASSERT_EQ(unicode::nfc_reference(pair), pair) << "U+" << std::hex << cp << " after " << starter;
    }
  }
  EXPECT_GT(inert, 1000000u);  // nearly all code points are inert
  EXPECT_FALSE(unicode::is_nfc_inert(0x0301));  // combining acute
  EXPECT_FALSE(unicode::is_nfc_inert(0x1161));  // Hangul vowel jamo
  EXPECT_FALSE(unicode::is_nfc_inert(0x212B));  // ANGSTROM SIGN -> U+00C5
  // utf8proc's own NFC drops U+11A7 after an LV syllable; ours keeps it.
  EXPECT_EQ(unicode::nfc_reference("\uac00\u11a7\u1100\u1161"), "\uac00\u11a7\uac00");
}

TEST(Property, LinearAndHeapBpeAgree) {
  const TokenizerModel m = load_tokenizer_json(
      test::read_text(data_path("tests/data/tokenizer/qwen3/tokenizer.json")), "qwen3");
  std::mt19937 rng(5);
  const std::string alphabet = "aaabcdeeefghiiklmnoorsttu    ACGT--__..0123";
  std::uniform_int_distribution<size_t> len(2, 300);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 2000; ++i) {
    std::string w;
    const size_t n = len(rng);
    const bool raw = i % 4 == 0;
    for (size_t k = 0; k < n; ++k) w.push_back(raw ? static_cast<char>(byte(rng)) : alphabet[pick(rng)]);
    std::vector<int32_t> linear, heap;
    const auto* p = reinterpret_cast<const unsigned char*>(w.data());
    bpe::merge_word_linear(m.merges, m.byte_ids, p, n, linear);
    bpe::merge_word_heap(m.merges, m.byte_ids, p, n, heap);
    ASSERT_EQ(linear, heap) << "word " << i << " of " << n << " bytes";
  }
}

}  // namespace
}  // namespace qtk
