// The mixture-of-experts kernels (kernels/cuda/moe.h) against float64
// references, on awkward sizes, and their batch invariance: a token's output
// bits are the same alone and in a batch.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <random>
#include <vector>

#include "core/tuning.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/moe.h"
#include "tests/cuda/gpu_test_util.h"

namespace qtk::cuda::test {
namespace {

using Vec = std::vector<double>;

// The top-k of softmax(logits) in float64 (ties to the lower index).
void route_ref(const std::vector<float>& logits, int64_t T, int64_t E, int64_t k, bool renorm,
               std::vector<int32_t>& ids, Vec& w) {
  ids.assign(T * k, 0);
  w.assign(T * k, 0);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * E;
    const double mx = *std::max_element(row, row + E);
    Vec p(E);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(row[e] - mx);
    for (double& x : p) x /= s;
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      w[t * k + j] = renorm ? p[order[j]] / sum : p[order[j]];
    }
  }
}

// Device scratch of the grouping for T tokens, k choices, E experts.
struct GroupBuffers {
  DeviceBuffer<int32_t> offsets, active, row_token, row_expert, pair_row;
  GroupBuffers(int64_t T, int64_t k, int64_t E)
      : offsets(E + 1), active(E), row_token(T * k), row_expert(T * k), pair_row(T * k) {}
  MoeGroups view() {
    return MoeGroups{offsets.get(), active.get(), row_token.get(), row_expert.get(),
                     pair_row.get()};
  }
};

TEST(MoeRoute, MatchesReferenceAndBreaksTiesToTheLowerExpert) {
  // note: up to 1024 experts one warp routes a token, more take a block
  // (kernels/cuda/moe.cu); 1100 covers the block.
  for (const int64_t E : {4, 60, 128, 256, 512, 1024, 1100})
    for (const int64_t k : {1, 2, 8}) {
      if (k > E) continue;
      const int64_t T = 37;
      // note: logits on a 1/8 grid (exact in f32) spread over [-4, 4]: ties
      // happen, and distinct values differ far above float rounding.
      auto logits = random_floats(T * E, -4, 4, static_cast<uint32_t>(E * 10 + k));
      for (float& x : logits) x = std::round(x * 8) / 8;
      for (const bool renorm : {false, true}) {
        DeviceBuffer<float> d(logits);
        DeviceBuffer<int32_t> ids(T * k);
        DeviceBuffer<float> w(T * k);
        moe_route(d.get(), E, T, E, k, renorm, ids.get(), w.get(), nullptr);
        std::vector<int32_t> rid;
        Vec rw;
        route_ref(logits, T, E, k, renorm, rid, rw);
        EXPECT_EQ(ids.download(), rid) << E << " experts, top " << k;
        EXPECT_LT(rel_error(w.download(), rw), 1e-6) << E << " experts, top " << k;
      }
    }
}

// `g` groups the T*k pairs of ids by expert: offsets are the prefix sums of
// the counts, active lists the experts with rows in order, and every pair
// has one row in its expert's range.
void expect_groups(const std::vector<int32_t>& ids, int64_t T, int64_t k, int64_t E,
                   GroupBuffers& g) {
  const auto off = g.offsets.download(), act = g.active.download();
  const auto tok = g.row_token.download(), ex = g.row_expert.download(), pr = g.pair_row.download();
  std::vector<int> count(E, 0);
  for (int32_t e : ids) ++count[e];
  int64_t acc = 0, na = 0;
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(off[e], acc);
    acc += count[e];
    if (count[e] > 0) {
      EXPECT_EQ(act[na++], e);
    }
  }
  EXPECT_EQ(off[E], T * k);
  for (int64_t a = na; a < E; ++a) EXPECT_EQ(act[a], -1);
  std::vector<int> seen(T * k, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t r = pr[i];
    ASSERT_GE(r, 0);
    ASSERT_LT(r, T * k);
    EXPECT_EQ(seen[r]++, 0) << "row " << r << " taken twice";
    EXPECT_EQ(tok[r], i / k);
    EXPECT_EQ(ex[r], ids[i]);
    EXPECT_GE(r, off[ids[i]]);
    EXPECT_LT(r, off[ids[i] + 1]);
  }
}

