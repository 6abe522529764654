#include "core/json.h"

#include <gtest/gtest.h>

#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

using testing::error_of;

TEST(StrictJson, SameDomAsNlohmannWithoutDuplicates) {
  const std::string text =
      R"({"a":[1,-2,3.5,{"b":null,"c":[true,false]}],"d":"\u00e9x","e":{},"f":[],"g":18446744073709551615})";
  EXPECT_EQ(parse_json_strict(text, "t.json"), nlohmann::json::parse(text));
}

TEST(StrictJson, RejectsDuplicateKeysAtAnyDepthWithPath) {
  EXPECT_NE(error_of([] {
              parse_json_strict(R"({"a":1,"a":2})", "t.json");
            }).find("t.json: duplicate JSON key 'a' in object /"),
            std::string::npos);
  const std::string nested =
      error_of([] { parse_json_strict(R"({"x":[{"ok":1},{"y":{"k":1,"k":1}}]})", "t.json"); });
  EXPECT_NE(nested.find("duplicate JSON key 'k' in object /x/1/y"), std::string::npos) << nested;
  // The same key in sibling objects is fine.
  EXPECT_NO_THROW(parse_json_strict(R"({"a":{"k":1},"b":{"k":2}})", "t.json"));
}

TEST(StrictJson, RejectsSyntaxErrorsAndTrailingGarbage) {
  EXPECT_NE(
      error_of([] { parse_json_strict("{\"a\":1} x", "t.json"); }).find("t.json: invalid JSON"),
      std::string::npos);
  EXPECT_NE(error_of([] { parse_json_strict("", "t.json"); }).find("invalid JSON"),
            std::string::npos);
}

TEST(StrictJson, Utf8Validator) {
  using sv = std::string_view;
  EXPECT_EQ(find_invalid_utf8("plain ascii"), sv::npos);
  EXPECT_EQ(find_invalid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), sv::npos);  // é € 😀
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);                // stray continuation byte
  EXPECT_EQ(find_invalid_utf8("a\xc3"), 1u);                 // truncated sequence
  EXPECT_EQ(find_invalid_utf8("a\xc1\xbf"), 1u);             // overlong 2-byte form
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\xaf"), 0u);          // overlong 3-byte form
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);          // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xf8\x88\x80\x80\x80"), 0u);  // 5-byte lead
  EXPECT_EQ(find_invalid_utf8("\xe2\x28\xa1"), 0u);          // bad continuation
}

TEST(StrictJson, LoadJsonFileNamesMissingFile) {
  const std::string msg = error_of([] { load_json_file("/nonexistent/config.json"); });
  EXPECT_NE(msg.find("/nonexistent/config.json: cannot open"), std::string::npos) << msg;
}

TEST(StrictJson, NumbersAsNlohmannMakesThem) {
  // note: the kinds matter: safetensors offsets are checked with is_number_unsigned().
  for (const char* text : {"0", "7", "-0", "-7", "18446744073709551615", "18446744073709551616",
                           "-9223372036854775808", "-9223372036854775809", "1.5", "-2.5e-3", "1E+2",
                           "1e-400", "4.9e-324", "[1,-1,1.0]"}) {
    const nlohmann::json got = parse_json_strict(text, "t.json");
    const nlohmann::json want = nlohmann::json::parse(text);
    EXPECT_EQ(got, want) << text;
    EXPECT_EQ(got.type(), want.type()) << text;
  }
  for (const char* text : {"01", "-01", "1.", ".5", "-", "+1", "1e", "1e+", "--1", "1e400", "0x10"})
    EXPECT_NE(error_of([&] { parse_json_strict(text, "t.json"); }).find("t.json: "),
              std::string::npos)
        << text;
}

// Request lines refuse integer literals past 64 bits (kRefuse); numbers
// within them, and fractions and exponents, read as before.
TEST(StrictJson, WideIntegersRefusedWhereAsked) {
  for (const char* text :
       {"18446744073709551615", "-9223372036854775808", "1e30", "1.5", "[0, -1]"}) {
    EXPECT_EQ(parse_json_strict(text, "t", WideIntegers::kRefuse), nlohmann::json::parse(text))
        << text;
  }
  for (const char* text :
       {"18446744073709551616", "-9223372036854775809", "[1, 100000000000000000000000]"}) {
    const std::string msg =
        error_of([&] { parse_json_strict(text, "line 4", WideIntegers::kRefuse); });
    EXPECT_NE(msg.find("line 4: invalid JSON at byte"), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not fit 64 bits"), std::string::npos) << msg;
  }
}

// A word that is no JSON literal is named as written, not as a 'null' the
// reader was supposedly waiting for.
TEST(StrictJson, AMisspelledLiteralIsNamedAsWritten) {
  EXPECT_NE(error_of([] { parse_json_strict("not json", "line 1"); })
                .find("line 1: invalid JSON at byte 0 (column 1): expected a JSON value, found "
                      "'not' (the only value starting with 'n' is null)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_json_strict("[1, tru]", "t"); })
                .find("expected a JSON value, found 'tru' (the only value starting with 't' is "
                      "true)"),
            std::string::npos);
}

TEST(StrictJson, SyntaxErrorsNameLineAndColumn) {
  const std::string msg = error_of([] { parse_json_strict("{\n  \"a\": x}", "t.json"); });
  EXPECT_NE(msg.find("t.json: invalid JSON at byte 9 (line 2, column 8)"), std::string::npos)
      << msg;
}

TEST(StrictJson, DepthLimit) {
  const auto nested = [](size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(parse_json_strict(nested(kMaxJsonDepth), "t.json"));
  const std::string msg = error_of([&] { parse_json_strict(nested(kMaxJsonDepth + 1), "t.json"); });
  EXPECT_NE(msg.find("t.json: expected JSON nested at most 128 levels deep"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace qtk
