#include "kernels/gdn.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/norm.h"
#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

// Minimal safetensors reader for the F32 op fixture (the test must not
// depend on the loaders' own reader, which other tests cover).
std::map<std::string, std::vector<float>> read_f32_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  auto meta = nlohmann::json::parse(header);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, info] : meta.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(info["dtype"], "F32") << name;
    uint64_t b = info["data_offsets"][0], e = info["data_offsets"][1];
    std::vector<float> data((e - b) / 4);
    in.seekg(static_cast<std::streamoff>(8 + header_len + b));
    in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(e - b));
    out[name] = std::move(data);
  }
  return out;
}

const std::string kFixture =
    std::string(QTK_SOURCE_DIR) + "/tests/data/ops/gated_delta_rule.safetensors";
constexpr int64_t kB = 2, kT = 150, kHk = 2, kHv = 4, kDk = 128, kDv = 128;

struct Prepared {
  std::vector<float> q, k, v, g, beta, state, out_ref, final_ref;
};

// Normalises q, k like the model does (l2norm eps 1e-6, q * Dk^-1/2) and
// recomputes g, beta with gdn_gates from a, b, A_log, dt_bias.
Prepared prepare() {
  auto f = read_f32_safetensors(kFixture);
  Prepared p{f["q"],
             f["k"],
             f["v"],
             std::vector<float>(kB * kT * kHv),
             std::vector<float>(kB * kT * kHv),
             f["initial_state"],
             f["output"],
             f["final_state"]};
  EXPECT_EQ(p.q.size(), static_cast<size_t>(kB * kT * kHk * kDk));
  EXPECT_EQ(p.state.size(), static_cast<size_t>(kB * kHv * kDk * kDv));
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDk));
  l2norm_heads(p.q.data(), kHk * kDk, kB * kT, kHk, kDk, 1e-6f, scale);
  l2norm_heads(p.k.data(), kHk * kDk, kB * kT, kHk, kDk, 1e-6f, 1.0f);
  std::vector<float> A(kHv);
  for (int64_t h = 0; h < kHv; ++h) A[h] = -std::exp(f["A_log"][h]);
  gdn_gates(f["a"].data(), f["b"].data(), kHv, A.data(), f["dt_bias"].data(), p.g.data(),
            p.beta.data(), kB * kT, kHv);
  // Our gates against the fixture's own g and beta (float64 reference
  // rounded to f32): a few f32 ulps.
  for (size_t i = 0; i < p.g.size(); ++i) {
    EXPECT_NEAR(p.g[i], f["g"][i], 1e-6 * std::fabs(f["g"][i]) + 1e-7) << i;
    EXPECT_NEAR(p.beta[i], f["beta"][i], 1e-6) << i;
  }
  return p;
}

// Runs sequence s of the fixture split into the given chunk lengths.
void run_chunks(const Prepared& p, int64_t s, const std::vector<int64_t>& chunks,
                std::vector<float>& state, std::vector<float>& out, ThreadPool* pool) {
  state.assign(p.state.begin() + s * kHv * kDk * kDv, p.state.begin() + (s + 1) * kHv * kDk * kDv);
  out.assign(kT * kHv * kDv, 0.0f);
  int64_t t0 = 0;
  for (int64_t len : chunks) {
    const int64_t r = s * kT + t0;
    gated_delta_rule(p.q.data() + r * kHk * kDk, kHk * kDk, p.k.data() + r * kHk * kDk, kHk * kDk,
                     p.v.data() + r * kHv * kDv, kHv * kDv, p.g.data() + r * kHv,
                     p.beta.data() + r * kHv, kHv, state.data(), out.data() + t0 * kHv * kDv,
                     kHv * kDv, len, kHk, kHv, kDk, kDv, pool);
    t0 += len;
  }
  ASSERT_EQ(t0, kT);
}

double max_abs(const float* x, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(x[i])));
  return m;
}

