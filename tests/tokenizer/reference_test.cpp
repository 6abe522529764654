// Exactness against Hugging Face tokenizers: the Qwen3 reference encodings
// and the prompts/outputs of both sample models' golden files.
#include <gtest/gtest.h>

#include "tests/tokenizer/test_util.h"

namespace qtk {
namespace {

using test::data_path;

TEST(Reference, Qwen3EncodingsAllMatch) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const auto rows = test::read_jsonl(data_path("tests/data/tokenizer/qwen3/reference_encodings.jsonl"));
  ASSERT_EQ(rows.size(), 161u) << "the fixture has 161 lines";
  size_t encode_ok = 0, decode_ok = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string text = rows[i]["text"];
    const std::vector<int32_t> expected = rows[i]["ids"];
    const std::string decoded = rows[i]["decoded"];
    SCOPED_TRACE("line " + std::to_string(i + 1) + " (" + rows[i]["category"].get<std::string>() + "): " +
                 nlohmann::json(text).dump());
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, expected);
    encode_ok += ids == expected;
    const std::string back = tok.decode(expected);
    EXPECT_EQ(back, decoded);
    decode_ok += back == decoded;
  }
  EXPECT_EQ(encode_ok, rows.size());
  EXPECT_EQ(decode_ok, rows.size());
}

TEST(Reference, Qwen3BatchEncodeMatchesReference) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const auto rows = test::read_jsonl(data_path("tests/data/tokenizer/qwen3/reference_encodings.jsonl"));
  std::vector<std::string> texts;
  for (const auto& r : rows) texts.push_back(r["text"]);
  const auto batch = tok.encode_batch(texts, 3);
  ASSERT_EQ(batch.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(batch[i], rows[i]["ids"].get<std::vector<int32_t>>()) << "line " << i + 1;
  }
}

class SampleGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(SampleGolden, PromptsAndOutputsMatch) {
  const std::string dir = data_path(std::string("samples/") + GetParam());
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const nlohmann::json golden = nlohmann::json::parse(test::read_text(dir + "/golden.json"));
  const auto& cases = golden["cases"];
  ASSERT_EQ(cases.size(), 20u);
  for (const auto& c : cases) {
    SCOPED_TRACE("case " + c["id"].dump());
    EXPECT_EQ(tok.encode(c["prompt"].get<std::string>()), c["prompt_token_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(c["output_token_ids"].get<std::vector<int32_t>>()), c["output_text"].get<std::string>());
    EXPECT_EQ(tok.decode(c["prompt_token_ids"].get<std::vector<int32_t>>()), c["prompt"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Samples, SampleGolden, ::testing::Values("qwen3-sample", "qwen3.5-sample"),
                         [](const auto& info) {
                           return std::string(info.param) == "qwen3-sample" ? "Qwen3" : "Qwen3_5";
                         });

}  // namespace
}  // namespace qtk
