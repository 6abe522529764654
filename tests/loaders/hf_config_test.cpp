#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/json.h"
#include "loaders/model_config.h"
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
const char* kQwen3Moe = "tests/data/models/qwen3-moe-tiny/config.json";
const char* kQwen35MoeVlm = "tests/data/models/qwen3.5-moe-tiny-vlm/config.json";

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

// --- mixture of experts --------------------------------------------------------

TEST(HfConfigMoe, Qwen3MoeTiny) {
  const ModelConfig c = load_hf_config(source_path(kQwen3Moe));
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.hf_architecture, "Qwen3MoeForCausalLM");
  EXPECT_TRUE(c.has_moe());
  EXPECT_EQ(c.moe.num_experts, 8);  // spelled num_local_experts in this file
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_intermediate_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.shared_expert_intermediate, 0);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.mlp_plan_string(), "EEE");
  EXPECT_FALSE(c.has_dense_mlp());
}

TEST(HfConfigMoe, ExpertCountEitherSpelling) {
  json j = load(kQwen3Moe);
  j["num_experts"] = j["num_local_experts"];
  EXPECT_EQ(parse(j).moe.num_experts, 8);  // both given, agreeing
  j.erase("num_local_experts");
  EXPECT_EQ(parse(j).moe.num_experts, 8);  // the Hub's spelling alone
}

// The resolution lines of `c` that mention `needle`, joined.
std::string resolution_with(const ModelConfig& c, const std::string& needle) {
  std::string out;
  for (const std::string& r : c.resolution)
    if (r.find(needle) != std::string::npos) out += r + "\n";
  return out;
}

// Qwen3MoeConfig's default, said in a resolution line (inspect's "config:"),
// since the Qwen3-MoE releases set true.
TEST(HfConfigMoe, NormTopkProbDefaultsFalseForQwen3Moe) {
  json j = load(kQwen3Moe);
  EXPECT_EQ(resolution_with(parse(j), "norm_topk_prob"), "");
  j.erase("norm_topk_prob");
  const ModelConfig absent = parse(j);
  EXPECT_FALSE(absent.moe.norm_topk_prob);  // Qwen3MoeConfig's default
  EXPECT_EQ(resolution_with(absent, "norm_topk_prob"),
            "norm_topk_prob: absent, false used (Qwen3MoeConfig's default: the top-k weights are "
            "not renormalised; the Qwen3-MoE releases set true)\n");
  j["norm_topk_prob"] = false;
  EXPECT_FALSE(parse(j).moe.norm_topk_prob);
  EXPECT_EQ(resolution_with(parse(j), "norm_topk_prob"), "");
  j.erase("decoder_sparse_step");
  EXPECT_EQ(resolution_with(parse(j), "decoder_sparse_step"),
            "decoder_sparse_step: absent, 1 used (Qwen3MoeConfig's default)\n");
}

// A field outside the model's text config block is named with its prefix.
TEST(HfConfigMoe, BoundsNameTheNestedField) {
  json j = load(kQwen35MoeVlm);
  j["text_config"]["moe_intermediate_size"] = int64_t{1000000000000};
  EXPECT_EQ(error_of([&] { parse(j); }),
            "cfg.json: field 'text_config.moe_intermediate_size': expected at most 16777216, "
            "found 1000000000000");
}

// transformers' rule: layer i is MoE when i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0; every other layer is a dense MLP.
TEST(HfConfigMoe, SparseStepAndMlpOnlyLayers) {
  json j = load(kQwen3Moe);
  j["num_hidden_layers"] = 7;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.mlp_plan_string(), "DEDDDED");
  EXPECT_TRUE(c.has_dense_mlp());
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(3));
  j["decoder_sparse_step"] = 3;
  j["mlp_only_layers"] = json::array();
  EXPECT_EQ(parse(j).mlp_plan_string(), "DDEDDED");
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {0, 6};
  EXPECT_EQ(parse(j).mlp_plan_string(), "DEEEEED");
  j.erase("decoder_sparse_step");
  j.erase("mlp_only_layers");
  EXPECT_EQ(parse(j).mlp_plan_string(), "EEEEEEE");  // defaults: step 1, none dense
}

