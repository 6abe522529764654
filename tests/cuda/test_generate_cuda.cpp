// `generate --device cuda` through the real programs (convert -> generate ->
// compare), on a machine with an NVIDIA GPU:
//  - f32 on the four fixture models against their golden.json, by the
//    fixtures rule (compare's exit status);
//  - bf16 on the two sample models against a CPU run of the same prompts
//    (bf16 is not exact: agreement is reported and bounded, see below);
//  - batch invariance through generate: each sequence alone, all batched,
//    and chunked prefill (--max-batched-tokens 7), plus a preempting cache:
//    byte-identical results files, with f32 and with bf16.
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

std::string name_of(const std::string& dir) {
  std::string n = dir.substr(dir.rfind('/') + 1);
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, F32MatchesReference) {
  const std::string dir = GetParam();
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto golden = load_json(src(dir + "/golden.json"));
  const std::string prompts = fmt::format("{}/{}.golden.jsonl", work_dir(), name_of(dir));
  const std::string out = fmt::format("{}/{}.cuda_f32.jsonl", work_dir(), name_of(dir));
  write_text(prompts, golden_prompts(golden));
  RunResult g =
      generate(pack, prompts, out, "--device cuda --precision f32 --ignore-eos --margins");
  ASSERT_EQ(g.status, 0) << g.err;
  const auto meta = load_json(out + ".meta.json");
  EXPECT_EQ(meta["settings"]["device"], "cuda") << meta.dump(2);
  EXPECT_EQ(meta["settings"]["precision"], "f32") << meta.dump(2);
  RunResult c = run(fmt::format("{} {} {}", QTK_COMPARE_BIN, src(dir + "/golden.json"), out));
  EXPECT_EQ(c.status, 0) << c.out << c.err;
  EXPECT_NE(c.out.find(fmt::format("compare: {} cases", golden["cases"].size())), std::string::npos)
      << c.out;
  std::printf("[ cuda f32 ] %s: %s", name_of(dir).c_str(), c.out.c_str());
  // note: 2e-3 absolute, as on the CPU. The f32 path once drifted up to
  // 8.7e-3 on qwen3-tiny: its RoPE used double-precision frequencies where
  // transformers uses float32 ones rounded to bf16 for bf16 checkpoints; the
  // kernel now computes them as the CPU does (kernels/rope.h).
  const auto results = read_jsonl(out);
  ASSERT_EQ(results.size(), golden["cases"].size());
  double worst = 0.0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& exp = golden["cases"][i];
    const auto& got = results[i];
    for (size_t k = 0; k < exp["top1_margin"].size(); ++k) {
      if (exp["top1_margin"][k].get<double>() < 1e-3) break;
      if (got["output_token_ids"][k] != exp["output_token_ids"][k]) break;
      const double d =
          std::abs(got["top1_margin"][k].get<double>() - exp["top1_margin"][k].get<double>());
      worst = std::max(worst, d);
      EXPECT_LE(d, 2e-3) << exp["id"] << " step " << k;
    }
  }
  std::printf("[ cuda f32 ] %s: largest margin deviation from the float64 reference %.3g\n",
              name_of(dir).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaGolden,
    ::testing::Values("tests/data/models/qwen3-tiny", "tests/data/models/qwen3-tiny-sharded-f32",
                      "tests/data/models/qwen3.5-tiny", "tests/data/models/qwen3.5-tiny-vlm",
                      "tests/data/models/qwen3-moe-tiny", "tests/data/models/qwen3.5-moe-tiny-vlm",
                      "tests/data/models/qwen3-fp8-tiny", "tests/data/models/qwen3.5-moe-fp8-tiny"),
    [](const auto& info) { return name_of(info.param); });