TEST(MoeGroup, EveryPairOnceGroupedByExpert) {
  const int64_t T = 300, k = 4, E = 33;
  std::vector<int32_t> ids(T * k);
  // Distinct experts per token (as routing gives), skewed towards low ids.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      ids[t * k + j] = static_cast<int32_t>((t * 7 + j * j * 3) % (E - 3));
  DeviceBuffer<int32_t> d(ids);
  GroupBuffers g(T, k, E);
  moe_group(d.get(), T, k, E, g.view(), nullptr);
  expect_groups(ids, T, k, E, g);
}

// The router front (moe_router_logits, then route and group; one launch up to
// 16 tokens) of n tokens from row t0 of h [*, H] and router [E, H].
struct FrontResult {
  std::vector<float> logits, weights;
  std::vector<int32_t> ids;
};
template <class T>
FrontResult run_front(const std::vector<float>& h, const std::vector<float>& router, int64_t t0,
                      int64_t n, int64_t E, int64_t H, int64_t k, bool renorm,
                      DeviceBuffer<unsigned>& ticket, int calls = 1) {
  DeviceBuffer<T> hd(
      to_device_type<T>(std::vector<float>(h.begin() + t0 * H, h.begin() + (t0 + n) * H)));
  DeviceBuffer<T> rd(to_device_type<T>(router));
  DeviceBuffer<float> logits(n * E), w(n * k);
  DeviceBuffer<int32_t> ids(n * k);
  GroupBuffers g(n, k, E);
  for (int c = 0; c < calls; ++c)
    moe_router_front<T>(hd.get(), H, rd.get(), n, E, H, k, renorm, logits.get(), ids.get(), w.get(),
                        g.view(), ticket.get(), nullptr);
  FrontResult r{logits.download(), w.download(), ids.download()};
  expect_groups(r.ids, n, k, E, g);
  return r;
}

template <class T>
class MoeRouterFrontTest : public ::testing::Test {};
using FrontTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(MoeRouterFrontTest, FrontTypes);

// The logits against float64 dot products, the routing against route_ref on
// those logits, on awkward widths (H of 9 or 33 16-byte pieces in bf16).
TYPED_TEST(MoeRouterFrontTest, MatchesReference) {
  using T = TypeParam;
  struct Shape {
    int64_t n, E, k, H;
  };
  DeviceBuffer<unsigned> ticket(std::vector<unsigned>{0u});
  for (const Shape s : {Shape{1, 60, 4, 72}, Shape{7, 128, 8, 264}, Shape{16, 33, 3, 2048},
                        Shape{45, 60, 4, 72}, Shape{70, 600, 8, 136}}) {
    const uint32_t seed = static_cast<uint32_t>(s.n * 7 + s.E);
    std::vector<float> h = random_floats(s.n * s.H, -1, 1, seed);
    std::vector<float> router = random_floats(s.E * s.H, -0.5f, 0.5f, seed + 1);
    for (float& f : h) f = to_float(from_float<T>(f));
    for (float& f : router) f = to_float(from_float<T>(f));
    const FrontResult r = run_front<T>(h, router, 0, s.n, s.E, s.H, s.k, true, ticket);
    Vec ref(s.n * s.E);
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t e = 0; e < s.E; ++e) {
        double d = 0;
        for (int64_t c = 0; c < s.H; ++c) d += double(h[t * s.H + c]) * router[e * s.H + c];
        ref[t * s.E + e] = d;
      }
    EXPECT_LT(rel_error(r.logits, ref), 1e-5) << s.n << " tokens, " << s.E << " experts";
    std::vector<int32_t> rid;
    Vec rw;
    route_ref(r.logits, s.n, s.E, s.k, true, rid, rw);
    EXPECT_EQ(r.ids, rid) << s.n << " tokens, " << s.E << " experts";
    EXPECT_LT(rel_error(r.weights, rw), 1e-6) << s.n << " tokens, " << s.E << " experts";
  }
}