TEST(GatedDeltaRule, MatchesFloat64FixtureInOneCallAndBitIdenticalInChunks) {
  Prepared p = prepare();
  ThreadPool pool(2);
  for (int64_t s = 0; s < kB; ++s) {
    std::vector<float> state, out;
    run_chunks(p, s, {kT}, state, out, &pool);
    const float* out_ref = p.out_ref.data() + s * kT * kHv * kDv;
    const float* fin_ref = p.final_ref.data() + s * kHv * kDk * kDv;
    double out_scale = max_abs(out_ref, out.size()), st_scale = max_abs(fin_ref, state.size());
    double out_err = 0.0, st_err = 0.0;
    for (size_t i = 0; i < out.size(); ++i)
      out_err = std::max(out_err, std::fabs(static_cast<double>(out[i]) - out_ref[i]));
    for (size_t i = 0; i < state.size(); ++i)
      st_err = std::max(st_err, std::fabs(static_cast<double>(state[i]) - fin_ref[i]));
    // note: a float32 state over 150 steps against the float64 reference:
    // each step adds ~1e-7 relative rounding which the decay (< 1) damps;
    // measured 3.4e-7 and 5.2e-7 of the largest output, bound 5e-6.
    EXPECT_LT(out_err, 5e-6 * out_scale) << "seq " << s;
    EXPECT_LT(st_err, 5e-6 * st_scale) << "seq " << s;
    std::printf("seq %ld: max |out err| / max|out| = %.3g, state %.3g\n", static_cast<long>(s),
                out_err / out_scale, st_err / st_scale);

    // Split into awkward chunks (and one-token decode steps): bit-identical.
    for (const auto& chunks : std::vector<std::vector<int64_t>>{
             {1, 149}, {63, 17, 1, 1, 68}, {7, 7, 7, 129}, std::vector<int64_t>(150, 1)}) {
      std::vector<float> st2, out2;
      run_chunks(p, s, chunks, st2, out2, chunks.size() % 2 ? nullptr : &pool);
      EXPECT_TRUE(test::bit_equal(out.data(), out2.data(), out.size()))
          << chunks.size() << " chunks";
      EXPECT_TRUE(test::bit_equal(state.data(), st2.data(), state.size()))
          << chunks.size() << " chunks";
    }
  }
}

TEST(GatedDeltaRule, MatchesScalarReferenceOnAwkwardShapes) {
  // Hk=1 → Hv=3, Dk != Dv, odd sizes.
  for (auto [Hk, Hv, Dk, Dv, T] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {1, 3, 17, 5, 9}, {2, 4, 32, 24, 13}, {1, 1, 1, 1, 3}}) {
    auto q = test::random_floats(T * Hk * Dk, 1), k = test::random_floats(T * Hk * Dk, 2);
    l2norm_heads(q.data(), Hk * Dk, T, Hk, Dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(Dk)));
    l2norm_heads(k.data(), Hk * Dk, T, Hk, Dk, 1e-6f, 1.0f);
    auto v = test::random_floats(T * Hv * Dv, 3);
    auto graw = test::random_floats(T * Hv, 4), braw = test::random_floats(T * Hv, 5);
    std::vector<float> g(T * Hv), beta(T * Hv);
    for (int64_t i = 0; i < T * Hv; ++i) {
      g[i] = -std::fabs(graw[i]);
      beta[i] = 1.0f / (1.0f + std::exp(-braw[i]));
    }
    auto state = test::random_floats(Hv * Dk * Dv, 6, 0.1f);
    auto state_ref = state;
    std::vector<float> out(T * Hv * Dv), out_ref(T * Hv * Dv);
    gated_delta_rule(q.data(), Hk * Dk, k.data(), Hk * Dk, v.data(), Hv * Dv, g.data(), beta.data(),
                     Hv, state.data(), out.data(), Hv * Dv, T, Hk, Hv, Dk, Dv, nullptr);
    ref::gated_delta_rule_ref(q.data(), k.data(), v.data(), g.data(), beta.data(), state_ref.data(),
                              out_ref.data(), T, Hk, Hv, Dk, Dv);
    // note: values are O(1); f32 vs double over <= 13 steps of Dk-long sums.
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5) << i;
    for (size_t i = 0; i < state.size(); ++i) ASSERT_NEAR(state[i], state_ref[i], 2e-5) << i;
  }
}

