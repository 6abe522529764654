// Tensor parallelism (runtime/parallel): the split table and the rank
// configs, the slices against an index-by-index reference, and N ranks
// emulated on the CPU through the real generate (--tensor-parallel N): the
// split model reproduces the unsplit one within float32 rounding (goldens by
// the near-tie rule, margins next to the TP-1 run's), and a TP run is
// bit-identical from run to run and under any schedule.
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/error.h"
#include "loaders/model_config.h"
#include "runtime/models/moe_weights.h"
#include "runtime/parallel/rank_group.h"
#include "runtime/parallel/tensor_parallel.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

ModelConfig qwen3_5_moe_like() {
  ModelConfig c;
  c.arch = Arch::kQwen3_5;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.attn_output_gate = true;
  c.linear_num_key_heads = 4;
  c.linear_num_value_heads = 8;
  c.linear_key_head_dim = 3;
  c.linear_value_head_dim = 5;
  c.moe.num_experts = 3;
  c.moe.expert_intermediate_size = 12;
  c.moe.shared_expert_intermediate = 8;
  c.moe.mlp_plan = {MlpKind::kMoe};
  c.num_layers = 1;
  return c;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallelConfig, DividesHeadsAndWidths) {
  const ModelConfig c = qwen3_5_moe_like();
  const ModelConfig r = tp_rank_config(c, 2, "m.pack");
  EXPECT_EQ(r.num_attention_heads, 4);
  EXPECT_EQ(r.num_kv_heads, 1);
  EXPECT_EQ(r.linear_num_key_heads, 2);
  EXPECT_EQ(r.linear_num_value_heads, 4);
  EXPECT_EQ(r.moe.expert_intermediate_size, 6);
  EXPECT_EQ(r.moe.shared_expert_intermediate, 4);
  EXPECT_EQ(r.hidden_size, 64);
  EXPECT_EQ(r.moe.num_experts, 3);
  // Fewer K/V heads than ranks: one (replicated) K/V head per rank.
  const ModelConfig r4 = tp_rank_config(c, 4, "m.pack");
  EXPECT_EQ(r4.num_attention_heads, 2);
  EXPECT_EQ(r4.num_kv_heads, 1);
  EXPECT_EQ(tp_rank_config(c, 1, "m.pack").num_attention_heads, 8);
}

TEST(TensorParallelConfig, RefusesWhatDoesNotSplit) {
  const ModelConfig c = qwen3_5_moe_like();
  EXPECT_EQ(error_of([&] { tp_rank_config(c, 3, "m.pack"); }),
            "m.pack: tensor parallel 3: config num_attention_heads = 8 is not divisible by 3");
  ModelConfig odd_kv = c;
  odd_kv.num_kv_heads = 3;
  odd_kv.num_attention_heads = 12;
  EXPECT_NE(error_of([&] {
              tp_rank_config(odd_kv, 4, "m.pack");
            }).find("num_key_value_heads = 3 neither divides into nor divides 4 ranks"),
            std::string::npos);
  ModelConfig moe = c;
  moe.moe.expert_intermediate_size = 10;
  EXPECT_NE(error_of([&] { tp_rank_config(moe, 4, "m.pack"); }).find("moe_intermediate_size = 10"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tp_rank_config(c, 0, "m.pack"); }).find("found 0"), std::string::npos);
}

// A float tensor whose element (e, i, j) holds e * 1e6 + i * 1e3 + j.
std::vector<float> indexed(int64_t outer, int64_t rows, int64_t cols) {
  std::vector<float> v(outer * rows * cols);
  for (int64_t e = 0; e < outer; ++e)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        v[(e * rows + i) * cols + j] = static_cast<float>(e * 1000000 + i * 1000 + j);
  return v;
}

