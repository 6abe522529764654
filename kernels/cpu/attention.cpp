#include "kernels/attention.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/simd_math.h"

namespace qtk {

namespace {

// note: a GCC generic vector of 16 floats: one zmm in the avx512 clone, two
// ymm in the avx2 clone, four xmm in the default one. Every operation on it
// is per lane and rounded separately (-ffp-contract=off), so all clones give
// the same bits. Helpers take pointers, never V16 by value, so no function
// ABI depends on the vector width.
typedef float V16 __attribute__((vector_size(64)));

constexpr int64_t kLanes = 16;
// Query vectors (query rows x heads of one kv head) per task: each K lane
// vector and each V row loaded is used this many times.
constexpr int kMaxQ = 8;
// Score accumulators per micro-kernel call (query vectors x key chunks):
// enough independent add chains to hide the add latency.
constexpr int kAccumulators = 8;

#define QTK_INLINE __attribute__((always_inline)) inline

QTK_INLINE void load16(V16* v, const float* p) { __builtin_memcpy(v, p, sizeof(V16)); }
QTK_INLINE void store16(float* p, const V16* v) { __builtin_memcpy(p, v, sizeof(V16)); }

// Where one (sequence, kv head) reads its cache.
struct KvView {
  const float* k_cache;   // f32 [Hkv, num_blocks, D, block_size]
  const float* v_cache;   // f32 [Hkv, num_blocks, block_size, D]
  const int32_t* blocks;  // physical block of each logical block
  int64_t block_size;
  int64_t block_stride;   // floats per block of one head (block_size * D)
  int64_t k_head_offset;  // kvh * num_blocks * block_size * D
  int64_t v_head_offset;  // the same
  int64_t token_stride;   // D: V row of the next key of the same head and block
  int64_t D;
};

// Up to kMaxQ query vectors of one sequence and one kv head.
struct Tile {
  const float* q[kMaxQ];
  float* o[kMaxQ];
  int64_t n_keys[kMaxQ];  // causal: keys 0..n_keys-1 are visible
};

// Scores of NQ query vectors against NC chunks of 16 keys.
//   kt[c]: chunk c's K, element (d, lane) at kt[c][d * kstride + lane]
//   out: score of query qi, key j0[c] + lane at scores[qi * ss + j0[c] + lane]
// note: keys sit in the lanes, so each score is one straight sum over d in
// increasing order (separate multiply and add): no horizontal reduction, and
// the arithmetic of a score does not depend on the lane, the chunk, the
// block size or which other queries share the call.
template <int NQ, int NC>
QTK_INLINE void qk_full(const Tile& t, const float* const* kt, int64_t kstride, const int64_t* j0,
                        int64_t D, float scale, float* scores, int64_t ss) {
  V16 acc[NQ][NC];
  for (int qi = 0; qi < NQ; ++qi)
    for (int c = 0; c < NC; ++c) acc[qi][c] = V16{};
  for (int64_t d = 0; d < D; ++d) {
    V16 kv[NC];
    for (int c = 0; c < NC; ++c) load16(&kv[c], kt[c] + d * kstride);
    for (int qi = 0; qi < NQ; ++qi) {
      const float qd = t.q[qi][d];
      for (int c = 0; c < NC; ++c) acc[qi][c] += qd * kv[c];
    }
  }
  for (int qi = 0; qi < NQ; ++qi) {
    for (int c = 0; c < NC; ++c) {
      V16 s = acc[qi][c] * scale;
      store16(scores + qi * ss + j0[c], &s);
    }
  }
}

// The same for one chunk of w < 16 keys at the end of a block whose size is
// not a multiple of 16 (lanes >= w are zero and their scores unused).
template <int NQ>
QTK_INLINE void qk_partial(const Tile& t, const float* kt, int64_t kstride, int64_t w, int64_t j0,
                           int64_t D, float scale, float* scores, int64_t ss) {
  V16 acc[NQ];
  for (int qi = 0; qi < NQ; ++qi) acc[qi] = V16{};
  for (int64_t d = 0; d < D; ++d) {
    V16 kv = V16{};
    for (int64_t i = 0; i < w; ++i) kv[i] = kt[d * kstride + i];
    for (int qi = 0; qi < NQ; ++qi) acc[qi] += t.q[qi][d] * kv;
  }
  for (int qi = 0; qi < NQ; ++qi) {
    V16 s = acc[qi] * scale;
    store16(scores + qi * ss + j0, &s);
  }
}

// Runs the pending full chunks (fewer than a full group only at the end).
template <int NQ, int NC>
QTK_INLINE void qk_flush(const Tile& t, const float* const* kt, int64_t kstride, const int64_t* j0,
                         int pending, int64_t D, float scale, float* scores, int64_t ss) {
  if (pending == NC) {
    qk_full<NQ, NC>(t, kt, kstride, j0, D, scale, scores, ss);
    return;
  }
  int c = 0;
  if constexpr (NC > 2) {
    for (; c + 2 <= pending; c += 2)
      qk_full<NQ, 2>(t, kt + c, kstride, j0 + c, D, scale, scores, ss);
  }
  for (; c < pending; ++c) qk_full<NQ, 1>(t, kt + c, kstride, j0 + c, D, scale, scores, ss);
}

// Pass 1: scores of every query vector of the tile for keys 0..max_keys-1
// (rows with fewer visible keys get extra scores that are never read).
template <int NQ>
QTK_INLINE void qk_scores(const Tile& t, const KvView& kv, int64_t max_keys, float scale,
                          float* scores, int64_t ss) {
  constexpr int NC = NQ >= kAccumulators ? 1 : kAccumulators / NQ;
  const int64_t bs = kv.block_size;
  const float* kt[NC];
  int64_t j0[NC];
  int pending = 0;
  for (int64_t b0 = 0, blk = 0; b0 < max_keys; b0 += bs, ++blk) {
    const float* kb = kv.k_cache + kv.blocks[blk] * kv.block_stride + kv.k_head_offset;
    const int64_t n = std::min(bs, max_keys - b0);
    for (int64_t c0 = 0; c0 < n; c0 += kLanes) {
      if (bs - c0 >= kLanes) {
        // note: a chunk that ends past the last visible key still loads 16
        // lanes inside its block; the extra lanes hold other (or stale)
        // cache slots and only produce scores that are never read.
        kt[pending] = kb + c0;
        j0[pending] = b0 + c0;
        if (++pending == NC) {
          qk_full<NQ, NC>(t, kt, bs, j0, kv.D, scale, scores, ss);
          pending = 0;
        }
      } else {
        qk_flush<NQ, NC>(t, kt, bs, j0, pending, kv.D, scale, scores, ss);
        pending = 0;
        qk_partial<NQ>(t, kb + c0, bs, bs - c0, b0 + c0, kv.D, scale, scores, ss);
      }
    }
  }
  if (pending > 0) qk_flush<NQ, NC>(t, kt, bs, j0, pending, kv.D, scale, scores, ss);
}

// max of s[0..n) (exact whatever the order; NaN scores are skipped as in a
// sequential `s > max ? s : max`).
QTK_INLINE float max_of(const float* s, int64_t n) {
  V16 m;
  for (int l = 0; l < kLanes; ++l) m[l] = -3.0e38f;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    V16 x;
    load16(&x, s + j);
    m = x > m ? x : m;
  }
  float r = -3.0e38f;
  for (int l = 0; l < kLanes; ++l) r = m[l] > r ? m[l] : r;
  for (; j < n; ++j) r = s[j] > r ? s[j] : r;
  return r;
}

// Pass 2: scores become exp(s - max) and inv[qi] = 1 / their sum, the sum
// taken in key-position order in double (the NQ chains are interleaved, each
// keeps its own order).
template <int NQ>
QTK_INLINE void softmax_weights(const Tile& t, float* scores, int64_t ss, int64_t min_keys,
                                double* inv) {
  for (int qi = 0; qi < NQ; ++qi) {
    float* s = scores + qi * ss;
    const float mx = max_of(s, t.n_keys[qi]);
    for (int64_t j = 0; j < t.n_keys[qi]; ++j) s[j] = cpu::exp_poly(s[j] - mx);
  }
  double sum[NQ];
  for (int qi = 0; qi < NQ; ++qi) sum[qi] = 0.0;
  for (int64_t j = 0; j < min_keys; ++j) {
    for (int qi = 0; qi < NQ; ++qi) sum[qi] += scores[qi * ss + j];
  }
  for (int qi = 0; qi < NQ; ++qi) {
    for (int64_t j = min_keys; j < t.n_keys[qi]; ++j) sum[qi] += scores[qi * ss + j];
    inv[qi] = 1.0 / sum[qi];
  }
}

// Pass 3, G chunks of 16 columns starting at column d0: o = (sum_j p_j * v_j
// in key-position order) * inv. Keys are the outer loop: each key's V row
// slice (G contiguous vectors) is loaded once and used by all NQ queries.
// note: a head's V rows are contiguous inside a block (the layout in
// attention.h), and each key's G vectors are loaded together: the block's
// rows stream in order (a loop over all keys per 16-column chunk waited on
// memory at every line: 2.4x slower than the bytes it read, cold). The row
// kPrefetchKeys ahead is prefetched, across block boundaries too. The per
// element arithmetic (one multiply and one add per key, in key order) does
// not depend on G.
constexpr int64_t kPrefetchKeys = 4;
template <int NQ, int G>
QTK_INLINE void pv_pass(const Tile& t, const KvView& kv, const float* p, int64_t ss,
                        int64_t min_keys, int64_t max_keys, const double* inv, int64_t d0) {
  const int64_t bs = kv.block_size;
  V16 acc[NQ][G];
  for (int qi = 0; qi < NQ; ++qi)
    for (int c = 0; c < G; ++c) acc[qi][c] = V16{};
  for (int64_t b0 = 0, blk = 0; b0 < max_keys; b0 += bs, ++blk) {
    const float* vb = kv.v_cache + kv.blocks[blk] * kv.block_stride + kv.v_head_offset + d0;
    const bool has_next = b0 + bs < max_keys;
    const float* vnext =
        has_next ? kv.v_cache + kv.blocks[blk + 1] * kv.block_stride + kv.v_head_offset + d0 : vb;
    const int64_t n = std::min(bs, max_keys - b0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = b0 + i;
      const float* row = vb + i * kv.token_stride;
      // note: the row kPrefetchKeys ahead, in the next block near the end of
      // this one (this row again at the very end). Prefetches change nothing.
      const int64_t ia = i + kPrefetchKeys;
      const float* ahead = ia < bs ? vb + ia * kv.token_stride
                                   : (has_next ? vnext + (ia - bs) * kv.token_stride : row);
      for (int c = 0; c < G; ++c) __builtin_prefetch(ahead + c * kLanes);
      V16 v[G];
      for (int c = 0; c < G; ++c) load16(&v[c], row + c * kLanes);
      if (j < min_keys) {
        for (int qi = 0; qi < NQ; ++qi) {
          const float pj = p[qi * ss + j];
          for (int c = 0; c < G; ++c) acc[qi][c] += pj * v[c];
        }
      } else {
        for (int qi = 0; qi < NQ; ++qi) {
          if (j >= t.n_keys[qi]) continue;
          const float pj = p[qi * ss + j];
          for (int c = 0; c < G; ++c) acc[qi][c] += pj * v[c];
        }
      }
    }
  }
  for (int qi = 0; qi < NQ; ++qi) {
    for (int c = 0; c < G; ++c) {
      for (int l = 0; l < kLanes; ++l) {
        t.o[qi][d0 + c * kLanes + l] =
            static_cast<float>(static_cast<double>(acc[qi][c][l]) * inv[qi]);
      }
    }
  }
}

// Pass 3 over all columns of the head.
template <int NQ>
QTK_INLINE void pv_columns(const Tile& t, const KvView& kv, const float* p, int64_t ss,
                           int64_t min_keys, int64_t max_keys, const double* inv) {
  const int64_t bs = kv.block_size, D = kv.D;
  const int64_t D16 = D / kLanes * kLanes;
  // note: NQ * G accumulators <= 16 vectors (of 32 zmm registers).
  constexpr int G = NQ <= 2 ? 8 : (NQ <= 4 ? 4 : 2);
  int64_t d0 = 0;
  for (; d0 + G * kLanes <= D16; d0 += G * kLanes)
    pv_pass<NQ, G>(t, kv, p, ss, min_keys, max_keys, inv, d0);
  for (; d0 < D16; d0 += kLanes) pv_pass<NQ, 1>(t, kv, p, ss, min_keys, max_keys, inv, d0);
  // Columns past the last multiple of 16 (head sizes such as 40): the same
  // per-element arithmetic, one column at a time.
  for (int64_t d = D16; d < D; ++d) {
    float acc[NQ];
    for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.0f;
    for (int64_t b0 = 0, blk = 0; b0 < max_keys; b0 += bs, ++blk) {
      const float* vb = kv.v_cache + kv.blocks[blk] * kv.block_stride + kv.v_head_offset + d;
      const int64_t n = std::min(bs, max_keys - b0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = b0 + i;
        const float v = vb[i * kv.token_stride];
        for (int qi = 0; qi < NQ; ++qi) {
          if (j < t.n_keys[qi]) acc[qi] += p[qi * ss + j] * v;
        }
      }
    }
    for (int qi = 0; qi < NQ; ++qi) {
      t.o[qi][d] = static_cast<float>(static_cast<double>(acc[qi]) * inv[qi]);
    }
  }
}

template <int NQ>
QTK_INLINE void attend(const Tile& t, const KvView& kv, float scale, float* scores, int64_t ss) {
  int64_t min_keys = t.n_keys[0], max_keys = t.n_keys[0];
  for (int qi = 1; qi < NQ; ++qi) {
    min_keys = std::min(min_keys, t.n_keys[qi]);
    max_keys = std::max(max_keys, t.n_keys[qi]);
  }
  double inv[NQ];
  qk_scores<NQ>(t, kv, max_keys, scale, scores, ss);
  softmax_weights<NQ>(t, scores, ss, min_keys, inv);
  pv_columns<NQ>(t, kv, scores, ss, min_keys, max_keys, inv);
}

// One task: nq query vectors of one sequence and one kv head, each an exact
// two-pass softmax in key-position order.
QTK_CLONES void attend_tile(const Tile& t, int nq, const KvView& kv, float scale, float* scores,
                            int64_t ss) {
  switch (nq) {
    case 1:
      attend<1>(t, kv, scale, scores, ss);
      break;
    case 2:
      attend<2>(t, kv, scale, scores, ss);
      break;
    case 3:
      attend<3>(t, kv, scale, scores, ss);
      break;
    case 4:
      attend<4>(t, kv, scale, scores, ss);
      break;
    case 5:
      attend<5>(t, kv, scale, scores, ss);
      break;
    case 6:
      attend<6>(t, kv, scale, scores, ss);
      break;
    case 7:
      attend<7>(t, kv, scale, scores, ss);
      break;
    default:
      attend<8>(t, kv, scale, scores, ss);
      break;
  }
}

// Floats of score scratch per query vector for contexts up to max_ctx: one
// chunk of slack because a chunk's 16 scores are stored whole.
int64_t score_stride(int64_t max_ctx) { return (max_ctx + 2 * kLanes - 1) / kLanes * kLanes; }

}  // namespace

