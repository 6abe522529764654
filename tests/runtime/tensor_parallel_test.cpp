// Tensor parallelism (runtime/parallel): the split table and the rank
// configs, the slices (FP8 ones with their block scales) against an
// index-by-index reference, and N ranks emulated on the CPU through the real
// generate (--tensor-parallel N): the split model reproduces the unsplit one
// within float32 rounding (goldens by the near-tie rule, margins next to the
// TP-1 run's; synthesised block-FP8 models likewise), and a TP run is
// bit-identical from run to run and under any schedule.
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "core/error.h"
#include "loaders/model_config.h"
#include "pack/pack.h"
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
  // Fewer GDN key heads than ranks: one (replicated) key head per rank, the
  // value heads split evenly.
  ModelConfig two_keys = c;
  two_keys.linear_num_key_heads = 2;
  const ModelConfig g4 = tp_rank_config(two_keys, 4, "m.pack");
  EXPECT_EQ(g4.linear_num_key_heads, 1);
  EXPECT_EQ(g4.linear_num_value_heads, 2);
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
  ModelConfig odd_keys = c;
  odd_keys.linear_num_key_heads = 3;
  odd_keys.linear_num_value_heads = 12;
  EXPECT_NE(error_of([&] {
              tp_rank_config(odd_keys, 4, "m.pack");
            }).find("linear_num_key_heads = 3 neither divides into nor divides 4 ranks"),
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

// Rank r's GDN key head is the one its value heads read: value head h reads
// key head h / (Hv / Hk) (the GDN layer's grouping), so the q and k rows a
// rank keeps are those of key head (first value head of r) / (Hv / Hk).
TEST(TensorParallelSlice, ReplicatedGdnKeyHeadIsTheOneTheRanksValueHeadsRead) {
  ModelConfig c = qwen3_5_moe_like();
  c.linear_num_key_heads = 2;  // Hv = 8: 4 value heads per key head
  const int64_t Hk = 2, Hv = 8, Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  const int64_t conv_rows = 2 * Hk * Dk + Hv * Dv;
  const TpSplit s = tp_split(c, "layers.0.linear_attn.conv1d", conv_rows);
  ASSERT_EQ(s.dim, TpSplit::Dim::kRows);
  const std::vector<float> conv = indexed(1, conv_rows, 4);
  const TensorView full(conv.data(), DType::F32, {conv_rows, 4});
  for (int r = 0; r < 4; ++r) {
    TpStorage store;
    const TensorView v = tp_slice(full, s, TpRank{r, 4}, "conv1d", store);
    const int64_t per_v = Hv / 4, key = (r * per_v) / (Hv / Hk);
    std::vector<int64_t> want;
    for (int64_t part = 0; part < 2; ++part)  // q then k channels of the key head
      for (int64_t u = 0; u < Dk; ++u) want.push_back(part * Hk * Dk + key * Dk + u);
    for (int64_t h = r * per_v; h < (r + 1) * per_v; ++h)
      for (int64_t u = 0; u < Dv; ++u) want.push_back(2 * Hk * Dk + h * Dv + u);
    ASSERT_EQ(v.shape[0], static_cast<int64_t>(want.size())) << "rank " << r;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(v.as<float>()[i * 4], static_cast<float>(want[i] * 1000))
          << "rank " << r << " row " << i;
  }
}

// recycle() ends the slices but keeps their memory: the next allocations of
// the same sizes reuse it (the smallest block that fits); clear() frees it.
TEST(TensorParallelStorage, RecycleReusesTheSmallestBlockThatFits) {
  TpStorage store;
  void* big = store.allocate(1 << 20);
  void* small = store.allocate(1000);
  store.recycle();
  EXPECT_EQ(store.allocate(900), small);    // the smallest that fits
  EXPECT_EQ(store.allocate(1 << 20), big);  // then the big one
  EXPECT_NE(store.allocate(64), nullptr);   // none left: a new block
  store.recycle();
  void* again = store.allocate((1 << 20) + 64);  // larger than any: new
  EXPECT_NE(again, big);
  EXPECT_NE(again, small);
  store.clear();
  EXPECT_NE(store.allocate(16), nullptr);
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

// ---- FP8 slices ----

// An F8_E4M3 tensor [rows, cols], or stacked experts [outer, rows, cols]
// (outer > 1), with float32 block scales holding their own index; the views
// point into its own vectors.
struct Fp8Tensor {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  PackFp8Scales q;
  int64_t outer, rows, cols;

  Fp8Tensor(const std::string& name, int64_t outer_, int64_t rows_, int64_t cols_, int64_t br,
            int64_t bc)
      : outer(outer_), rows(rows_), cols(cols_) {
    bytes.resize(outer * rows * cols);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i % 251);
    const int64_t srows = outer * ((rows + br - 1) / br), scols = (cols + bc - 1) / bc;
    scales = indexed(1, srows, scols);
    q.tensor = name;
    q.scale_name = name + ".scale";
    const std::vector<int64_t> shape =
        outer > 1 ? std::vector<int64_t>{outer, rows, cols} : std::vector<int64_t>{rows, cols};
    q.weight = TensorView(bytes.data(), DType::F8_E4M3, shape);
    q.scale = TensorView(scales.data(), DType::F32, {srows, scols});
    q.block_rows = br;
    q.block_cols = bc;
  }
  Fp8Tensor(const Fp8Tensor&) = delete;
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Element by element: slice element (e, i, j) of `w` is element
// (e, row_of[i], col_of[j]) of f, and the scale that the rank's scales `p`
// give it is the scale f's give that element.
void expect_fp8_slice(const Fp8Tensor& f, const TensorView& w, const PackFp8Scales& p,
                      const std::vector<int64_t>& row_of, const std::vector<int64_t>& col_of) {
  const int64_t kr = static_cast<int64_t>(row_of.size()), kc = static_cast<int64_t>(col_of.size());
  const int64_t br = f.q.block_rows, bc = f.q.block_cols;
  ASSERT_EQ(w.dtype, DType::F8_E4M3);
  ASSERT_EQ(w.numel(), f.outer * kr * kc);
  ASSERT_EQ(p.weight.data, w.data);
  ASSERT_EQ(p.tensor, f.q.tensor);
  ASSERT_EQ(p.block_rows, br);
  ASSERT_EQ(p.block_cols, bc);
  ASSERT_EQ(p.scale.dtype, DType::F32);
  ASSERT_EQ(p.scale.shape[0], f.outer * ceil_div(kr, br));
  ASSERT_EQ(p.scale.shape[1], ceil_div(kc, bc));
  const int64_t pcols = p.scale.shape[1], fcols = f.q.scale.shape[1];
  for (int64_t e = 0; e < f.outer; ++e)
    for (int64_t i = 0; i < kr; ++i)
      for (int64_t j = 0; j < kc; ++j) {
        const int64_t fr = e * f.rows + row_of[i], fc = col_of[j];
        ASSERT_EQ(w.as<uint8_t>()[(e * kr + i) * kc + j], f.bytes[fr * f.cols + fc]);
        ASSERT_EQ(p.scale.as<float>()[((e * kr + i) / br) * pcols + j / bc],
                  f.scales[(fr / br) * fcols + fc / bc])
            << "expert " << e << " row " << i << " col " << j;
      }
}

// The error of rank r of n's slice of f (tp_slice, then tp_slice_fp8).
std::string fp8_slice_error(const Fp8Tensor& f, const TpSplit& s, int r, int n) {
  return error_of([&] {
    TpStorage store;
    const TensorView w = tp_slice(f.q.weight, s, TpRank{r, n}, f.q.tensor, store);
    tp_slice_fp8(f.q, w, s, TpRank{r, n}, "m.pack", store);
  });
}

TEST(TensorParallelFp8, RowSplitKeepsTheScaleRowsOfItsBlocks) {
  ModelConfig c;
  c.intermediate_size = 96;
  // 16-row blocks; 40 columns: a partial edge block of 8 columns.
  const Fp8Tensor f("layers.0.mlp.gate_up_proj", 1, 192, 40, 16, 16);
  const TpSplit s = tp_split(c, f.q.tensor, 192);
  ASSERT_EQ(s.dim, TpSplit::Dim::kRows);
  for (int n : {2, 3}) {
    for (int r = 0; r < n; ++r) {
      TpStorage store;
      const TensorView w = tp_slice(f.q.weight, s, TpRank{r, n}, f.q.tensor, store);
      const PackFp8Scales* p = tp_slice_fp8(f.q, w, s, TpRank{r, n}, "m.pack", store);
      ASSERT_NE(p, &f.q);
      expect_fp8_slice(f, w, *p, kept(s.segments, r, n), iota(40));
    }
  }
  // Unsplit, or a replicated tensor: the pack's own scales.
  TpStorage store;
  EXPECT_EQ(tp_slice_fp8(f.q, f.q.weight, s, TpRank{0, 1}, "m.pack", store), &f.q);
  EXPECT_EQ(tp_slice_fp8(f.q, f.q.weight, TpSplit{}, TpRank{1, 2}, "m.pack", store), &f.q);
  // 4 ranks: 24 rows each, inside the 16-row blocks; every rank names the
  // first such boundary.
  const std::string want =
      "m.pack: tensor parallel 4: tensor 'layers.0.mlp.gate_up_proj' splits at row 24, inside its "
      "FP8 scale blocks of 16 rows (expected a multiple of 16); convert with --dtype f32 "
      "(exact) or bf16 to split it";
  EXPECT_EQ(error_of([&] { tp_check_fp8(f.q, s, 4, "m.pack"); }), want);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(fp8_slice_error(f, s, r, 4), want) << r;
  EXPECT_EQ(error_of([&] { tp_check_fp8(f.q, s, 2, "m.pack"); }), "");
}

TEST(TensorParallelFp8, ColumnSplitKeepsTheScaleColumnsOfItsBlocks) {
  ModelConfig c;
  c.intermediate_size = 96;
  // 32-column blocks; 40 rows: a partial edge block of 8 rows.
  const Fp8Tensor f("layers.0.mlp.down_proj", 1, 40, 96, 16, 32);
  const TpSplit s = tp_split(c, f.q.tensor, 40);
  ASSERT_EQ(s.dim, TpSplit::Dim::kCols);
  for (int r = 0; r < 3; ++r) {
    TpStorage store;
    const TensorView w = tp_slice(f.q.weight, s, TpRank{r, 3}, f.q.tensor, store);
    const PackFp8Scales* p = tp_slice_fp8(f.q, w, s, TpRank{r, 3}, "m.pack", store);
    expect_fp8_slice(f, w, *p, iota(40), kept(s.segments, r, 3));
  }
  EXPECT_EQ(fp8_slice_error(f, s, 1, 2),
            "m.pack: tensor parallel 2: tensor 'layers.0.mlp.down_proj' splits at column 48, "
            "inside its FP8 scale blocks of 32 columns (expected a multiple of 32); convert with "
            "--dtype f32 (exact) or bf16 to split it");
}

// A range that ends at the tensor's end may end inside a (partial) block;
// one that ends inside a block elsewhere is refused.
TEST(TensorParallelFp8, PartialEdgeBlockAtTheTensorsEnd) {
  // Rows: 2 heads of 16 (one per rank), then 1 head of 8 that both ranks
  // keep (as a replicated K/V head): the last range is [32, 40) of 40 rows.
  const TpSplit s{TpSplit::Dim::kRows, {{2, 16}, {1, 8, true}}};
  const Fp8Tensor f("t", 1, 40, 20, 16, 16);
  for (int r = 0; r < 2; ++r) {
    TpStorage store;
    const TensorView w = tp_slice(f.q.weight, s, TpRank{r, 2}, "t", store);
    const PackFp8Scales* p = tp_slice_fp8(f.q, w, s, TpRank{r, 2}, "m.pack", store);
    expect_fp8_slice(f, w, *p, kept(s.segments, r, 2), iota(20));
  }
  const TpSplit inside{TpSplit::Dim::kRows, {{2, 16}, {1, 8, true}, {1, 8, true}}};
  const Fp8Tensor g("t", 1, 48, 20, 16, 16);
  EXPECT_NE(fp8_slice_error(g, inside, 0, 2)
                .find("tensor 't' splits at row 40, inside its FP8 "
                      "scale blocks of 16 rows"),
            std::string::npos);
}

TEST(TensorParallelFp8, StackedExpertsKeepTheirScaleRowsPerExpert) {
  ModelConfig c = qwen3_5_moe_like();
  c.moe.expert_intermediate_size = 64;
  c.moe.shared_expert_intermediate = 32;
  const int64_t E = 3, H = 40, Ie = 64, S = 32;
  // Per expert 128 gate_up rows in blocks of 32 and 40 columns (a partial
  // edge block of 8); down_proj's 40 rows per expert in blocks of 8.
  const Fp8Tensor gu("layers.0.mlp.experts.gate_up_proj", E, 2 * Ie, H, 32, 16);
  const Fp8Tensor dn("layers.0.mlp.experts.down_proj", E, H, Ie, 8, 16);
  const Fp8Tensor sgu("layers.0.mlp.shared_expert.gate_up_proj", 1, 2 * S, H, 16, 16);
  const Fp8Tensor sdn("layers.0.mlp.shared_expert.down_proj", 1, H, S, 8, 16);
  const std::vector<float> router(E * H, 1.0f);
  MoeWeights full;
  full.router = TensorView(router.data(), DType::F32, {E, H});
  full.gate_up_proj = gu.q.weight;
  full.gate_up_fp8 = &gu.q;
  full.down_proj = dn.q.weight;
  full.down_fp8 = &dn.q;
  index_experts(full);
  full.has_shared = true;
  full.shared_gate_up_proj = sgu.q.weight;
  full.shared_gate_up_fp8 = &sgu.q;
  full.shared_down_proj = sdn.q.weight;
  full.shared_down_fp8 = &sdn.q;
  for (int r = 0; r < 2; ++r) {
    TpStorage store;
    const MoeWeights w = tp_slice_experts(full, c, TpRank{r, 2}, "layers.0.", "m.pack", store);
    const TpSplit s_gu = tp_split(c, gu.q.tensor, 0), s_dn = tp_split(c, dn.q.tensor, 0);
    expect_fp8_slice(gu, w.gate_up_proj, *w.gate_up_fp8, kept(s_gu.segments, r, 2), iota(H));
    expect_fp8_slice(dn, w.down_proj, *w.down_fp8, iota(H), kept(s_dn.segments, r, 2));
    expect_fp8_slice(sgu, w.shared_gate_up_proj, *w.shared_gate_up_fp8,
                     kept(tp_split(c, sgu.q.tensor, 0).segments, r, 2), iota(H));
    expect_fp8_slice(sdn, w.shared_down_proj, *w.shared_down_fp8, iota(H),
                     kept(tp_split(c, sdn.q.tensor, 0).segments, r, 2));
    // Each expert's slice starts on its own scale rows (expert_matmul's rule).
    ASSERT_EQ(w.expert_gate_up.size(), 3u);
    EXPECT_EQ(w.expert_gate_up[2].data, w.gate_up_proj.as<uint8_t>() + 2 * Ie * H);
    EXPECT_EQ(w.gate_up_fp8->scale.shape[0], E * Ie / 32);
    EXPECT_EQ(w.router.data, full.router.data);
    EXPECT_EQ(w.router_fp8, nullptr);
  }
  // 4 ranks: 16 rows of each expert's gate and up, inside its 32-row blocks.
  EXPECT_EQ(error_of([&] {
              TpStorage store;
              tp_slice_experts(full, c, TpRank{3, 4}, "layers.0.", "m.pack", store);
            }),
            "m.pack: tensor parallel 4: tensor 'layers.0.mlp.experts.gate_up_proj' splits each "
            "expert at row 16, inside its FP8 scale blocks of 32 rows (expected a multiple of 32); "
            "convert with --dtype f32 (exact) or bf16 to split it");
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
                                           TpCase{"tests/data/models/qwen3.5-tiny", 4},
                                           TpCase{"tests/data/models/qwen3.5-tiny-vlm", 2},
                                           TpCase{"tests/data/models/qwen3-moe-tiny", 2},
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 2},
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 4}),
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
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 2},
                                           TpCase{"tests/data/models/qwen3.5-moe-tiny-vlm", 4}),
                         [](const auto& info) { return case_name(info.param); });

