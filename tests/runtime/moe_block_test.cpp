// The shared mixture-of-experts block on random weights: against a float64
// reference of transformers' formula, and batch invariance at the block
// level (each token's output bit-identical whether it runs alone, in any
// chunk of a 500-token batch, or with another thread count).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kernels/thread_pool.h"
#include "runtime/backend/cpu/moe_block.h"
#include "runtime/backend/cpu/tiled_weights.h"

namespace qtk {
namespace {

uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}
double from_bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Random bf16 weights and the views the block reads.
struct RandomMoe {
  ModelConfig c;
  std::vector<uint16_t> router, gate_up, down, s_gate_up, s_down, s_gate;
  MoeWeights w;

  RandomMoe(int64_t H, int64_t E, int64_t k, int64_t I, int64_t S, bool renorm, uint32_t seed) {
    c.hidden_size = H;
    c.moe.num_experts = E;
    c.moe.top_k = k;
    c.moe.expert_intermediate_size = I;
    c.moe.norm_topk_prob = renorm;
    c.moe.shared_expert_intermediate = S;
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.3f);
    auto fill = [&](std::vector<uint16_t>& v, int64_t n) {
      v.resize(n);
      for (auto& x : v) x = to_bf16(d(rng));
    };
    fill(router, E * H);
    fill(gate_up, E * 2 * I * H);
    fill(down, E * H * I);
    w.router = TensorView(router.data(), DType::BF16, {E, H});
    w.gate_up_proj = TensorView(gate_up.data(), DType::BF16, {E, 2 * I, H});
    w.down_proj = TensorView(down.data(), DType::BF16, {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      w.expert_gate_up.push_back(
          TensorView(gate_up.data() + e * 2 * I * H, DType::BF16, {2 * I, H}));
      w.expert_down.push_back(TensorView(down.data() + e * H * I, DType::BF16, {H, I}));
    }
    if (S > 0) {
      fill(s_gate_up, 2 * S * H);
      fill(s_down, H * S);
      fill(s_gate, H);
      w.has_shared = true;
      w.shared_gate_up_proj = TensorView(s_gate_up.data(), DType::BF16, {2 * S, H});
      w.shared_down_proj = TensorView(s_down.data(), DType::BF16, {H, S});
      w.shared_expert_gate = TensorView(s_gate.data(), DType::BF16, {1, H});
    }
  }

  // transformers' formula in float64 (top-k on the float64 probabilities).
  std::vector<double> reference(const float* x) const {
    const int64_t H = c.hidden_size, E = c.moe.num_experts, k = c.moe.top_k;
    const int64_t I = c.moe.expert_intermediate_size, S = c.moe.shared_expert_intermediate;
    auto silu = [](double v) { return v / (1 + std::exp(-v)); };
    // y = down(silu(gate x) * up x) with gate/up rows at gu, down [H, n] at dn.
    auto mlp = [&](const uint16_t* gu, const uint16_t* dn, int64_t n) {
      std::vector<double> a(n), y(H, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        double g = 0, u = 0;
        for (int64_t j = 0; j < H; ++j) {
          g += from_bf16(gu[i * H + j]) * x[j];
          u += from_bf16(gu[(n + i) * H + j]) * x[j];
        }
        a[i] = silu(g) * u;
      }
      for (int64_t r = 0; r < H; ++r)
        for (int64_t i = 0; i < n; ++i) y[r] += from_bf16(dn[r * n + i]) * a[i];
      return y;
    };
    std::vector<double> p(E);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < H; ++j) p[e] += from_bf16(router[e * H + j]) * x[j];
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += v = std::exp(v - mx);
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double top = 0;
    for (int64_t j = 0; j < k; ++j) top += p[order[j]];
    std::vector<double> out(H, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const double wt = c.moe.norm_topk_prob ? p[e] / top : p[e];
      const auto y = mlp(gate_up.data() + e * 2 * I * H, down.data() + e * H * I, I);
      for (int64_t r = 0; r < H; ++r) out[r] += wt * y[r];
    }
    if (S > 0) {
      double g = 0;
      for (int64_t j = 0; j < H; ++j) g += from_bf16(s_gate[j]) * x[j];
      const auto y = mlp(s_gate_up.data(), s_down.data(), S);
      for (int64_t r = 0; r < H; ++r) out[r] += y[r] / (1 + std::exp(-g));
    }
    return out;
  }
};

std::vector<float> run_block(const RandomMoe& m, const std::vector<float>& x, int64_t T,
                             int64_t chunk, int threads) {
  const int64_t H = m.c.hidden_size;
  ThreadPool pool(threads);
  TiledWeights none;  // plain matmul() on the active CPU path
  MoeBlock block(m.c);
  block.reserve(chunk);
  std::vector<float> out(T * H, -7.0f);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    block.forward(m.w, x.data() + t0 * H, n, out.data() + t0 * H, none, &pool);
  }
  return out;
}

struct Shape {
  int64_t H, E, k, I, S;
  bool renorm;
};

std::string shape_name(const Shape& s) {
  return fmt::format("H{}_E{}_k{}_I{}_S{}_{}", s.H, s.E, s.k, s.I, s.S,
                     s.renorm ? "renorm" : "raw");
}
// note: printed by name: the default byte dump would show the struct's
// padding, which differs between runs and so between ctest discoveries.
void PrintTo(const Shape& s, std::ostream* os) { *os << shape_name(s); }

class MoeBlockTest : public ::testing::TestWithParam<Shape> {};

TEST_P(MoeBlockTest, MatchesFloat64ReferenceAndIsBatchInvariant) {
  const Shape s = GetParam();
  const RandomMoe m(s.H, s.E, s.k, s.I, s.S, s.renorm, 42);
  const int64_t T = 500, H = s.H;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(T * H);
  for (auto& v : x) v = d(rng);

  const std::vector<float> all = run_block(m, x, T, T, 2);
  // note: 2e-4 relative (per token, Frobenius): float32 accumulation over
  // K <= 96 against float64; a token whose k-th and (k+1)-th router
  // probabilities are within float32 noise could pick another expert, so
  // such tokens are counted and must stay rare.
  int far = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto ref = m.reference(x.data() + t * H);
    double num = 0, den = 0;
    for (int64_t r = 0; r < H; ++r) {
      num += (all[t * H + r] - ref[r]) * (all[t * H + r] - ref[r]);
      den += ref[r] * ref[r];
    }
    far += std::sqrt(num / std::max(den, 1e-30)) > 2e-4;
  }
  EXPECT_LE(far, 1) << "tokens off the float64 reference";

  // Batch invariance: alone, odd chunks, another thread count.
  for (const auto& [chunk, threads] :
       std::vector<std::pair<int64_t, int>>{{1, 1}, {7, 3}, {64, 1}, {T, 1}, {T, 3}}) {
    const std::vector<float> got = run_block(m, x, T, chunk, threads);
    EXPECT_EQ(std::memcmp(got.data(), all.data(), all.size() * sizeof(float)), 0)
        << "chunk " << chunk << ", " << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeBlockTest,
                         ::testing::Values(Shape{48, 9, 3, 20, 0, true},    // Qwen3-MoE-like
                                           Shape{64, 8, 2, 32, 48, true},   // Qwen3.5-MoE-like
                                           Shape{40, 5, 1, 17, 0, false},   // top-1, no renorm
                                           Shape{33, 16, 16, 9, 11, false}  // every expert
                                           ),
                         [](const auto& info) { return shape_name(info.param); });

}  // namespace
}  // namespace qtk
