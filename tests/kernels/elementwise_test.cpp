#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/argmax.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/embedding.h"
#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

TEST(Elementwise, ExpPolynomialIsWithinFourUlp) {
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    float xf = static_cast<float>(x);
    double exact = std::exp(static_cast<double>(xf));
    double rel = std::fabs(cpu::exp_poly(xf) - exact) / exact;
    worst = std::max(worst, rel);
  }
  // note: 4 ulp = 4 * 2^-23 relative (measured ~1.5 ulp).
  EXPECT_LT(worst, 4.0 * std::ldexp(1.0, -23)) << "worst relative error " << worst;
  EXPECT_EQ(cpu::exp_poly(0.0f), 1.0f);
  EXPECT_LT(cpu::exp_poly(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isfinite(cpu::exp_poly(1000.0f)));
}

TEST(Elementwise, SwigluMatchesReference) {
  for (int64_t I : {1, 3, 17, 63, 130}) {
    const int64_t T = 5, ld = 2 * I + 3, ldo = I + 2;
    auto gu = test::random_floats(T * ld, 3 + I, 4.0f);
    std::vector<float> out(T * ldo), ref_out(T * ldo);
    swiglu(gu.data(), ld, out.data(), ldo, T, I);
    ref::swiglu_ref(gu.data(), ld, ref_out.data(), ldo, T, I);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < I; ++i) {
        // note: exp polynomial (~2 ulp) + a division and a product in f32.
        float r = ref_out[t * ldo + i];
        ASSERT_NEAR(out[t * ldo + i], r, 1e-6 * std::fabs(r) + 1e-30) << I << " " << t << " " << i;
      }
  }
}

TEST(Elementwise, SigmoidMulMatchesReference) {
  const int64_t n = 131;
  auto x = test::random_floats(n, 1), gate = test::random_floats(n, 2, 5.0f);
  auto a = x, b = x;
  sigmoid_mul(a.data(), gate.data(), n);
  ref::sigmoid_mul_ref(b.data(), gate.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6 * std::fabs(b[i]) + 1e-30);

  // Per head with the [query | gate] layout of Qwen3.5's q_proj.
  const int64_t T = 3, H = 4, D = 5;
  auto out = test::random_floats(T * H * D, 3);
  auto qg = test::random_floats(T * H * 2 * D, 4);
  auto out2 = out;
  sigmoid_mul_heads(out.data(), H * D, qg.data() + D, H * 2 * D, 2 * D, T, H, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      sigmoid_mul(out2.data() + t * H * D + h * D, qg.data() + t * H * 2 * D + h * 2 * D + D, D);
  EXPECT_TRUE(test::bit_equal(out.data(), out2.data(), out.size()));
}

TEST(Elementwise, EmbeddingLookupAllDtypes) {
  const int64_t vocab = 11, hidden = 13;
  auto table = test::random_floats(vocab * hidden, 5);
  std::vector<uint16_t> bf(table.size()), hf(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    bf[i] = test::float_to_bf16(table[i]);
    hf[i] = test::float_to_f16(table[i] * 1e-4f);  // includes f16 subnormals
  }
  const std::vector<int32_t> ids = {0, 10, 3, 3};
  for (auto [t, data] : {std::pair<DType, const void*>{DType::F32, table.data()},
                         {DType::BF16, bf.data()},
                         {DType::F16, hf.data()}}) {
    std::vector<float> out(ids.size() * hidden), ref_out(ids.size() * hidden);
    embedding_lookup(data, t, hidden, ids.data(), 4, out.data());
    ref::embedding_lookup_ref(data, t, hidden, ids.data(), 4, ref_out.data());
    EXPECT_TRUE(test::bit_equal(out.data(), ref_out.data(), out.size())) << dtype_name(t);
  }
  std::vector<float> out(hidden);
  EXPECT_THROW(embedding_lookup(table.data(), DType::I32, hidden, ids.data(), 1, out.data()),
               Error);
}

TEST(Elementwise, ArgmaxTiesGoToLowestIdAndMarginIsTop1MinusTop2) {
  const int64_t vocab = 7;
  std::vector<float> logits = {
      1,  5,  2,  5,  0,  0,  0,     // tie between 1 and 3
      -3, -2, -1, -9, -9, -9, -9,    // negatives
      0,  0,  0,  0,  0,  0,  4.5f,  // max at the end
  };
  std::vector<int32_t> ids(3), ref_ids(3);
  std::vector<float> margin(3), ref_margin(3);
  argmax_rows(logits.data(), 3, vocab, ids.data(), margin.data());
  ref::argmax_rows_ref(logits.data(), 3, vocab, ref_ids.data(), ref_margin.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 6}));
  EXPECT_EQ(margin, (std::vector<float>{0.0f, 1.0f, 4.5f}));
  EXPECT_EQ(ids, ref_ids);
  EXPECT_EQ(margin, ref_margin);
  // Random rows with many ties (values from a tiny set), against the reference.
  const int64_t rows = 20, v2 = 1000;
  std::vector<float> r(rows * v2);
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<float>((i * 7919) % 13);
  std::vector<int32_t> a(rows), b(rows);
  std::vector<float> ma(rows), mb(rows);
  argmax_rows(r.data(), rows, v2, a.data(), ma.data());
  ref::argmax_rows_ref(r.data(), rows, v2, b.data(), mb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(ma, mb);
  argmax_rows(r.data(), rows, v2, a.data(), nullptr);  // margin optional
  EXPECT_EQ(a, b);
}

