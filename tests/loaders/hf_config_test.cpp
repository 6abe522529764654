#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "loaders/model_config.h"
#include "loaders/strict_json.h"
#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

using nlohmann::json;
using testing::error_of;
using testing::source_path;

json load(const std::string& rel) { return load_json_file(source_path(rel)); }

const char* kQwen3Tiny = "tests/data/models/qwen3-tiny/config.json";
const char* kQwen3Sharded = "tests/data/models/qwen3-tiny-sharded-f32/config.json";
const char* kQwen35Tiny = "tests/data/models/qwen3.5-tiny/config.json";
const char* kQwen35Vlm = "tests/data/models/qwen3.5-tiny-vlm/config.json";

ModelConfig parse(const json& j) { return parse_hf_config(j, "cfg.json"); }
std::string reject(const json& j) {
  return error_of([&] { parse(j); });
}
void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
}

// Expected values below are read from the config.json files themselves.
TEST(HfConfig, Qwen3Tiny) {
  const ModelConfig c = load_hf_config(source_path(kQwen3Tiny));
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.hf_architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 128);  // != hidden
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.plan_string(), "FFF");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope.rotary_dim, 32);
  EXPECT_TRUE(c.rope.mrope_section.empty());
  EXPECT_FALSE(c.norm_adds_one);
  EXPECT_FALSE(c.attn_output_gate);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.max_position_embeddings, 4096);
}

TEST(HfConfig, Qwen3ShardedUntied) {
  const ModelConfig c = load_hf_config(source_path(kQwen3Sharded));
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.plan_string(), "FFFF");
}

TEST(HfConfig, Qwen35Tiny) {
  const ModelConfig c = load_hf_config(source_path(kQwen35Tiny));
  EXPECT_EQ(c.arch, Arch::kQwen3_5);
  EXPECT_EQ(c.plan_string(), "LLLFLLLF");
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.linear_key_head_dim, 16);
  EXPECT_EQ(c.linear_value_head_dim, 16);
  EXPECT_EQ(c.linear_conv_kernel, 4);
  EXPECT_EQ(c.linear_conv_dim(), 2 * 32 + 64);
  EXPECT_DOUBLE_EQ(c.rope.partial_factor, 0.25);
  EXPECT_EQ(c.rope.rotary_dim, 8);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_TRUE(c.rope.mrope_interleaved);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e7);
  EXPECT_TRUE(c.norm_adds_one);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(HfConfig, Qwen35VlmNestedTextConfig) {
  const ModelConfig c = load_hf_config(source_path(kQwen35Vlm));
  EXPECT_EQ(c.hf_architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.plan_string(), "LFLLFL");
  EXPECT_EQ(c.linear_key_head_dim, 32);
  EXPECT_EQ(c.linear_value_head_dim, 24);
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 2);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.rope.rotary_dim, 8);
}