// A token's logits, choices and weights are the same bits alone, among up
// to 16 tokens (one launch), among 17 or 33 (three launches, 1 x 4 warp
// items) and among 80 (three launches, 4 x 8 warp tiles); a launch leaves
// the ticket ready for the next (three calls in a row give the same).
TYPED_TEST(MoeRouterFrontTest, TokenBitsDoNotDependOnTheBatch) {
  using T = TypeParam;
  for (const bool renorm : {false, true}) {
    const int64_t N = 80, E = 128, k = 8, H = 264;
    const std::vector<float> h = random_floats(N * H, -1, 1, 21);
    const std::vector<float> router = random_floats(E * H, -0.5f, 0.5f, 22);
    DeviceBuffer<unsigned> ticket(std::vector<unsigned>{0u});
    const FrontResult all = run_front<T>(h, router, 0, N, E, H, k, renorm, ticket);
    struct Part {
      int64_t t0, n;
    };
    for (const Part p :
         {Part{0, 1}, Part{79, 1}, Part{3, 5}, Part{30, 16}, Part{10, 17}, Part{41, 33}}) {
      const FrontResult part = run_front<T>(h, router, p.t0, p.n, E, H, k, renorm, ticket, 3);
      EXPECT_TRUE(bitwise_equal(part.logits.data(), all.logits.data() + p.t0 * E, p.n * E))
          << "tokens " << p.t0 << "+" << p.n;
      EXPECT_TRUE(bitwise_equal(part.weights.data(), all.weights.data() + p.t0 * k, p.n * k))
          << "tokens " << p.t0 << "+" << p.n;
      EXPECT_TRUE(std::equal(part.ids.begin(), part.ids.end(), all.ids.begin() + p.t0 * k))
          << "tokens " << p.t0 << "+" << p.n;
    }
    EXPECT_EQ(ticket.download(), std::vector<unsigned>{0u});
  }
}

// A whole expert block on the device: route, group, gate_up, SwiGLU, down,
// combine (with a shared expert output given directly).
template <class T>
struct MoeCase {
  int64_t T_, E, k, H, I;
  bool shared;
  std::vector<float> logits, x, gate_up, down, shared_out, gate_w;

  MoeCase(int64_t tokens, int64_t E_, int64_t k_, int64_t H_, int64_t I_, bool sh, uint32_t seed)
      : T_(tokens), E(E_), k(k_), H(H_), I(I_), shared(sh) {
    logits = random_floats(T_ * E, -3, 3, seed);
    for (float& f : logits) f = std::round(f * 8) / 8;  // see MoeRoute: no near-ties
    x = round(random_floats(T_ * H, -1, 1, seed + 1));
    gate_up = round(random_floats(E * 2 * I * H, -0.3f, 0.3f, seed + 2));
    down = round(random_floats(E * H * I, -0.3f, 0.3f, seed + 3));
    shared_out = random_floats(T_ * H, -1, 1, seed + 4);
    gate_w = round(random_floats(H, -0.5f, 0.5f, seed + 5));
  }
  static std::vector<float> round(std::vector<float> v) {
    for (float& f : v) f = to_float(from_float<T>(f));
    return v;
  }

  // Block-FP8 experts instead (fp8_rows > 0): random e4m3 bytes (never the
  // NaN codes 0x7F, 0xFF) and f32 scales in fp8_rows x 64 blocks over the
  // stacked experts; the T weights above are then unused.
  int64_t fp8_rows = 0;
  std::vector<uint8_t> gate_up_q, down_q;
  std::vector<float> gate_up_s, down_s;
  void make_fp8(int64_t block_rows, uint32_t seed) {
    fp8_rows = block_rows;
    auto bytes = [&](int64_t n, uint32_t sd) {
      std::vector<uint8_t> q(n);
      std::mt19937 rng(sd);
      for (uint8_t& b : q) {
        do b = static_cast<uint8_t>(rng() & 0xFF);
        while ((b & 0x7F) == 0x7F);
      }
      return q;
    };
    auto scales = [&](int64_t rows, int64_t cols, uint32_t sd) {
      return random_floats(((rows + block_rows - 1) / block_rows) * ((cols + 63) / 64), 1e-3f,
                           4e-3f, sd);
    };
    gate_up_q = bytes(E * 2 * I * H, seed + 10);
    down_q = bytes(E * H * I, seed + 11);
    gate_up_s = scales(E * 2 * I, H, seed + 12);
    down_s = scales(E * H, I, seed + 13);
  }

