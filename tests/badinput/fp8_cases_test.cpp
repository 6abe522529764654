// Bad FP8 checkpoints (issue 23) handed to the real `convert`: every rule of
// the quantization_config and of the F8_E4M3 weight / float32 scale pairing.
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

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

const char* const kQ = "model.layers.0.self_attn.q_proj.weight";  // F8_E4M3 [256, 256]
const char* const kQScale = "model.layers.0.self_attn.q_proj.weight_scale_inv";  // F32 [2, 2]

// Byte offset in the data buffer of element [r, c] of tensor `name` (2-D).
uint64_t at(const ordered_json& h, const std::string& name, int64_t r, int64_t c,
            int64_t esize = 1) {
  const int64_t cols = h[name]["shape"][1];
  return h[name]["data_offsets"][0].get<uint64_t>() + static_cast<uint64_t>((r * cols + c) * esize);
}

void set_f32(std::string& d, uint64_t off, float v) { std::memcpy(&d[off], &v, 4); }

// Zeroes block [1, 1] of q_proj (rows and columns 128..255) but for element
// [200, 130], set to 448 (byte 0x7e), the largest e4m3fn value.
void one_448_in_block_1_1(const ordered_json& h, std::string& d) {
  for (int64_t r = 128; r < 256; ++r)
    for (int64_t c = 128; c < 256; ++c) d[at(h, kQ, r, c)] = '\0';
  d[at(h, kQ, 200, 130)] = '\x7e';
}

