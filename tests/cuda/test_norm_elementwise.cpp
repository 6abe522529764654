// Norms, RoPE and elementwise kernels against the float64 references.
#include <algorithm>

#include "kernels/argmax.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda/gpu_test_util.h"
#include "tests/cuda/reference.h"
#include "tests/cuda/rope_cases.h"

namespace qtk::cuda::test {
namespace {

template <class T>
class NormTest : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(NormTest, ActTypes);

TYPED_TEST(NormTest, RmsNormMatchesReference) {
  using T = TypeParam;
  for (int64_t rows : {1, 3, 17, 130})
    for (int64_t cols : {7, 64, 1000, 4096}) {
      const auto xh = to_device_type<T>(random_floats(rows * cols, -3, 3, 1));
      const auto w = random_floats(cols, 0.5f, 1.5f, 2);
      DeviceBuffer<T> x(xh), y(rows * cols);
      DeviceBuffer<float> wd(w);
      rmsnorm<T>(x.get(), cols, wd.get(), y.get(), cols, rows, cols, 1e-6f, nullptr);
      const Vec ref = rmsnorm_ref(to_double(xh), Vec(w.begin(), w.end()), rows, cols, 1e-6);
      EXPECT_LT(rel_error(y.download(), ref), tolerance<T>()) << rows << "x" << cols;
    }
}

TYPED_TEST(NormTest, AddRmsNormUpdatesResidualAndNorms) {
  using T = TypeParam;
  // 1030 columns: all in registers; 2600: past the 2048 the kernel keeps in
  // registers (the rest is re-read).
  for (const int64_t cols : {1030, 2600}) {
    const int64_t rows = 19;
    const auto rh = to_device_type<T>(random_floats(rows * cols, -2, 2, 3));
    const auto xh = to_device_type<T>(random_floats(rows * cols, -2, 2, 4));
    const auto w = random_floats(cols, 0.5f, 1.5f, 5);
    DeviceBuffer<T> r(rh), x(xh), y(rows * cols);
    DeviceBuffer<float> wd(w);
    add_rmsnorm<T>(r.get(), cols, x.get(), cols, wd.get(), y.get(), cols, rows, cols, 1e-6f,
                   nullptr);
    Vec sum(rows * cols);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = to_float(rh[i]) + to_float(xh[i]);
    EXPECT_LT(rel_error(r.download(), sum), tolerance<T>());
    const Vec ref = rmsnorm_ref(sum, Vec(w.begin(), w.end()), rows, cols, 1e-6);
    EXPECT_LT(rel_error(y.download(), ref), tolerance<T>()) << cols;
  }
}

TYPED_TEST(NormTest, GatedRmsNormWithStridedInputs) {
  using T = TypeParam;
  const int64_t tokens = 13, heads = 3, dim = 24, ld = heads * dim + 8;  // padded rows
  const auto xh = to_device_type<T>(random_floats(tokens * ld, -2, 2, 6));
  const auto zh = to_device_type<T>(random_floats(tokens * ld, -3, 3, 7));
  const auto w = random_floats(dim, 0.5f, 1.5f, 8);
  DeviceBuffer<T> x(xh), z(zh), y(tokens * heads * dim);
  DeviceBuffer<float> wd(w);
  gated_rmsnorm<T>(x.get(), ld, z.get(), ld, wd.get(), y.get(), heads * dim, tokens, heads, dim,
                   1e-6f, nullptr);
  Vec xs, zs;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < heads * dim; ++c) {
      xs.push_back(to_float(xh[t * ld + c]));
      zs.push_back(to_float(zh[t * ld + c]));
    }
  const Vec ref = gated_rmsnorm_ref(xs, zs, Vec(w.begin(), w.end()), tokens * heads, dim, 1e-6);
  EXPECT_LT(rel_error(y.download(), ref), tolerance<T>());
}

TYPED_TEST(NormTest, L2NormHeads) {
  using T = TypeParam;
  for (int64_t dim : {16, 32, 128}) {
    const int64_t tokens = 11, heads = 5;
    const auto xh = to_device_type<T>(random_floats(tokens * heads * dim, -4, 4, 9));
    DeviceBuffer<T> x(xh);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    l2norm_heads<T>(x.get(), heads * dim, tokens, heads, dim, 1e-6f, scale, nullptr);
    const Vec ref = l2norm_ref(to_double(xh), tokens * heads, dim, 1e-6, scale);
    EXPECT_LT(rel_error(x.download(), ref), tolerance<T>()) << dim;
  }
}

struct RopeCase {
  int64_t dim, rotary_dim;
  RopeParams p;
  bool norm;
};

TYPED_TEST(NormTest, QkNormRopePlainPartialAndMrope) {
  using T = TypeParam;
  std::vector<RopeCase> cases;
  const RopeParams plain = plain_rope(), mrope = qwen35_mrope();
  cases.push_back({128, 128, plain, true});
  cases.push_back({256, 64, mrope, true});
  RopeParams tiny = mrope;  // qwen3.5-tiny: head 32, rotary 8, sections [2, 1, 1]
  tiny.rotary_dim = 8;
  tiny.sections[0] = 2;
  tiny.sections[1] = 1;
  tiny.sections[2] = 1;
  cases.push_back({32, 8, tiny, false});
  RopeParams contiguous = tiny;
  contiguous.interleaved = false;
  cases.push_back({32, 8, contiguous, true});
  RopeParams d64 = plain;
  d64.rotary_dim = 64;
  cases.push_back({64, 64, d64, true});
  for (const auto& c : cases) {
    const int64_t tokens = 37, heads = 3, ld = heads * c.dim + 16;
    auto xf = random_floats(tokens * ld, -2, 2, 10);
    const auto xh = to_device_type<T>(xf);
    const auto w = random_floats(c.dim, 0.5f, 1.5f, 11);
    std::vector<int32_t> pos(3 * tokens);
    std::mt19937 rng(12);
    for (auto& v : pos) v = static_cast<int32_t>(rng() % 40000);  // long-context angles
    DeviceBuffer<T> x(xh);
    DeviceBuffer<float> wd(w);
    DeviceBuffer<int32_t> pd(pos);
    qk_norm_rope<T>(x.get(), ld, tokens, heads, c.dim, c.norm ? wd.get() : nullptr, 1e-6f, pd.get(),
                    c.p, nullptr);
    Vec xs;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < heads * c.dim; ++i) xs.push_back(to_float(xh[t * ld + i]));
    const Vec wv(w.begin(), w.end());
    const Vec ref =
        qk_norm_rope_ref(xs, tokens, heads, c.dim, c.norm ? &wv : nullptr, 1e-6, pos, c.p);
    const auto out = x.download();
    std::vector<T> got;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < heads * c.dim; ++i) got.push_back(out[t * ld + i]);
    EXPECT_LT(rel_error(got, ref), tolerance<T>()) << "dim " << c.dim;
    // The padding after each row stays untouched.
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = heads * c.dim; i < ld; ++i)
        ASSERT_EQ(to_float(out[t * ld + i]), to_float(xh[t * ld + i]));
  }
}