// A NaN or an infinity anywhere in a row makes its margin NaN (no greedy token
// is defined); the id is the argmax of the finite logits, 0 when there is none.
TEST(Elementwise, ArgmaxMarksRowsWithNonFiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const int64_t vocab : {1, 2, 5, 1001}) {
    const int64_t rows = 6;
    auto logits = test::random_floats(static_cast<size_t>(rows * vocab),
                                      static_cast<uint32_t>(11 + vocab), 4.0f);
    logits[0 * vocab + vocab - 1] = nan;
    logits[1 * vocab + vocab / 2] = inf;
    logits[2 * vocab] = -inf;
    for (int64_t c = 0; c < vocab; ++c) logits[3 * vocab + c] = nan;
    for (int64_t c = 0; c < vocab; ++c) logits[4 * vocab + c] = c % 2 ? nan : inf;
    // row 5 stays finite
    std::vector<int32_t> ids(rows), ref_ids(rows);
    std::vector<float> margin(rows), ref_margin(rows);
    argmax_rows(logits.data(), rows, vocab, ids.data(), margin.data());
    ref::argmax_rows_ref(logits.data(), rows, vocab, ref_ids.data(), ref_margin.data());
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(std::isnan(margin[r]), r != 5) << "vocab " << vocab << " row " << r;
      EXPECT_EQ(std::isnan(ref_margin[r]), r != 5) << "vocab " << vocab << " row " << r;
      EXPECT_EQ(ids[r], ref_ids[r]) << "vocab " << vocab << " row " << r;
      EXPECT_GE(ids[r], 0);
      EXPECT_LT(ids[r], vocab);
    }
    EXPECT_EQ(ids[3], 0);
    EXPECT_EQ(ids[4], 0);
    EXPECT_FALSE(std::isnan(margin[5]));
    EXPECT_EQ(margin[5], ref_margin[5]);
    if (vocab > 1) {  // the finite winner beside the NaN at the end of row 0
      int32_t best = 0;
      for (int64_t c = 1; c < vocab - 1; ++c)
        if (logits[c] > logits[best]) best = static_cast<int32_t>(c);
      EXPECT_EQ(ids[0], best);
    }
  }
}

}  // namespace
}  // namespace qtk