// bf16 on the sample models against the CPU (float32) run of the same text
// prompts. note: bf16 weights, activations and K/V move logits by ~1e-2 on
// these models, so a bf16 run may leave the CPU's path only where the CPU's
// own top-1 margin is small: each case must equal the CPU's tokens up to
// the first step whose CPU margin is below 0.5 (the sample models' margins
// are mostly wide). The share of tokens that agree is printed for the report.
class CudaBf16 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBf16, AgreesWithCpu) {
  const std::string dir = GetParam();
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto golden = load_json(src(dir + "/golden.json"));
  std::string lines;
  for (const auto& c : golden["cases"])
    lines +=
        nlohmann::json{
            {"id", c["id"]}, {"prompt", c["prompt"]}, {"max_tokens", c["max_new_tokens"]}}
            .dump() +
        "\n";
  const std::string prompts = fmt::format("{}/{}.text.jsonl", work_dir(), name_of(dir));
  write_text(prompts, lines);
  const std::string cpu = fmt::format("{}/{}.cpu.jsonl", work_dir(), name_of(dir));
  const std::string gpu = fmt::format("{}/{}.cuda_bf16.jsonl", work_dir(), name_of(dir));
  RunResult rc = generate(pack, prompts, cpu, "--device cpu --ignore-eos --margins");
  ASSERT_EQ(rc.status, 0) << rc.err;
  // bf16 is the default precision on cuda.
  RunResult rg = generate(pack, prompts, gpu, "--device cuda --ignore-eos --margins");
  ASSERT_EQ(rg.status, 0) << rg.err;
  EXPECT_EQ(load_json(gpu + ".meta.json")["settings"]["precision"], "bf16");
  const auto a = read_jsonl(cpu), b = read_jsonl(gpu);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), golden["cases"].size());
  int64_t agree = 0, total = 0, identical = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& ta = a[i]["output_token_ids"];
    const auto& tb = b[i]["output_token_ids"];
    ASSERT_EQ(ta.size(), tb.size()) << a[i]["id"];
    size_t k = 0;
    while (k < ta.size() && ta[k] == tb[k]) ++k;
    agree += static_cast<int64_t>(k);
    total += static_cast<int64_t>(ta.size());
    identical += k == ta.size();
    if (k == ta.size()) continue;
    double min_margin = 1e30;
    for (size_t j = 0; j <= k; ++j)
      min_margin = std::min(min_margin, a[i]["top1_margin"][j].get<double>());
    EXPECT_LT(min_margin, 0.5) << a[i]["id"] << ": bf16 left the CPU's tokens at step " << k
                               << " although every CPU margin up to it is >= 0.5";
  }
  std::printf(
      "[ cuda bf16] %s: %lld of %lld tokens agree with the CPU before divergence; %lld of %zu "
      "cases identical\n",
      name_of(dir).c_str(), static_cast<long long>(agree), static_cast<long long>(total),
      static_cast<long long>(identical), a.size());
  // note: a sanity floor far under what bf16 gave on these models (about
  // 80-90% vs the goldens, bench/HISTORY.md): a broken bf16 path agrees
  // on a few tokens only.
  EXPECT_GE(agree * 2, total) << "fewer than half of the tokens agree with the CPU";
}

INSTANTIATE_TEST_SUITE_P(Samples, CudaBf16,
                         ::testing::Values("samples/qwen3-sample", "samples/qwen3.5-sample"),
                         [](const auto& info) { return name_of(info.param); });

// 48 prompts of mixed lengths (1..160 tokens) and budgets (1..12 tokens),
// some with M-RoPE positions on models that take them. long_prompts: every
// third prompt has 129..320 tokens (2..5 full 64-token chunks, the chunked
// GDN path of bf16), the others 1..100.
std::string make_prompts(int64_t vocab, bool mrope, bool long_prompts, int64_t* longest) {
  std::mt19937 rng(long_prompts ? 8765 : 4321);
  std::string s;
  *longest = 0;
  for (int i = 0; i < 48; ++i) {
    const int len = long_prompts ? (i % 3 == 0 ? 129 + static_cast<int>(rng() % 192)
                                               : 1 + static_cast<int>(rng() % 100))
                    : i % 9 == 0 ? 100 + static_cast<int>(rng() % 60)
                                 : 1 + static_cast<int>(rng() % 40);
    const int max_tokens = 1 + static_cast<int>(rng() % 12);
    std::vector<int> ids(len);
    for (int& t : ids) t = static_cast<int>(rng() % vocab);
    nlohmann::json j = {
        {"id", fmt::format("p{}", i)}, {"prompt_token_ids", ids}, {"max_tokens", max_tokens}};
    if (mrope && i % 5 == 1) {
      std::vector<int> t(len), h(len), w(len);
      for (int k = 0; k < len; ++k) {
        t[k] = k < 3 ? k : 3;
        h[k] = k < 3 ? k : 3 + (k - 3) / 4;
        w[k] = k < 3 ? k : 3 + (k - 3) % 4;
      }
      j["mrope_position_ids"] = {t, h, w};
    }
    *longest = std::max<int64_t>(*longest, len + max_tokens);
    s += j.dump() + "\n";
  }
  return s;
}