// The rows (or columns) rank r keeps, by the rule written out per segment.
std::vector<int64_t> kept(const std::vector<TpSegment>& segs, int r, int n) {
  std::vector<int64_t> out;
  int64_t offset = 0;
  for (const TpSegment& g : segs) {
    const int64_t per = std::max<int64_t>(1, g.heads / n);
    const int64_t first = g.heads >= n ? r * per : r * g.heads / n;
    for (int64_t h = first; h < first + per; ++h)
      for (int64_t u = 0; u < g.unit; ++u) out.push_back(offset + h * g.unit + u);
    offset += g.heads * g.unit;
  }
  return out;
}

TEST(TensorParallelSlice, RowsColumnsAndStackedExpertsAgainstTheIndexRule) {
  const ModelConfig c = qwen3_5_moe_like();
  const int64_t H = c.hidden_size, D = c.head_dim;
  for (int n : {2, 4}) {
    // Gated attention rows: q, gate, k, v; K/V replicated at 4 ranks.
    const int64_t qkv_rows = 2 * 8 * D + 2 * 2 * D;
    const std::vector<float> qkv = indexed(1, qkv_rows, H);
    const TpSplit s = tp_split(c, "layers.0.self_attn.qkv_proj", qkv_rows);
    ASSERT_EQ(s.dim, TpSplit::Dim::kRows);
    // o_proj columns; stacked expert down_proj columns.
    const std::vector<float> o = indexed(1, H, 8 * D);
    const TpSplit so = tp_split(c, "layers.0.self_attn.o_proj", H);
    ASSERT_EQ(so.dim, TpSplit::Dim::kCols);
    const std::vector<float> down = indexed(3, H, 12);
    const TpSplit sd = tp_split(c, "layers.0.mlp.experts.down_proj", H);
    std::vector<int> covered(qkv_rows, 0);
    for (int r = 0; r < n; ++r) {
      TpStorage store;
      const TensorView full(qkv.data(), DType::F32, {qkv_rows, H});
      const TensorView v = tp_slice(full, s, TpRank{r, n}, "qkv", store);
      const std::vector<int64_t> rows = kept(s.segments, r, n);
      ASSERT_EQ(v.shape[0], static_cast<int64_t>(rows.size()));
      ASSERT_EQ(v.shape[1], H);
      for (size_t i = 0; i < rows.size(); ++i) {
        ++covered[rows[i]];
        for (int64_t j = 0; j < H; ++j)
          ASSERT_EQ(v.as<float>()[i * H + j], static_cast<float>(rows[i] * 1000 + j));
      }
      const TensorView vo =
          tp_slice(TensorView(o.data(), DType::F32, {H, 8 * D}), so, TpRank{r, n}, "o", store);
      const std::vector<int64_t> cols = kept(so.segments, r, n);
      ASSERT_EQ(vo.shape[1], static_cast<int64_t>(cols.size()));
      for (int64_t i = 0; i < H; ++i)
        for (size_t j = 0; j < cols.size(); ++j)
          ASSERT_EQ(vo.as<float>()[i * cols.size() + j], static_cast<float>(i * 1000 + cols[j]));
      if (n == 2) {
        const TensorView vd =
            tp_slice(TensorView(down.data(), DType::F32, {3, H, 12}), sd, TpRank{r, n}, "d", store);
        ASSERT_EQ(vd.ndim, 3);
        ASSERT_EQ(vd.shape[2], 6);
        for (int64_t e = 0; e < 3; ++e)
          for (int64_t i = 0; i < H; ++i)
            for (int64_t j = 0; j < 6; ++j)
              ASSERT_EQ(vd.as<float>()[(e * H + i) * 6 + j],
                        static_cast<float>(e * 1000000 + i * 1000 + r * 6 + j));
      }
    }
    // q and gate rows go to exactly one rank; K/V rows to size/Hkv ranks.
    for (int64_t i = 0; i < qkv_rows; ++i)
      EXPECT_EQ(covered[i], i < 2 * 8 * D ? 1 : std::max(1, n / 2)) << "row " << i;
  }
  // Replicated tensors come back as the pack's own view.
  EXPECT_EQ(tp_split(c, "layers.0.mlp.router", 3).dim, TpSplit::Dim::kNone);
  EXPECT_EQ(tp_split(c, "embed_tokens", 512).dim, TpSplit::Dim::kNone);
  EXPECT_EQ(tp_split(c, "layers.0.linear_attn.norm", 5).dim, TpSplit::Dim::kNone);
  // A tensor whose extent disagrees with the config is refused by name.
  const std::vector<float> bad = indexed(1, 7, 3);
  TpStorage store;
  EXPECT_NE(error_of([&] {
              tp_slice(TensorView(bad.data(), DType::F32, {7, 3}),
                       tp_split(c, "layers.0.linear_attn.dt_bias", 7), TpRank{0, 2},
                       "layers.0.linear_attn.dt_bias", store);
            }).find("tensor 'layers.0.linear_attn.dt_bias' has shape [7, 3]; expected 8 rows"),
            std::string::npos);
}

