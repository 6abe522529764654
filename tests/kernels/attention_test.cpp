#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ref/reference.h"
#include "tests/kernels/test_util.h"

namespace qtk {
namespace {

constexpr int64_t kHq = 6, kHkv = 2, kD = 40;

// One sequence in a call: its full K/V history [ctx, Hkv, D] and the query
// rows of this step (the last q_len positions).
struct Seq {
  int64_t ctx;
  int64_t q_len;
  std::vector<float> k, v, q;  // q: [q_len, Hq, D]
};

Seq make_seq(int64_t ctx, int64_t q_len, uint32_t seed) {
  Seq s{ctx, q_len, test::random_floats(ctx * kHkv * kD, seed),
        test::random_floats(ctx * kHkv * kD, seed + 1),
        test::random_floats(q_len * kHq * kD, seed + 2)};
  return s;
}

// Runs paged_attention over all sequences in one call with the given block
// size, scattering each sequence's history into shuffled physical blocks
// through kv_cache_write. Returns out [sum q_len, Hq, D].
std::vector<float> run_paged(const std::vector<const Seq*>& seqs, int64_t block_size,
                             ThreadPool* pool, uint32_t shuffle_seed = 1) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  int64_t max_blocks = 0, total_blocks = 0, rows = 0, max_ctx = 0;
  for (auto* s : seqs) {
    int64_t nb = (s->ctx + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
    rows += s->q_len;
    max_ctx = std::max(max_ctx, s->ctx);
  }
  total_blocks += 3;  // unused blocks, filled with garbage
  std::vector<int32_t> physical(total_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(shuffle_seed));
  const int64_t slot_floats = kHkv * kD;
  std::vector<float> k_cache(total_blocks * block_size * slot_floats, 1e30f);
  std::vector<float> v_cache(total_blocks * block_size * slot_floats, 1e30f);
  std::vector<int32_t> table(n * std::max<int64_t>(max_blocks, 1), -1);
  std::vector<int32_t> q_start(n + 1, 0), seq_len(n);
  std::vector<float> q(rows * kHq * kD);
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Seq& s = *seqs[i];
    int64_t nb = (s.ctx + block_size - 1) / block_size;
    for (int64_t b = 0; b < nb; ++b) table[i * max_blocks + b] = physical[next++];
    std::vector<int64_t> slots(s.ctx);
    for (int64_t p = 0; p < s.ctx; ++p) {
      slots[p] = static_cast<int64_t>(table[i * max_blocks + p / block_size]) * block_size +
                 p % block_size;
    }
    kv_cache_write(s.k.data(), slot_floats, s.v.data(), slot_floats, s.ctx, kHkv, kD, slots.data(),
                   block_size, total_blocks, k_cache.data(), v_cache.data());
    seq_len[i] = static_cast<int32_t>(s.ctx);
    q_start[i + 1] = q_start[i] + static_cast<int32_t>(s.q_len);
    std::copy(s.q.begin(), s.q.end(), q.begin() + q_start[i] * kHq * kD);
  }
  AttentionBatch b{n,          q_start.data(), seq_len.data(), table.data(),
                   max_blocks, block_size,     total_blocks};
  std::vector<float> scratch(paged_attention_scratch_floats(max_ctx, pool_size(pool)));
  std::vector<float> out(rows * kHq * kD, -7.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  paged_attention(q.data(), kHq * kD, k_cache.data(), v_cache.data(), out.data(), kHq * kD, b, kHq,
                  kHkv, kD, scale, scratch.data(), pool);
  return out;
}

TEST(Attention, MatchesDenseReferenceForMixedPrefillAndDecode) {
  ThreadPool pool(2);
  // (ctx, q_len): a whole prompt, a later prefill chunk, decode tokens.
  std::vector<Seq> seqs = {make_seq(17, 17, 1), make_seq(130, 1, 2), make_seq(63, 20, 3),
                           make_seq(1, 1, 4), make_seq(40, 3, 5)};
  std::vector<const Seq*> ptrs;
  for (auto& s : seqs) ptrs.push_back(&s);
  for (int64_t bs : {1, 3, 16, 20, 32}) {
    auto out = run_paged(ptrs, bs, &pool);
    int64_t row = 0;
    for (auto& s : seqs) {
      std::vector<float> ref(s.q_len * kHq * kD);
      ref::attention_ref(s.q.data(), s.k.data(), s.v.data(), ref.data(), s.q_len, s.ctx, kHq, kHkv,
                         kD, 1.0f / std::sqrt(static_cast<float>(kD)));
      float vmax = 0.0f;
      for (float x : s.v) vmax = std::max(vmax, std::fabs(x));
      for (size_t i = 0; i < ref.size(); ++i) {
        // note: scores are f32 dots of 40 terms and the softmax weights use
        // the float exp polynomial; each output is a convex combination of V
        // entries, so its error is a few f32 ulps of max|v| (measured ~1e-7).
        ASSERT_NEAR(out[row * kHq * kD + i], ref[i], 2e-6 * vmax)
            << "ctx=" << s.ctx << " q_len=" << s.q_len << " bs=" << bs << " i=" << i;
      }
      row += s.q_len;
    }
  }
}

TEST(Attention, BitIdenticalAcrossBlockSizeThreadsBatchAndChunks) {
  ThreadPool pool2(2), pool3(3);
  Seq a = make_seq(45, 45, 10), b = make_seq(90, 1, 20), c = make_seq(33, 5, 30);
  auto base = run_paged({&a}, 16, nullptr);
  // Block size, thread count, shuffled placement.
  EXPECT_TRUE(test::bit_equal(base.data(), run_paged({&a}, 1, nullptr).data(), base.size()));
  EXPECT_TRUE(test::bit_equal(base.data(), run_paged({&a}, 7, &pool2, 9).data(), base.size()));
  EXPECT_TRUE(test::bit_equal(base.data(), run_paged({&a}, 16, &pool3).data(), base.size()));
  // In a batch with other sequences, in any position.
  auto batched = run_paged({&b, &a, &c}, 5, &pool2);
  EXPECT_TRUE(test::bit_equal(base.data(), batched.data() + 1 * kHq * kD, base.size()));
  // Prefill split into chunks of 7, 1, 20 and 17 rows: each chunk sees the
  // cache up to its end.
  int64_t done = 0;
  for (int64_t chunk : {7, 1, 20, 17}) {
    Seq part{done + chunk, chunk, a.k, a.v, {}};
    part.k.resize((done + chunk) * kHkv * kD);
    part.v.resize((done + chunk) * kHkv * kD);
    part.q.assign(a.q.begin() + done * kHq * kD, a.q.begin() + (done + chunk) * kHq * kD);
    auto out = run_paged({&b, &part}, 3, &pool2);
    ASSERT_TRUE(
        test::bit_equal(base.data() + done * kHq * kD, out.data() + 1 * kHq * kD, chunk * kHq * kD))
        << "chunk ending at " << done + chunk;
    done += chunk;
  }
  EXPECT_EQ(done, 45);
}

TEST(Attention, KvCacheWriteLayoutAndNegativeSlots) {
  // 2 blocks of size 2: slot 2 is offset 0 of block 1. Each kv head owns
  // num_blocks blocks; inside a block K is stored [D][block] (keys in the
  // last index) and V as [block][D].
  const int64_t Hkv = 2, D = 3, bs = 2, nb = 2, width = Hkv * D, head = nb * bs * D;
  std::vector<float> k = {1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0};
  std::vector<float> v = {7, 8, 9, 10, 11, 12, 0, 0, 0, 0, 0, 0};
  std::vector<float> kc(Hkv * head, 0.0f), vc(Hkv * head, 0.0f);
  std::vector<int64_t> slots = {2, -1};
  kv_cache_write(k.data(), width, v.data(), width, 2, Hkv, D, slots.data(), bs, nb, kc.data(),
                 vc.data());
  std::vector<float> k_want(Hkv * head, 0.0f), v_want(Hkv * head, 0.0f);
  for (int64_t h = 0; h < Hkv; ++h) {
    for (int64_t d = 0; d < D; ++d) {
      k_want[h * head + 1 * bs * D + d * bs + 0] = k[h * D + d];
      v_want[h * head + (1 * bs + 0) * D + d] = v[h * D + d];
    }
  }
  EXPECT_EQ(kc, k_want);
  EXPECT_EQ(vc, v_want);
  EXPECT_EQ(kc[6], 1.0f);   // head 0, block 1, d 0, offset 0
  EXPECT_EQ(kc[18], 4.0f);  // head 1 starts num_blocks * bs * D = 12 floats later
  EXPECT_EQ(vc[6], 7.0f);
  EXPECT_EQ(vc[18], 10.0f);
}

}  // namespace
}  // namespace qtk
