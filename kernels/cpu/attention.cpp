#include "kernels/attention.h"

#include <algorithm>

#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

constexpr int64_t kScratchAlign = 16;  // floats

// D-dot in a fixed order: lane l sums k = l, l+16, ... (separate multiply and
// add), then a fixed tree. 16 lanes map onto one zmm, two ymm or four xmm
// registers without shuffles, and every ISA clone computes the same bits.
__attribute__((always_inline)) inline float dot_fixed(const float* __restrict a,
                                                      const float* __restrict b, int64_t n) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) lane[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += a[i] * b[i];
  float s8[8], s4[4];
  for (int l = 0; l < 8; ++l) s8[l] = lane[l] + lane[l + 8];
  for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

__attribute__((always_inline)) inline void exp_shift(float* __restrict s, int64_t n, float max) {
  for (int64_t i = 0; i < n; ++i) s[i] = cpu::exp_poly(s[i] - max);
}

__attribute__((always_inline)) inline void axpy(float* __restrict acc, const float* __restrict v, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += a * v[i];
}

__attribute__((always_inline)) inline void scale_out(float* __restrict acc, double inv, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<float>(static_cast<double>(acc[i]) * inv);
}

// One (query row, head): exact two-pass softmax in key-position order.
// Keys are walked block by block (no division per key).
QTK_CLONES void attend_one(const float* qr, const float* k_cache, const float* v_cache,
                           const int32_t* blocks, int64_t block_size, int64_t block_stride,
                           int64_t token_stride, int64_t head_offset, int64_t n_keys, int64_t D,
                           float scale, float* scores, float* o) {
  // Pass 1: scores in position order, and their max.
  float max = -3.0e38f;
  for (int64_t j0 = 0, blk = 0; j0 < n_keys; j0 += block_size, ++blk) {
    const float* kb = k_cache + blocks[blk] * block_stride + head_offset;
    const int64_t n = n_keys - j0 < block_size ? n_keys - j0 : block_size;
    for (int64_t i = 0; i < n; ++i) {
      float sc = dot_fixed(qr, kb + i * token_stride, D) * scale;
      scores[j0 + i] = sc;
      max = sc > max ? sc : max;
    }
  }
  // Pass 2: exp(s - max), summed in position order in double.
  exp_shift(scores, n_keys, max);
  double sum = 0.0;
  for (int64_t j = 0; j < n_keys; ++j) sum += scores[j];
  // Pass 3: exp-weighted V rows in position order, then one division.
  for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
  for (int64_t j0 = 0, blk = 0; j0 < n_keys; j0 += block_size, ++blk) {
    const float* vb = v_cache + blocks[blk] * block_stride + head_offset;
    const int64_t n = n_keys - j0 < block_size ? n_keys - j0 : block_size;
    for (int64_t i = 0; i < n; ++i) axpy(o, vb + i * token_stride, scores[j0 + i], D);
  }
  scale_out(o, 1.0 / sum, D);
}

}  // namespace

size_t paged_attention_scratch_floats(int64_t max_total_context, int threads) {
  int64_t per = (max_total_context + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  return static_cast<size_t>(per) * static_cast<size_t>(threads < 1 ? 1 : threads);
}

void paged_attention(const float* q, int64_t ldq, const float* k_cache, const float* v_cache,
                     float* out, int64_t ldo, const AttentionBatch& b, int64_t Hq, int64_t Hkv,
                     int64_t D, float scale, float* scratch, ThreadPool* pool) {
  if (b.num_seqs <= 0) return;
  const int64_t first_row = b.q_start[0];
  const int64_t total_rows = b.q_start[b.num_seqs] - first_row;
  if (total_rows <= 0) return;
  int64_t max_ctx = 0;
  for (int64_t s = 0; s < b.num_seqs; ++s) max_ctx = std::max<int64_t>(max_ctx, b.seq_len[s]);
  const int64_t scratch_stride = (max_ctx + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  const int64_t group = Hq / Hkv;
  const int64_t token_stride = Hkv * D;             // floats per cache slot
  const int64_t block_stride = b.block_size * token_stride;

  // One task per (query row, head). note: rows are taken in zig-zag order
  // (first, last, second, second-to-last, ...) so that each thread's
  // contiguous piece mixes short and long causal rows; which thread computes
  // a row never changes how it is computed.
  parallel_for_tid(pool, total_rows * Hq, [&](int64_t begin, int64_t end, int tid) {
    float* scores = scratch + tid * scratch_stride;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / Hq;
      const int64_t row = first_row + ((i % 2 == 0) ? i / 2 : total_rows - 1 - i / 2);
      const int64_t h = task % Hq;
      // Sequence of this row: binary search over q_start.
      int64_t lo = 0, hi = b.num_seqs - 1;
      while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (b.q_start[mid] <= row) lo = mid; else hi = mid - 1;
      }
      const int64_t seq = lo;
      const int64_t q_len = b.q_start[seq + 1] - b.q_start[seq];
      const int64_t pos = b.seq_len[seq] - q_len + (row - b.q_start[seq]);
      const int64_t n_keys = pos + 1;
      const int32_t* blocks = b.block_table + seq * b.max_blocks;
      const int64_t kvh = h / group;
      const float* qr = q + row * ldq + h * D;
      float* o = out + row * ldo + h * D;

      attend_one(qr, k_cache, v_cache, blocks, b.block_size, block_stride, token_stride,
                 kvh * D, n_keys, D, scale, scores, o);
    }
  });
}

void kv_cache_write(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t T,
                    int64_t Hkv, int64_t D, const int64_t* slot_mapping, float* k_cache,
                    float* v_cache) {
  const int64_t width = Hkv * D;
  for (int64_t t = 0; t < T; ++t) {
    int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    std::copy(k + t * ldk, k + t * ldk + width, k_cache + slot * width);
    std::copy(v + t * ldv, v + t * ldv + width, v_cache + slot * width);
  }
}

}  // namespace qtk