// ---- block-FP8 models through generate ----

// A small block-FP8 model whose every split falls on its 128x128 scale
// blocks at 2 ranks: the config of fixture `base` with `changes` (a JSON
// merge patch), synthesised with --fp8 (bench/synth) and converted.
struct Fp8TpModel {
  const char* name;
  const char* base;
  const char* fp8_tensor;  // a pack tensor that must be F8_E4M3
  const char* changes;
};

class TensorParallelFp8Model : public ::testing::TestWithParam<Fp8TpModel> {};

#ifdef QTK_SYNTH_BIN
// Multiplies the float32 block scales (`*_scale_inv`) of every safetensors
// file in `dir` by factors from 0.5 to 2 that differ from block to block.
// note: synth's uniform weights give every block nearly the same amax, so
// its scales are nearly equal and a rank reading another block's scale
// would go unnoticed; varied scales make every block's scale matter.
void vary_fp8_scales(const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::string bytes = read_text(entry.path().string());
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
    int64_t k = 0;
    for (const auto& [name, t] : header.items()) {
      if (!name.ends_with("_scale_inv")) continue;
      ASSERT_EQ(t["dtype"], "F32") << name;
      const uint64_t begin = 8 + header_len + t["data_offsets"][0].get<uint64_t>();
      const uint64_t end = 8 + header_len + t["data_offsets"][1].get<uint64_t>();
      for (uint64_t o = begin; o < end; o += 4, ++k) {
        float v;
        std::memcpy(&v, bytes.data() + o, 4);
        v *= 0.5f + static_cast<float>(k * 7 % 13) / 8.0f;
        std::memcpy(bytes.data() + o, &v, 4);
      }
    }
    write_text(entry.path().string(), bytes);
  }
}
#endif

