// MoE routing and accumulation kernels against scalar references written
// independently here (softmax in double, a stable sort for the top-k).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

struct RefRoute {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  std::vector<double> probs;
};

// softmax in double; the k largest in decreasing order, ties to the lower
// index (std::stable_sort keeps index order among equal values).
RefRoute ref_route(const float* logits, int64_t E, int64_t k, bool renormalize) {
  RefRoute r;
  double mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
  double sum = 0;
  r.probs.resize(E);
  for (int64_t e = 0; e < E; ++e) sum += r.probs[e] = std::exp(logits[e] - mx);
  for (double& p : r.probs) p /= sum;
  std::vector<int32_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return r.probs[a] > r.probs[b]; });
  double top = 0;
  for (int64_t j = 0; j < k; ++j) {
    r.ids.push_back(order[j]);
    r.weights.push_back(r.probs[order[j]]);
    top += r.probs[order[j]];
  }
  if (renormalize)
    for (double& w : r.weights) w /= top;
  return r;
}

// Logits whose probabilities are well apart (a shuffled ramp with steps of
// 0.05 plus noise below 0.01), so float32 and double agree on the order.
std::vector<float> separated_logits(int64_t T, int64_t E, int64_t ld, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-0.01f, 0.01f);
  std::vector<float> x(T * ld, -1e30f);  // padding past E is never read
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t e = 0; e < E; ++e) x[t * ld + e] = 0.05f * perm[e] - 2.0f + noise(rng);
  }
  return x;
}

TEST(MoeRoute, MatchesReferenceOnAwkwardSizes) {
  int checked = 0;
  for (int64_t E : {1, 2, 3, 7, 8, 61, 128, 257}) {
    for (int64_t k : {int64_t{1}, int64_t{2}, std::min<int64_t>(8, E), E}) {
      if (k > E) continue;
      for (int64_t T : {1, 5, 33}) {
        for (bool renorm : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "E " << E << " k " << k << " T " << T << " renorm " << renorm);
          const int64_t ld = E + 3;  // a row stride wider than E
          std::vector<float> x =
              separated_logits(T, E, ld, static_cast<uint32_t>(E * 131 + k * 7 + T));
          const std::vector<float> x0 = x;
          std::vector<int32_t> ids(T * k, -1);
          std::vector<float> w(T * k, -1.0f);
          moe_route(x.data(), ld, T, E, k, renorm, ids.data(), w.data());
          for (int64_t t = 0; t < T; ++t) {
            const RefRoute r = ref_route(x0.data() + t * ld, E, k, renorm);
            for (int64_t j = 0; j < k; ++j) {
              ASSERT_EQ(ids[t * k + j], r.ids[j]) << "token " << t << " rank " << j;
              // note: 1e-5 relative: a float32 softmax (exp within 4 ulp, a
              // running sum of up to 257 positive terms, ~257 * 2^-24 at
              // worst) against a double one.
              EXPECT_NEAR(w[t * k + j], r.weights[j], 1e-5 * r.weights[j])
                  << "token " << t << " rank " << j;
            }
            // The probabilities are left in the logits buffer.
            for (int64_t e = 0; e < E; ++e)
              EXPECT_NEAR(x[t * ld + e], r.probs[e], 1e-5 * r.probs[e]);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(MoeRoute, RenormalisedWeightsSumToOne) {
  const int64_t T = 17, E = 60, k = 6;
  std::vector<float> x = test::random_floats(T * E, 5, 3.0f);
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k), w_raw(T * k);
  std::vector<float> x2 = x;
  moe_route(x.data(), E, T, E, k, true, ids.data(), w.data());
  moe_route(x2.data(), E, T, E, k, false, ids.data(), w_raw.data());
  for (int64_t t = 0; t < T; ++t) {
    float s = 0, s_raw = 0;
    for (int64_t j = 0; j < k; ++j) s += w[t * k + j], s_raw += w_raw[t * k + j];
    EXPECT_NEAR(s, 1.0f, 1e-6f);
    EXPECT_LT(s_raw, 1.0f);
    for (int64_t j = 1; j < k; ++j) EXPECT_GE(w[t * k + j - 1], w[t * k + j]);  // decreasing
  }
}

TEST(MoeRoute, TiesGoToTheLowerExpertIndex) {
  // Token 0: all equal. Token 1: experts 2, 5 and 6 share the largest logit.
  // Token 2: one winner, then a tie between 7 and 3 for the second place.
  const int64_t E = 8, k = 3;
  std::vector<float> x = {0, 0, 0, 0, 0, 0, 0, 0,  //
                          1, 1, 4, 1, 1, 4, 4, 1,  //
                          0, 0, 0, 2, 0, 0, 9, 2};
  std::vector<int32_t> ids(3 * k);
  std::vector<float> w(3 * k);
  moe_route(x.data(), E, 3, E, k, true, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 2, 5, 6, 6, 3, 7}));
  for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(w[j], 1.0f / 3);
  EXPECT_EQ(w[7], w[8]);
}

TEST(MoeScatterAdd, MatchesScalarLoopBitForBit) {
  const int64_t H = 37, n = 11, ldo = 41, ldy = 39, T = 9;
  std::vector<float> out = test::random_floats(T * ldo, 1);
  const std::vector<float> y = test::random_floats(n * ldy, 2);
  const std::vector<float> w = test::random_floats(n, 3);
  const std::vector<int32_t> rows = {0, 2, 2, 3, 8, 1, 0, 5, 5, 7, 4};  // repeats included
  std::vector<float> ref = out;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < H; ++c) {
      const float p = w[r] * y[r * ldy + c];  // one product, one add, in r order
      ref[rows[r] * ldo + c] = ref[rows[r] * ldo + c] + p;
    }
  moe_scatter_add(out.data(), ldo, y.data(), ldy, rows.data(), w.data(), n, H);
  EXPECT_TRUE(test::bit_equal(out.data(), ref.data(), out.size()));
}

TEST(MoeAddGated, MatchesReference) {
  const int64_t H = 45, T = 13, ldo = 47, ldy = 50;
  std::vector<float> out = test::random_floats(T * ldo, 4);
  const std::vector<float> y = test::random_floats(T * ldy, 5);
  const std::vector<float> g = test::random_floats(T, 6, 4.0f);
  const std::vector<float> before = out;
  moe_add_gated(out.data(), ldo, y.data(), ldy, g.data(), T, H);
  for (int64_t t = 0; t < T; ++t) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[t])));
    for (int64_t c = 0; c < ldo; ++c) {
      const double want = c < H ? before[t * ldo + c] + s * y[t * ldy + c] : before[t * ldo + c];
      // note: the sigmoid is a float32 polynomial exp (4 ulp); two roundings follow.
      EXPECT_NEAR(out[t * ldo + c], want, 1e-6 * (std::fabs(want) + 1)) << t << " " << c;
    }
  }
}

}  // namespace
}  // namespace qtk
