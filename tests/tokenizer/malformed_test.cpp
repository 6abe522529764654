// Malformed or unsupported tokenizer.json files are refused with a message
// that names the file, the field, what was expected and what was found.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "tests/tokenizer/test_util.h"

namespace qtk {
namespace {

using nlohmann::json;

struct Case {
  const char* name;
  std::function<void(json&)> mutate;
  std::vector<std::string> message_parts;
};

std::string load_error(const std::string& text) {
  try {
    Tokenizer::from_json_text(text, "bad/tokenizer.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const std::string& text, const std::vector<std::string>& parts) {
  const std::string message = load_error(text);
  ASSERT_FALSE(message.empty()) << "accepted but should be refused";
  EXPECT_EQ(message.rfind("bad/tokenizer.json: ", 0), 0u) << message;
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
  }
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
}

TEST(Malformed, TheUnmodifiedSampleLoads) {
  EXPECT_EQ(load_error(test::sample_tokenizer_text()), "");
}

TEST(Malformed, UnsupportedComponentsAreNamed) {
  const std::vector<Case> cases = {
      {"metaspace",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
       },
       {"pre_tokenizer type 'Metaspace' is not supported", "expected Sequence[Split, ByteLevel]"}},
      {"no_pre_tokenizer",
       [](json& j) { j["pre_tokenizer"] = nullptr; },
       {"pre_tokenizer is missing"}},
      {"nfkc",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       {"normalizer type 'NFKC' is not supported", "expected NFC or null"}},
      {"wordpiece",
       [](json& j) { j["model"]["type"] = "WordPiece"; },
       {"model type 'WordPiece' is not supported", "expected BPE"}},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       {"decoder type 'Metaspace' is not supported", "expected ByteLevel"}},
      {"no_decoder", [](json& j) { j.erase("decoder"); }, {"decoder is missing"}},
      {"template",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       {"post_processor type 'TemplateProcessing' is not supported"}},
      {"split_first",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Digits"; },
       {"pretokenizers[0] type 'Digits'", "expected Split"}},
      {"other_regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
       {"pattern.Regex is not supported", "found \\s+"}},
      {"string_pattern",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
       },
       {"pattern must be {\"Regex\": ...}"}},
      {"behavior",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       {"behavior \"Removed\" is not supported", "expected \"Isolated\""}},
      {"invert",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       {"pretokenizers[0].invert = true is not supported"}},
      {"prefix_space",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       {"pretokenizers[1].add_prefix_space = true is not supported"}},
      {"use_regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1].erase("use_regex"); },
       {"use_regex = true is not supported"}},
      {"three_pretokenizers",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}});
       },
       {"pretokenizers must be an array of 2", "found 3 items"}},
      {"dropout",
       [](json& j) { j["model"]["dropout"] = 0.1; },
       {"model.dropout = 0.1 is not supported"}},
      {"suffix",
       [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       {"model.end_of_word_suffix = \"</w>\" is not supported"}},
      {"truncation",
       [](json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       {"truncation is not supported"}},
      {"merge_unknown",
       [](json& j) {
         j["model"]["merges"][5] = {"zzz_not_a_token", "a"};
       },
       {"model.merges[5] uses \"zzz_not_a_token\", which is not in model.vocab"}},
      {"merge_result_unknown",
       [](json& j) {
         j["model"]["merges"][0] = {"!", "!"};
       },
       {"model.merges[0] makes \"!!\", which is not in model.vocab"}},
      {"merge_three_parts",
       [](json& j) { j["model"]["merges"][2] = "a b c"; },
       {"model.merges[2] \"a b c\" must be two tokens separated by one space"}},
      {"merge_one_part",
       [](json& j) { j["model"]["merges"][3] = json::array({"a"}); },
       {"model.merges[3] must hold 2 strings, found 1"}},
      {"missing_byte",
       [](json& j) { j["model"]["vocab"].erase("\u010a"); },
       {"model.vocab has no token \"\u010a\" for byte 0x0A"}},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, {"model.vocab is missing"}},
      {"no_model", [](json& j) { j.erase("model"); }, {"model is missing"}},
      {"duplicate_id", [](json& j) { j["model"]["vocab"]["!"] = 5; }, {"gives id 5 to both"}},
      {"negative_id", [](json& j) { j["model"]["vocab"]["!"] = -3; }, {"has id -3"}},
      {"lstrip",
       [](json& j) { j["added_tokens"][1]["lstrip"] = true; },
       {"added_tokens[1].lstrip = true is not supported"}},
      {"added_wrong_id",
       [](json& j) { j["added_tokens"][0]["id"] = 4000; },
       {"added_tokens[0] \"<|endoftext|>\" has id 4000", "would give it id 0"}},
      // An id far past the entries is refused before the id tables are sized
      // by it (2^31 - 1 took ~16 GB first).
      {"added_id_huge",
       [](json& j) { j["added_tokens"][0]["id"] = 2147483647; },
       {"added_tokens holds id 2147483647, far past its", "expected ids below"}},
      {"added_empty",
       [](json& j) { j["added_tokens"][2]["content"] = ""; },
       {"added_tokens[2].content must be a non-empty string"}},
  };
  const json original = json::parse(test::sample_tokenizer_text());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json j = original;
    c.mutate(j);
    expect_refused(j.dump(), c.message_parts);
  }
}

TEST(Malformed, BrokenJsonIsRefusedWithItsPosition) {
  const std::string& text = test::sample_tokenizer_text();
  expect_refused(text.substr(0, text.size() / 2), {"invalid JSON at byte"});
  expect_refused("", {"invalid JSON at byte 0", "expected an object for the top level",
                      "found the end of the file"});
  expect_refused("[1, 2]", {"expected an object for the top level", "found '['"});
  expect_refused(text + "x", {"expected the end of the file"});
  std::string bad_utf8 = text;
  bad_utf8[bad_utf8.find("<|endoftext|>") + 2] = '\xFF';
  expect_refused(bad_utf8, {"is not valid UTF-8", "0xFF"});
  expect_refused("{\"model\": {\"vocab\": {\"a\": 1.5}}}",
                 {"expected an integer for the id of a model.vocab token"});
  expect_refused("{\"model\": {\"vocab\": {\"a\\q\": 1}}}", {"expected a valid escape"});
}

TEST(Malformed, MissingFileIsNamed) {
  try {
    Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
    FAIL() << "must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json: cannot open"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qtk