// TP 2 next to TP 1 (the same tokens while the TP-1 margin is above 1e-3,
// margins within 1e-4), and TP 2 byte-identical to itself under other
// schedules.
TEST_P(TensorParallelFp8Model, SplitsOnScaleBlocksLikeTheUnsplitModel) {
#ifdef QTK_SYNTH_BIN
  const Fp8TpModel& p = GetParam();
  const std::string base = fmt::format("{}/{}", work_dir(), p.name);
  nlohmann::json config = load_json(src(std::string(p.base) + "/config.json"));
  config.erase("quantization_config");  // synth --fp8 writes its own
  config.merge_patch(nlohmann::json::parse(p.changes));
  write_text(base + ".config.json", config.dump(2));
  RunResult sy =
      run(fmt::format("{} {}.config.json {}-ckpt --seed 5 --fp8", QTK_SYNTH_BIN, base, base));
  ASSERT_EQ(sy.status, 0) << sy.err;
  vary_fp8_scales(base + "-ckpt");
  const std::string pack = base + ".pack";
  RunResult cv = run(fmt::format("{} {}-ckpt {} --force", QTK_CONVERT_BIN, base, pack));
  ASSERT_EQ(cv.status, 0) << cv.err;
  ASSERT_NE(Pack::open(pack)->fp8_scales(p.fp8_tensor), nullptr) << p.fp8_tensor;
  write_text(base + ".jsonl", mixed_prompts(500));
  const std::string flags = "--ignore-eos --margins --threads 2";
  RunResult one = generate(pack, base + ".jsonl", base + ".tp1.out", flags);
  ASSERT_EQ(one.status, 0) << one.err;
  const std::vector<std::string> schedules = {"", "--max-num-seqs 1",
                                              "--max-batched-tokens 7 --block-size 4"};
  std::string first;
  for (size_t i = 0; i < schedules.size(); ++i) {
    const std::string out = fmt::format("{}.tp2.{}.out", base, i);
    RunResult g =
        generate(pack, base + ".jsonl", out, flags + " --tensor-parallel 2 " + schedules[i]);
    ASSERT_EQ(g.status, 0) << schedules[i] << ": " << g.err;
    const std::string text = read_text(out);
    EXPECT_EQ(text.find("\"error\""), std::string::npos) << text.substr(0, 400);
    if (i == 0)
      first = text;
    else
      EXPECT_EQ(text, first) << "schedule: " << schedules[i];
  }
  const auto a = read_jsonl(base + ".tp1.out"), b = read_jsonl(base + ".tp2.0.out");
  ASSERT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto &ta = a[i]["output_token_ids"], &tb = b[i]["output_token_ids"];
    ASSERT_EQ(ta.size(), tb.size()) << "line " << i;
    for (size_t k = 0; k < ta.size(); ++k) {
      const double ma = a[i]["top1_margin"][k].get<double>();
      if (ta[k] != tb[k]) {  // a near tie in the TP-1 run may go the other way
        EXPECT_LE(ma, 1e-3) << "line " << i << " token " << k;
        break;
      }
      worst = std::max(worst, std::abs(ma - b[i]["top1_margin"][k].get<double>()));
    }
  }
  EXPECT_LT(worst, 1e-4);
  const std::string precision = load_json(base + ".tp2.0.out.meta.json")["precision"];
  EXPECT_NE(precision.find("F8_E4M3 (e4m3fn) weights split over the ranks on scale-block "
                           "boundaries, each rank's slice read as it is with float32 block "
                           "scales (blocks of 128 rows x 128 columns)"),
            std::string::npos)
      << precision;
  const std::string p1 = load_json(base + ".tp1.out.meta.json")["precision"];
  EXPECT_NE(p1.find("F8_E4M3 (e4m3fn) weights read in place"), std::string::npos) << p1;