// The fused attention-input kernel equals qk_norm_rope (q, k) followed by
// kv_cache_write, bit for bit, including padding rows (slot -1) that write
// nothing and a shuffled slot mapping.
TYPED_TEST(NormTest, QkvRopeCacheEqualsSeparateCalls) {
  using T = TypeParam;
  RopeParams rope;
  rope.rotary_dim = 64;
  rope.theta = 1e6;
  for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
    const int64_t tokens = 29, hq = 6, hkv = 2, w = (hq + 2 * hkv) * dim, ld = w + 8;
    const int64_t slots = 64;
    const auto xh = to_device_type<T>(random_floats(tokens * ld, -2, 2, 31));
    const auto qw = random_floats(dim, 0.5f, 1.5f, 32), kw = random_floats(dim, 0.5f, 1.5f, 33);
    std::vector<int32_t> pos(3 * tokens);
    std::vector<int64_t> slot(tokens);
    std::mt19937 rng(34);
    for (auto& v : pos) v = static_cast<int32_t>(rng() % 5000);
    for (int64_t t = 0; t < tokens; ++t) slot[t] = t % 7 == 3 ? -1 : (t * 37) % slots;
    const std::vector<T> poison(slots * hkv * dim, from_float<T>(NAN));
    DeviceBuffer<float> qwd(qw), kwd(kw);
    DeviceBuffer<int32_t> pd(pos);
    DeviceBuffer<int64_t> sd(slot);
    DeviceBuffer<T> a(xh), b(xh), ka(poison), va(poison), kb(poison), vb(poison);
    qk_norm_rope<T>(a.get(), ld, tokens, hq, dim, qwd.get(), 1e-6f, pd.get(), rope, nullptr);
    qk_norm_rope<T>(a.get() + hq * dim, ld, tokens, hkv, dim, kwd.get(), 1e-6f, pd.get(), rope,
                    nullptr);
    kv_cache_write<T>(a.get() + hq * dim, ld, a.get() + (hq + hkv) * dim, ld, tokens, hkv, dim,
                      sd.get(), ka.get(), va.get(), nullptr);
    qkv_rope_cache<T>(b.get(), ld, tokens, hq, hkv, dim, qwd.get(), kwd.get(), 1e-6f, pd.get(),
                      rope, sd.get(), kb.get(), vb.get(), nullptr);
    const auto xa = a.download(), xb = b.download();
    EXPECT_TRUE(bitwise_equal(xa.data(), xb.data(), xa.size())) << "dim " << dim;
    const auto k1 = ka.download(), k2 = kb.download(), v1 = va.download(), v2 = vb.download();
    EXPECT_TRUE(bitwise_equal(k1.data(), k2.data(), k1.size())) << "dim " << dim;
    EXPECT_TRUE(bitwise_equal(v1.data(), v2.data(), v1.size())) << "dim " << dim;
    // The values really moved: every written slot differs from the poison.
    int64_t written = 0;
    for (int64_t t = 0; t < tokens; ++t)
      if (slot[t] >= 0) written += !std::isnan(to_float(k2[slot[t] * hkv * dim]));
    EXPECT_EQ(written, tokens - (tokens + 3) / 7);
  }
}

