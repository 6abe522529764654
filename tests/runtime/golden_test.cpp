// Golden cases of every fixture model through the real programs:
// convert -> generate -> compare, by the fixtures rule (exact up to the
// first step whose reference top-1 margin is below 1e-3).
#include "kernels/cpu_features.h"
#include "pack/pack.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

struct GoldenModel {
  const char* dir;
};

class Golden : public ::testing::TestWithParam<GoldenModel> {};

TEST_P(Golden, GenerateMatchesReference) {
  const std::string dir = GetParam().dir;
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto golden = load_json(src(dir + "/golden.json"));
  std::string name = dir;
  for (char& c : name)
    if (c == '/') c = '_';
  const std::string prompts = fmt::format("{}/{}.golden.jsonl", work_dir(), name);
  const std::string out = fmt::format("{}/{}.results.jsonl", work_dir(), name);
  write_text(prompts, golden_prompts(golden));
  RunResult g = generate(pack, prompts, out, "--ignore-eos --margins --threads 2");
  ASSERT_EQ(g.status, 0) << g.err;
  RunResult c = run(fmt::format("{} {} {}", QTK_COMPARE_BIN, src(dir + "/golden.json"), out));
  EXPECT_EQ(c.status, 0) << c.out << c.err;
  // The summary names every case; none may be missing or have failed.
  EXPECT_NE(c.out.find(fmt::format("compare: {} cases", golden["cases"].size())), std::string::npos)
      << c.out;
  // Margins are the model's own: they must agree with the reference's to
  // within float32 noise on the steps before any near-tie.
  // note: 2e-3 absolute: the reference is float64, we run float32 with bf16
  // weights; logits differ by ~1e-4 and a margin is a difference of two.
  const auto results = read_jsonl(out);
  ASSERT_EQ(results.size(), golden["cases"].size());
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& exp = golden["cases"][i];
    const auto& got = results[i];
    ASSERT_EQ(got["id"], exp["id"]);
    for (size_t k = 0; k < exp["top1_margin"].size(); ++k) {
      if (exp["top1_margin"][k].get<double>() < 1e-3) break;
      if (got["output_token_ids"][k] != exp["output_token_ids"][k]) break;
      EXPECT_NEAR(got["top1_margin"][k].get<double>(), exp["top1_margin"][k].get<double>(), 2e-3)
          << exp["id"] << " step " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Golden,
                         ::testing::Values(GoldenModel{"tests/data/models/qwen3-tiny"},
                                           GoldenModel{"tests/data/models/qwen3-tiny-sharded-f32"},
                                           GoldenModel{"samples/qwen3-sample"},
                                           GoldenModel{"tests/data/models/qwen3.5-tiny"},
                                           GoldenModel{"tests/data/models/qwen3.5-tiny-vlm"},
                                           GoldenModel{"samples/qwen3.5-sample"},
                                           GoldenModel{"tests/data/models/qwen3-moe-tiny"},
                                           GoldenModel{"tests/data/models/qwen3.5-moe-tiny-vlm"},
                                           GoldenModel{"tests/data/models/qwen3-fp8-tiny"},
                                           GoldenModel{"tests/data/models/qwen3.5-moe-fp8-tiny"}),
                         [](const auto& info) {
                           std::string n = info.param.dir;
                           n = n.substr(n.rfind('/') + 1);
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// An FP8 pack (weights read in place with their block scales) and the same
// checkpoint dequantized by `convert --dtype f32` give the same bytes: the
// FP8 kernels compute each weight as the float32 product fp8 x scale, which
// is what the f32 pack stores, and then the f32 path's exact arithmetic
// (kernels/matmul_fp8.h). The run headers differ only in the precision line.
// Models: the qwen3-fp8-tiny fixture (its golden prompts), and a Qwen3.5
// checkpoint synthesised by bench/synth --fp8 from the qwen3.5-tiny-vlm
// config (nested text_config quantization; split_q_gate with head_dim 32 and
// the GDN in_proj q,k,v,z rows give 32- and 16-row scale blocks; FP8
// in_proj_qkv/z beside bf16 in_proj_b/a, the split_gdn_in_proj_ba layout;
// random prompts); and the qwen3.5-moe-fp8-tiny fixture (per-expert FP8
// experts stacked with their scales, expert width 160: 32-row scale blocks;
// split_q_gate with head_dim 64: 64-row blocks).
struct Fp8Model {
  const char* name;
  const char* dir;  // fixture with golden.json, or the config's model dir for synth
  bool synthesise;
  const char* block_text;
};

class Fp8Equivalence : public ::testing::TestWithParam<Fp8Model> {};

TEST_P(Fp8Equivalence, SameResultsAsItsFloat32Dequantization) {
  const Fp8Model& p = GetParam();
  std::string ckpt = src(p.dir);
  std::string prompts_text;
  if (p.synthesise) {
#ifdef QTK_SYNTH_BIN
    ckpt = fmt::format("{}/{}-ckpt", work_dir(), p.name);
    RunResult s =
        run(fmt::format("{} {}/config.json {} --seed 5 --fp8", QTK_SYNTH_BIN, src(p.dir), ckpt));
    ASSERT_EQ(s.status, 0) << s.err;
    for (int i = 0; i < 12; ++i) {
      std::vector<int> ids;
      for (int k = 0; k < 1 + (i * 37) % 90; ++k) ids.push_back((i * 131 + k * 17) % 500);
      prompts_text +=
          nlohmann::json{{"id", i}, {"prompt_token_ids", ids}, {"max_tokens", 10}}.dump() + "\n";
    }
#else
    GTEST_SKIP() << "built without QTK_BENCH: no bench/synth to synthesise the FP8 checkpoint";
#endif
  } else {
    prompts_text = golden_prompts(load_json(src(std::string(p.dir) + "/golden.json")));
  }
  const std::string fp8 = fmt::format("{}/{}.fp8.pack", work_dir(), p.name);
  const std::string f32 = fmt::format("{}/{}.f32.pack", work_dir(), p.name);
  RunResult c1 = run(fmt::format("{} {} {} --force", QTK_CONVERT_BIN, ckpt, fp8));
  ASSERT_EQ(c1.status, 0) << c1.err;
  RunResult c2 = run(fmt::format("{} {} {} --dtype f32 --force", QTK_CONVERT_BIN, ckpt, f32));
  ASSERT_EQ(c2.status, 0) << c2.err;
  if (p.synthesise) {
    EXPECT_TRUE(Pack::open(fp8)->has_transform("split_gdn_in_proj_ba"));
  }
  const std::string prompts = fmt::format("{}/{}.fp8-vs-f32.jsonl", work_dir(), p.name);
  write_text(prompts, prompts_text);
  const std::string out_fp8 = prompts + ".fp8.out", out_f32 = prompts + ".f32.out";
  // note: on the amx path the FP8 pack's bf16 matrices (lm_head, ...) run on
  // AMX tiles while the f32 pack's run the avx512 kernel, a different
  // arithmetic; there the identity is checked on the avx512 path, which an
  // AMX machine also has (the amx path keeps its own golden check).
  const std::string env = active_cpu_path() == CpuPath::kAmx ? "QTK_CPU_PATH=avx512 " : "";
  auto gen = [&](const std::string& pack, const std::string& out) {
    return run(fmt::format("{}{} --model {} --batch {} --out {} --ignore-eos --margins --threads 2",
                           env, QTK_GENERATE_BIN, pack, prompts, out));
  };
  RunResult a = gen(fp8, out_fp8);
  ASSERT_EQ(a.status, 0) << a.err;
  RunResult b = gen(f32, out_f32);
  ASSERT_EQ(b.status, 0) << b.err;
  const std::string text = read_text(out_fp8);
  EXPECT_EQ(text.find("\"error\""), std::string::npos) << text;
  EXPECT_EQ(text, read_text(out_f32));
  const auto meta = load_json(out_fp8 + ".meta.json");
  const std::string precision = meta["precision"];
  EXPECT_NE(precision.find("BF16+F8_E4M3 weights"), std::string::npos) << precision;
  EXPECT_NE(precision.find(p.block_text), std::string::npos) << precision;
  EXPECT_NE(precision.find("float32 product fp8 x scale"), std::string::npos) << precision;
  const std::string p32 = load_json(out_f32 + ".meta.json")["precision"];
  EXPECT_EQ(p32.find("F8"), std::string::npos) << p32;
  // The dequantized pack says its weights are not the checkpoint's FP8 as they are.
  EXPECT_NE(p32.find("matrices were dequantized from block-FP8 e4m3 at convert (fp8 x scale, "
                     "rounded once to nearest even)"),
            std::string::npos)
      << p32;
  EXPECT_EQ(precision.find("dequantized"), std::string::npos) << precision;
}

INSTANTIATE_TEST_SUITE_P(
    Models, Fp8Equivalence,
    ::testing::Values(
        Fp8Model{"qwen3_fp8_tiny", "tests/data/models/qwen3-fp8-tiny", false,
                 "float32 block scales (blocks of 64 or 128 rows x 128 columns)"},
        Fp8Model{"qwen3_5_vlm_synth_fp8", "tests/data/models/qwen3.5-tiny-vlm", true,
                 "float32 block scales (blocks of 16 or 32 or 128 rows x 128 columns)"},
        Fp8Model{"qwen3_5_moe_fp8_tiny", "tests/data/models/qwen3.5-moe-fp8-tiny", false,
                 "float32 block scales (blocks of 32 or 64 or 128 rows x 128 columns)"}),
    [](const auto& info) { return std::string(info.param.name); });

// The sample models' text prompts go through the pack's tokenizer and give
// the reference prompt ids, outputs and output text.
class SampleText : public ::testing::TestWithParam<GoldenModel> {};

TEST_P(SampleText, TextPromptsThroughTokenizer) {
  const std::string dir = GetParam().dir;
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto golden = load_json(src(dir + "/golden.json"));
  std::string lines;
  for (const auto& c : golden["cases"]) {
    lines +=
        nlohmann::json{
            {"id", c["id"]}, {"prompt", c["prompt"]}, {"max_tokens", c["max_new_tokens"]}}
            .dump() +
        "\n";
  }
  std::string name = dir.substr(dir.rfind('/') + 1);
  const std::string prompts = fmt::format("{}/{}.text.jsonl", work_dir(), name);
  const std::string out = fmt::format("{}/{}.text.results.jsonl", work_dir(), name);
  write_text(prompts, lines);
  RunResult g = generate(pack, prompts, out, "--ignore-eos");
  ASSERT_EQ(g.status, 0) << g.err;
  const auto results = read_jsonl(out);
  ASSERT_EQ(results.size(), golden["cases"].size());
  int near_ties = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& exp = golden["cases"][i];
    EXPECT_EQ(results[i]["prompt_token_ids"], exp["prompt_token_ids"]) << exp["id"];
    bool tie = false;
    for (const auto& m : exp["top1_margin"]) tie = tie || m.get<double>() < 1e-3;
    if (tie) {
      ++near_ties;
      continue;
    }
    EXPECT_EQ(results[i]["output_token_ids"], exp["output_token_ids"]) << exp["id"];
    EXPECT_EQ(results[i]["output_text"], exp["output_text"]) << exp["id"];
  }
  EXPECT_LT(near_ties, 3);  // the sample goldens have wide margins
}

INSTANTIATE_TEST_SUITE_P(Models, SampleText,
                         ::testing::Values(GoldenModel{"samples/qwen3-sample"},
                                           GoldenModel{"samples/qwen3.5-sample"}),
                         [](const auto& info) {
                           std::string n = info.param.dir;
                           n = n.substr(n.rfind('/') + 1);
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace qtk::rt_test
