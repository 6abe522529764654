// The config precedence rules of loaders/hf_config.cpp (R1..R9), one test per
// rule, on real-looking configs: the fixtures' 5.x configs, the real
// Qwen3.5-0.8B config, a 4.x-style Qwen3.5 config (rope_scaling and top-level
// rope fields) and configs with disagreeing duplicates. Each expectation is
// what transformers 5.17 computes from that config.json.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/json.h"
#include "loaders/model_config.h"
#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

using nlohmann::json;

const char* kQwen3Tiny = "tests/data/models/qwen3-tiny/config.json";
const char* kQwen35Tiny = "tests/data/models/qwen3.5-tiny/config.json";
const char* kQwen35Vlm = "tests/data/models/qwen3.5-tiny-vlm/config.json";
const char* kQwen35Real = "tests/data/configs/qwen3.5-0.8b.json";

json load(const char* rel) { return load_json_file(testing::source_path(rel)); }
ModelConfig parse(const json& j) { return parse_hf_config(j, "cfg.json"); }
std::string reject(const json& j) {
  return testing::error_of([&] { parse(j); });
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "expected '" << part << "' in: " << msg;
}

// The resolution line that mentions `needle`, or "" (none).
std::string resolution_with(const ModelConfig& c, const std::string& needle) {
  for (const std::string& r : c.resolution)
    if (r.find(needle) != std::string::npos) return r;
  return "";
}

// A Qwen3.5 config as transformers 4.x-era tools wrote it: rope_theta and
// partial_rotary_factor at the top level, M-RoPE in rope_scaling.
json qwen35_4x_style() {
  json j = load(kQwen35Tiny);
  j.erase("rope_parameters");
  j["rope_theta"] = 10000000.0;
  j["partial_rotary_factor"] = 0.25;
  j["rope_scaling"] = {
      {"type", "default"}, {"mrope_section", {2, 1, 1}}, {"mrope_interleaved", true}};
  return j;
}

TEST(ConfigPrecedence, FiveAndFourStyleQwen35ConfigsReadAlike) {
  const ModelConfig v5 = parse(load(kQwen35Tiny));
  const ModelConfig v4 = parse(qwen35_4x_style());
  EXPECT_DOUBLE_EQ(v5.rope.theta, 1e7);
  EXPECT_DOUBLE_EQ(v4.rope.theta, 1e7);
  EXPECT_EQ(v5.rope.rotary_dim, 8);
  EXPECT_EQ(v4.rope.rotary_dim, 8);
  EXPECT_EQ(v5.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(v4.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_TRUE(v4.rope.mrope_interleaved);
  // Nothing was found twice with different values in either.
  EXPECT_TRUE(v5.resolution.empty()) << v5.resolution.front();
  EXPECT_TRUE(v4.resolution.empty()) << v4.resolution.front();
}

// R1: the multimodal layout reads the text model from text_config only.
TEST(ConfigPrecedence, R1TextConfigOnlyInMultimodalLayout) {
  json j = load(kQwen35Vlm);
  j["hidden_size"] = 4096;  // a top-level duplicate: transformers ignores it
  j["rms_norm_eps"] = 0.5;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.hidden_size, load(kQwen35Vlm)["text_config"]["hidden_size"].get<int64_t>());
  EXPECT_NE(c.rms_norm_eps, 0.5);
  json moved = load(kQwen35Vlm);
  moved["vocab_size"] = moved["text_config"]["vocab_size"];
  moved["text_config"].erase("vocab_size");
  expect_has(reject(moved), "missing field 'text_config.vocab_size'");
  // Token ids do not change the forward pass: they fall back to the top level.
  json ids = load(kQwen35Vlm);
  ids["text_config"].erase("eos_token_id");
  ids["eos_token_id"] = 3;
  EXPECT_EQ(parse(ids).eos_token_ids, std::vector<int64_t>{3});
}

// R2: a non-empty rope_scaling replaces rope_parameters wholesale.
TEST(ConfigPrecedence, R2RopeScalingReplacesRopeParameters) {
  json j = load(kQwen35Tiny);
  j["rope_scaling"] = {{"type", "default"}, {"rope_theta", 5e6}, {"mrope_section", {1, 2, 1}}};
  const ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope.theta, 5e6);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{1, 2, 1}));
  expect_has(resolution_with(c, "rope_parameters ignored"), "rope_scaling used");
  // null or {} rope_scaling (what 4.x tools wrote) leaves rope_parameters in force.
  for (const json& empty : {json(nullptr), json::object()}) {
    json k = load(kQwen35Tiny);
    k["rope_scaling"] = empty;
    EXPECT_DOUBLE_EQ(parse(k).rope.theta, 1e7);
  }
}

// R3: rope_theta from the RoPE dict, else the top level, else 10000.
TEST(ConfigPrecedence, R3RopeTheta) {
  json both = load(kQwen3Tiny);
  both["rope_theta"] = 10000.0;  // a serialised class default beside rope_parameters' 1e6
  const ModelConfig c = parse(both);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  expect_has(resolution_with(c, "rope_theta"), "('rope_theta' 10000 ignored)");
  json top = load(kQwen3Tiny);
  top["rope_parameters"].erase("rope_theta");
  top["rope_theta"] = 2e6;
  EXPECT_DOUBLE_EQ(parse(top).rope.theta, 2e6);
  json none = load(kQwen3Tiny);
  none["rope_parameters"].erase("rope_theta");
  const ModelConfig d = parse(none);
  EXPECT_DOUBLE_EQ(d.rope.theta, 10000.0);
  expect_has(resolution_with(d, "rope_theta"), "absent, 10000 used");
}