// Converts ckpt with the extra arguments and expects success.
void expect_converts(const std::string& ckpt, const std::vector<std::string>& args) {
  TempDir t;
  std::vector<std::string> argv = {program("convert"), ckpt, t / "ok.pack"};
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run_program(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// e4m3fn has no inf; 0x7f and 0xff are its NaNs. Refused under every
// --dtype (kept as they are or dequantized), naming the tensor, the element
// and the byte.
TEST(BadFp8, NanBytesInFp8WeightsRefusedUnderEveryDtype) {
  for (const char* dtype : {"keep", "bf16", "f16", "f32"}) {
    for (const char byte : {'\x7f', '\xff'}) {
      SCOPED_TRACE(dtype);
      expect_convert_rejects(
          kFp8, edit_st([byte](ordered_json& h, std::string& d) { d[at(h, kQ, 130, 5)] = byte; }),
          {"model.safetensors", kQ, "[130, 5]", byte == '\x7f' ? "0x7f" : "0xff", "NaN", "F8_E4M3"},
          {"--dtype", dtype});
    }
  }
}

// The same for a per-expert FP8 weight of a Qwen3.5-MoE checkpoint.
TEST(BadFp8, NanByteInAnFp8ExpertRefused) {
  const std::string name = "model.layers.0.mlp.experts.3.up_proj.weight";  // F8_E4M3 [160, 128]
  for (const char* dtype : {"keep", "bf16"}) {
    SCOPED_TRACE(dtype);
    expect_convert_rejects(
        "qwen3.5-moe-fp8-tiny",
        edit_st([&](ordered_json& h, std::string& d) { d[at(h, name, 3, 7)] = '\x7f'; }),
        {"model.safetensors", name, "[3, 7]", "0x7f", "NaN"}, {"--dtype", dtype});
  }
}

// A finite scale so large that fp8 x scale overflows float32 (which the FP8
// kernels and every dequantization compute) is refused at load, whatever
// the --dtype.
TEST(BadFp8, ScaleThatOverflowsFloat32Refused) {
  for (const char* dtype : {"keep", "f32"}) {
    SCOPED_TRACE(dtype);
    expect_convert_rejects(kFp8, edit_st([](ordered_json& h, std::string& d) {
                             one_448_in_block_1_1(h, d);
                             set_f32(d, at(h, kQScale, 1, 1, 4), 1e38f);
                           }),
                           {"model.safetensors", kQScale, "[1, 1]", "[200, 130]", kQ, "448",
                            "1e+38", "overflows float32"},
                           {"--dtype", dtype});
  }
}

// A dequantized value within float32 but beyond f16's 65504 becomes inf in
// an f16 pack: refused naming the source value and the target dtype (bf16
// holds it).
TEST(BadFp8, DequantizedValueOverflowingF16Refused) {
  const auto edit = edit_st([](ordered_json& h, std::string& d) {
    one_448_in_block_1_1(h, d);  // 448 x 1000 = 448000
    set_f32(d, at(h, kQScale, 1, 1, 4), 1000.0f);
  });
  expect_convert_rejects(
      kFp8, edit,
      {"model.safetensors", kQ, "[200, 130]", "F16", "448", "1000", "448000", "overflows", "inf"},
      {"--dtype", "f16"});
  TempDir t;
  copy_checkpoint(kFp8, t / "ckpt");
  edit(t / "ckpt");
  expect_converts(t / "ckpt", {"--dtype", "bf16"});
}

// A negative scale flips its block's signs; a zero scale erases a block
// whose FP8 data is not zero. A zero scale over an all-zero block is fine.
TEST(BadFp8, NegativeOrZeroScaleRefused) {
  expect_convert_rejects(kFp8, edit_st([](ordered_json& h, std::string& d) {
                           set_f32(d, at(h, kQScale, 0, 1, 4), -0.5f);
                         }),
                         {"model.safetensors", kQScale, "non-negative", "-0.5", "[0, 1]"});
  expect_convert_rejects(
      kFp8, edit_st([](ordered_json& h, std::string& d) {
        for (int64_t r = 128; r < 256; ++r)
          for (int64_t c = 0; c < 128; ++c) d[at(h, kQ, r, c)] = '\0';
        d[at(h, kQ, 250, 3)] = '\x38';  // 1.0
        set_f32(d, at(h, kQScale, 1, 0, 4), 0.0f);
      }),
      {"model.safetensors", kQScale, "positive", "[1, 0]", "[250, 3]", "0x38", "found 0"},
      {"--dtype", "bf16"});
  TempDir t;
  copy_checkpoint(kFp8, t / "ckpt");
  edit_st([](ordered_json& h, std::string& d) {
    for (int64_t r = 128; r < 256; ++r)
      for (int64_t c = 0; c < 128; ++c) d[at(h, kQ, r, c)] = (r + c) % 2 ? '\0' : '\x80';  // +-0
    set_f32(d, at(h, kQScale, 1, 0, 4), 0.0f);
  })(t / "ckpt");
  expect_converts(t / "ckpt", {});
  expect_converts(t / "ckpt", {"--dtype", "f16"});
}

// An FP8 embedding table is a valid checkpoint, but the runtime has no FP8
// embedding lookup: --dtype keep refuses it at convert time (with the
// wording generate uses for such a pack), and --dtype bf16 converts it into
// a pack generate runs.
TEST(BadFp8, Fp8EmbeddingRefusedUnderKeep) {
  const std::string name = "model.embed_tokens.weight";  // BF16 [512, 256]
  const auto edit = edit_st([name](ordered_json& h, std::string& d) {
    remove_tensor(h, d, name);
    const uint64_t end = d.size();
    h[name] = {
        {"dtype", "F8_E4M3"}, {"shape", {512, 256}}, {"data_offsets", {end, end + 512 * 256}}};
    d.append(512 * 256, '\x38');  // 1.0
    const uint64_t s0 = d.size();
    h[name + "_scale_inv"] = {{"dtype", "F32"}, {"shape", {4, 2}}, {"data_offsets", {s0, s0 + 32}}};
    const float one = 1.0f;
    for (int i = 0; i < 8; ++i) d.append(reinterpret_cast<const char*>(&one), 4);
  });
  expect_convert_rejects(kFp8, edit,
                         {"model.safetensors", name, "F8_E4M3",
                          "an FP8 embedding table is not supported", "--dtype bf16"});
  TempDir t;
  const std::string ckpt = t / "ckpt";
  copy_checkpoint(kFp8, ckpt);
  edit(ckpt);
  const RunResult i = run_program({program("inspect"), ckpt});
  EXPECT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("tensor \"model.embed_tokens.weight\" is F8_E4M3; an FP8 embedding table "
                       "is not supported: convert refuses --dtype keep; pass --dtype bf16"),
            std::string::npos)
      << i.out;
  const RunResult c = run_program({program("convert"), ckpt, t / "e.pack", "--dtype", "bf16"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  write_file(t / "p.jsonl", "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
  const RunResult g = run_program({program("generate"), "--model", t / "e.pack", "--batch",
                                   t / "p.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
  EXPECT_EQ(g.exit_code, 0) << g.err;
}

// Non-finite source weights (BF16 here) are refused under every --dtype;
// a finite BF16 weight beyond f16's range is refused under --dtype f16 only
// (it would become inf), naming the source value and the target dtype.
TEST(BadWeights, NonFiniteOrOverflowingFloatWeights) {
  const std::string name = "model.layers.0.mlp.down_proj.weight";  // BF16 [64, 128]
  const auto put = [name](uint16_t bits) {
    return [name, bits](const std::string& ckpt) {
      SafetensorsParts p = read_safetensors(ckpt + "/model.safetensors");
      std::memcpy(&p.data[at(p.header, name, 1, 2, 2)], &bits, 2);
      write_file(ckpt + "/model.safetensors", build_safetensors(p.header, p.data));
    };
  };
  for (const char* dtype : {"keep", "f16", "f32"}) {
    SCOPED_TRACE(dtype);
    expect_convert_rejects("qwen3-tiny", put(0x7fc0),
                           {"model.safetensors", name, "[1, 2]", "expected finite", "nan", "BF16"},
                           {"--dtype", dtype});
    expect_convert_rejects("qwen3-tiny", put(0xff80),
                           {"model.safetensors", name, "[1, 2]", "expected finite", "-inf"},
                           {"--dtype", dtype});
  }
  expect_convert_rejects(
      "qwen3-tiny", put(0x47c3),  // 99840
      {"model.safetensors", name, "[1, 2]", "F16", "BF16", "99840", "inf", "overflows"},
      {"--dtype", "f16"});
  TempDir t;
  copy_checkpoint("qwen3-tiny", t / "ckpt");
  put(0x47c3)(t / "ckpt");
  expect_converts(t / "ckpt", {});
  expect_converts(t / "ckpt", {"--dtype", "f32"});
}

}  // namespace
}  // namespace qtk::testing