  // Runs tokens [t0, t0 + n) and returns their outputs. fused: gate_up and
  // SwiGLU in one launch where moe_expert_matmul_swiglu takes them (whether
  // it did into *fused_ran).
  std::vector<T> run(int64_t t0, int64_t n, bool fused = false, bool* fused_ran = nullptr) const {
    DeviceBuffer<float> lg(
        std::vector<float>(logits.begin() + t0 * E, logits.begin() + (t0 + n) * E));
    DeviceBuffer<T> xd(
        to_device_type<T>(std::vector<float>(x.begin() + t0 * H, x.begin() + (t0 + n) * H)));
    DeviceBuffer<T> gu(to_device_type<T>(gate_up)), dn(to_device_type<T>(down));
    DeviceBuffer<uint8_t> guq(gate_up_q), dnq(down_q);
    DeviceBuffer<float> gus(gate_up_s), dns(down_s);
    DeviceBuffer<float> sh(
        std::vector<float>(shared_out.begin() + t0 * H, shared_out.begin() + (t0 + n) * H));
    DeviceBuffer<T> gw(to_device_type<T>(gate_w));
    DeviceBuffer<int32_t> ids(n * k);
    DeviceBuffer<float> w(n * k);
    GroupBuffers g(n, k, E);
    DeviceBuffer<T> gu_out(n * k * 2 * I), act(n * k * I);
    DeviceBuffer<float> y(n * k * H);
    DeviceBuffer<T> out(n * H);
    moe_route(lg.get(), E, n, E, k, true, ids.get(), w.get(), nullptr);
    moe_group(ids.get(), n, k, E, g.view(), nullptr);
    const int64_t max_active = std::min(E, n * k);
    WeightRef<T> gu_w, dn_w;
    if (fp8_rows > 0) {
      gu_w.fp8 = guq.get();
      dn_w.fp8 = dnq.get();
      gu_w.scale = gus.get();
      dn_w.scale = dns.get();
      gu_w.block_rows = dn_w.block_rows = fp8_rows;
      gu_w.block_cols = dn_w.block_cols = 64;
    } else {
      gu_w.dense = gu.get();
      dn_w.dense = dn.get();
    }
    const bool one = fused && moe_expert_matmul_swiglu<T>(xd.get(), H, true, gu_w, I, H, act.get(),
                                                          I, n * k, g.view(), max_active, nullptr);
    if (fused_ran != nullptr) *fused_ran = one;
    if (!one) {
      moe_expert_matmul<T, T>(xd.get(), H, true, gu_w, 2 * I, H, gu_out.get(), 2 * I, n * k,
                              g.view(), max_active, false, nullptr);
      swiglu<T>(gu_out.get(), 2 * I, act.get(), I, n * k, I, nullptr);
    }
    // (the groups settled: moe_group ran two or more launches back)
    moe_expert_matmul<T, float>(act.get(), I, false, dn_w, H, I, y.get(), H, n * k, g.view(),
                                max_active, true, nullptr);
    moe_combine<T>(y.get(), H, ids.get(), w.get(), g.pair_row.get(), n, k, H,
                   shared ? sh.get() : nullptr, H, xd.get(), H, gw.get(), out.get(), H, nullptr);
    return out.download();
  }