struct InvarianceCase {
  const char* dir;  // a model directory, or (synthesized) a config file
  bool mrope;
  bool long_prompts = false;
  bool synthesized = false;
};

// note: the fixtures and samples are too narrow for the K-sliced products
// (Gemm: K >= 2048), so two random-weight models of such widths are
// synthesized from configs in tests/cuda/data (o_proj, down_proj and, in
// Qwen3.5, the GDN out_proj at K 2048).
std::string synthesized_pack(const std::string& config_rel) {
#ifdef QTK_SYNTH_BIN
  const std::string name = name_of(config_rel);
  const std::string hf = fmt::format("{}/{}.hf", work_dir(), name);
  const std::string pack = fmt::format("{}/{}.pack", work_dir(), name);
  RunResult r = run(fmt::format("rm -rf {} && {} {} {} && {} {} {} --force", hf, QTK_SYNTH_BIN,
                                src(config_rel), hf, QTK_CONVERT_BIN, hf, pack));
  if (r.status != 0) {
    ADD_FAILURE() << "synth/convert " << config_rel << " failed: " << r.err;
    return {};
  }
  return pack;
#else
  ADD_FAILURE() << "built without synth (QTK_BENCH=OFF): " << config_rel;
  return {};
#endif
}

class CudaInvariance : public ::testing::TestWithParam<InvarianceCase> {};