// R4: partial_rotary_factor from the RoPE dict, else the top level, else the
// class default; rotary_dim = int(head_dim * factor).
TEST(ConfigPrecedence, R4PartialRotaryFactor) {
  json both = load(kQwen35Tiny);  // head_dim 32
  both["partial_rotary_factor"] = 0.5;
  const ModelConfig c = parse(both);
  EXPECT_EQ(c.rope.rotary_dim, 8);  // 0.25 from rope_parameters
  expect_has(resolution_with(c, "partial_rotary_factor"), "('partial_rotary_factor' 0.5 ignored)");
  json neither35 = load(kQwen35Tiny);
  neither35.erase("partial_rotary_factor");
  neither35["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(parse(neither35).rope.rotary_dim, 8);  // Qwen3_5TextConfig's 0.25
  json neither3 = load(kQwen3Tiny);
  EXPECT_EQ(parse(neither3).rope.rotary_dim, 32);  // Qwen3: full rotary
  json truncated = load(kQwen35Tiny);
  truncated["rope_parameters"]["partial_rotary_factor"] = 0.3;  // 32 * 0.3 = 9.6 -> 9: odd
  expect_has(reject(truncated), "= 9 must be even");
}

// R5: mrope_section only from the RoPE dict (Qwen3.5), default [11, 11, 10].
TEST(ConfigPrecedence, R5MropeSection) {
  json top = load(kQwen35Tiny);
  top["mrope_section"] = {4, 0, 0};
  const ModelConfig c = parse(top);
  EXPECT_EQ(c.rope.mrope_section, (std::vector<int64_t>{2, 1, 1}));
  expect_has(resolution_with(c, "'mrope_section' ignored"), "rope_parameters.mrope_section");
  json none = load(kQwen35Tiny);
  none["rope_parameters"].erase("mrope_section");
  const ModelConfig d = parse(none);
  EXPECT_EQ(d.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  expect_has(resolution_with(d, "mrope_section"), "[11, 11, 10] used");
  // Qwen3 has no M-RoPE: a section is ignored, not refused.
  json q3 = load(kQwen3Tiny);
  q3["rope_parameters"]["mrope_section"] = {8, 4, 4};
  const ModelConfig e = parse(q3);
  EXPECT_TRUE(e.rope.mrope_section.empty());
  expect_has(resolution_with(e, "mrope_section"), "has no M-RoPE");
  // Sections not summing to rotary_dim / 2 are what transformers runs as well.
  json sum = load(kQwen35Tiny);
  sum["rope_parameters"]["mrope_section"] = {2, 2, 1};
  EXPECT_EQ(parse(sum).rope.mrope_section, (std::vector<int64_t>{2, 2, 1}));
  json bad = load(kQwen35Tiny);
  bad["rope_parameters"]["mrope_section"] = {2, 1};
  expect_has(reject(bad), "field 'rope_parameters.mrope_section': expected 3 integers");
}

// R6: Qwen3.5 always interleaves M-RoPE.
TEST(ConfigPrecedence, R6MropeAlwaysInterleaved) {
  json off = load(kQwen35Tiny);
  off["rope_parameters"]["mrope_interleaved"] = false;
  const ModelConfig c = parse(off);
  EXPECT_TRUE(c.rope.mrope_interleaved);
  expect_has(resolution_with(c, "mrope_interleaved"), "always interleaves");
  json absent = load(kQwen35Tiny);
  absent["rope_parameters"].erase("mrope_interleaved");
  EXPECT_TRUE(parse(absent).rope.mrope_interleaved);
}

// R7: only the default RoPE type.
TEST(ConfigPrecedence, R7OnlyDefaultRopeType) {
  json yarn = load(kQwen3Tiny);
  yarn["rope_parameters"]["rope_type"] = "yarn";
  expect_has(reject(yarn), "only \"default\" RoPE is supported, found \"yarn\"");
  json scaled = load(kQwen35Real);
  scaled["text_config"]["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_has(reject(scaled), "field 'text_config.rope_scaling.type'");
}

// R8: an absent head_dim is the class default, not hidden_size / heads.
TEST(ConfigPrecedence, R8HeadDimClassDefault) {
  json q3 = load(kQwen3Tiny);
  q3.erase("head_dim");
  const ModelConfig c = parse(q3);
  EXPECT_EQ(c.head_dim, 128);
  expect_has(resolution_with(c, "head_dim"), "Qwen3Config's default");
  json q35 = load(kQwen35Real);
  q35["text_config"].erase("head_dim");
  EXPECT_EQ(parse(q35).head_dim, 256);
}

// R9: tie_word_embeddings at either level; different values are ambiguous.
TEST(ConfigPrecedence, R9TieWordEmbeddings) {
  json text_only = load(kQwen35Vlm);
  text_only.erase("tie_word_embeddings");
  text_only["text_config"]["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(text_only).tie_word_embeddings);
  json top_only = load(kQwen35Vlm);
  top_only["text_config"].erase("tie_word_embeddings");
  top_only["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(top_only).tie_word_embeddings);
  json neither = load(kQwen35Vlm);
  neither.erase("tie_word_embeddings");
  neither["text_config"].erase("tie_word_embeddings");
  EXPECT_FALSE(parse(neither).tie_word_embeddings);
  json disagree = load(kQwen35Vlm);
  disagree["tie_word_embeddings"] = true;
  expect_has(reject(disagree), "disagree");
}

// The resolution lines travel through the pack manifest.
TEST(ConfigPrecedence, ResolutionSurvivesTheManifest) {
  json j = load(kQwen3Tiny);
  j["rope_theta"] = 10000.0;
  const ModelConfig c = parse(j);
  ASSERT_FALSE(c.resolution.empty());
  const ModelConfig back = config_from_json(config_to_json(c), "manifest.json");
  EXPECT_EQ(back.resolution, c.resolution);
}

}  // namespace
}  // namespace qtk