  Vec reference() const {
    std::vector<int32_t> ids;
    Vec w;
    route_ref(logits, T_, E, k, true, ids, w);
    Vec out(T_ * H, 0.0);
    for (int64_t t = 0; t < T_; ++t) {
      const float* xt = x.data() + t * H;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[t * k + j];
        Vec act(I);
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          const float* wg = gate_up.data() + (e * 2 * I + i) * H;
          const float* wu = gate_up.data() + (e * 2 * I + I + i) * H;
          for (int64_t c = 0; c < H; ++c) {
            g += double(xt[c]) * wg[c];
            u += double(xt[c]) * wu[c];
          }
          act[i] = g / (1 + std::exp(-g)) * u;
        }
        for (int64_t c = 0; c < H; ++c) {
          double y = 0;
          const float* wd = down.data() + (e * H + c) * I;
          for (int64_t i = 0; i < I; ++i) y += act[i] * wd[i];
          out[t * H + c] += w[t * k + j] * y;
        }
      }
      if (shared) {
        double s = 0;
        for (int64_t c = 0; c < H; ++c) s += double(xt[c]) * gate_w[c];
        const double gate = 1 / (1 + std::exp(-s));
        for (int64_t c = 0; c < H; ++c) out[t * H + c] += gate * shared_out[t * H + c];
      }
    }
    return out;
  }
};

template <class T>
class MoeBlockTest : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(MoeBlockTest, ActTypes);

// note: H 520 spreads moe_combine over 3 column blocks, each recomputing
// the shared expert's gate. H 72 and I 40 take the vector path with a tail (72 = 64 + 8 in bf16,
// 2 x 32 + 8 in f32); H 36 and I 20 the scalar path. With bf16, H 128 / I 48
// and H 64 / I 32 (K % 16 == 0) take the tensor-core product
// (kernels/cuda/mma_matmul.cuh): 70 tokens x top 8 of 16 experts give groups
// of ~35 rows, 150 x top 2 of 4 groups of ~75 (its 64-row passes).
TYPED_TEST(MoeBlockTest, MatchesReference) {
  using T = TypeParam;
  struct Shape {
    int64_t T, E, k, H, I;
    bool shared;
  };
  for (const Shape s : {Shape{1, 8, 2, 72, 40, false}, Shape{19, 8, 2, 72, 40, true},
                        Shape{33, 60, 4, 36, 20, true}, Shape{70, 16, 8, 264, 24, false},
                        Shape{70, 16, 8, 128, 48, true}, Shape{150, 4, 2, 64, 32, true},
                        Shape{9, 16, 8, 520, 24, true}}) {
    const MoeCase<T> c(s.T, s.E, s.k, s.H, s.I, s.shared, static_cast<uint32_t>(s.T * 31 + s.E));
    EXPECT_LT(rel_error(c.run(0, s.T), c.reference()), 3 * tolerance<T>())
        << s.T << " tokens, " << s.E << " experts, top " << s.k << ", H " << s.H << ", I " << s.I;
  }
}

// Tokens `singles` run alone and tokens part0 .. part0 + part_n - 1 run
// together give the bits they get among all n tokens.
template <class T>
void expect_token_bits(const MoeCase<T>& c, int64_t n, std::initializer_list<int64_t> singles,
                       int64_t part0, int64_t part_n) {
  const int64_t H = c.H;
  const std::vector<T> all = c.run(0, n);
  for (const int64_t t : singles) {
    const std::vector<T> one = c.run(t, 1);
    EXPECT_TRUE(bitwise_equal(one.data(), all.data() + t * H, H)) << "token " << t;
  }
  const std::vector<T> part = c.run(part0, part_n);
  EXPECT_TRUE(bitwise_equal(part.data(), all.data() + part0 * H, part_n * H))
      << "tokens " << part0 << ".." << part0 + part_n - 1;
}

TYPED_TEST(MoeBlockTest, TokenBitsDoNotDependOnTheBatch) {
  expect_token_bits(MoeCase<TypeParam>(41, 12, 4, 72, 40, true, 7), 41, {0, 5, 40}, 3, 17);
}