#else
  GTEST_SKIP() << "built without QTK_BENCH: no bench/synth to synthesise the FP8 checkpoint";
#endif
}

// note: head_dim 128 (and the GDN's 4 key heads of 64) so that each rank's
// query, K/V and GDN rows are whole 128-row blocks; the widths 512 and 256
// split into 256 and 128.
INSTANTIATE_TEST_SUITE_P(
    Models, TensorParallelFp8Model,
    ::testing::Values(Fp8TpModel{"qwen3_fp8_tp", "tests/data/models/qwen3-fp8-tiny",
                                 "layers.1.mlp.gate_up_proj",
                                 R"({"hidden_size": 256, "head_dim": 128, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 512,
                       "num_hidden_layers": 2})"},
                      // Qwen3-MoE: per-expert FP8 experts, stacked with their scales by convert.
                      Fp8TpModel{"qwen3_moe_fp8_tp", "tests/data/models/qwen3-moe-tiny",
                                 "layers.1.mlp.experts.gate_up_proj",
                                 R"({"hidden_size": 256, "head_dim": 128, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "moe_intermediate_size": 256,
                       "num_local_experts": 4, "num_hidden_layers": 2})"},
                      // Qwen3.5-MoE: GDN and gated attention; the routed experts are bf16
                      // (synth writes the fused layout unquantised), the shared expert FP8.
                      Fp8TpModel{"qwen3_5_moe_fp8_tp", "tests/data/models/qwen3.5-moe-fp8-tiny",
                                 "layers.1.mlp.shared_expert.gate_up_proj",
                                 R"({"hidden_size": 256, "head_dim": 128, "num_attention_heads": 2,
                       "num_key_value_heads": 1, "linear_num_key_heads": 4,
                       "linear_num_value_heads": 4, "linear_key_head_dim": 64,
                       "linear_value_head_dim": 64, "moe_intermediate_size": 256,
                       "shared_expert_intermediate_size": 256, "num_experts": 4,
                       "num_hidden_layers": 2,
                       "layer_types": ["linear_attention", "full_attention"],
                       "rope_parameters": {"mrope_section": [8, 4, 4]}})"}),
    [](const auto& info) { return std::string(info.param.name); });

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
  // FP8 packs whose splits fall inside their scale blocks are refused with
  // the tensor, the boundary, the block size and what to do instead: the
  // fixtures' 64-row K/V heads and 64-column GDN value heads per rank lie
  // inside 128-row (128-column) blocks.
  struct BadModel {
    std::string dir, message;
  };
  const std::vector<BadModel> fp8_bads = {
      {"tests/data/models/qwen3-fp8-tiny",
       ": tensor parallel 2: tensor 'layers.0.self_attn.qkv_proj' splits at row 320, inside its "
       "FP8 scale blocks of 128 rows (expected a multiple of 128); convert with --dtype f32 "
       "(exact) or bf16 to split it"},
      {"tests/data/models/qwen3.5-moe-fp8-tiny",
       ": tensor parallel 2: tensor 'layers.0.linear_attn.out_proj' splits at column 64, inside "
       "its FP8 scale blocks of 128 columns (expected a multiple of 128); convert with --dtype "
       "f32 (exact) or bf16 to split it"},
  };
  for (const BadModel& b : fp8_bads) {
    const std::string fp8 = pack_of(b.dir);
    ASSERT_FALSE(fp8.empty());
    RunResult g = generate(fp8, base + ".jsonl", base + ".fp8.out", "--tensor-parallel 2");
    EXPECT_EQ(g.status, 1) << b.dir;
    EXPECT_NE(g.err.find(b.message), std::string::npos) << b.dir << ": " << g.err;
    EXPECT_FALSE(std::filesystem::exists(base + ".fp8.out")) << b.dir;
    EXPECT_FALSE(std::filesystem::exists(base + ".fp8.out.meta.json")) << b.dir;
  }
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
  EXPECT_NE(b.err.find("setting 'tensor_parallel' was 2, now 1 (it changes the results)"),
            std::string::npos)
      << b.err;
  RunResult c = generate(pack, base + ".jsonl", base + ".out", "--resume --tensor-parallel 2");
  EXPECT_EQ(c.status, 0) << c.err;
}

}  // namespace
}  // namespace qtk::rt_test