size_t paged_attention_scratch_floats(int64_t max_total_context, int threads) {
  return static_cast<size_t>(score_stride(max_total_context)) * kMaxQ *
         static_cast<size_t>(threads < 1 ? 1 : threads);
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
  const int64_t ss = score_stride(max_ctx);
  const int64_t group = Hq / Hkv;
  // note: a task is up to kMaxQ query vectors that share one kv head: `rows`
  // consecutive query rows of one sequence times `heads` query heads of the
  // group. Grouping only decides which K/V loads are shared; every output is
  // computed the same way whatever it is grouped with.
  const int64_t heads = std::min<int64_t>(group, kMaxQ);
  const int64_t head_parts = (group + heads - 1) / heads;
  const int64_t rows = std::max<int64_t>(1, kMaxQ / heads);
  const int64_t per_row = Hkv * head_parts;
  if (b.num_blocks < 1) {
    fail("paged_attention: AttentionBatch.num_blocks must be the cache's block count, found {}",
         b.num_blocks);
  }
  const int64_t head_floats = b.num_blocks * b.block_size * D;

  // Task index = (kv head, head part, row slot); only row slots that start a
  // row tile of their sequence do work. note: kv head outermost so that a
  // thread's consecutive tasks reuse one head's K and V from L2; row slots
  // are taken in zig-zag order (first, last, second, second-to-last, ...) so
  // that each thread's contiguous piece mixes short and long causal rows.
  // Which thread computes a row never changes how it is computed.
  parallel_for_tid(pool, total_rows * per_row, [&](int64_t begin, int64_t end, int tid) {
    float* scores = scratch + tid * kMaxQ * ss;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task % total_rows;
      const int64_t part = task / total_rows;  // kvh * head_parts + head part
      const int64_t row = first_row + ((i % 2 == 0) ? i / 2 : total_rows - 1 - i / 2);
      // Sequence of this row: binary search over q_start.
      int64_t lo = 0, hi = b.num_seqs - 1;
      while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (b.q_start[mid] <= row)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int64_t seq = lo;
      const int64_t local = row - b.q_start[seq];
      if (local % rows != 0) continue;
      const int64_t q_len = b.q_start[seq + 1] - b.q_start[seq];
      const int64_t n_rows = std::min(rows, q_len - local);
      const int64_t kvh = part / head_parts;
      const int64_t h0 = kvh * group + (part % head_parts) * heads;
      const int64_t n_heads = std::min(heads, kvh * group + group - h0);
      const int64_t pos0 = b.seq_len[seq] - q_len + local;

      Tile t;
      int nq = 0;
      for (int64_t r = 0; r < n_rows; ++r) {
        for (int64_t h = h0; h < h0 + n_heads; ++h, ++nq) {
          t.q[nq] = q + (row + r) * ldq + h * D;
          t.o[nq] = out + (row + r) * ldo + h * D;
          t.n_keys[nq] = pos0 + r + 1;
        }
      }
      KvView kv{k_cache,
                v_cache,
                b.block_table + seq * b.max_blocks,
                b.block_size,
                b.block_size * D,
                kvh * head_floats,
                kvh * head_floats,
                D,
                D};
      attend_tile(t, nq, kv, scale, scores, ss);
    }
  });
}

void kv_cache_write(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t T,
                    int64_t Hkv, int64_t D, const int64_t* slot_mapping, int64_t block_size,
                    int64_t num_blocks, float* k_cache, float* v_cache) {
  const int64_t head_floats = num_blocks * block_size * D;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    // K: [Hkv][num_blocks][D][block_size]; V: [Hkv][num_blocks][block_size][D].
    const int64_t block = slot / block_size, offset = slot % block_size;
    const float* kr = k + t * ldk;
    const float* vr = v + t * ldv;
    for (int64_t h = 0; h < Hkv; ++h) {
      float* kb = k_cache + h * head_floats + block * block_size * D + offset;
      for (int64_t d = 0; d < D; ++d) kb[d * block_size] = kr[h * D + d];
      float* vb = v_cache + h * head_floats + (block * block_size + offset) * D;
      std::copy(vr + h * D, vr + h * D + D, vb);
    }
  }
}

}  // namespace qtk
