#include "loaders/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

using testing::error_of;
using testing::safetensors_bytes;
using testing::source_path;
using testing::TempDir;
using testing::write_file;

TEST(Safetensors, OpsFixtureShapesAndMetadata) {
  // Shapes from the fixture README: B=2, T=150, 2 key heads, 4 value heads, Dk=Dv=128.
  auto f = SafetensorsFile::open(source_path("tests/data/ops/gated_delta_rule.safetensors"));
  const SafetensorsTensor* state = f->find("final_state");
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->view.dtype, DType::F32);
  EXPECT_EQ(state->view.shape_string(), "[2, 4, 128, 128]");
  const SafetensorsTensor* a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->view.shape_string(), "[2, 150, 4]");
  EXPECT_EQ(f->find("no_such_tensor"), nullptr);
  ASSERT_TRUE(f->metadata().count("layout"));
  EXPECT_NE(f->metadata().at("layout").find("q,k: [B,T,Hk,Dk]"), std::string::npos);
  // File order: ascending offsets, tiling the buffer.
  uint64_t expect = 8 + f->header_size();
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.file_offset, expect) << t.name;
    expect += static_cast<uint64_t>(t.view.nbytes());
  }
  EXPECT_EQ(expect, f->file_size());
}

TEST(Safetensors, ActivationsViewIsZeroCopyAndMatchesGolden) {
  // The prompt ids stored in activations.safetensors must equal golden.json's
  // len16 prompt (both written by the reference implementation).
  const std::string dir = source_path("tests/data/models/qwen3-tiny/");
  auto f = SafetensorsFile::open(dir + "activations.safetensors");
  const auto* ids = f->find("prompt_token_ids");
  ASSERT_NE(ids, nullptr);
  ASSERT_EQ(ids->view.dtype, DType::I64);
  ASSERT_EQ(ids->view.ndim, 1);
  const auto golden = nlohmann::json::parse(testing::read_file(dir + "golden.json"));
  std::vector<int64_t> expected;
  for (const auto& c : golden["cases"])
    if (c["id"] == "len16") expected = c["prompt_token_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(expected.size(), 16u);
  ASSERT_EQ(ids->view.dim(0), 16);
  std::vector<int64_t> got(16);
  std::memcpy(got.data(), ids->view.data, 16 * sizeof(int64_t));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(f->find("logits")->view.shape_string(), "[16, 512]");  // vocab 512
}

TEST(Safetensors, EmptyFileOfTensorsAndZeroSizedAndScalar) {
  TempDir tmp;
  write_file(tmp.file("empty.safetensors"), safetensors_bytes("{}", 0));
  EXPECT_TRUE(SafetensorsFile::open(tmp.file("empty.safetensors"))->tensors().empty());

  const std::string h = R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                        R"("s":{"dtype":"I16","shape":[],"data_offsets":[0,2]},)"
                        R"("__metadata__":{"format":"pt"}})";
  write_file(tmp.file("edge.safetensors"), safetensors_bytes(h, 2));
  auto f = SafetensorsFile::open(tmp.file("edge.safetensors"));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "z");
  EXPECT_EQ(f->tensors()[0].view.numel(), 0);
  EXPECT_EQ(f->tensors()[1].view.ndim, 0);
  EXPECT_EQ(f->tensors()[1].view.numel(), 1);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

struct BadCase {
  const char* label;
  std::string bytes;
  const char* expected;  // substring of the message
};

std::string tensor_header(const std::string& body) { return "{" + body + "}"; }

class SafetensorsRejects : public ::testing::TestWithParam<int> {};

std::vector<BadCase> bad_cases() {
  const std::string ok_t = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  return {
      {"short_file", std::string(5, '\0'), "expected at least 8 bytes"},
      {"huge_header_length", safetensors_bytes("{}", 0, 100'000'001), "exceeds the limit"},
      {"header_past_end", safetensors_bytes("{}", 0, 64), "runs past the end of the file"},
      {"invalid_utf8", safetensors_bytes("{\"a\xff\":1}", 0), "invalid UTF-8"},
      {"overlong_utf8", safetensors_bytes("{\"\xc0\xaf\":1}", 0), "invalid UTF-8"},
      {"not_json", safetensors_bytes("{\"a\":", 0), "invalid JSON"},
      {"not_object", safetensors_bytes("[1,2]", 0), "expected a JSON object, found array"},
      {"duplicate_tensor", safetensors_bytes(tensor_header(ok_t + "," + ok_t), 8),
       "duplicate JSON key 'a'"},
      {"duplicate_field",
       safetensors_bytes(R"({"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                         8),
       "duplicate JSON key 'dtype' in object /a"},
      {"bad_dtype",
       safetensors_bytes(R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor \"a\": field 'dtype': expected one of BF16"},
      {"dtype_not_string",
       safetensors_bytes(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8),
       "field 'dtype': expected a string, found 4"},
      {"negative_dim",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "field 'shape': expected integers >= 0 that fit in int64, found -2"},
      {"float_dim",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
       "field 'shape': expected integers >= 0"},
      {"shape_overflow",
       safetensors_bytes(
           R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
       "overflows int64"},
      {"byte_size_overflow",
       safetensors_bytes(
           R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
       "byte size of"},
      {"rank_too_high",
       safetensors_bytes(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})",
                         1),
       "expected at most 8 dimensions, found 9"},
      {"offsets_not_pair",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       "field 'data_offsets': expected [start, end]"},
      {"offsets_negative",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
       "field 'data_offsets': expected integers >= 0"},
      {"offsets_reversed",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       "expected start <= end"},
      {"size_mismatch",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "spans 8 bytes, but shape [3] of F32 needs 12 bytes"},
      {"first_not_at_zero",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "expected the first tensor to start at 0, found 4"},
      {"gap",
       safetensors_bytes(
           tensor_header(ok_t + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]})"), 16),
       "expected start 8 (end of tensor \"a\"), found 12 (a gap of 4 bytes)"},
      {"overlap",
       safetensors_bytes(
           tensor_header(ok_t + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]})"), 8),
       "overlaps tensor"},
      {"trailing_bytes", safetensors_bytes(tensor_header(ok_t), 12),
       "data buffer has 12 bytes but the tensors cover 8"},
      {"truncated", safetensors_bytes(tensor_header(ok_t), 6),
       "tensor \"a\": field 'data_offsets': [0, 8] ends past the 6-byte data buffer"},
      // The cause is named, not the gap it leaves where the tensor should
      // have been (met first in offset order).
      {"overlap_leaving_a_gap",
       safetensors_bytes(
           tensor_header(ok_t + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]})"
                                R"(,"c":{"dtype":"U8","shape":[4],"data_offsets":[16,20]})"
                                R"(,"d":{"dtype":"U8","shape":[4],"data_offsets":[16,20]})"),
           20),
       "tensor \"d\": field 'data_offsets': [16, 20] overlaps tensor \"c\" [16, 20]"},
      {"past_the_end_leaving_a_gap",
       safetensors_bytes(
           tensor_header(ok_t + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]})"
                                R"(,"c":{"dtype":"U8","shape":[4],"data_offsets":[16,20]})"),
           16),
       "tensor \"c\": field 'data_offsets': [16, 20] ends past the 16-byte data buffer"},
      {"empty_name",
       safetensors_bytes(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       "expected a non-empty tensor name"},
      {"control_char_name",
       safetensors_bytes(R"({"a\nb":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       "tensor \"a\\nb\": expected a tensor name without control characters"},
      {"c1_control_name",
       safetensors_bytes("{\"a\xc2\x85\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                         8),
       "without control characters"},
      {"unknown_field",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8),
       "unexpected field \"extra\""},
      {"missing_shape", safetensors_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
       "missing field 'shape'"},
      {"tensor_not_object", safetensors_bytes(R"({"a":[1]})", 0),
       "expected an object with dtype, shape and data_offsets"},
      {"metadata_not_object", safetensors_bytes(R"({"__metadata__":[]})", 0),
       "field '__metadata__': expected an object of strings"},
      {"metadata_value_not_string", safetensors_bytes(R"({"__metadata__":{"k":1}})", 0),
       "field '__metadata__': key \"k\": expected a string value, found 1"},
  };
}