// The host all-reduce adds in rank order, the same bits on every rank.
TEST(TensorParallelRankGroup, OrderedSumSameOnEveryRank) {
  for (int n : {1, 2, 3, 4}) {
    RankGroup g(n);
    const int64_t len = 1037;
    std::vector<std::vector<float>> bufs(n, std::vector<float>(len));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1e3f, 1e3f);
    for (auto& b : bufs)
      for (float& x : b) x = u(rng);
    std::vector<float> want(len);
    for (int64_t i = 0; i < len; ++i) {
      float s = bufs[0][i];
      for (int r = 1; r < n; ++r) s += bufs[r][i];
      want[i] = s;
    }
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        for (int k = 0; k < 3; ++k) g.barrier();
        g.all_reduce_sum(r, bufs[r].data(), len);
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(std::memcmp(bufs[r].data(), want.data(), len * sizeof(float)), 0) << n << " " << r;
  }
}

TEST(TensorParallelRankGroup, AbortWakesTheWaitingRanks) {
  RankGroup g(3);
  std::string e1, e2;
  std::thread a([&] { e1 = error_of([&] { g.barrier(); }); });
  std::thread b([&] { e2 = error_of([&] { g.barrier(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  g.abort();
  a.join();
  b.join();
  EXPECT_EQ(e1, "tensor parallel: another rank failed");
  EXPECT_EQ(e2, "tensor parallel: another rank failed");
}

// ---- N CPU ranks through the real generate ----

struct TpCase {
  const char* dir;
  int ranks;
};

std::string case_name(const TpCase& p) {
  std::string n = p.dir;
  n = n.substr(n.rfind('/') + 1);
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return fmt::format("{}_tp{}", n, p.ranks);
}

class TensorParallelGolden : public ::testing::TestWithParam<TpCase> {};

// Goldens by the near-tie rule (compare), and every margin within 1e-4 of the
// TP-1 run's while the tokens agree: the split changes only the order of
// float32 additions.
TEST_P(TensorParallelGolden, ReproducesTheUnsplitModel) {
  const TpCase& p = GetParam();
  const std::string dir = p.dir;
  const std::string pack = pack_of(dir);
  ASSERT_FALSE(pack.empty());
  const auto golden = load_json(src(dir + "/golden.json"));
  const std::string base = fmt::format("{}/{}", work_dir(), case_name(p));
  write_text(base + ".jsonl", golden_prompts(golden));
  const std::string flags = "--ignore-eos --margins --threads 2";
  RunResult one = generate(pack, base + ".jsonl", base + ".tp1.out", flags);
  ASSERT_EQ(one.status, 0) << one.err;
  RunResult tp = generate(pack, base + ".jsonl", base + ".tp.out",
                          flags + fmt::format(" --tensor-parallel {}", p.ranks));
  ASSERT_EQ(tp.status, 0) << tp.err;
  RunResult c =
      run(fmt::format("{} {} {}", QTK_COMPARE_BIN, src(dir + "/golden.json"), base + ".tp.out"));
  EXPECT_EQ(c.status, 0) << c.out << c.err;
  EXPECT_NE(c.out.find(fmt::format("compare: {} cases", golden["cases"].size())), std::string::npos)
      << c.out;
  const auto a = read_jsonl(base + ".tp1.out"), b = read_jsonl(base + ".tp.out");
  ASSERT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto &ta = a[i]["output_token_ids"], &tb = b[i]["output_token_ids"];
    for (size_t k = 0; k < ta.size() && k < tb.size() && ta[k] == tb[k]; ++k)
      worst = std::max(worst, std::abs(a[i]["top1_margin"][k].get<double>() -
                                       b[i]["top1_margin"][k].get<double>()));
  }
  EXPECT_LT(worst, 1e-4);
  const auto meta = load_json(base + ".tp.out.meta.json");
  EXPECT_EQ(meta["settings"]["tensor_parallel"], p.ranks);
  EXPECT_EQ(meta["tensor_parallel"]["ranks"], p.ranks);
  EXPECT_NE(meta["tensor_parallel"]["compare"].get<std::string>().find("near-tie rule"),
            std::string::npos);
  EXPECT_NE(meta["device"].get<std::string>().find(fmt::format("{} emulated ranks", p.ranks)),
            std::string::npos);
  EXPECT_FALSE(load_json(base + ".tp1.out.meta.json").contains("tensor_parallel"));
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelGolden,
                         ::testing::Values(TpCase{"tests/data/models/qwen3-tiny", 2},
                                           TpCase{"tests/data/models/qwen3-tiny", 4},
                                           TpCase{"tests/data/models/qwen3-tiny-sharded-f32", 4},
                                           TpCase{"tests/data/models/qwen3.5-tiny", 2},
                                           TpCase{"tests/data/models/qwen3.5-tiny-vlm", 2},
                                           TpCase{"tests/data/models/qwen3-moe-tiny", 2},
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 2}),
                         [](const auto& info) { return case_name(info.param); });

// 40 mixed prompts (lengths 1..90, budgets 1..8).
std::string mixed_prompts(int64_t vocab) {
  std::mt19937 rng(99);
  std::string s;
  for (int i = 0; i < 40; ++i) {
    std::vector<int> ids(1 + rng() % 90);
    for (int& t : ids) t = static_cast<int>(rng() % vocab);
    s +=
        nlohmann::json{{"id", i}, {"prompt_token_ids", ids}, {"max_tokens", 1 + rng() % 8}}.dump() +
        "\n";
  }
  return s;
}

class TensorParallelInvariance : public ::testing::TestWithParam<TpCase> {};

// A TP run gives the same bytes run after run, alone or batched, in any
// chunking, block size and thread count, and after preemption.
TEST_P(TensorParallelInvariance, BitIdenticalUnderAnySchedule) {
  const TpCase& p = GetParam();
  const std::string pack = pack_of(p.dir);
  ASSERT_FALSE(pack.empty());
  const auto config = load_json(src(std::string(p.dir) + "/config.json"));
  const int64_t vocab = config.contains("text_config")
                            ? config["text_config"]["vocab_size"].get<int64_t>()
                            : config["vocab_size"].get<int64_t>();
  const std::string base = fmt::format("{}/{}.inv", work_dir(), case_name(p));
  write_text(base + ".jsonl", mixed_prompts(vocab));
  const std::string tp = fmt::format("--margins --ignore-eos --tensor-parallel {}", p.ranks);
  const std::vector<std::string> schedules = {
      "--threads 2",
      "--threads 2",  // again: run to run
      "--threads 1 --max-num-seqs 1",
      "--threads 2 --max-batched-tokens 7 --block-size 4",
      "--threads 4 --max-num-seqs 40 --max-batched-tokens 33 --block-size 32",
      "--threads 2 --kv-cache-blocks 40 --block-size 4",  // preemption
  };
  std::string first;
  for (size_t i = 0; i < schedules.size(); ++i) {
    const std::string out = fmt::format("{}.{}.out", base, i);
    RunResult g = generate(pack, base + ".jsonl", out, tp + " " + schedules[i]);
    ASSERT_EQ(g.status, 0) << schedules[i] << ": " << g.err;
    const std::string text = read_text(out);
    EXPECT_EQ(text.find("\"error\""), std::string::npos) << text.substr(0, 400);
    if (i == 0)
      first = text;
    else
      EXPECT_EQ(text, first) << "schedule: " << schedules[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelInvariance,
                         ::testing::Values(TpCase{"tests/data/models/qwen3-tiny", 2},
                                           TpCase{"tests/data/models/qwen3.5-tiny", 2},
                                           TpCase{"tests/data/models/qwen3-moe-tiny", 2},
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 2}),
                         [](const auto& info) { return case_name(info.param); });

TEST(TensorParallelCli, BadRankCountsAndModelsThatDoNotSplit) {
  const std::string pack = pack_of("tests/data/models/qwen3-tiny");
  ASSERT_FALSE(pack.empty());
  const std::string base = fmt::format("{}/tp-bad", work_dir());
  write_text(base + ".jsonl", "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
  struct Bad {
    std::string flags, message;
  };
  const std::vector<Bad> bads = {
      {"--tensor-parallel 0", "--tensor-parallel: expected a rank count from 1 to 64, found \"0\""},
      {"--tensor-parallel two", "--tensor-parallel: expected a rank count from 1 to 64"},
      {"--tensor-parallel 3",
       ": tensor parallel 3: config num_attention_heads = 4 is not divisible by 3"},
      {"--tensor-parallel 8",
       ": tensor parallel 8: config num_attention_heads = 4 is not divisible by 8"},
  };
  for (const Bad& b : bads) {
    const std::string out = base + ".out";
    RunResult g = generate(pack, base + ".jsonl", out, b.flags);
    EXPECT_EQ(g.status, 1) << b.flags;
    EXPECT_NE(g.err.find(b.message), std::string::npos) << b.flags << ": " << g.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << b.flags;
    EXPECT_FALSE(std::filesystem::exists(out + ".meta.json")) << b.flags;
  }
  {
    RunResult g =
        generate(pack, base + ".jsonl", base + ".dp.out", "--tensor-parallel 2 --devices 0,1");
    EXPECT_EQ(g.status, 1);
    EXPECT_NE(g.err.find("--devices with --tensor-parallel 2: each worker runs on one device"),
              std::string::npos)
        << g.err;
    EXPECT_FALSE(std::filesystem::exists(base + ".dp.out"));
  }
  // FP8 packs are refused with the tensor's name and what to do instead.
  const std::string fp8 = pack_of("tests/data/models/qwen3-fp8-tiny");
  ASSERT_FALSE(fp8.empty());
  RunResult g = generate(fp8, base + ".jsonl", base + ".fp8.out", "--tensor-parallel 2");
  EXPECT_EQ(g.status, 1);
  EXPECT_NE(g.err.find("tensor parallel over an FP8 pack is not supported (found F8_E4M3 tensor "
                       "'layers.0.self_attn.qkv_proj'); convert the checkpoint with --dtype bf16"),
            std::string::npos)
      << g.err;
  EXPECT_FALSE(std::filesystem::exists(base + ".fp8.out"));
}

// A run cannot be resumed with another rank count (it changes the results).
TEST(TensorParallelCli, ResumeRefusesAnotherRankCount) {
  const std::string pack = pack_of("tests/data/models/qwen3-tiny");
  ASSERT_FALSE(pack.empty());
  const std::string base = fmt::format("{}/tp-resume", work_dir());
  write_text(base + ".jsonl", mixed_prompts(500));
  RunResult a = generate(pack, base + ".jsonl", base + ".out", "--tensor-parallel 2");
  ASSERT_EQ(a.status, 0) << a.err;
  RunResult b = generate(pack, base + ".jsonl", base + ".out", "--resume");
  EXPECT_EQ(b.status, 1);
  EXPECT_NE(b.err.find("setting 'tensor_parallel' was 2, now null (it changes the results)"),
            std::string::npos)
      << b.err;
  RunResult c = generate(pack, base + ".jsonl", base + ".out", "--resume --tensor-parallel 2");
  EXPECT_EQ(c.status, 0) << c.err;
}

}  // namespace
}  // namespace qtk::rt_test