// The RoPE (cos, sin) table gives bit for bit the values computed inline,
// for positions inside it and (inline fallback) past it, plain and M-RoPE.
TYPED_TEST(NormTest, RopeTableGivesTheInlineValues) {
  using T = TypeParam;
  const RopeParams plain = plain_rope(), mrope = qwen35_mrope();
  const int64_t table_positions = 2000;
  for (const RopeParams& rope : {plain, mrope}) {
    const int64_t dim = 128, tokens = 41, heads = 4, ld = heads * dim + 8;
    const auto xh = to_device_type<T>(random_floats(tokens * ld, -2, 2, 41));
    const auto w = random_floats(dim, 0.5f, 1.5f, 42);
    std::vector<int32_t> pos(3 * tokens);
    std::mt19937 rng(43);
    for (auto& v : pos) v = static_cast<int32_t>(rng() % 3000);  // a third past the table
    DeviceBuffer<float2> table(table_positions * rope.rotary_dim / 2);
    rope_table_build(table.get(), table_positions, rope, nullptr);
    RopeParams with = rope;
    with.table = table.get();
    with.table_positions = table_positions;
    DeviceBuffer<T> a(xh), b(xh);
    DeviceBuffer<float> wd(w);
    DeviceBuffer<int32_t> pd(pos);
    qk_norm_rope<T>(a.get(), ld, tokens, heads, dim, wd.get(), 1e-6f, pd.get(), rope, nullptr);
    qk_norm_rope<T>(b.get(), ld, tokens, heads, dim, wd.get(), 1e-6f, pd.get(), with, nullptr);
    const auto xa = a.download(), xb = b.download();
    EXPECT_TRUE(bitwise_equal(xa.data(), xb.data(), xa.size())) << "rotary " << rope.rotary_dim;
    // The kernel really reads the table: an identity table (cos 1, sin 0)
    // changes the tokens whose positions it covers (position 0 rotates by
    // the identity anyway) and none whose positions are all past it.
    const std::vector<float2> identity(table_positions * rope.rotary_dim / 2, float2{1.0f, 0.0f});
    DeviceBuffer<float2> fake(identity);
    RopeParams fake_rope = with;
    fake_rope.table = fake.get();
    DeviceBuffer<T> c(xh);
    qk_norm_rope<T>(c.get(), ld, tokens, heads, dim, wd.get(), 1e-6f, pd.get(), fake_rope, nullptr);
    const auto xc = c.download();
    for (int64_t t = 0; t < tokens; ++t) {
      bool covered = true;
      for (int a = 0; a < 3; ++a)
        covered = covered && pos[a * tokens + t] > 0 && pos[a * tokens + t] < table_positions;
      bool inside_any = false;
      for (int a = 0; a < 3; ++a) inside_any = inside_any || pos[a * tokens + t] < table_positions;
      const bool same = bitwise_equal(&xc[t * ld], &xa[t * ld], heads * dim);
      if (covered) {
        EXPECT_FALSE(same) << "token " << t;
      }
      if (!inside_any) {
        EXPECT_TRUE(same) << "token " << t;
      }
    }
  }
}