TEST(HfConfigMoe, Qwen35MoeVlm) {
  const ModelConfig c = load_hf_config(source_path(kQwen35MoeVlm));
  EXPECT_EQ(c.arch, Arch::kQwen3_5);
  EXPECT_EQ(c.hf_architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(c.plan_string(), "LFLF");
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_intermediate_size, 32);
  EXPECT_EQ(c.moe.shared_expert_intermediate, 48);
  EXPECT_TRUE(c.moe.norm_topk_prob);  // always, for Qwen3.5-MoE
  EXPECT_EQ(c.mlp_plan_string(), "EEEE");
  EXPECT_EQ(c.intermediate_size, 0);  // absent: no dense MLP
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
}

TEST(HfConfigMoe, Qwen35MoeTextOnlyAndAlwaysRenormalised) {
  const json vlm = load(kQwen35MoeVlm);
  json j = vlm["text_config"];
  j["architectures"] = {"Qwen3_5MoeForCausalLM"};
  j["norm_topk_prob"] = false;  // Qwen3_5MoeSparseMoeBlock has no such switch
  j["decoder_sparse_step"] = 2;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.hf_architecture, "Qwen3_5MoeForCausalLM");
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.mlp_plan_string(), "EEEE");
  // Both said to be ignored (a checkpoint that sets them expects an effect).
  EXPECT_EQ(resolution_with(c, "ignored (Qwen3_5MoeForCausalLM has no such switch"),
            "'norm_topk_prob' (false) ignored (Qwen3_5MoeForCausalLM has no such switch: every "
            "layer is MoE and the top-k weights are always renormalised)\n"
            "'decoder_sparse_step' (2) ignored (Qwen3_5MoeForCausalLM has no such switch: every "
            "layer is MoE and the top-k weights are always renormalised)\n");
  EXPECT_EQ(config_to_json(c)["moe"], config_to_json(parse(vlm))["moe"]);
}

TEST(HfConfigMoe, RealSizeConfigs) {
  const ModelConfig a = load_hf_config(source_path("tests/data/configs/qwen3-30b-a3b.json"));
  EXPECT_EQ(a.moe.num_experts, 128);
  EXPECT_EQ(a.moe.top_k, 8);
  EXPECT_EQ(a.moe.expert_intermediate_size, 768);
  EXPECT_TRUE(a.moe.norm_topk_prob);
  EXPECT_EQ(a.mlp_plan_string(), std::string(48, 'E'));
  const ModelConfig b = load_hf_config(source_path("tests/data/configs/qwen3.5-35b-a3b.json"));
  EXPECT_EQ(b.moe.num_experts, 256);
  EXPECT_EQ(b.moe.top_k, 8);
  EXPECT_EQ(b.moe.expert_intermediate_size, 512);
  EXPECT_EQ(b.moe.shared_expert_intermediate, 512);
  EXPECT_EQ(b.mlp_plan_string(), std::string(40, 'E'));
}

TEST(HfConfigMoe, DenseModelsHaveNoExperts) {
  const ModelConfig c = load_hf_config(source_path(kQwen3Tiny));
  EXPECT_FALSE(c.has_moe());
  EXPECT_EQ(c.mlp_plan_string(), "DDD");
  EXPECT_FALSE(config_to_json(c).contains("moe"));  // dense manifests are unchanged
  json j = load(kQwen3Tiny);
  j["num_experts"] = 0;  // written as 0 by some exports: still dense
  EXPECT_FALSE(parse(j).has_moe());
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
  // Disagreeing duplicates and absent values: config_precedence_test.cpp.
}