TEST(GatedDeltaRule, VarlenBatchIsBitIdenticalToOneSequenceAtATime) {
  Prepared p = prepare();
  ThreadPool pool(2);
  // Both fixture sequences in one call: sequence 0's tokens 0..39 as a
  // prefill chunk and sequence 1's token 0 as a decode-like single row.
  std::vector<float> st0(p.state.begin(), p.state.begin() + kHv * kDk * kDv);
  std::vector<float> st1(p.state.begin() + kHv * kDk * kDv, p.state.end());
  const int64_t rows = 41, ldq = kHk * kDk, ldv = kHv * kDv;
  std::vector<float> q(rows * ldq), k(rows * ldq), v(rows * ldv), g(rows * kHv), beta(rows * kHv);
  auto copy_rows = [&](int64_t dst, int64_t src, int64_t n) {
    std::memcpy(q.data() + dst * ldq, p.q.data() + src * ldq, n * ldq * 4);
    std::memcpy(k.data() + dst * ldq, p.k.data() + src * ldq, n * ldq * 4);
    std::memcpy(v.data() + dst * ldv, p.v.data() + src * ldv, n * ldv * 4);
    std::memcpy(g.data() + dst * kHv, p.g.data() + src * kHv, n * kHv * 4);
    std::memcpy(beta.data() + dst * kHv, p.beta.data() + src * kHv, n * kHv * 4);
  };
  copy_rows(0, 0, 40);
  copy_rows(40, kT, 1);
  std::vector<int32_t> q_start = {0, 40, 41};
  float* states[2] = {st0.data(), st1.data()};
  std::vector<float> out(rows * ldv);
  gated_delta_rule_varlen(q.data(), ldq, k.data(), ldq, v.data(), ldv, g.data(), beta.data(), kHv,
                          2, q_start.data(), states, out.data(), ldv, kHk, kHv, kDk, kDv, &pool);
  std::vector<float> s_alone, o_alone;
  run_chunks(p, 0, {40, 110}, s_alone, o_alone, nullptr);
  EXPECT_TRUE(test::bit_equal(out.data(), o_alone.data(), 40 * ldv));
  run_chunks(p, 1, {1, 149}, s_alone, o_alone, nullptr);
  EXPECT_TRUE(test::bit_equal(out.data() + 40 * ldv, o_alone.data(), ldv));
}

TEST(CausalConv1d, MatchesReferenceAndChunksAreBitIdentical) {
  for (int64_t K : {2, 4}) {
    for (int64_t C : {1, 3, 17, 130}) {
      const int64_t T = 23, ldx = C + 2;
      auto x = test::random_floats(T * ldx, 1 + C);
      auto w = test::random_floats(C * K, 2 + C);
      auto st0 = test::random_floats(C * (K - 1), 3 + C);
      for (bool silu : {true, false}) {
        auto st = st0, st_ref = st0;
        std::vector<float> y(T * C), y_ref(T * C);
        causal_conv1d(x.data(), ldx, T, C, w.data(), K, st.data(), y.data(), C, silu);
        ref::causal_conv1d_ref(x.data(), ldx, T, C, w.data(), K, st_ref.data(), y_ref.data(), C,
                               silu);
        // note: K-term f32 sums (K <= 4) and the float exp polynomial.
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], y_ref[i], 2e-6 * (1 + std::fabs(y_ref[i]))) << i;
        EXPECT_TRUE(test::bit_equal(st.data(), st_ref.data(), st.size()));
        // Chunks 1 (decode), 2 (< K-1 for K = 4), 13, 7.
        auto st2 = st0;
        std::vector<float> y2(T * C);
        int64_t t0 = 0;
        for (int64_t len : {1, 2, 13, 7}) {
          causal_conv1d(x.data() + t0 * ldx, ldx, len, C, w.data(), K, st2.data(),
                        y2.data() + t0 * C, C, silu);
          t0 += len;
        }
        EXPECT_TRUE(test::bit_equal(y.data(), y2.data(), y.size())) << "K=" << K << " C=" << C;
        EXPECT_TRUE(test::bit_equal(st.data(), st2.data(), st.size()));
      }
    }
  }
}