TEST_P(SafetensorsRejects, WithMessageNamingFileAndField) {
  const BadCase c = bad_cases()[static_cast<size_t>(GetParam())];
  TempDir tmp;
  const std::string path = tmp.file(std::string(c.label) + ".safetensors");
  write_file(path, c.bytes);
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << c.label << ": " << msg;
  EXPECT_NE(msg.find(c.expected), std::string::npos)
      << c.label << ": expected '" << c.expected << "' in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(All, SafetensorsRejects,
                         ::testing::Range(0, static_cast<int>(bad_cases().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(bad_cases()[static_cast<size_t>(i.param)].label);
                         });

TEST(Safetensors, MissingFileNamesPath) {
  const std::string msg = error_of([] { SafetensorsFile::open("/nonexistent/x.safetensors"); });
  EXPECT_NE(msg.find("/nonexistent/x.safetensors: cannot open"), std::string::npos) << msg;
}

TEST(Safetensors, ControlCharacterDetector) {
  EXPECT_FALSE(has_control_character("model.layers.0.mlp"));
  EXPECT_FALSE(has_control_character("caf\xc3\xa9"));  // é is fine
  EXPECT_TRUE(has_control_character(std::string("a\0b", 3)));
  EXPECT_TRUE(has_control_character("a\x7f"));
  EXPECT_TRUE(has_control_character("a\xc2\x9f"));
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

// Every prefix of a valid file, and every single-byte corruption of its
// header, either opens or throws qtk::Error: never a crash (the ASan/UBSan
// build runs this too).
TEST(SafetensorsRobustness, TruncationsAndByteFlipsOnlyThrowQtkError) {
  const std::string good = safetensors_bytes(
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
      16);
  TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  auto outcome = [&](const std::string& bytes) -> int {
    write_file(path, bytes);
    try {
      SafetensorsFile::open(path);
      return 0;
    } catch (const Error&) {
      return 1;
    }
  };
  ASSERT_EQ(outcome(good), 0);
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_EQ(outcome(good.substr(0, n)), 1) << "prefix " << n;
  int opened = 0;
  for (size_t i = 0; i < good.size() - 16; ++i) {
    for (unsigned char v : {0x00, 0x22, 0x2c, 0x30, 0x5d, 0x7d, 0xff}) {
      std::string bad = good;
      bad[i] = static_cast<char>(v);
      opened +=
          outcome(bad) == 0;  // a flip may still be valid (e.g. "k" -> "0"); no crash is the point
    }
  }
  EXPECT_LT(opened, 200);  // most corruptions must be rejected
}

}  // namespace
}  // namespace qtk
