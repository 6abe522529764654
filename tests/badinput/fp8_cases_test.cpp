// Bad FP8 checkpoints (issue 23) handed to the real `convert`: every rule of
// the quantization_config and of the F8_E4M3 weight / float32 scale pairing.
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "tests/badinput/checkpoint_fixture.h"

namespace qtk::testing {
namespace {

using nlohmann::ordered_json;

const char* const kFp8 = "qwen3-fp8-tiny";

auto edit_config(std::function<void(ordered_json&)> edit) {
  return [edit](const std::string& ckpt) { edit_json(ckpt + "/config.json", edit); };
}

auto edit_st(std::function<void(ordered_json&, std::string&)> edit) {
  return [edit](const std::string& ckpt) {
    SafetensorsParts p = read_safetensors(ckpt + "/model.safetensors");
    edit(p.header, p.data);
    write_file(ckpt + "/model.safetensors", build_safetensors(p.header, p.data));
  };
}

// Removes a tensor and its bytes, keeping the others tiled.
void remove_tensor(ordered_json& h, std::string& data, const std::string& name) {
  const uint64_t a = h[name]["data_offsets"][0], b = h[name]["data_offsets"][1];
  data.erase(a, b - a);
  h.erase(name);
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    for (auto& o : v["data_offsets"])
      if (o.get<uint64_t>() > a) o = o.get<uint64_t>() - (b - a);
  }
}

const char* const kDownScale = "model.layers.0.mlp.down_proj.weight_scale_inv";  // F32 [2, 3]

TEST(BadFp8, QuantMethodOtherThanFp8) {
  for (const char* method : {"awq", "gptq", "bitsandbytes"}) {
    SCOPED_TRACE(method);
    expect_convert_rejects(
        kFp8,
        edit_config([&](ordered_json& c) { c["quantization_config"]["quant_method"] = method; }),
        {"config.json", "quantization_config.quant_method", "not supported", method});
  }
}

TEST(BadFp8, UnsupportedFormatBlockSizeOrActivations) {
  expect_convert_rejects(
      kFp8, edit_config([](ordered_json& c) { c["quantization_config"]["fmt"] = "e5m2"; }),
      {"config.json", "quantization_config.fmt", "e4m3", "e5m2"});
  expect_convert_rejects(kFp8, edit_config([](ordered_json& c) {
                           c["quantization_config"]["weight_block_size"] = {64, 128};
                         }),
                         {"config.json", "weight_block_size", "[128, 128]", "[64,128]"});
  expect_convert_rejects(kFp8, edit_config([](ordered_json& c) {
                           c["quantization_config"]["activation_scheme"] = "static";
                         }),
                         {"config.json", "activation_scheme", "dynamic", "static"});
}

TEST(BadFp8, Fp8WeightsWithoutQuantizationConfig) {
  expect_convert_rejects(kFp8, edit_config([](ordered_json& c) { c.erase("quantization_config"); }),
                         {"model.safetensors", "F8_E4M3", "quantization_config"});
}

TEST(BadFp8, E5M2WeightRefused) {
  expect_convert_rejects(
      kFp8, edit_st([](ordered_json& h, std::string&) {
        h["model.layers.1.self_attn.o_proj.weight"]["dtype"] = "F8_E5M2";
      }),
      {"model.safetensors", "model.layers.1.self_attn.o_proj.weight", "F8_E5M2", "not supported"});
}

TEST(BadFp8, MissingScale) {
  expect_convert_rejects(
      kFp8, edit_st([](ordered_json& h, std::string& d) { remove_tensor(h, d, kDownScale); }),
      {"model.layers.0.mlp.down_proj.weight", kDownScale, "missing", "[2, 3]"});
}

TEST(BadFp8, ScaleOfTheWrongShapeOrDtype) {
  // [3, 2] holds the same bytes as the right [2, 3].
  expect_convert_rejects(kFp8, edit_st([](ordered_json& h, std::string&) {
                           h[kDownScale]["shape"] = {3, 2};
                         }),
                         {"model.safetensors", kDownScale, "expected shape [2, 3]", "[3, 2]"});
  expect_convert_rejects(
      kFp8, edit_st([](ordered_json& h, std::string&) { h[kDownScale]["dtype"] = "I32"; }),
      {"model.safetensors", kDownScale, "F32", "I32"});
}

TEST(BadFp8, ScaleOnANonFp8Tensor) {
  // lm_head stays BF16 [512, 256]; a scale beside it is an error, not ignored.
  expect_convert_rejects(kFp8, edit_st([](ordered_json& h, std::string& d) {
                           const uint64_t end = d.size();
                           h["lm_head.weight_scale_inv"] = {{"dtype", "F32"},
                                                            {"shape", {4, 2}},
                                                            {"data_offsets", {end, end + 32}}};
                           d.append(32, '\0');
                         }),
                         {"model.safetensors", "lm_head.weight_scale_inv", "BF16", "F8_E4M3"});
}

TEST(BadFp8, NonFiniteScale) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    expect_convert_rejects(kFp8, edit_st([bad](ordered_json& h, std::string& d) {
                             const uint64_t a = h[kDownScale]["data_offsets"][0];
                             std::memcpy(&d[a + 4 * 4], &bad, 4);  // block [1, 1]
                           }),
                           {"model.safetensors", kDownScale, "finite", "[1, 1]"});
  }
}

// An FP8 embedding table converts (it is a valid checkpoint) but the runtime
// has no FP8 embedding lookup: generate refuses the pack in one line and
// writes nothing.
TEST(BadFp8, Fp8EmbeddingRefusedByGenerate) {
  TempDir t;
  const std::string ckpt = t / "ckpt";
  copy_checkpoint(kFp8, ckpt);
  edit_st([](ordered_json& h, std::string& d) {
    const std::string name = "model.embed_tokens.weight";  // BF16 [512, 256]
    remove_tensor(h, d, name);
    const uint64_t end = d.size();
    h[name] = {
        {"dtype", "F8_E4M3"}, {"shape", {512, 256}}, {"data_offsets", {end, end + 512 * 256}}};
    d.append(512 * 256, '\x38');  // 1.0
    const uint64_t s0 = d.size();
    h[name + "_scale_inv"] = {{"dtype", "F32"}, {"shape", {4, 2}}, {"data_offsets", {s0, s0 + 32}}};
    const float one = 1.0f;
    for (int i = 0; i < 8; ++i) d.append(reinterpret_cast<const char*>(&one), 4);
  })(ckpt);
  const RunResult c = run_program({program("convert"), ckpt, t / "e.pack"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  write_file(t / "p.jsonl", "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
  const RunResult g = run_program({program("generate"), "--model", t / "e.pack", "--batch",
                                   t / "p.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
  expect_clean_failure(g, "generate", {"e.pack", "embed_tokens", "F8_E4M3", "not supported"});
  EXPECT_FALSE(file_exists(t / "out.jsonl"));
  EXPECT_FALSE(file_exists(t / "out.jsonl.meta.json"));
}

}  // namespace
}  // namespace qtk::testing