// The kernel vectorises across channels (2 to 4 taps) or loops per channel
// (more taps); both must do exactly acc = 0, acc += w[c, j] * xpad[t + j, c]
// for j in order, so without the activation the output is bit-for-bit the
// sequential float sum. volatile keeps this loop from being contracted into
// fused multiply-adds.
TEST(CausalConv1d, SumsInTapOrderBitForBitOnEveryPath) {
  for (int64_t K : {1, 2, 3, 4, 5, 9}) {
    const int64_t C = 150, T = 6, ldx = C + 1, S = K - 1;
    auto x = test::random_floats(T * ldx, 40 + K);
    auto w = test::random_floats(C * K, 50 + K);
    auto st0 = test::random_floats(C * S + 1, 60 + K);
    auto st = st0;
    std::vector<float> y(T * C);
    causal_conv1d(x.data(), ldx, T, C, w.data(), K, st.data(), y.data(), C, false);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        volatile float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t p = t + j;
          const float xv = p < S ? st0[c * S + p] : x[(p - S) * ldx + c];
          volatile float prod = w[c * K + j] * xv;
          acc = acc + prod;
        }
        ASSERT_EQ(y[t * C + c], acc) << "K=" << K << " t=" << t << " c=" << c;
      }
    }
    // The new state is the last K-1 inputs (T >= K-1 here except K = 9).
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t j = 0; j < S; ++j) {
        const int64_t p = T + j;  // position in xpad of the state's entry j
        const float want = p < S ? st0[c * S + p] : x[(p - S) * ldx + c];
        ASSERT_EQ(st[c * S + j], want) << "K=" << K << " c=" << c << " j=" << j;
      }
    }
  }
}

TEST(CausalConv1d, VarlenMatchesPerSequenceCalls) {
  ThreadPool pool(2);
  const int64_t C = 150, K = 4, ld = C;
  auto x = test::random_floats(12 * ld, 5);
  auto w = test::random_floats(C * K, 6);
  auto sa = test::random_floats(C * 3, 7), sb = test::random_floats(C * 3, 8);
  auto sa2 = sa, sb2 = sb;
  std::vector<int32_t> q_start = {0, 11, 12};
  float* states[2] = {sa.data(), sb.data()};
  std::vector<float> y(12 * ld), y2(12 * ld);
  causal_conv1d_varlen(x.data(), ld, 2, q_start.data(), C, w.data(), K, states, y.data(), ld, true,
                       &pool);
  causal_conv1d(x.data(), ld, 11, C, w.data(), K, sa2.data(), y2.data(), ld, true);
  causal_conv1d(x.data() + 11 * ld, ld, 1, C, w.data(), K, sb2.data(), y2.data() + 11 * ld, ld,
                true);
  EXPECT_TRUE(test::bit_equal(y.data(), y2.data(), y.size()));
  EXPECT_TRUE(test::bit_equal(sa.data(), sa2.data(), sa.size()));
  EXPECT_TRUE(test::bit_equal(sb.data(), sb2.data(), sb.size()));
}

TEST(GdnGates, MatchesReferenceIncludingSoftplusThreshold) {
  const int64_t T = 5, Hv = 4;
  std::vector<float> a = test::random_floats(T * Hv, 1, 10.0f),
                     b = test::random_floats(T * Hv, 2, 3.0f);
  a[0] = 25.0f;  // above torch's softplus threshold (x > 20 → x)
  a[1] = 19.0f;
  std::vector<float> A = {-0.5f, -1.0f, -2.0f, -0.01f}, dt = {0.1f, 1.5f, -0.3f, 0.0f};
  std::vector<float> g(T * Hv), beta(T * Hv), g_ref(T * Hv), beta_ref(T * Hv);
  gdn_gates(a.data(), b.data(), Hv, A.data(), dt.data(), g.data(), beta.data(), T, Hv);
  ref::gdn_gates_ref(a.data(), b.data(), A.data(), dt.data(), g_ref.data(), beta_ref.data(), T, Hv);
  for (int64_t i = 0; i < T * Hv; ++i) {
    // Both in double, rounded once: within 1 ulp.
    EXPECT_NEAR(g[i], g_ref[i], 2.4e-7 * std::fabs(g_ref[i]) + 1e-30) << i;
    EXPECT_NEAR(beta[i], beta_ref[i], 2.4e-7 * beta_ref[i]) << i;
  }
  EXPECT_EQ(g[0], static_cast<float>(-0.5 * (25.0 + 0.1f)));
}

}  // namespace
}  // namespace qtk