// tie_word_embeddings at either level: config_precedence_test.cpp (R9).

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
      {"moe_fields_dense_arch", kQwen3Tiny, [](json& j) { j["num_experts"] = 8; },
       "field 'num_experts': mixture-of-experts models are not supported for Qwen3ForCausalLM, "
       "found 8 (expected Qwen3MoeForCausalLM or a Qwen3_5Moe architecture)"},
      {"unknown_arch", kQwen3Moe, [](json& j) { j["architectures"] = {"MixtralForCausalLM"}; },
       "field 'architectures': expected Qwen3ForCausalLM, Qwen3_5ForCausalLM, "
       "Qwen3_5ForConditionalGeneration, Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM or "
       "Qwen3_5MoeForConditionalGeneration, found \"MixtralForCausalLM\""},
      {"moe_no_expert_count", kQwen3Moe, [](json& j) { j.erase("num_local_experts"); },
       "missing field 'num_experts' (or 'num_local_experts') for Qwen3MoeForCausalLM"},
      {"moe_expert_counts_disagree", kQwen3Moe, [](json& j) { j["num_experts"] = 16; },
       "fields 'num_experts' (16) and 'num_local_experts' (8) disagree"},
      {"moe_top_k_over", kQwen3Moe, [](json& j) { j["num_experts_per_tok"] = 9; },
       "field 'num_experts_per_tok': expected at most num_experts = 8, found 9"},
      {"moe_top_k_missing", kQwen3Moe, [](json& j) { j.erase("num_experts_per_tok"); },
       "missing field 'num_experts_per_tok' (expected a positive integer)"},
      {"moe_width_zero", kQwen3Moe, [](json& j) { j["moe_intermediate_size"] = 0; },
       "field 'moe_intermediate_size': expected a positive integer, found 0"},
      {"moe_sparse_step_zero", kQwen3Moe, [](json& j) { j["decoder_sparse_step"] = 0; },
       "field 'decoder_sparse_step': expected a positive integer, found 0"},
      {"moe_mlp_only_out_of_range", kQwen3Moe,
       [](json& j) {
         j["mlp_only_layers"] = {0, 3};
       },
       "field 'mlp_only_layers': expected layer indices in [0, 3), found 3"},
      {"moe_mlp_only_not_list", kQwen3Moe, [](json& j) { j["mlp_only_layers"] = 1; },
       "field 'mlp_only_layers': expected a list of layer indices, found 1"},
      {"moe_norm_topk_not_bool", kQwen3Moe, [](json& j) { j["norm_topk_prob"] = "yes"; },
       "field 'norm_topk_prob': expected true or false, found \"yes\""},
      {"moe_dense_layer_needs_intermediate", kQwen3Moe,
       [](json& j) {
         j["mlp_only_layers"] = {1};
         j.erase("intermediate_size");
       },
       "field 'intermediate_size': expected a positive integer, found 0"},
      {"moe35_no_shared_expert", kQwen35MoeVlm,
       [](json& j) { j["text_config"].erase("shared_expert_intermediate_size"); },
       "missing field 'text_config.shared_expert_intermediate_size'"},
      {"moe35_no_experts", kQwen35MoeVlm, [](json& j) { j["text_config"].erase("num_experts"); },
       "missing field 'text_config.num_experts' (or 'text_config.num_local_experts') for "
       "Qwen3_5MoeForConditionalGeneration"},
      {"quant_awq", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
       },
       "field 'quantization_config.quant_method': not supported: quant_method \"awq\""},
      {"quant_gptq_nested", kQwen35Vlm,
       [](json& j) {
         j["text_config"]["quantization_config"] = {{"quant_method", "gptq"}};
       },
       "field 'text_config.quantization_config.quant_method': not supported: quant_method "
       "\"gptq\""},
      {"quant_method_missing", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"fmt", "e4m3"}};
       },
       "field 'quantization_config.quant_method': expected a string (\"fp8\"), found nothing"},
      {"quant_not_object", kQwen3Tiny, [](json& j) { j["quantization_config"] = "fp8"; },
       "field 'quantization_config': expected an object, found \"fp8\""},
      {"fp8_e5m2", kQwen3Tiny,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}};
       },
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
         j["quantization_config"] = {{"quant_method", "fp8"},
                                     {"modules_to_not_convert", "lm_head"}};
       },
       "field 'quantization_config.modules_to_not_convert': expected a list of names"},
      {"fp8_levels_disagree", kQwen35Vlm,
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "fp8"}};
         j["text_config"]["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}};
       },
       "fields 'quantization_config' ({\"quant_method\":\"fp8\"}) and "
       "'text_config.quantization_config' ({\"fmt\":\"e4m3\",\"quant_method\":\"fp8\"}) "
       "disagree (at key 'fmt': absent vs \"e4m3\")"},
      {"layer_types_length", kQwen35Tiny, [](json& j) { j["layer_types"].erase(0); },
       "field 'layer_types': expected 8 entries (num_hidden_layers), found 7"},
      {"layer_type_unknown", kQwen35Tiny, [](json& j) { j["layer_types"][0] = "mamba"; },
       "field 'layer_types[0]': expected \"full_attention\" or \"linear_attention\", found "
       "\"mamba\""},
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
      {"rotary_odd_truncated", kQwen3Tiny, [](json& j) { j["partial_rotary_factor"] = 0.3; },
       "rotary dim head_dim 32 x 0.3 = 9 must be even"},
      {"hidden_size_negative", kQwen3Tiny, [](json& j) { j["hidden_size"] = -64; },
       "field 'hidden_size': expected a positive integer, found -64"},
      // Over the limit: the message says the limit.
      {"hidden_size_huge", kQwen3Tiny, [](json& j) { j["hidden_size"] = int64_t{1} << 62; },
       "field 'hidden_size': expected a positive integer of at most 2^40 = 1099511627776, found "
       "4611686018427387904"},
      // Per-layer tables are built from the layer count: a huge one is refused
      // first (it exhausted memory before the tensors were met).
      // Sizes whose products (heads x head_dim, ...) could wrap around int64
      // and pass a shape check: bounded one by one (a pack's config too).
      {"heads_huge", kQwen3Tiny, [](json& j) { j["num_attention_heads"] = int64_t{1} << 20; },
       "field 'num_attention_heads': expected at most 65536, found 1048576"},
      {"moe_width_huge", kQwen3Tiny,
       [](json& j) {
         j["architectures"] = {"Qwen3MoeForCausalLM"};
         j["num_experts"] = 8;
         j["num_experts_per_tok"] = 2;
         j["moe_intermediate_size"] = int64_t{1} << 30;
       },
       "field 'moe_intermediate_size': expected at most 16777216, found 1073741824"},
      {"num_layers_huge", kQwen3Tiny, [](json& j) { j["num_hidden_layers"] = 1000000000; },
       "field 'num_hidden_layers': expected at most 65536 layers, found 1000000000"},
      {"vocab_size_huge", kQwen3Tiny, [](json& j) { j["vocab_size"] = int64_t{1} << 62; },
       "field 'vocab_size': expected a positive integer of at most 2^40 = 1099511627776, found "
       "4611686018427387904"},
      {"mrope_section_huge", kQwen35Tiny,
       [](json& j) {
         j["rope_parameters"]["mrope_section"] = {int64_t{1} << 40, 1, 1};
       },
       "field 'rope_parameters.mrope_section': expected 3 integers in [0, 2^20 = 1048576], found "
       "[1099511627776,1,1]"},
      // A RoPE value is named where it is in the file.
      {"rope_theta_in_rope_parameters", kQwen3Tiny,
       [](json& j) { j["rope_parameters"]["rope_theta"] = -1; },
       "field 'rope_parameters.rope_theta': expected a positive number, found -1"},
      {"rope_theta_zero_in_rope_parameters", kQwen35Vlm,
       [](json& j) { j["text_config"]["rope_parameters"]["rope_theta"] = 0; },
       "field 'text_config.rope_parameters.rope_theta': expected a positive number, found 0"},
      {"rope_theta_top_level", kQwen3Tiny,
       [](json& j) {
         j["rope_parameters"].erase("rope_theta");
         j["rope_theta"] = 0;
       },
       "field 'rope_theta': expected a positive number, found 0"},
      {"partial_factor_zero_in_rope_parameters", kQwen35Tiny,
       [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0; },
       "field 'rope_parameters.partial_rotary_factor': expected a number in (0, 1], found 0"},
      {"partial_factor_two_in_rope_parameters", kQwen35Tiny,
       [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 2; },
       "field 'rope_parameters.partial_rotary_factor': expected a number in (0, 1], found 2"},
      // A text-model field missing from text_config is named there.
      {"vlm_hidden_size_missing", kQwen35Vlm,
       [](json& j) { j["text_config"].erase("hidden_size"); },
       "missing field 'text_config.hidden_size' (expected a positive integer)"},
      {"linear_dim_missing", kQwen35Tiny, [](json& j) { j.erase("linear_key_head_dim"); },
       "missing field 'linear_key_head_dim'"},
      {"no_text_config", kQwen35Vlm, [](json& j) { j.erase("text_config"); },
       "field 'text_config': expected an object"},
      {"gelu", kQwen3Tiny, [](json& j) { j["hidden_act"] = "gelu"; },
       "field 'hidden_act': expected \"silu\", found \"gelu\""},
      {"no_output_gate", kQwen35Tiny, [](json& j) { j["attn_output_gate"] = false; },
       "field 'attn_output_gate': false is not supported"},
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
  for (const char* rel : {kQwen3Tiny, kQwen3Sharded, kQwen35Tiny, kQwen35Vlm,
                          "tests/data/configs/qwen3.5-9b.json", "samples/qwen3-sample/config.json",
                          kQwen3Moe, kQwen35MoeVlm, "tests/data/configs/qwen3-30b-a3b.json"}) {
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

  const ModelConfig m = load_hf_config(source_path(kQwen3Moe));
  j = config_to_json(m);
  j["moe"]["mlp_plan"] = "EXE";
  expect_has(error_of([&] { config_from_json(j, "m.json"); }),
             "m.json: field 'config.moe.mlp_plan': expected letters D and E, found \"EXE\"");
  j = config_to_json(m);
  j["moe"]["mlp_plan"] = "EE";
  expect_has(error_of([&] { config_from_json(j, "m.json"); }),
             "m.json: field 'mlp_plan': expected 3 layers (num_hidden_layers), found 2");
  j = config_to_json(m);
  j["moe"]["top_k"] = 9;
  expect_has(error_of([&] { config_from_json(j, "m.json"); }),
             "field 'num_experts_per_tok': expected an integer in [1, num_experts = 8], found 9");
  j = config_to_json(m);
  j["moe"].erase("norm_topk_prob");
  expect_has(error_of([&] { config_from_json(j, "m.json"); }),
             "m.json: missing field 'config.moe.norm_topk_prob'");
}