// swiglu's 16-byte path (bf16, aligned rows, inter % 8 == 0; several
// column blocks) gives the bits of its element-wise path (odd row stride).
TYPED_TEST(NormTest, SwigluVectorPathEqualsScalarPath) {
  using T = TypeParam;
  const int64_t tokens = 5, inter = 2056, ld_vec = 2 * inter + 8, ld_odd = 2 * inter + 1;
  const auto f = random_floats(tokens * 2 * inter, -6, 6, 15);
  std::vector<float> fv(tokens * ld_vec, 0.0f), fo(tokens * ld_odd, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < 2 * inter; ++i)
      fv[t * ld_vec + i] = fo[t * ld_odd + i] = f[t * 2 * inter + i];
  DeviceBuffer<T> gv(to_device_type<T>(fv)), go(to_device_type<T>(fo));
  DeviceBuffer<T> ov(tokens * inter), oo(tokens * inter);
  swiglu<T>(gv.get(), ld_vec, ov.get(), inter, tokens, inter, nullptr);
  swiglu<T>(go.get(), ld_odd, oo.get(), inter, tokens, inter, nullptr);
  const auto a = ov.download(), b = oo.download();
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size()));
  Vec ref(tokens * inter);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < inter; ++i)
      ref[t * inter + i] = silu_d(to_float(to_device_type<T>({f[t * 2 * inter + i]})[0])) *
                           to_float(to_device_type<T>({f[t * 2 * inter + inter + i]})[0]);
  EXPECT_LT(rel_error(a, ref), tolerance<T>());
}

TYPED_TEST(NormTest, SwigluSigmoidMulAndGates) {
  using T = TypeParam;
  const int64_t tokens = 21, inter = 333;
  const auto gu = to_device_type<T>(random_floats(tokens * 2 * inter, -4, 4, 13));
  DeviceBuffer<T> gud(gu), out(tokens * inter);
  swiglu<T>(gud.get(), 2 * inter, out.get(), inter, tokens, inter, nullptr);
  Vec ref(tokens * inter);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < inter; ++i)
      ref[t * inter + i] =
          silu_d(to_float(gu[t * 2 * inter + i])) * to_float(gu[t * 2 * inter + inter + i]);
  EXPECT_LT(rel_error(out.download(), ref), tolerance<T>());

  // sigmoid_mul on the gate half (stride 2*inter) into the up half.
  DeviceBuffer<T> x(gu);
  sigmoid_mul<T>(x.get() + inter, 2 * inter, x.get(), 2 * inter, tokens, inter, nullptr);
  const auto xs = x.download();
  Vec got, want;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      got.push_back(to_float(xs[t * 2 * inter + inter + i]));
      want.push_back(to_float(gu[t * 2 * inter + inter + i]) *
                     sigmoid_d(to_float(gu[t * 2 * inter + i])));
    }
  EXPECT_LT(rel_error(got, want), tolerance<T>());

  // gdn_gates, including arguments above softplus' threshold of 20.
  const int64_t hv = 6, ld = 16;
  auto ab = random_floats(tokens * ld, -8, 8, 14);
  ab[3] = 25.0f;
  const auto abh = to_device_type<T>(ab);
  const auto A = random_floats(hv, -3, -0.1f, 15), dt = random_floats(hv, -1, 1, 16);
  DeviceBuffer<T> abd(abh);
  DeviceBuffer<float> Ad(A), dtd(dt), g(tokens * hv), beta(tokens * hv);
  gdn_gates<T>(abd.get(), ld, abd.get() + hv, ld, Ad.get(), dtd.get(), g.get(), beta.get(), tokens,
               hv, nullptr);
  Vec gref(tokens * hv), bref(tokens * hv);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < hv; ++h) {
      const double a = double(to_float(abh[t * ld + h])) + dt[h];
      gref[t * hv + h] = A[h] * (a > 20 ? a : std::log1p(std::exp(a)));
      bref[t * hv + h] = sigmoid_d(to_float(abh[t * ld + hv + h]));
    }
  // note: f32 outputs from T inputs: float32 rounding only.
  EXPECT_LT(rel_error(g.download(), gref), 1e-5);
  EXPECT_LT(rel_error(beta.download(), bref), 1e-5);
}

