// Paged attention against a scalar statement of its documented arithmetic
// (kernels/attention.h): each score a sum over d in increasing order with a
// separate multiply and add, times scale; max; exp_poly(s - max) summed in
// position order in double; V rows accumulated in position order; one
// multiply by 1/sum in double. Every output must match bit for bit, for head
// groups that are split across tasks (group > 8), head sizes that are not a
// multiple of 16, block sizes that are not, and any placement in a batch.
// note: this file is built with -ffp-contract=off (tests/kernels/CMakeLists.txt)
// so that the compiler cannot fuse the spec's multiply-adds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/simd_math.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

struct Shape {
  int64_t Hq, Hkv, D;
};

// The documented order for query rows at positions ctx-q_len .. ctx-1 of one
// sequence with dense K/V [ctx, Hkv, D].
std::vector<float> attention_spec(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int64_t q_len, int64_t ctx,
                                  const Shape& sh, float scale) {
  std::vector<float> out(q_len * sh.Hq * sh.D);
  std::vector<float> p(ctx);
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t n = ctx - q_len + i + 1;
    for (int64_t h = 0; h < sh.Hq; ++h) {
      const int64_t kvh = h / (sh.Hq / sh.Hkv);
      const float* qr = q.data() + (i * sh.Hq + h) * sh.D;
      float mx = -3.0e38f;
      for (int64_t j = 0; j < n; ++j) {
        const float* kr = k.data() + (j * sh.Hkv + kvh) * sh.D;
        float s = 0.0f;
        for (int64_t d = 0; d < sh.D; ++d) s = s + qr[d] * kr[d];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = cpu::exp_poly(p[j] - mx);
        sum += p[j];
      }
      const double inv = 1.0 / sum;
      for (int64_t d = 0; d < sh.D; ++d) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j) acc = acc + p[j] * v[(j * sh.Hkv + kvh) * sh.D + d];
        out[(i * sh.Hq + h) * sh.D + d] = static_cast<float>(static_cast<double>(acc) * inv);
      }
    }
  }
  return out;
}

struct Seq {
  int64_t ctx, q_len;
  std::vector<float> k, v, q;
};

// All sequences in one paged call, blocks shuffled; stale garbage (NaN) in
// every cache slot that no sequence owns, so reading past the visible keys
// would show up.
std::vector<float> run_paged(const std::vector<Seq>& seqs, const Shape& sh, int64_t bs,
                             ThreadPool* pool, float scale) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  if (n == 0 || n > 1000) return {};  // (also bounds n for GCC's -Walloc-size-larger-than)
  int64_t max_blocks = 1, total_blocks = 2, rows = 0, max_ctx = 0;
  for (const Seq& s : seqs) {
    max_blocks = std::max(max_blocks, (s.ctx + bs - 1) / bs);
    total_blocks += (s.ctx + bs - 1) / bs;
    rows += s.q_len;
    max_ctx = std::max(max_ctx, s.ctx);
  }
  std::vector<int32_t> physical(total_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(5));
  const int64_t width = sh.Hkv * sh.D;
  std::vector<float> kc(total_blocks * bs * width, NAN), vc(total_blocks * bs * width, NAN);
  std::vector<int32_t> table(n * max_blocks, -1), q_start(n + 1, 0);
  std::vector<int32_t> seq_len(q_start.size() - 1);
  std::vector<float> q(rows * sh.Hq * sh.D);
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Seq& s = seqs[i];
    std::vector<int64_t> slots(s.ctx);
    for (int64_t b = 0; b < (s.ctx + bs - 1) / bs; ++b)
      table[i * max_blocks + b] = physical[next++];
    for (int64_t p = 0; p < s.ctx; ++p)
      slots[p] = int64_t{table[i * max_blocks + p / bs]} * bs + p % bs;
    kv_cache_write(s.k.data(), width, s.v.data(), width, s.ctx, sh.Hkv, sh.D, slots.data(), bs,
                   total_blocks, kc.data(), vc.data());
    seq_len[i] = static_cast<int32_t>(s.ctx);
    q_start[i + 1] = q_start[i] + static_cast<int32_t>(s.q_len);
    std::copy(s.q.begin(), s.q.end(), q.begin() + q_start[i] * sh.Hq * sh.D);
  }
  AttentionBatch b{n, q_start.data(), seq_len.data(), table.data(), max_blocks, bs, total_blocks};
  std::vector<float> scratch(paged_attention_scratch_floats(max_ctx, pool_size(pool)));
  std::vector<float> out(rows * sh.Hq * sh.D, -7.0f);
  paged_attention(q.data(), sh.Hq * sh.D, kc.data(), vc.data(), out.data(), sh.Hq * sh.D, b, sh.Hq,
                  sh.Hkv, sh.D, scale, scratch.data(), pool);
  return out;
}

TEST(AttentionOrder, BitIdenticalToDocumentedOrder) {
  ThreadPool pool(2);
  const Shape shapes[] = {{16, 8, 128}, {8, 2, 256}, {6, 2, 40}, {16, 1, 24}, {5, 5, 17}};
  uint32_t seed = 100;
  for (const Shape& sh : shapes) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
    // (ctx, q_len): a prompt, a later chunk, decode steps of several lengths.
    std::vector<Seq> seqs;
    for (auto [ctx, q_len] :
         {std::pair<int64_t, int64_t>{37, 37}, {70, 9}, {33, 1}, {16, 1}, {1, 1}}) {
      seqs.push_back({ctx, q_len, test::random_floats(ctx * sh.Hkv * sh.D, seed),
                      test::random_floats(ctx * sh.Hkv * sh.D, seed + 1),
                      test::random_floats(q_len * sh.Hq * sh.D, seed + 2)});
      seed += 3;
    }
    for (int64_t bs : {16, 5, 20, 32}) {
      auto out = run_paged(seqs, sh, bs, &pool, scale);
      int64_t row = 0;
      for (const Seq& s : seqs) {
        auto want = attention_spec(s.q, s.k, s.v, s.q_len, s.ctx, sh, scale);
        for (size_t e = 0; e < want.size(); ++e) {
          const float got = out[row * sh.Hq * sh.D + e];
          ASSERT_TRUE(std::memcmp(&got, &want[e], 4) == 0)
              << "Hq=" << sh.Hq << " Hkv=" << sh.Hkv << " D=" << sh.D << " bs=" << bs
              << " ctx=" << s.ctx << " q_len=" << s.q_len << " element " << e << ": " << got
              << " vs " << want[e];
        }
        row += s.q_len;
      }
    }
  }
}

}  // namespace
}  // namespace qtk