// Values of the right type that no model runs with: each named, with what
// was expected and found.
TEST(ConfigJson, RejectsValuesNoModelRunsWith) {
  const ModelConfig c = load_hf_config(source_path(kQwen35Tiny));
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"theta 0", [](json& j) { j["rope"]["theta"] = 0; },
       "field 'rope_theta': expected a positive finite number, found 0"},
      {"theta -1", [](json& j) { j["rope"]["theta"] = -1.0; }, "field 'rope_theta'"},
      {"eps 1e300", [](json& j) { j["rms_norm_eps"] = 1e300; },
       "field 'rms_norm_eps': expected a positive number below 1, found 1e+300"},
      {"eps 0", [](json& j) { j["rms_norm_eps"] = 0; }, "field 'rms_norm_eps'"},
      {"context 0", [](json& j) { j["max_position_embeddings"] = 0; },
       "field 'max_position_embeddings': expected a positive integer, found 0"},
      {"context -5", [](json& j) { j["max_position_embeddings"] = -5; },
       "field 'max_position_embeddings'"},
      {"mrope -3",
       [](json& j) {
         j["rope"]["mrope_section"] = {-3, 9, 2};
       },
       "field 'mrope_section': expected entries of 0 or more, found [-3,9,2]"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    json j = config_to_json(c);
    k.edit(j);
    expect_has(error_of([&] { config_from_json(j, "m.json"); }), std::string("m.json: ") + k.says);
  }
}

}  // namespace
}  // namespace qtk