TYPED_TEST(NormTest, EmbeddingLookupIsExact) {
  using T = TypeParam;
  const int64_t vocab = 301, hidden = 72, n = 9;
  const auto table_f = random_floats(vocab * hidden, -1, 1, 17);
  const auto table_b = to_device_type<bf16>(table_f);
  const std::vector<int32_t> ids = {0, 300, 5, 5, 17, 299, 1, 150, 42};
  DeviceBuffer<int32_t> idd(ids);
  for (bool use_bf16 : {false, true}) {
    DeviceBuffer<float> tf(table_f);
    DeviceBuffer<bf16> tb(table_b);
    DeviceBuffer<T> out(n * hidden);
    embedding_lookup<T>(use_bf16 ? static_cast<const void*>(tb.get()) : tf.get(),
                        use_bf16 ? DType::BF16 : DType::F32, hidden, idd.get(), n, out.get(),
                        hidden, nullptr);
    const auto o = out.download();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < hidden; ++c) {
        const float src =
            use_bf16 ? to_float(table_b[ids[i] * hidden + c]) : table_f[ids[i] * hidden + c];
        ASSERT_EQ(to_float(o[i * hidden + c]), to_float(from_float<T>(src)));
      }
  }
  EXPECT_THROW(
      embedding_lookup<T>(nullptr, DType::I32, hidden, idd.get(), n, nullptr, hidden, nullptr),
      std::exception);
}

// The host's answer: first index of the maximum, margin to the best other.
void expect_host_argmax(const std::vector<float>& logits, int64_t ld, int64_t rows, int64_t vocab,
                        const std::vector<int32_t>& gi, const std::vector<float>& gm) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &logits[r * ld];
    int32_t best = 0;
    for (int64_t c = 1; c < vocab; ++c)
      if (row[c] > row[best]) best = static_cast<int32_t>(c);
    float second = -INFINITY;
    for (int64_t c = 0; c < vocab; ++c)
      if (c != best) second = std::max(second, row[c]);
    EXPECT_EQ(gi[r], best) << "row " << r << " ld " << ld;
    EXPECT_EQ(gm[r], row[best] - second) << "row " << r << " ld " << ld;  // both exact in float
  }
}

TEST(Argmax, LowestIdOnTiesAndExactMargin) {
  const int64_t rows = 5, vocab = 151936;
  auto logits = random_floats(rows * vocab, -10, 10, 18);
  logits[0 * vocab + 70000] = 50.0f;  // row 0: clear winner
  logits[1 * vocab + 9] = 30.0f;      // row 1: tie between 9 and 100000 -> 9, margin 0
  logits[1 * vocab + 100000] = 30.0f;
  logits[2 * vocab + vocab - 1] = 40.0f;  // row 2: the last id
  // row 3: a tie inside one thread's columns (float4 groups 2 and 2 + 1024 of
  // thread 2), and in one float4 group
  logits[3 * vocab + 4104] = 35.0f;
  logits[3 * vocab + 8] = 35.0f;
  logits[4 * vocab + 7] = 33.0f;
  logits[4 * vocab + 6] = 33.0f;
  DeviceBuffer<float> ld(logits), margin(rows);
  DeviceBuffer<int32_t> ids(rows);
  argmax_rows(ld.get(), vocab, rows, vocab, ids.get(), margin.get(), nullptr);
  const auto gi = ids.download();
  const auto gm = margin.download();
  expect_host_argmax(logits, vocab, rows, vocab, gi, gm);
  EXPECT_EQ(gi[1], 9);
  EXPECT_EQ(gm[1], 0.0f);
  EXPECT_EQ(gi[3], 8);
  EXPECT_EQ(gi[4], 6);
}

// Rows that are not 16-byte aligned (odd stride) and a vocabulary that is not
// a multiple of 4 take the scalar loads; same answers.
TEST(Argmax, UnalignedRowsAndOddVocabulary) {
  for (const auto& [vocab, ld] : {std::pair<int64_t, int64_t>{1001, 1003}, {151936, 151937}}) {
    const int64_t rows = 4;
    auto logits = random_floats(rows * ld, -10, 10, 19);
    logits[1 * ld + vocab - 1] = 20.0f;  // the last id (tail)
    logits[2 * ld + 3] = 21.0f;
    logits[2 * ld + 900] = 21.0f;
    DeviceBuffer<float> dl(logits), margin(rows);
    DeviceBuffer<int32_t> ids(rows);
    argmax_rows(dl.get(), ld, rows, vocab, ids.get(), margin.get(), nullptr);
    const auto gi = ids.download();
    expect_host_argmax(logits, ld, rows, vocab, gi, margin.download());
    EXPECT_EQ(gi[1], vocab - 1);
    EXPECT_EQ(gi[2], 3);
  }
}