// The same with the tensor-core product's shapes (bf16; f32 stays on the warp
// product): a token alone (groups of 1 row, the 16-row kernel) and among 150
// (groups of ~75 rows in 64-row passes, the wide kernel).
TYPED_TEST(MoeBlockTest, TokenBitsDoNotDependOnTheBatchInWideGroups) {
  expect_token_bits(MoeCase<TypeParam>(150, 4, 2, 64, 32, true, 9), 150, {0, 77, 149}, 20, 9);
}

// The same wide groups on each form of the tensor-core product above 16
// rows (QTK_MMA_WIDE: the 4-warp kernel, the split kernel, the warpgroup
// kernel where the GPU has it).
TYPED_TEST(MoeBlockTest, TokenBitsDoNotDependOnTheBatchInEachWideForm) {
  const Tuning saved = tuning();
  for (const int wide : {4, 64, 90}) {
    Tuning t = saved;
    t.mma_wide = wide;
    set_tuning(t);
    SCOPED_TRACE(testing::Message() << "QTK_MMA_WIDE " << wide);
    expect_token_bits(MoeCase<TypeParam>(150, 4, 2, 64, 32, true, 9), 150, {0, 77, 149}, 20, 9);
  }
  set_tuning(saved);
}

// FP8 experts on the tensor-core narrow kernel (bf16 activations): a token
// alone (4 groups of one row, the 6-deep ring) gets the bits it gets among
// 12 tokens (up to 48 groups of about one row, the 4-deep ring that many
// groups take, warp_matmul.cuh) and among 5.
TEST(MoeFp8, TokenBitsDoNotDependOnTheGroupCount) {
  MoeCase<bf16> c(12, 64, 4, 128, 48, false, 41);
  c.make_fp8(16, 41);
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "gate_up and SwiGLU in one launch" : "two steps");
    const std::vector<bf16> all = c.run(0, 12, fused);
    int64_t finite = 0, nonzero = 0;
    for (const bf16 v : all) {
      finite += std::isfinite(to_float(v)) ? 1 : 0;
      nonzero += to_float(v) != 0.0f ? 1 : 0;
    }
    EXPECT_EQ(finite, static_cast<int64_t>(all.size()));
    EXPECT_GT(nonzero, static_cast<int64_t>(all.size()) / 2);
    for (const int64_t t : {0, 7, 11}) {
      const std::vector<bf16> one = c.run(t, 1, fused);
      EXPECT_TRUE(bitwise_equal(one.data(), all.data() + t * c.H, c.H)) << "token " << t;
    }
    const std::vector<bf16> part = c.run(3, 5, fused);
    EXPECT_TRUE(bitwise_equal(part.data(), all.data() + 3 * c.H, 5 * c.H)) << "tokens 3..7";
  }
}

// The experts' gate_up and SwiGLU in one launch (the tensor-core narrow
// kernel, up to 16 rows per expert on average) give the bits of the two
// steps; a wide batch falls back to them.
TEST(MoeSwiglu, OneLaunchChangesNoBits) {
  struct Shape {
    int64_t n, E, k, H, I;
  };
  for (const Shape s : {Shape{1, 16, 4, 256, 40}, Shape{3, 8, 2, 192, 64}, Shape{12, 6, 3, 128, 24},
                        Shape{40, 4, 2, 128, 24}}) {
    const MoeCase<bf16> c(s.n, s.E, s.k, s.H, s.I, false, static_cast<uint32_t>(s.n * 13 + s.I));
    bool ran = false;
    const std::vector<bf16> two = c.run(0, s.n), one = c.run(0, s.n, true, &ran);
    // n * k rows over min(E, n * k) experts: up to 16 on average takes the one launch.
    EXPECT_EQ(ran, s.n * s.k / std::min(s.E, s.n * s.k) <= 16) << s.n << " tokens";
    EXPECT_TRUE(bitwise_equal(one.data(), two.data(), one.size())) << s.n << " tokens";
  }
}

}  // namespace
}  // namespace qtk::cuda::test