TEST(HfConfig, RealSizeConfigs) {
  const ModelConfig q3 = load_hf_config(source_path("tests/data/configs/qwen3-0.6b.json"));
  EXPECT_DOUBLE_EQ(q3.rope.theta, 1e6);  // 4.x: top-level rope_theta, rope_scaling null
  EXPECT_EQ(q3.num_layers, 28);
  EXPECT_EQ(q3.plan_string(), std::string(28, 'F'));
  EXPECT_EQ(q3.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(q3.bos_token_id, 151643);
  EXPECT_TRUE(q3.tie_word_embeddings);
  EXPECT_FALSE(load_hf_config(source_path("tests/data/configs/qwen3-8b.json")).tie_word_embeddings);

  const ModelConfig s = load_hf_config(source_path("tests/data/configs/qwen3.5-0.8b.json"));
  EXPECT_EQ(s.num_layers, 24);
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_EQ(s.rope.rotary_dim, 64);
  EXPECT_EQ(s.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_EQ(s.eos_token_ids, std::vector<int64_t>{248044});
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.plan_string(), "LLLFLLLFLLLFLLLFLLLFLLLF");
  const ModelConfig n = load_hf_config(source_path("tests/data/configs/qwen3.5-9b.json"));
  EXPECT_FALSE(n.tie_word_embeddings);
  EXPECT_EQ(n.linear_num_value_heads, 32);
}

TEST(HfConfig, Samples) {
  const ModelConfig a = load_hf_config(source_path("samples/qwen3-sample/config.json"));
  EXPECT_EQ(a.eos_token_ids, std::vector<int64_t>{0});
  EXPECT_EQ(a.pad_token_id, 0);
  EXPECT_EQ(a.num_layers, 6);
  const ModelConfig b = load_hf_config(source_path("samples/qwen3.5-sample/config.json"));
  EXPECT_EQ(b.plan_string(), "LLLFLLLF");
  EXPECT_EQ(b.rope.mrope_section, (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(b.rope.rotary_dim, 16);
}

// --- spelling variants ------------------------------------------------------

TEST(HfConfigVariants, Transformers4RopeThetaAtTopLevel) {
  json j = load(kQwen35Tiny);
  j["rope_theta"] = 5e6;
  j["rope_scaling"] = {
      {"type", "default"}, {"mrope_section", {2, 1, 1}}, {"mrope_interleaved", true}};
  j.erase("rope_parameters");
  const ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 5e6);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_TRUE(c.rope.mrope_interleaved);
  EXPECT_EQ(c.rope.rotary_dim, 8);  // from the top-level partial_rotary_factor
}

TEST(HfConfigVariants, PartialFactorInEitherPlace) {
  json top_only = load(kQwen35Tiny);
  top_only["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(parse(top_only).rope.rotary_dim, 8);
  json params_only = load(kQwen35Tiny);
  params_only.erase("partial_rotary_factor");
  EXPECT_EQ(parse(params_only).rope.rotary_dim, 8);
  json neither = load(kQwen3Tiny);  // Qwen3: full rotary
  EXPECT_DOUBLE_EQ(parse(neither).rope.partial_factor, 1.0);
  json disagree = load(kQwen35Tiny);
  disagree["partial_rotary_factor"] = 0.5;
  expect_has(
      reject(disagree),
      "'partial_rotary_factor' (0.5) and 'rope_parameters.partial_rotary_factor' (0.25) disagree");
  json both_theta = load(kQwen3Tiny);
  both_theta["rope_theta"] = 1e4;
  expect_has(reject(both_theta), "disagree");
  json no_theta = load(kQwen3Tiny);
  no_theta["rope_parameters"].erase("rope_theta");
  expect_has(reject(no_theta), "missing field 'rope_theta'");
}

TEST(HfConfigVariants, TieAtEitherLevel) {
  json text_only = load(kQwen35Vlm);
  text_only.erase("tie_word_embeddings");
  text_only["text_config"]["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(text_only).tie_word_embeddings);
  json top_only = load(kQwen35Vlm);
  top_only["text_config"].erase("tie_word_embeddings");
  top_only["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(top_only).tie_word_embeddings);
  json disagree = load(kQwen35Vlm);
  disagree["tie_word_embeddings"] = true;
  expect_has(reject(disagree),
             "'tie_word_embeddings' (true) and 'text_config.tie_word_embeddings' (false) disagree");
}

TEST(HfConfigVariants, TokenIdsIntListOrNull) {
  json j = load(kQwen3Tiny);
  j["eos_token_id"] = 7;
  EXPECT_EQ(parse(j).eos_token_ids, std::vector<int64_t>{7});
  j["eos_token_id"] = {7, 9};
  EXPECT_EQ(parse(j).eos_token_ids, (std::vector<int64_t>{7, 9}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse(j).eos_token_ids.empty());
  j["eos_token_id"] = "7";
  expect_has(reject(j), "field 'eos_token_id': expected a token id");
  j["eos_token_id"] = 512;
  expect_has(reject(j), "field 'eos_token_id': expected ids below vocab_size 512, found 512");
  json bos = load(kQwen3Tiny);
  bos["bos_token_id"] = 3;
  EXPECT_EQ(parse(bos).bos_token_id, 3);
  json vlm = load(kQwen35Vlm);  // nested: ids inside text_config
  vlm["text_config"]["eos_token_id"] = {1, 2};
  EXPECT_EQ(parse(vlm).eos_token_ids, (std::vector<int64_t>{1, 2}));
}

TEST(HfConfigVariants, FullAttentionIntervalWhenLayerTypesAbsent) {
  json j = load(kQwen35Tiny);
  j.erase("layer_types");
  j["full_attention_interval"] = 4;
  EXPECT_EQ(parse(j).plan_string(), "LLLFLLLF");
  j["full_attention_interval"] = 2;
  EXPECT_EQ(parse(j).plan_string(), "LFLFLFLF");
  json real = load("tests/data/configs/qwen3.5-0.8b.json");
  const std::string with_types = parse(real).plan_string();
  real["text_config"].erase("layer_types");
  EXPECT_EQ(parse(real).plan_string(), with_types);
  json neither = load(kQwen35Tiny);
  neither.erase("layer_types");
  expect_has(reject(neither), "missing field 'layer_types' (or 'full_attention_interval')");
  json qwen3 = load(kQwen3Tiny);
  qwen3.erase("layer_types");
  EXPECT_EQ(parse(qwen3).plan_string(), "FFF");
}

TEST(HfConfigVariants, KvHeadsDefaultToHeads) {
  json j = load(kQwen3Tiny);
  j.erase("num_key_value_heads");
  EXPECT_EQ(parse(j).num_kv_heads, 4);
}

// --- rejections ---------------------------------------------------------------

struct Reject {
  const char* label;
  const char* base;
  std::function<void(json&)> edit;
  const char* expected;
};

std::vector<Reject> rejects() {
  return {
      {"rope_yarn", kQwen3Tiny, [](json& j) { j["rope_parameters"]["rope_type"] = "yarn"; },
       "field 'rope_parameters.rope_type': only \"default\" RoPE is supported, found \"yarn\""},
      {"rope_scaling_linear", "tests/data/configs/qwen3-0.6b.json",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "field 'rope_scaling.type': only \"default\" RoPE is supported, found \"linear\""},
      {"sliding_window", kQwen3Tiny,
       [](json& j) { j["use_sliding_window"] = true, j["sliding_window"] = 4096; },
       "field 'use_sliding_window': an active sliding window is not supported (use_sliding_window "
       "true, sliding_window 4096)"},
      {"sliding_layer_type", kQwen3Tiny, [](json& j) { j["layer_types"][1] = "sliding_attention"; },
       "field 'layer_types[1]': expected \"full_attention\", found \"sliding_attention\""},
      {"attention_bias", kQwen3Tiny, [](json& j) { j["attention_bias"] = true; },
       "field 'attention_bias': attention_bias true is not supported"},
      {"attention_bias_nested", kQwen35Vlm,
       [](json& j) { j["text_config"]["attention_bias"] = true; },
       "field 'text_config.attention_bias'"},
      {"moe", kQwen3Tiny, [](json& j) { j["num_experts"] = 8; },
       "field 'num_experts': mixture-of-experts models are not supported, found 8"},
      {"moe_arch", kQwen3Tiny, [](json& j) { j["architectures"] = {"Qwen3MoeForCausalLM"}; },
       "field 'architectures': expected Qwen3ForCausalLM, Qwen3_5ForCausalLM or "
       "Qwen3_5ForConditionalGeneration, found \"Qwen3MoeForCausalLM\""},
      {"quant_awq", kQwen3Tiny,
       [](json& j) { j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}}; },
       "field 'quantization_config.quant_method': not supported: quant_method \"awq\""},
      {"quant_gptq_nested", kQwen35Vlm,
       [](json& j) { j["text_config"]["quantization_config"] = {{"quant_method", "gptq"}}; },
       "field 'text_config.quantization_config.quant_method': not supported: quant_method "
       "\"gptq\""},
      {"quant_method_missing", kQwen3Tiny,
       [](json& j) { j["quantization_config"] = {{"fmt", "e4m3"}}; },
       "field 'quantization_config.quant_method': expected a string (\"fp8\"), found nothing"},
      {"quant_not_object", kQwen3Tiny, [](json& j) { j["quantization_config"] = "fp8"; },
       "field 'quantization_config': expected an object, found \"fp8\""},
      {"fp8_e5m2", kQwen3Tiny,
       [](json& j) { j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}}; },
       "field 'quantization_config.fmt': not supported: expected \"e4m3\", found \"e5m2\""},
      {"fp8_block_64", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
       },
       "field 'quantization_config.weight_block_size': not supported: expected [128, 128], "
       "found [64,64]"},
      {"fp8_static_activations", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}};
       },
       "field 'quantization_config.activation_scheme': not supported: expected \"dynamic\""},
      {"fp8_not_convert_type", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"modules_to_not_convert", "lm_head"}};
       },
       "field 'quantization_config.modules_to_not_convert': expected a list of names"},
      {"fp8_levels_disagree", kQwen35Vlm,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}};
         j["text_config"]["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}};
       },
       "fields 'quantization_config' and 'text_config.quantization_config' disagree"},
      {"layer_types_length", kQwen35Tiny, [](json& j) { j["layer_types"].erase(0); },
       "field 'layer_types': expected 8 entries (num_hidden_layers), found 7"},
      {"layer_type_unknown", kQwen35Tiny, [](json& j) { j["layer_types"][0] = "mamba"; },
       "field 'layer_types[0]': expected \"full_attention\" or \"linear_attention\", found "
       "\"mamba\""},
      {"mrope_sum", kQwen35Tiny,
       [](json& j) {
         j["rope_parameters"]["mrope_section"] = {2, 2, 1};
       },
       "field 'mrope_section': expected entries summing to rotary_dim / 2 = 4, found [2,2,1] (sum "
       "5)"},
      {"heads_not_divisible", kQwen3Tiny, [](json& j) { j["num_key_value_heads"] = 3; },
       "field 'num_key_value_heads': expected a divisor of num_attention_heads (4), found 3"},
      {"value_heads_not_divisible", kQwen35Tiny, [](json& j) { j["linear_num_value_heads"] = 3; },
       "field 'linear_num_value_heads': expected a multiple of linear_num_key_heads (2), found 3"},
      {"rotary_odd", kQwen35Tiny,
       [](json& j) {
         j["partial_rotary_factor"] = 0.15625,
         j["rope_parameters"]["partial_rotary_factor"] = 0.15625;
         j["rope_parameters"].erase("mrope_section");
         j["rope_parameters"].erase("mrope_interleaved");
       },
       "rotary dim head_dim 32 x 0.15625 = 5 must be even"},
      {"rotary_over_head_dim", kQwen3Tiny, [](json& j) { j["partial_rotary_factor"] = 1.5; },
       "field 'partial_rotary_factor': expected a number in (0, 1], found 1.5"},
      {"rotary_not_whole", kQwen3Tiny, [](json& j) { j["partial_rotary_factor"] = 0.3; },
       "is not a whole rotary dimension"},
      {"head_dim_missing", kQwen3Tiny, [](json& j) { j.erase("head_dim"); },
       "missing field 'head_dim'"},
      {"hidden_size_negative", kQwen3Tiny, [](json& j) { j["hidden_size"] = -64; },
       "field 'hidden_size': expected a positive integer, found -64"},
      {"linear_dim_missing", kQwen35Tiny, [](json& j) { j.erase("linear_key_head_dim"); },
       "missing field 'linear_key_head_dim'"},
      {"no_text_config", kQwen35Vlm, [](json& j) { j.erase("text_config"); },
       "field 'text_config': expected an object"},
      {"gelu", kQwen3Tiny, [](json& j) { j["hidden_act"] = "gelu"; },
       "field 'hidden_act': expected \"silu\", found \"gelu\""},
      {"no_output_gate", kQwen35Tiny, [](json& j) { j["attn_output_gate"] = false; },
       "field 'attn_output_gate': false is not supported"},
      {"mrope_for_qwen3", kQwen3Tiny,
       [](json& j) {
         j["rope_parameters"]["mrope_section"] = {8, 4, 4};
       },
       "M-RoPE is not supported for Qwen3ForCausalLM"},
      {"not_object", kQwen3Tiny, [](json& j) { j = json::array(); }, "expected a JSON object"},
  };
}