// With a workspace, small batches spread each row over several blocks
// (kernels/cuda/elementwise.cu): the same ids and margins, ties across the
// blocks' segments included, for aligned and unaligned rows.
TEST(Argmax, RowsSplitOverBlocksGiveTheSameAnswers) {
  for (const auto& [vocab, ld] : {std::pair<int64_t, int64_t>{151936, 151936},
                                  {151935, 151937},
                                  {248320, 248320},
                                  {5000, 5000}})
    for (const int64_t rows : {1, 3, 9, 300}) {
      auto logits = random_floats(rows * ld, -10, 10, static_cast<uint32_t>(rows + vocab));
      // row 0: a tie between the first column and one in the last segment;
      // the last row: its best in the last column, the runner-up in column 0.
      logits[0] = 25.0f;
      logits[vocab - 3] = 25.0f;
      logits[(rows - 1) * ld + vocab - 1] = 30.0f;
      logits[(rows - 1) * ld] = 29.5f;
      DeviceBuffer<float> dl(logits), margin(rows);
      DeviceBuffer<int32_t> ids(rows);
      DeviceBuffer<char> work(argmax_work_bytes(rows));
      argmax_rows(dl.get(), ld, rows, vocab, ids.get(), margin.get(), nullptr, work.get());
      const auto gi = ids.download();
      const auto gm = margin.download();
      expect_host_argmax(logits, ld, rows, vocab, gi, gm);
      if (rows > 1) {
        EXPECT_EQ(gi[0], 0) << vocab << " " << rows;
        EXPECT_EQ(gm[0], 0.0f);
      }
      EXPECT_EQ(gi[rows - 1], vocab - 1);
      EXPECT_EQ(gm[rows - 1], 0.5f);
    }
}

// Rows with NaN and infinite logits: the margin is NaN and the id the argmax
// of the finite logits (0 when none is finite), as the host's argmax_rows
// gives, whole rows and rows split over blocks alike; the finite rows beside
// them keep their answers.
TEST(Argmax, NonFiniteLogitsGiveANaNMarginAndAValidId) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t vocab : {151936, 1001}) {
    const int64_t rows = 7;
    auto logits = random_floats(rows * vocab, -10, 10, static_cast<uint32_t>(vocab + 3));
    logits[0 * vocab + 17] = nan;                                     // one NaN
    logits[1 * vocab + vocab - 1] = inf;                              // +inf at the end
    logits[2 * vocab + 5] = -inf;                                     // -inf
    for (int64_t c = 0; c < vocab; ++c) logits[3 * vocab + c] = nan;  // all NaN
    logits[4 * vocab + 3] = 40.0f;                                    // finite, clear winner
    logits[5 * vocab + 3] = 40.0f;                                    // a winner beside a NaN
    logits[5 * vocab + vocab / 2] = nan;
    for (int64_t c = 0; c < vocab; ++c) logits[6 * vocab + c] = c % 2 ? -inf : inf;
    std::vector<int32_t> host_ids(rows);
    std::vector<float> host_margin(rows);
    qtk::argmax_rows(logits.data(), rows, vocab, host_ids.data(), host_margin.data());
    DeviceBuffer<float> dl(logits);
    for (const bool split : {false, true}) {
      DeviceBuffer<float> margin(rows);
      DeviceBuffer<int32_t> ids(rows);
      DeviceBuffer<char> work(argmax_work_bytes(rows));
      argmax_rows(dl.get(), vocab, rows, vocab, ids.get(), margin.get(), nullptr,
                  split ? work.get() : nullptr);
      const auto gi = ids.download();
      const auto gm = margin.download();
      for (int64_t r = 0; r < rows; ++r) {
        const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(r) +
                                  (split ? " split" : " whole");
        EXPECT_EQ(std::isnan(gm[r]), r != 4) << where;
        EXPECT_TRUE(std::isnan(host_margin[r]) == (r != 4)) << where;
        EXPECT_EQ(gi[r], host_ids[r]) << where;
        EXPECT_GE(gi[r], 0) << where;
        EXPECT_LT(gi[r], vocab) << where;
      }
      EXPECT_EQ(gi[3], 0);
      EXPECT_EQ(gi[4], 3);
      EXPECT_EQ(gi[5], 3);
      EXPECT_EQ(gi[6], 0);
      EXPECT_EQ(gm[4], host_margin[4]);
    }
  }
}

}  // namespace
}  // namespace qtk::cuda::test