TEST_P(CudaInvariance, ResultsFilesByteIdentical) {
  const std::string dir = GetParam().dir;
  const std::string pack = GetParam().synthesized ? synthesized_pack(dir) : pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto config = load_json(src(GetParam().synthesized ? dir : dir + "/config.json"));
  const int64_t vocab = config.contains("text_config")
                            ? config["text_config"]["vocab_size"].get<int64_t>()
                            : config["vocab_size"].get<int64_t>();
  int64_t longest = 0;
  const std::string set_name = GetParam().long_prompts ? "inv_long" : "inv";
  const std::string prompts = fmt::format("{}/{}.{}.jsonl", work_dir(), name_of(dir), set_name);
  write_text(prompts, make_prompts(vocab, GetParam().mrope, GetParam().long_prompts, &longest));
  for (const char* precision : {"f32", "bf16"}) {
    // env: variables for the generate process (e.g. "QTK_PIPELINE=0 ").
    auto run_on = [&](const std::string& batch, const std::string& tag, const std::string& flags,
                      const std::string& env = "") {
      const std::string out =
          fmt::format("{}/{}.{}.{}.{}.jsonl", work_dir(), name_of(dir), set_name, precision, tag);
      RunResult r =
          run(fmt::format("{}{} --model {} --batch {} --out {} --device cuda "
                          "--precision {} --margins {}",
                          env, QTK_GENERATE_BIN, pack, batch, out, precision, flags));
      EXPECT_EQ(r.status, 0) << precision << " " << tag << ": " << r.err;
      return out;
    };
    auto run_with = [&](const std::string& tag, const std::string& flags,
                        const std::string& env = "") {
      return run_on(prompts, tag, "--ignore-eos " + flags, env);
    };
    // One sequence at a time: decode steps of batch 1 (graph bucket 1).
    const std::string alone = read_text(run_with("alone", "--max-num-seqs 1"));
    ASSERT_EQ(std::count(alone.begin(), alone.end(), '\n'), 48) << precision;
    ASSERT_EQ(alone.find("\"error\""), std::string::npos) << alone;
    EXPECT_EQ(read_text(run_with("batched", "")), alone)
        << precision << ": batched differs from alone";
    EXPECT_EQ(read_text(run_with("mbt7", "--max-batched-tokens 7")), alone)
        << precision << ": --max-batched-tokens 7 differs from alone";
    EXPECT_EQ(read_text(run_with("bs5", "--block-size 5 --max-num-seqs 7")), alone)
        << precision << ": --block-size 5 --max-num-seqs 7 differs from alone";
    // A cache that holds one longest sequence only: preemption and recompute.
    const std::string pre = run_with("preempt", fmt::format("--block-size 5 --kv-cache-blocks {} "
                                                            "--max-batched-tokens 23",
                                                            (longest + 4) / 5));
    EXPECT_EQ(read_text(pre), alone) << precision << ": preemption changed the results";
    EXPECT_GT(load_json(pre + ".meta.json")["stats"]["preemptions"].get<int64_t>(), 0) << precision;
    // Every step at a time (no pipelined steps, runtime/scheduler.h).
    EXPECT_EQ(read_text(run_with("serial", "", "QTK_PIPELINE=0 ")), alone)
        << precision << ": QTK_PIPELINE=0 differs from the pipelined steps";
    // Sequences that stop on a token the next pipelined step was already
    // built on: every other prompt stops on its third generated token (from
    // the run above); pipelined and step by step give the same files.
    std::string stop_prompts;
    {
      std::istringstream in(alone), pin(read_text(prompts));
      std::string line, pline;
      int i = 0, stopping = 0;
      while (std::getline(in, line) && std::getline(pin, pline)) {
        auto p = nlohmann::json::parse(pline);
        const auto got = nlohmann::json::parse(line)["output_token_ids"];
        if (i++ % 2 == 0 && got.size() >= 4) {
          p["stop_token_ids"] = {got[2]};
          ++stopping;
        }
        stop_prompts += p.dump() + "\n";
      }
      EXPECT_GT(stopping, 0) << precision;
    }
    const std::string stop_file =
        fmt::format("{}/{}.{}.stops.jsonl", work_dir(), name_of(dir), set_name);
    write_text(stop_file, stop_prompts);
    const std::string stops = read_text(run_on(stop_file, "stops", "--ignore-eos"));
    EXPECT_EQ(read_text(run_on(stop_file, "stops-serial", "--ignore-eos", "QTK_PIPELINE=0 ")),
              stops)
        << precision << ": stopping sequences differ between pipelined and serial steps";
    EXPECT_NE(stops.find("\"finish_reason\": \"stop\""), std::string::npos) << precision;
    std::printf(
        "[ cuda inv ] %s%s %s: alone, batched, mbt7, bs5, preempt, serial, stops byte-identical: "
        "%s\n",
        name_of(dir).c_str(), GetParam().long_prompts ? " (long prompts)" : "", precision,
        ::testing::Test::HasFailure() ? "NO" : "yes");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaInvariance,
    ::testing::Values(InvarianceCase{"tests/data/models/qwen3-tiny", false},
                      InvarianceCase{"tests/data/models/qwen3.5-tiny", true},
                      InvarianceCase{"tests/data/models/qwen3-moe-tiny", false},
                      InvarianceCase{"tests/data/models/qwen3.5-moe-tiny-vlm", true},
                      InvarianceCase{"samples/qwen3-sample", false},
                      InvarianceCase{"samples/qwen3.5-sample", false},
                      // note: prompts over 128 tokens, so that bf16 really
                      // runs full chunks through the chunked GDN kernel
                      // (mbt7 and preempt then split them only at 64s).
                      InvarianceCase{"tests/data/models/qwen3.5-tiny", true, true},
                      InvarianceCase{"samples/qwen3.5-sample", false, true},
                      InvarianceCase{"tests/cuda/data/qwen3-sliced.json", false, false, true},
                      InvarianceCase{"tests/cuda/data/qwen3.5-sliced.json", true, true, true}),
    [](const auto& info) {
      return name_of(info.param.dir) + (info.param.long_prompts ? "_long" : "");
    });

// A token whose embedding is NaN (tests/runtime/test_util.h): every line
// whose prompt holds it, or whose undamaged result generates it before its
// last token (it is then fed back), gets an error line naming the first output
// token whose logits are NaN (no greedy token is defined) and every other line
// the bits of the undamaged pack, alone and batched, pipelined and step by step, f32 and bf16;
// generate exits 3 and the device keeps running (the NaN row's argmax gives a valid id to the step
// already queued on it). Dense, MoE (NaN through the router) and GDN models.
class CudaNonFinite : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaNonFinite, LinesReachingANaNGetErrorLinesAndTheOthersTheirBits) {
  const std::string dir = GetParam();
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const std::string bad = pack_with_nan_embedding(pack, 7);
  ASSERT_FALSE(bad.empty());
  const auto config = load_json(src(dir + "/config.json"));
  const int64_t vocab = config.contains("text_config")
                            ? config["text_config"]["vocab_size"].get<int64_t>()
                            : config["vocab_size"].get<int64_t>();
  // 24 prompts; every third holds token 7 somewhere, at its end for some.
  std::mt19937 rng(77);
  std::string prompts;
  std::vector<std::vector<int>> prompt_ids;
  for (int i = 0; i < 24; ++i) {
    std::vector<int> ids(1 + rng() % 30);
    for (int& t : ids) t = 8 + static_cast<int>(rng() % (vocab - 8));
    if (i % 3 == 0) ids[i % 2 ? ids.size() - 1 : rng() % ids.size()] = 7;
    prompt_ids.push_back(ids);
    prompts +=
        nlohmann::json({{"id", i}, {"prompt_token_ids", ids}, {"max_tokens", 1 + i % 9}}).dump() +
        "\n";
  }
  const std::string in = fmt::format("{}/{}.nan.jsonl", work_dir(), name_of(dir));
  write_text(in, prompts);
  for (const char* precision : {"f32", "bf16"}) {
    // env: variables for the generate process (e.g. "QTK_PIPELINE=0 ").
    auto run_on = [&](const std::string& p, const std::string& tag, const std::string& flags,
                      int want_status, const std::string& env = "") {
      const std::string out =
          fmt::format("{}/{}.nan.{}.{}.jsonl", work_dir(), name_of(dir), precision, tag);
      const RunResult r = run(
          fmt::format("{}{} --model {} --batch {} --out {} --device cuda --precision {} --margins "
                      "--ignore-eos --no-verify {}",
                      env, QTK_GENERATE_BIN, p, in, out, precision, flags));
      EXPECT_EQ(r.status, want_status) << precision << " " << tag << ": " << r.err;
      return read_jsonl(out);
    };
    const auto good = run_on(pack, "good", "", 0);
    ASSERT_EQ(good.size(), 24u);
    // The output token at which each line must fail (0: none).
    std::vector<int64_t> fails_at;
    int64_t expected_errors = 0;
    for (size_t i = 0; i < 24; ++i) {
      fails_at.push_back(first_output_token_after_nan(prompt_ids[i], good[i], 7));
      if (i % 3 == 0) {
        EXPECT_EQ(fails_at.back(), 1) << "line " << i + 1;
      }
      expected_errors += fails_at.back() > 0;
    }
    int64_t errors = 0;
    for (const auto& [tag, flags] :
         std::vector<std::pair<std::string, std::string>>{{"alone", "--max-num-seqs 1"},
                                                          {"batched", ""},
                                                          {"mbt7", "--max-batched-tokens 7"},
                                                          {"serial", ""}}) {
      const auto res = run_on(bad, tag, flags, 3, tag == "serial" ? "QTK_PIPELINE=0 " : "");
      ASSERT_EQ(res.size(), 24u) << precision << " " << tag;
      for (size_t i = 0; i < 24; ++i) {
        if (fails_at[i] > 0) {
          ASSERT_TRUE(res[i].contains("error")) << precision << " " << tag << " " << res[i];
          EXPECT_NE(res[i]["error"].get<std::string>().find(fmt::format(
                        "line {}: the model computed a non-finite logit (NaN or infinity) for "
                        "output token {} at position ",
                        i + 1, fails_at[i])),
                    std::string::npos)
              << res[i];
          ++errors;
        } else {
          EXPECT_EQ(res[i], good[i]) << precision << " " << tag << " line " << i + 1;
        }
      }
    }
    EXPECT_EQ(errors, 4 * expected_errors) << precision;
    std::printf(
        "[ cuda nan ] %s %s: error lines where token 7 is read (%lld of 24 lines, %lld by a "
        "generated 7), other lines identical: %s\n",
        name_of(dir).c_str(), precision, static_cast<long long>(expected_errors),
        static_cast<long long>(expected_errors - 8), ::testing::Test::HasFailure() ? "NO" : "yes");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaNonFinite,
                         ::testing::Values("tests/data/models/qwen3-moe-tiny",
                                           "tests/data/models/qwen3.5-moe-tiny-vlm",
                                           "tests/data/models/qwen3.5-tiny-vlm"),
                         [](const auto& info) { return name_of(info.param); });

// The GEMM plan cache (runtime/backend/cuda/cuda_startup.h) through generate: a run
// that takes its GEMM choices from the cache file writes the results file
// of a run that tuned from scratch, byte for byte, whether the file came
// from earlier runs (partly or fully covering the ranges used) or from
// --tune-only; a foreign, corrupt or stale file is ignored with a message
// naming it, and tuning runs.
struct PlanCacheCase {
  const char* dir;
  bool mrope;
};

class CudaPlanCache : public ::testing::TestWithParam<PlanCacheCase> {};

TEST_P(CudaPlanCache, CachedPlanGivesTheBitsOfTuningFromScratch) {
  const std::string dir = GetParam().dir;
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto config = load_json(src(dir + "/config.json"));
  const int64_t vocab = config.contains("text_config")
                            ? config["text_config"]["vocab_size"].get<int64_t>()
                            : config["vocab_size"].get<int64_t>();
  int64_t longest = 0;
  const std::string prompts = fmt::format("{}/{}.plans.jsonl", work_dir(), name_of(dir));
  // Long prompts: prefill steps of up to 512+ rows (the ranges 65..511 and
  // 512..2047) and decode steps of up to 48 sequences (1..16, 17..64).
  write_text(prompts, make_prompts(vocab, GetParam().mrope, true, &longest));
  for (const char* precision : {"f32", "bf16"}) {
    const std::string base = fmt::format("{}/{}.plans.{}", work_dir(), name_of(dir), precision);
    struct Run {
      std::string results;
      nlohmann::json plan;  // the run header's gemm_plan
      RunResult r;
    };
    auto run_with = [&](const std::string& tag, const std::string& flags) {
      const std::string out = fmt::format("{}.{}.jsonl", base, tag);
      Run x;
      x.r = generate(
          pack, prompts, out,
          fmt::format("--device cuda --precision {} --ignore-eos --margins {}", precision, flags));
      EXPECT_EQ(x.r.status, 0) << precision << " " << tag << ": " << x.r.err;
      if (x.r.status != 0) return x;
      x.results = read_text(out);
      const auto meta = load_json(out + ".meta.json");
      x.plan = meta.value("gemm_plan", nlohmann::json());
      EXPECT_TRUE(meta.contains("startup")) << meta.dump(2);
      EXPECT_GT(meta["stats"]["first_token_seconds"].get<double>(), 0.0) << meta.dump(2);
      std::printf("[ cuda plan] %s %s %-10s %s: %s, %lld ranges cached, %lld tuned\n",
                  name_of(dir).c_str(), precision, tag.c_str(),
                  x.plan.value("cache", std::string("?")).c_str(),
                  x.plan.value("source", std::string("?")).c_str(),
                  static_cast<long long>(x.plan.value("ranges_cached", int64_t{-1})),
                  static_cast<long long>(x.plan.value("ranges_tuned", int64_t{-1})));
      return x;
    };
    const std::string cache = base + ".cache.json";
    std::filesystem::remove(cache);

    // The reference: tuned from scratch, no file read or written.
    const Run off = run_with("off", "--plan-cache off");
    ASSERT_EQ(off.r.status, 0);
    ASSERT_EQ(std::count(off.results.begin(), off.results.end(), '\n'), 48);
    ASSERT_EQ(off.results.find("\"error\""), std::string::npos) << off.results;
    EXPECT_EQ(off.plan["cache"], "off");
    EXPECT_EQ(off.plan["source"], "tuned");
    EXPECT_GT(off.plan["ranges_tuned"].get<int64_t>(), 0);
    EXPECT_FALSE(std::filesystem::exists(cache));

    // One sequence at a time into an empty cache: it tunes and writes the
    // ranges of batch-1 decode steps and of the prefill.
    const Run first = run_with("first", fmt::format("--plan-cache {} --max-num-seqs 1", cache));
    EXPECT_EQ(first.results, off.results) << precision << ": tuned into a new cache file";
    EXPECT_EQ(first.plan["source"], "tuned") << first.plan.dump(2);
    EXPECT_EQ(first.plan["written"], true) << first.plan.dump(2);
    EXPECT_NE(first.r.err.find(cache), std::string::npos) << "no stderr line names the new file";
    ASSERT_TRUE(std::filesystem::exists(cache));

    // Batched: the cached ranges, plus the batch ranges tuned and added.
    const Run grow = run_with("grow", fmt::format("--plan-cache {}", cache));
    EXPECT_EQ(grow.results, off.results) << precision << ": partly cached plan";
    EXPECT_GT(grow.plan["ranges_cached"].get<int64_t>(), 0) << grow.plan.dump(2);
    EXPECT_EQ(grow.plan["file_used"], true) << grow.plan.dump(2);

    // The same run again: every range from the file, nothing tuned.
    const Run warm = run_with("warm", fmt::format("--plan-cache {}", cache));
    EXPECT_EQ(warm.results, off.results) << precision << ": fully cached plan";
    EXPECT_EQ(warm.plan["source"], "cached") << warm.plan.dump(2);
    EXPECT_EQ(warm.plan["ranges_tuned"].get<int64_t>(), 0) << warm.plan.dump(2);
    EXPECT_EQ(warm.plan["records_stale"].get<int64_t>(), 0) << warm.plan.dump(2);
    EXPECT_EQ(warm.plan["written"], false) << "nothing new, nothing written";

    // --tune-only into a fresh file (no --batch/--out), then a run with it.
    const std::string tuned = base + ".tuneonly.json";
    std::filesystem::remove(tuned);
    RunResult t =
        run(fmt::format("{} --model {} --device cuda --precision {} --tune-only "
                        "--plan-cache {}",
                        QTK_GENERATE_BIN, pack, precision, tuned));
    EXPECT_EQ(t.status, 0) << t.err;
    EXPECT_NE(t.err.find("written to " + tuned), std::string::npos) << t.err;
    const Run pre = run_with("tuneonly", fmt::format("--plan-cache {}", tuned));
    EXPECT_EQ(pre.results, off.results) << precision << ": plan from --tune-only";
    EXPECT_EQ(pre.plan["source"], "cached") << pre.plan.dump(2);
    EXPECT_EQ(pre.plan["ranges_tuned"].get<int64_t>(), 0) << pre.plan.dump(2);

    // A file made for another setup: ignored (stderr names it), tuned.
    auto doc = load_json(cache);
    doc["key"]["gpu"] = "Some Other GPU";
    const std::string foreign = base + ".foreign.json";
    write_text(foreign, doc.dump());
    const Run f = run_with("foreign", fmt::format("--plan-cache {}", foreign));
    EXPECT_EQ(f.results, off.results) << precision << ": foreign cache";
    EXPECT_EQ(f.plan["source"], "tuned") << f.plan.dump(2);
    EXPECT_EQ(f.plan["ranges_cached"].get<int64_t>(), 0) << f.plan.dump(2);
    EXPECT_NE(f.r.err.find(foreign), std::string::npos) << f.r.err;
    EXPECT_NE(f.r.err.find("Some Other GPU"), std::string::npos) << f.r.err;
    // It was rewritten for this setup.
    EXPECT_NE(load_json(foreign)["key"]["gpu"], "Some Other GPU");

    // A corrupt file: a warning naming it, tuned.
    const std::string corrupt = base + ".corrupt.json";
    write_text(corrupt, "{\"format\": \"qtk-gemm-plans\", \"version\": 1, \"plans\": [");
    const Run c = run_with("corrupt", fmt::format("--plan-cache {}", corrupt));
    EXPECT_EQ(c.results, off.results) << precision << ": corrupt cache";
    EXPECT_EQ(c.plan["source"], "tuned") << c.plan.dump(2);
    EXPECT_NE(c.r.err.find(corrupt), std::string::npos) << c.r.err;

    // Records whose plan algorithm is not the one this run picks (a stale
    // entry under a matching key): not used, tuned instead.
    doc = load_json(cache);
    ASSERT_FALSE(doc["plans"].empty());
    for (auto& p : doc["plans"]) {
      std::string a = p["algo"];
      a[127] = a[127] == '0' ? '1' : '0';
      p["algo"] = a;
    }
    const std::string stale = base + ".stale.json";
    write_text(stale, doc.dump());
    const Run st = run_with("stale", fmt::format("--plan-cache {}", stale));
    EXPECT_EQ(st.results, off.results) << precision << ": stale records";
    EXPECT_GT(st.plan["records_stale"].get<int64_t>(), 0) << st.plan.dump(2);
    EXPECT_EQ(st.plan["ranges_cached"].get<int64_t>(), 0) << st.plan.dump(2);

    std::printf(
        "[ cuda plan] %s %s: cached, partly cached, --tune-only, foreign, corrupt, "
        "stale all byte-identical to tuning from scratch: %s\n",
        name_of(dir).c_str(), precision, ::testing::Test::HasFailure() ? "NO" : "yes");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaPlanCache,
                         ::testing::Values(PlanCacheCase{"samples/qwen3-sample", false},
                                           PlanCacheCase{"samples/qwen3.5-sample", false},
                                           PlanCacheCase{"tests/data/models/qwen3.5-tiny", true}),
                         [](const auto& info) { return name_of(info.param.dir); });

}  // namespace
}  // namespace qtk::rt_test