class HfConfigRejects : public ::testing::TestWithParam<int> {};

TEST_P(HfConfigRejects, NamingFieldAndValue) {
  const Reject r = rejects()[static_cast<size_t>(GetParam())];
  json j = load(r.base);
  r.edit(j);
  const std::string msg = reject(j);
  expect_has(msg, "cfg.json: ");
  expect_has(msg, r.expected);
}

INSTANTIATE_TEST_SUITE_P(All, HfConfigRejects,
                         ::testing::Range(0, static_cast<int>(rejects().size())),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(rejects()[static_cast<size_t>(i.param)].label);
                         });

// --- manifest JSON round trip ---------------------------------------------------

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(config_to_json(a).dump(), config_to_json(b).dump());
  EXPECT_EQ(a.plan_string(), b.plan_string());
  // Bitwise equality of doubles (no tolerance: the round trip must be exact).
  EXPECT_EQ(std::memcmp(&a.rope.theta, &b.rope.theta, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.rms_norm_eps, &b.rms_norm_eps, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&a.rope.partial_factor, &b.rope.partial_factor, sizeof(double)), 0);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.linear_value_head_dim, b.linear_value_head_dim);
  EXPECT_EQ(a.rope.mrope_section, b.rope.mrope_section);
}

TEST(ConfigJson, RoundTripIsExact) {
  for (const char* rel :
       {kQwen3Tiny, kQwen3Sharded, kQwen35Tiny, kQwen35Vlm, "tests/data/configs/qwen3.5-9b.json",
        "samples/qwen3-sample/config.json"}) {
    SCOPED_TRACE(rel);
    ModelConfig c = load_hf_config(source_path(rel));
    c.rms_norm_eps = 0.1 + 0.2;  // a double with no short decimal form
    c.rope.theta = 1e7 / 3;
    const json j = config_to_json(c);
    const ModelConfig back = config_from_json(json::parse(j.dump()), "manifest.json");
    expect_same(c, back);
    EXPECT_EQ(back.rms_norm_eps, 0.1 + 0.2);
  }
}

TEST(ConfigJson, RejectsMissingOrWrongFields) {
  const ModelConfig c = load_hf_config(source_path(kQwen35Tiny));
  json j = config_to_json(c);
  j["rope"].erase("theta");
  expect_has(error_of([&] { config_from_json(j, "m.json"); }),
             "m.json: missing field 'config.rope.theta'");
  j = config_to_json(c);
  j["layer_plan"] = "LLXF";
  expect_has(error_of([&] { config_from_json(j, "m.json"); }), "field 'config.layer_plan'");
  j = config_to_json(c);
  j["num_kv_heads"] = 3;
  expect_has(error_of([&] { config_from_json(j, "m.json"); }), "field 'num_key_value_heads'");
  j = config_to_json(c);
  j["arch"] = "llama";
  expect_has(error_of([&] { config_from_json(j, "m.json"); }), "field 'config.arch'");
}

}  // namespace
}  // namespace qtk
