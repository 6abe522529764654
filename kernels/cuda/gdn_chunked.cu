// Gated delta rule, chunked (WY) form over full 64-token chunks on tensor
// cores, updating the f32 state pool in place (declared in
// kernels/cuda/gdn_chunked.h).
#include <cstdlib>
#include <string>

#include "core/tuning.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_chunked.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kC = static_cast<int>(kGdnChunk);  // tokens per chunk
constexpr int kPad = 8;                          // bf16 padding per shared row (ldmatrix banks)
constexpr int kLd = kC + 4;                      // f32 row stride of A and T
constexpr int kB = 16;                           // block size of the blocked triangular inverse
constexpr int kPrepThreads = 256;
constexpr int kStateThreads = 256;
constexpr int64_t kTile = 32 * 16;  // bytes of one 16 x 16 A fragment tile (32 lanes x 16 B)

// note: the math. Per token t the recurrent form is
//   S_t = e^{g_t} S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),
//   o_t = S_t^T q_t,
// with S [Dk, Dv]. Inside a chunk of 64 tokens starting from state S (token
// i = 0..63), let gcum_i = g_0 + ... + g_i (a fixed serial sum) and
// gamma_i = e^{gcum_i}. Unrolling the recurrence:
//   S_i = gamma_i S + sum_{j<=i} e^{gcum_i - gcum_j} k_j u_j^T,
//   u_i = beta_i v_i - beta_i gamma_i k_i^T S
//         - sum_{j<i} beta_i (k_i . k_j) e^{gcum_i - gcum_j} u_j.
// With A = strictly-lower [beta_i (k_i . k_j) e^{gcum_i - gcum_j}] this is
// (I + A) U' = beta V - beta gamma K S, so with T = (I + A)^-1 (unit lower
// triangular),
//   W = T diag(beta gamma) K,  U = T diag(beta) V,  new_v = U - W S.
// Then, with P = [(q_i . k_j) e^{gcum_i - gcum_j}] for j <= i (0 above),
//   O = diag(gamma) Q S + P new_v,
//   S' = gamma_63 S + K^T diag(e^{gcum_63 - gcum_j}) new_v.
// Every exponent is <= 0 (g < 0), so nothing overflows and nothing divides
// by a decay that may have underflowed.
//
// Two kernels. (1) gdn_chunk_prep_kernel, one block per (chunk, value head),
// all chunks of all items at once: everything that does not depend on the
// incoming state: gcum, K K^T and Q K^T (mma), A, P, T (f32 on CUDA cores),
// W (mma), and the operands of the state pass as mma A fragments in the
// workspace. (2) gdn_chunk_state_kernel, one block per (item, value head,
// 16 or 32 value columns), walks the item's chunks in order: new_v = T' V -
// W S, O = gamma Q S + P new_v, S' = gamma_63 S + K^T (e^{..} new_v), the
// state tile kept in registers (f32) for the whole item.
//
// note: measured on the H100 (Qwen3.5-0.8B heads: 16 x Dk 128 x Dv 128, us
// per launch, BM_GatedDeltaRuleChunked; prep + state from ncu): 1 x 512
// tokens 59.8 -> 30.0 (prep 18.5 -> 12.5: the diagonal-block inverse on all
// 256 threads instead of 64, the off-diagonal blocks 2 x 2 per thread with
// all blocks of a diagonal at once, beta gamma computed once per token;
// state 41 -> 19.8: record staged in shared memory instead of L2 -> L1
// loads, 8 warps in two roles, 16 value columns per block), 8 x 512 186 ->
// 173, 64 x 128 (a batch-128 prefill step) 393 (prep 125, state 279: 4096
// blocks at one per SM). The bulk copies and the two mma chains per tile
// (below) came with no measurable change at 1 x 512 (state 19.4 us with
// per-thread cp.async and one chain); what bounds the state pass now is not
// established (no profile of this version).
//
// note: precision per product (mma.sync m16n8k16, bf16 inputs, f32
// accumulate). q, k, v are bf16 already: bf16 x bf16 products are exact in
// f32. f32 operands (S, T, W, new_v) are split x = hi + lo with hi = bf16(x),
// lo = bf16(x - hi) (relative representation error ~2^-17) where they feed
// the state; the lo x lo term (~2^-18) is dropped.
//   K K^T, Q K^T: bf16 inputs, exact products.
//   W = T diag(beta gamma) K: (T diag(beta gamma)) hi + lo, K exact.
//   T' V = T diag(beta) V: T' hi + lo, V exact.
//   W S: W hi x S hi + W hi x S lo + W lo x S hi.
//   Q S: Q exact x (S hi + S lo).
//   P new_v: P rounded to bf16 once (the output is bf16: 2^-9 relative per
//     term, below the output's own rounding) x (new_v hi + lo).
//   K^T (e^{..} new_v): K exact x (hi + lo).
// Measured on the H100 against the float64 chunked reference
// (tests/cuda/test_gdn_chunked.cpp, relative L2, 1..9 chunks, Dk 16..128):
// state 1.4e-6 .. 2.9e-6 (an f32 CUDA-core kernel: 1.6e-7 ..
// 5.2e-7), outputs 2.3e-3 .. 2.4e-3 (1.7e-3 is the bf16 rounding of the
// outputs alone, which the f32 kernel reached). The extra output error is
// P in bf16; a hi/lo P would cost 4 more mma per k tile of (3) and 8 KiB
// more workspace per chunk and head. Against the recurrent kernel: state
// 3.3e-6, outputs 2.6e-3. The 4-lane forward substitution of the diagonal
// T blocks and the two-chain mma sums leave these figures where they are
// without them (within 2.2e-3 .. 2.4e-3 for the outputs); the bf16 generate tests still agree with
// the CPU on 810 of 960 qwen3.5-sample tokens and every invariance case is byte-identical.
//
// note: fixed order: every sum runs in an order fixed by Dk, the chunk row
// and the column alone (mma k-steps ascending, hi before lo), so the result
// does not depend on the batch, the grid or the other chunks in the launch.

// Workspace record of one (chunk, value head), byte offsets. A fragment
// tiles (16 x 16 bf16, 32 lanes x uint4 in lane order, tile (row tile, k
// tile) at index rt * k_tiles + kt). Part A (up to a_bytes) is what the
// state pass reads before new_v exists, part B the rest: each is staged into
// shared memory while the other half of the chunk runs.
template <int DK>
struct Rec {
  static constexpr int kKt = DK / 16;
  static constexpr int64_t w_hi = 0;                       // -W hi [64][DK]: 4 x kKt tiles
  static constexpr int64_t w_lo = w_hi + 4 * kKt * kTile;  // -W lo
  static constexpr int64_t t_hi = w_lo + 4 * kKt * kTile;  // T' = T diag(beta) hi [64][64]
  static constexpr int64_t t_lo = t_hi + 16 * kTile;       // T' lo
  static constexpr int64_t qf = t_lo + 16 * kTile;         // Q [64][DK]
  static constexpr int64_t kd = qf + 4 * kKt * kTile;      // f32 [64] e^{gcum_63 - gcum_j}
  static constexpr int64_t a_bytes = kd + kC * 4;
  static constexpr int64_t p = a_bytes;                // P [64][64]
  static constexpr int64_t kt = p + 16 * kTile;        // K^T [DK][64]: kKt x 4 tiles
  static constexpr int64_t eg = kt + 4 * kKt * kTile;  // f32 [64] gamma_i
  static constexpr int64_t bytes = eg + kC * 4;
  static constexpr int64_t b_bytes = bytes - a_bytes;
};

__device__ __forceinline__ uint4* frag_at(uint8_t* rec, int64_t off, int tile, int lane) {
  return reinterpret_cast<uint4*>(rec + off + tile * kTile) + lane;
}
// x, y as bf16 pairs hi = bf16(x, y) and lo = bf16(x - hi_x, y - hi_y).
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x, y);
  lo = pack_bf16(x - __uint_as_float(hi << 16), y - __uint_as_float(hi & 0xffff0000u));
}

// ---- (1) the state-independent part, one block per (chunk, value head) ----

template <int DK>
struct PrepSmem {                                  // byte offsets
  static constexpr int ld = DK + kPad;             // bf16 row stride of q and k
  static constexpr int ks = 0;                     // bf16 [64][ld] keys
  static constexpr int qs = ks + kC * ld * 2;      // bf16 [64][ld] queries
  static constexpr int am = qs + kC * ld * 2;      // f32 [64][kLd] A (strictly lower)
  static constexpr int tm = am + kC * kLd * 4;     // f32 [64][kLd] T (lower blocks)
  static constexpr int mb = tm + kC * kLd * 4;     // f32 [3][16][16] scratch of the inverse
  static constexpr int gc = mb + 3 * kB * kB * 4;  // f32 [64] g, then gcum
  static constexpr int bt = gc + kC * 4;           // f32 [64] beta
  static constexpr int bg = bt + kC * 4;           // f32 [64] beta_j gamma_j
  static constexpr int total = bg + kC * 4;
};

template <int DK>
__global__ void __launch_bounds__(kPrepThreads)
    gdn_chunk_prep_kernel(const bf16* __restrict__ q, int64_t ldq, const bf16* __restrict__ k,
                          int64_t ldk, const float* __restrict__ g, const float* __restrict__ beta,
                          const int32_t* __restrict__ first_row,
                          const int32_t* __restrict__ chunk_start, int count, int hk, int hv,
                          uint8_t* __restrict__ ws, bool vec) {
  using L = PrepSmem<DK>;
  using R = Rec<DK>;
  constexpr int ld = L::ld;
  extern __shared__ uint4 smem_u4[];
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem_u4);
  bf16* Ks = reinterpret_cast<bf16*>(sm + L::ks);
  bf16* Qs = reinterpret_cast<bf16*>(sm + L::qs);
  float* Am = reinterpret_cast<float*>(sm + L::am);
  float* Tm = reinterpret_cast<float*>(sm + L::tm);
  float* Mb = reinterpret_cast<float*>(sm + L::mb);
  float* Gc = reinterpret_cast<float*>(sm + L::gc);
  float* Bt = reinterpret_cast<float*>(sm + L::bt);
  float* Bg = reinterpret_cast<float*>(sm + L::bg);

  const int chunk = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int gq = lane >> 2, cq = lane & 3;  // fragment row / column pair of this lane
  const int item = find_seq(chunk_start, count, chunk);
  const int64_t r0 =
      static_cast<int64_t>(first_row[item]) + static_cast<int64_t>(chunk - chunk_start[item]) * kC;
  const int kh = h / (hv / hk);
  uint8_t* rec = ws + (static_cast<int64_t>(chunk) * hv + h) * R::bytes;

  // (0) q, k rows of the chunk, g and beta.
  if (vec) {
    for (int e = tid; e < kC * DK / 8; e += kPrepThreads) {
      const int i = e / (DK / 8), d = (e % (DK / 8)) * 8;
      *reinterpret_cast<uint4*>(Ks + i * ld + d) =
          *reinterpret_cast<const uint4*>(k + (r0 + i) * ldk + kh * DK + d);
      *reinterpret_cast<uint4*>(Qs + i * ld + d) =
          *reinterpret_cast<const uint4*>(q + (r0 + i) * ldq + kh * DK + d);
    }
  } else {
    for (int e = tid; e < kC * DK; e += kPrepThreads) {
      const int i = e / DK, d = e % DK;
      Ks[i * ld + d] = k[(r0 + i) * ldk + kh * DK + d];
      Qs[i * ld + d] = q[(r0 + i) * ldq + kh * DK + d];
    }
  }
  if (tid < kC) {
    Gc[tid] = g[(r0 + tid) * hv + h];
    Bt[tid] = beta[(r0 + tid) * hv + h];
  }
  __syncthreads();
  // (1) gcum: one serial sum (fixed order), in registers.
  if (tid == 0) {
    float4 x[kC / 4];
#pragma unroll
    for (int i = 0; i < kC / 4; ++i) x[i] = reinterpret_cast<const float4*>(Gc)[i];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kC / 4; ++i) {
      x[i].x = acc += x[i].x;
      x[i].y = acc += x[i].y;
      x[i].z = acc += x[i].z;
      x[i].w = acc += x[i].w;
    }
#pragma unroll
    for (int i = 0; i < kC / 4; ++i) reinterpret_cast<float4*>(Gc)[i] = x[i];
  }
  __syncthreads();
  if (tid < kC) {
    Bg[tid] = Bt[tid] * expf(Gc[tid]);
    reinterpret_cast<float*>(rec + R::eg)[tid] = expf(Gc[tid]);
    reinterpret_cast<float*>(rec + R::kd)[tid] = expf(Gc[kC - 1] - Gc[tid]);
  }
  // (2) K K^T (warps 0-3) and Q K^T (warps 4-7), 16 rows per warp, all 64
  // keys: A = beta_i kk e^{gcum_i - gcum_j} (j < i) to shared memory, P =
  // qk e^{gcum_i - gcum_j} (j <= i) rounded to bf16 as A fragments to the
  // workspace.
  {
    const int rt = w & 3;
    const bool is_q = w >= 4;
    const bf16* rows = is_q ? Qs : Ks;
    float sc[kC / 8][4];
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(rows + (rt * 16 + (lane & 15)) * ld + kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int nn = 0; nn < kC / 16; ++nn) {
        uint32_t b[4];
        const int key = nn * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(b, smem_addr(Ks + key * ld + kk * 16 + ((lane >> 3) & 1) * 8));
        mma_bf16(sc[2 * nn], a, b[0], b[1]);
        mma_bf16(sc[2 * nn + 1], a, b[2], b[3]);
      }
    }
    const int i0 = rt * 16 + gq, i1 = i0 + 8;
    const float g0 = Gc[i0], g1 = Gc[i1];
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e < 2 ? i0 : i1, j = n * 8 + 2 * cq + (e & 1);
        const float gi = e < 2 ? g0 : g1;
        const float decay = j <= i ? expf(gi - Gc[j]) : 0.0f;
        if (is_q)
          sc[n][e] = j <= i ? sc[n][e] * decay : 0.0f;
        else
          sc[n][e] = j < i ? Bt[i] * sc[n][e] * decay : 0.0f;
      }
    }
    if (is_q) {
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt)
        *frag_at(rec, R::p, rt * 4 + kt, lane) = make_uint4(
            pack_bf16(sc[2 * kt][0], sc[2 * kt][1]), pack_bf16(sc[2 * kt][2], sc[2 * kt][3]),
            pack_bf16(sc[2 * kt + 1][0], sc[2 * kt + 1][1]),
            pack_bf16(sc[2 * kt + 1][2], sc[2 * kt + 1][3]));
    } else {
#pragma unroll
      for (int n = 0; n < kC / 8; ++n) {
        const int j = n * 8 + 2 * cq;
        *reinterpret_cast<float2*>(Am + i0 * kLd + j) = make_float2(sc[n][0], sc[n][1]);
        *reinterpret_cast<float2*>(Am + i1 * kLd + j) = make_float2(sc[n][2], sc[n][3]);
      }
    }
  }
  __syncthreads();
  // (3a) T = (I + A)^-1, f32 on CUDA cores. The diagonal 16 x 16 blocks by
  // forward substitution, column m of block b by the 4 lanes 4 (16 b + m)
  // + q (q = 0..3): t_i = 0 (i < m), 1 (i = m), -sum_{j<i} A_ij t_j (i > m;
  // t_j = 0 below m). Lane q sums j = q, q + 4, ... (ascending) and keeps
  // those t_j in registers; the four partial sums are added as (p0 + p1) +
  // (p2 + p3) (every lane gets the same bits).
  // note: the order differs from a plain serial sum (a 15-step chain of
  // 4-term sums instead of a 120-term chain on 64 threads); the errors are
  // measured in tests/cuda/test_gdn_chunked.cpp.
  {
    const int col = tid >> 2, q = tid & 3;
    const int b0 = (col >> 4) * kB, mr = col & (kB - 1);
    float tq[kB / 4];
#pragma unroll
    for (int s = 0; s < kB / 4; ++s) tq[s] = 4 * s + q == mr ? 1.0f : 0.0f;
    const float* arow = Am + b0 * kLd + b0 + q;
#pragma unroll
    for (int ri = 1; ri < kB; ++ri) {
      float part = 0.0f;
#pragma unroll
      for (int s = 0; s < kB / 4; ++s)
        if (4 * s < ri && 4 * s + q < ri) part += arow[ri * kLd + 4 * s] * tq[s];
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      const float ti = ri > mr ? -part : (ri == mr ? 1.0f : 0.0f);
      if (q == (ri & 3)) tq[ri >> 2] = ti;
    }
#pragma unroll
    for (int s = 0; s < kB / 4; ++s) Tm[(b0 + 4 * s + q) * kLd + b0 + mr] = tq[s];
  }
  __syncthreads();
  // (3b) Blocks below the diagonal, block diagonal dist = 1, 2, 3, all
  // blocks of one diagonal at once (64 threads each, 2 x 2 elements per
  // thread: rows x, x + 8, columns y, y + 1): M = sum_{c<=k<r} A_rk T_kc
  // (ascending k, z), then T_rc = -T_rr M.
  {
    const int cb = tid >> 6, x = (tid >> 3) & 7, y = (tid & 7) * 2;
    for (int dist = 1; dist < kC / kB; ++dist) {
      const int rb = cb + dist;
      const bool on = rb < kC / kB;
      if (on) {
        float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        const float* a0 = Am + (rb * kB + x) * kLd;
        for (int kb = cb; kb < rb; ++kb) {
#pragma unroll
          for (int z = 0; z < kB; ++z) {
            const float2 t =
                *reinterpret_cast<const float2*>(Tm + (kb * kB + z) * kLd + cb * kB + y);
            const float u0 = a0[kb * kB + z], u1 = a0[8 * kLd + kb * kB + z];
            acc[0][0] += u0 * t.x;
            acc[0][1] += u0 * t.y;
            acc[1][0] += u1 * t.x;
            acc[1][1] += u1 * t.y;
          }
        }
        *reinterpret_cast<float2*>(Mb + (cb * kB + x) * kB + y) = make_float2(acc[0][0], acc[0][1]);
        *reinterpret_cast<float2*>(Mb + (cb * kB + x + 8) * kB + y) =
            make_float2(acc[1][0], acc[1][1]);
      }
      __syncthreads();
      if (on) {
        float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
        const float* t0 = Tm + (rb * kB + x) * kLd + rb * kB;
#pragma unroll
        for (int z = 0; z < kB; ++z) {
          const float2 m = *reinterpret_cast<const float2*>(Mb + (cb * kB + z) * kB + y);
          const float u0 = t0[z], u1 = t0[8 * kLd + z];
          acc[0][0] += u0 * m.x;
          acc[0][1] += u0 * m.y;
          acc[1][0] += u1 * m.x;
          acc[1][1] += u1 * m.y;
        }
        float* o = Tm + (rb * kB + x) * kLd + cb * kB + y;
        *reinterpret_cast<float2*>(o) = make_float2(-acc[0][0], -acc[0][1]);
        *reinterpret_cast<float2*>(o + 8 * kLd) = make_float2(-acc[1][0], -acc[1][1]);
      }
      __syncthreads();
    }
  }
  // T_ij scaled by s_j as hi/lo A fragments of k tile kt for 16 rows from
  // rt * 16 (0 above the diagonal).
  auto t_frags = [&](int rt, int kt, bool with_gamma, uint32_t(&hi)[4], uint32_t(&lo)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = rt * 16 + gq + (r & 1) * 8, j = kt * 16 + 2 * cq + (r >> 1) * 8;
      float x0 = 0.0f, x1 = 0.0f;
      if (j <= i) {
        const float s = with_gamma ? Bg[j] : Bt[j];
        x0 = Tm[i * kLd + j] * s;
      }
      if (j + 1 <= i) {
        const float s = with_gamma ? Bg[j + 1] : Bt[j + 1];
        x1 = Tm[i * kLd + j + 1] * s;
      }
      split2(x0, x1, hi[r], lo[r]);
    }
  };
  if (w < 4) {
    // (4) -W = -(T diag(beta gamma)) K for rows 16 w.., in column groups of
    // up to 64, stored as hi/lo A fragments (k = the Dk index).
    const int rt = w;
    uint32_t th[kC / 16][4], tl[kC / 16][4];
#pragma unroll
    for (int kt = 0; kt < kC / 16; ++kt) t_frags(rt, kt, true, th[kt], tl[kt]);
    constexpr int kNc = DK < 64 ? DK : 64;
#pragma unroll
    for (int d0 = 0; d0 < DK; d0 += kNc) {
      float acc[kNc / 8][4];
#pragma unroll
      for (int n = 0; n < kNc / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        const int key = kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int nd = 0; nd < kNc / 16; ++nd) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_addr(Ks + key * ld + d0 + nd * 16 + (lane >> 4) * 8));
          mma_bf16(acc[2 * nd], th[kt], b[0], b[1]);
          mma_bf16(acc[2 * nd], tl[kt], b[0], b[1]);
          mma_bf16(acc[2 * nd + 1], th[kt], b[2], b[3]);
          mma_bf16(acc[2 * nd + 1], tl[kt], b[2], b[3]);
        }
      }
#pragma unroll
      for (int t = 0; t < kNc / 16; ++t) {
        uint4 hi, lo;
        split2(-acc[2 * t][0], -acc[2 * t][1], hi.x, lo.x);
        split2(-acc[2 * t][2], -acc[2 * t][3], hi.y, lo.y);
        split2(-acc[2 * t + 1][0], -acc[2 * t + 1][1], hi.z, lo.z);
        split2(-acc[2 * t + 1][2], -acc[2 * t + 1][3], hi.w, lo.w);
        const int tile = rt * (DK / 16) + d0 / 16 + t;
        *frag_at(rec, R::w_hi, tile, lane) = hi;
        *frag_at(rec, R::w_lo, tile, lane) = lo;
      }
    }
  } else {
    // (5) T' = T diag(beta) (hi/lo), Q and K^T as A fragments.
    const int rt = w - 4;
#pragma unroll
    for (int kt = 0; kt < kC / 16; ++kt) {
      uint32_t hi[4], lo[4];
      t_frags(rt, kt, false, hi, lo);
      *frag_at(rec, R::t_hi, rt * 4 + kt, lane) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *frag_at(rec, R::t_lo, rt * 4 + kt, lane) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(Qs + (rt * 16 + (lane & 15)) * ld + kk * 16 + (lane >> 4) * 8));
      *frag_at(rec, R::qf, rt * (DK / 16) + kk, lane) = make_uint4(a[0], a[1], a[2], a[3]);
    }
    // K^T tile (mt, kt): rows d = 16 mt.., columns j = 16 kt..; the
    // transposed 8 x 8 loads of K rows j (+8 for a2, a3) at columns d (+8
    // for a1, a3).
    for (int e = rt; e < (DK / 16) * 4; e += 4) {
      const int mt = e >> 2, kt = e & 3, m = lane >> 3;
      const int j = kt * 16 + (lane & 7) + (m >> 1) * 8, d = mt * 16 + (m & 1) * 8;
      uint32_t a[4];
      ldmatrix_x4_trans(a, smem_addr(Ks + j * ld + d));
      *frag_at(rec, R::kt, mt * 4 + kt, lane) = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
}

// ---- (2) the state pass, one block per (item, value head, 16 or 32 columns) ----

// note: 8 warps per block with two roles. Phase A (needs the state): warps
// 0-3 new_v = T' V - W S for chunk rows 16 w.., warps 4-7 Q S for rows
// 16 (w - 4)..; phase B (needs new_v): warps 4-7 O = gamma Q S + P new_v,
// and warp w updates state row tile w (S' = gamma_63 S + K^T (e^{..} new_v),
// f32 in registers for the whole item). Each phase's half of the chunk's
// record is copied into shared memory while the other phase runs,
// so the chain of chunks waits on shared memory, not on L2. NV = 16 value
// columns per block when 32-column blocks would leave SMs idle (one long
// prompt: twice the blocks, half the chain per block), else 32 (half the
// record traffic); every output and state element is computed the same way
// in both (its own mma rows and columns, same k order). Every product sums
// its k tiles in two interleaved mma chains (even and odd k tiles, added
// once at the end): a warp holds only 2 (16 columns) or 4 output tiles, so a
// single chain per tile waited on the mma latency step after step.
// note: on sm_90 each record part arrives by one bulk copy (the copy
// engine; cp.async.bulk, completion counted on an mbarrier) instead of ~20
// cp.async per thread per chunk; the compute_80 PTX keeps cp.async.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QTK_GDN_BULK 1
#else
#define QTK_GDN_BULK 0
#endif

#if QTK_GDN_BULK
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, int bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
#endif

template <int DK, int NV>
struct StateSmem {                                                    // byte offsets
  static constexpr int ld = NV + kPad;                                // bf16 row stride below
  static constexpr int ra = 0;                                        // record part A
  static constexpr int rb = ra + static_cast<int>(Rec<DK>::a_bytes);  // record part B
  static constexpr int sh = rb + static_cast<int>(Rec<DK>::b_bytes);  // bf16 [DK][ld] S hi
  static constexpr int sl = sh + DK * ld * 2;                         // S lo
  static constexpr int nh = sl + DK * ld * 2;                         // bf16 [64][ld] new_v hi
  static constexpr int nl = nh + kC * ld * 2;                         // new_v lo
  static constexpr int dh = nl + kC * ld * 2;       // e^{gcum_63 - gcum_j} new_v hi
  static constexpr int dl = dh + kC * ld * 2;       // ... lo
  static constexpr int v0 = dl + kC * ld * 2;       // bf16 [2][64][ld] V tiles
  static constexpr int bar = v0 + 2 * kC * ld * 2;  // 2 mbarriers (record parts A, B)
  static constexpr int total = bar + 16;
};

// Stores the pair (x, y) at row r, column c of the hi and lo arrays (row
// stride ld).
__device__ __forceinline__ void put_split(bf16* hi, bf16* lo, int ld, int r, int c, float x,
                                          float y) {
  uint32_t h, l;
  split2(x, y, h, l);
  *reinterpret_cast<uint32_t*>(hi + r * ld + c) = h;
  *reinterpret_cast<uint32_t*>(lo + r * ld + c) = l;
}

// B fragments for n tiles 2 nd, 2 nd + 1 and k tile kt of a [k][ld] bf16
// shared array: b[0], b[1] and b[2], b[3].
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const bf16* m, int ld, int kt, int nd,
                                       int lane) {
  const int key = kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  ldmatrix_x4_trans(b, smem_addr(m + key * ld + nd * 16 + (lane >> 4) * 8));
}

// A fragment tile `tile` of a record part staged in shared memory.
__device__ __forceinline__ void frag_smem(uint32_t (&a)[4], const uint8_t* part, int64_t off,
                                          int tile, int lane) {
  const uint4 x = *reinterpret_cast<const uint4*>(part + off + tile * kTile + lane * 16);
  a[0] = x.x;
  a[1] = x.y;
  a[2] = x.z;
  a[3] = x.w;
}

template <int DK, int NV>
__global__ void __launch_bounds__(kStateThreads, 1)
    gdn_chunk_state_kernel(const bf16* __restrict__ v, int64_t ldv, float* state_pool,
                           const int32_t* __restrict__ slot, const int32_t* __restrict__ first_row,
                           const int32_t* __restrict__ chunk_start, bf16* __restrict__ out,
                           int64_t ldo, int hv, int dv, const uint8_t* __restrict__ ws, bool vec_v,
                           bool pair_out) {
  using L = StateSmem<DK, NV>;
  using R = Rec<DK>;
  constexpr int kKt = DK / 16;
  constexpr int kNf = NV / 8;  // n tiles of the value columns
  constexpr int ld = L::ld;
  extern __shared__ uint4 smem_u4[];
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem_u4);
  const uint8_t* Ra = sm + L::ra;
  const uint8_t* Rb = sm + L::rb;
  bf16* Sh = reinterpret_cast<bf16*>(sm + L::sh);
  bf16* Sl = reinterpret_cast<bf16*>(sm + L::sl);
  bf16* Nh = reinterpret_cast<bf16*>(sm + L::nh);
  bf16* Nl = reinterpret_cast<bf16*>(sm + L::nl);
  bf16* Dh = reinterpret_cast<bf16*>(sm + L::dh);
  bf16* Dl = reinterpret_cast<bf16*>(sm + L::dl);
  bf16* V0 = reinterpret_cast<bf16*>(sm + L::v0);

  const int tile = blockIdx.x, h = blockIdx.y, item = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, rt = w & 3;
  const int gq = lane >> 2, cq = lane & 3;
  const int c0 = tile * NV;
  const int cs = chunk_start[item], n_chunks = chunk_start[item + 1] - cs;
  if (n_chunks <= 0) return;
  float* S = state_pool + (static_cast<int64_t>(slot[item]) * hv + h) * DK * dv;
  const int64_t row0 = first_row[item];
  auto rec_at = [&](int c) { return ws + (static_cast<int64_t>(cs + c) * hv + h) * R::bytes; };
  // Part 0 (A) or 1 (B) of chunk c's record into shared memory: one bulk
  // copy on sm_90 (completion on an mbarrier, phase c & 1), else cp.async
  // by every thread (completion with the V copies' group).
  const uint32_t bar = smem_addr(sm + L::bar);
#if QTK_GDN_BULK
  if (tid == 0) {
    mbar_init(bar, 1);
    mbar_init(bar + 8, 1);
    mbar_fence_init();
  }
  __syncthreads();
#endif
  auto stage_rec = [&](int part, int c) {
    const uint8_t* src = rec_at(c) + (part ? R::a_bytes : 0);
    const int dst = part ? L::rb : L::ra;
    const int bytes = static_cast<int>(part ? R::b_bytes : R::a_bytes);
#if QTK_GDN_BULK
    if (tid == 0) {
      mbar_expect_tx(bar + 8 * part, bytes);
      bulk_copy_g2s(smem_addr(sm + dst), src, bytes, bar + 8 * part);
    }
#else
    for (int o = tid * 16; o < bytes; o += kStateThreads * 16)
      cp_async_16(smem_addr(sm + dst + o), src + o, true);
#endif
  };
  auto wait_rec = [&](int part, int c) {
#if QTK_GDN_BULK
    mbar_wait(bar + 8 * part, c & 1);
#else
    (void)part;
    (void)c;
#endif
  };
  // Chunk c's V tile (zero past dv) into buffer c & 1.
  auto stage_v = [&](int c) {
    bf16* Vs = V0 + (c & 1) * kC * ld;
    const int64_t r0 = row0 + static_cast<int64_t>(c) * kC;
    const bf16* vh = v + static_cast<int64_t>(h) * dv;
    if (vec_v) {
      for (int e = tid; e < kC * (NV / 8); e += kStateThreads) {
        const int i = e / (NV / 8), cc = (e % (NV / 8)) * 8;
        const bool ok = c0 + cc < dv;
        cp_async_16(smem_addr(Vs + i * ld + cc), ok ? vh + (r0 + i) * ldv + c0 + cc : v, ok);
      }
    } else {
      for (int e = tid; e < kC * NV; e += kStateThreads) {
        const int i = e / NV, cc = e % NV;
        Vs[i * ld + cc] = c0 + cc < dv ? vh[(r0 + i) * ldv + c0 + cc] : __float2bfloat16_rn(0.0f);
      }
    }
  };

  // Warp w's state row tile w (if w < kKt) in C fragment layout.
  const bool has_state = w < kKt;
  float st[kNf][4];
#pragma unroll
  for (int nf = 0; nf < kNf; ++nf)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int d = w * 16 + gq + (e >> 1) * 8, col = c0 + nf * 8 + 2 * cq + (e & 1);
      st[nf][e] = has_state && col < dv ? S[static_cast<int64_t>(d) * dv + col] : 0.0f;
    }
  auto put_state = [&] {
    if (has_state) {
#pragma unroll
      for (int nf = 0; nf < kNf; ++nf) {
        const int d = w * 16 + gq, col = nf * 8 + 2 * cq;
        put_split(Sh, Sl, ld, d, col, st[nf][0], st[nf][1]);
        put_split(Sh, Sl, ld, d + 8, col, st[nf][2], st[nf][3]);
      }
    }
  };
  // Accumulator pairs: k tiles alternate between [0] and [1] (two
  // independent mma chains), summed as [0] + [1] at the end.
  auto zero2 = [](float(&a)[2][kNf][4]) {
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
      for (int n = 0; n < kNf; ++n) a[p][n][0] = a[p][n][1] = a[p][n][2] = a[p][n][3] = 0.0f;
  };

  stage_rec(0, 0);
  stage_v(0);
  cp_async_commit();
  put_state();
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t r0 = row0 + static_cast<int64_t>(c) * kC;
    wait_rec(0, c);
    cp_async_wait<0>();
    __syncthreads();  // part A, V and S of chunk c in place; part B, V (c + 1) free
    stage_rec(1, c);
    if (c + 1 < n_chunks) stage_v(c + 1);
    cp_async_commit();
    const bf16* Vs = V0 + (c & 1) * kC * ld;
    // Phase A: new_v (warps 0-3) or Q S (warps 4-7) for rows 16 rt..
    float acc[2][kNf][4];
    zero2(acc);
    if (w < 4) {
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        uint32_t th[4], tl[4];
        frag_smem(th, Ra, R::t_hi, rt * 4 + kt, lane);
        frag_smem(tl, Ra, R::t_lo, rt * 4 + kt, lane);
#pragma unroll
        for (int nd = 0; nd < NV / 16; ++nd) {
          uint32_t b[4];
          load_b(b, Vs, ld, kt, nd, lane);
          float(&a0)[4] = acc[kt & 1][2 * nd];
          float(&a1)[4] = acc[kt & 1][2 * nd + 1];
          mma_bf16(a0, th, b[0], b[1]);
          mma_bf16(a0, tl, b[0], b[1]);
          mma_bf16(a1, th, b[2], b[3]);
          mma_bf16(a1, tl, b[2], b[3]);
        }
      }
#pragma unroll
      for (int kt = 0; kt < kKt; ++kt) {
        uint32_t wh[4], wl[4];
        frag_smem(wh, Ra, R::w_hi, rt * kKt + kt, lane);
        frag_smem(wl, Ra, R::w_lo, rt * kKt + kt, lane);
#pragma unroll
        for (int nd = 0; nd < NV / 16; ++nd) {
          uint32_t bh[4], bl[4];
          load_b(bh, Sh, ld, kt, nd, lane);
          load_b(bl, Sl, ld, kt, nd, lane);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float(&a)[4] = acc[kt & 1][2 * nd + half];
            mma_bf16(a, wh, bh[2 * half], bh[2 * half + 1]);
            mma_bf16(a, wh, bl[2 * half], bl[2 * half + 1]);
            mma_bf16(a, wl, bh[2 * half], bh[2 * half + 1]);
          }
        }
      }
      // new_v and e^{gcum_63 - gcum_i} new_v to shared memory (hi/lo).
      const float* kd = reinterpret_cast<const float*>(Ra + R::kd);
      const int i0 = rt * 16 + gq, i1 = i0 + 8;
      const float k0 = kd[i0], k1 = kd[i1];
#pragma unroll
      for (int nf = 0; nf < kNf; ++nf) {
        const int col = nf * 8 + 2 * cq;
        float nv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) nv[e] = acc[0][nf][e] + acc[1][nf][e];
        put_split(Nh, Nl, ld, i0, col, nv[0], nv[1]);
        put_split(Nh, Nl, ld, i1, col, nv[2], nv[3]);
        put_split(Dh, Dl, ld, i0, col, k0 * nv[0], k0 * nv[1]);
        put_split(Dh, Dl, ld, i1, col, k1 * nv[2], k1 * nv[3]);
      }
    } else {
#pragma unroll
      for (int kt = 0; kt < kKt; ++kt) {
        uint32_t qa[4];
        frag_smem(qa, Ra, R::qf, rt * kKt + kt, lane);
#pragma unroll
        for (int nd = 0; nd < NV / 16; ++nd) {
          uint32_t bh[4], bl[4];
          load_b(bh, Sh, ld, kt, nd, lane);
          load_b(bl, Sl, ld, kt, nd, lane);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float(&a)[4] = acc[kt & 1][2 * nd + half];
            mma_bf16(a, qa, bh[2 * half], bh[2 * half + 1]);
            mma_bf16(a, qa, bl[2 * half], bl[2 * half + 1]);
          }
        }
      }
    }
    wait_rec(1, c);
    cp_async_wait<0>();
    __syncthreads();  // new_v, part B and V (c + 1) in place; part A, S free
    if (c + 1 < n_chunks) {
      stage_rec(0, c + 1);
      cp_async_commit();
    }
    // Phase B.
    const float* eg = reinterpret_cast<const float*>(Rb + (R::eg - R::a_bytes));
    if (w >= 4) {
      // O = diag(gamma) Q S + P new_v.
      float po[2][kNf][4];
      zero2(po);
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        uint32_t pa[4];
        frag_smem(pa, Rb, R::p - R::a_bytes, rt * 4 + kt, lane);
#pragma unroll
        for (int nd = 0; nd < NV / 16; ++nd) {
          uint32_t bh[4], bl[4];
          load_b(bh, Nh, ld, kt, nd, lane);
          load_b(bl, Nl, ld, kt, nd, lane);
          float(&a0)[4] = po[kt & 1][2 * nd];
          float(&a1)[4] = po[kt & 1][2 * nd + 1];
          mma_bf16(a0, pa, bh[0], bh[1]);
          mma_bf16(a0, pa, bl[0], bl[1]);
          mma_bf16(a1, pa, bh[2], bh[3]);
          mma_bf16(a1, pa, bl[2], bl[3]);
        }
      }
      const int i0 = rt * 16 + gq, i1 = i0 + 8;
      const float e0 = eg[i0], e1 = eg[i1];
      bf16* o0 = out + (r0 + i0) * ldo + static_cast<int64_t>(h) * dv;
      bf16* o1 = out + (r0 + i1) * ldo + static_cast<int64_t>(h) * dv;
#pragma unroll
      for (int nf = 0; nf < kNf; ++nf) {
        const int col = c0 + nf * 8 + 2 * cq;
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[e] =
              (e < 2 ? e0 : e1) * (acc[0][nf][e] + acc[1][nf][e]) + (po[0][nf][e] + po[1][nf][e]);
        if (pair_out && col + 1 < dv) {
          *reinterpret_cast<__nv_bfloat162*>(o0 + col) = __floats2bfloat162_rn(o[0], o[1]);
          *reinterpret_cast<__nv_bfloat162*>(o1 + col) = __floats2bfloat162_rn(o[2], o[3]);
        } else {
          if (col < dv) {
            o0[col] = __float2bfloat16_rn(o[0]);
            o1[col] = __float2bfloat16_rn(o[2]);
          }
          if (col + 1 < dv) {
            o0[col + 1] = __float2bfloat16_rn(o[1]);
            o1[col + 1] = __float2bfloat16_rn(o[3]);
          }
        }
      }
    }
    if (has_state) {
      // S' = gamma_63 S + K^T (e^{gcum_63 - gcum_j} new_v), rows 16 w..
      float ds[2][kNf][4];
      zero2(ds);
#pragma unroll
      for (int kt = 0; kt < kC / 16; ++kt) {
        uint32_t ka[4];
        frag_smem(ka, Rb, R::kt - R::a_bytes, w * 4 + kt, lane);
#pragma unroll
        for (int nd = 0; nd < NV / 16; ++nd) {
          uint32_t bh[4], bl[4];
          load_b(bh, Dh, ld, kt, nd, lane);
          load_b(bl, Dl, ld, kt, nd, lane);
          float(&a0)[4] = ds[kt & 1][2 * nd];
          float(&a1)[4] = ds[kt & 1][2 * nd + 1];
          mma_bf16(a0, ka, bh[0], bh[1]);
          mma_bf16(a0, ka, bl[0], bl[1]);
          mma_bf16(a1, ka, bh[2], bh[3]);
          mma_bf16(a1, ka, bl[2], bl[3]);
        }
      }
      const float decay = eg[kC - 1];
#pragma unroll
      for (int nf = 0; nf < kNf; ++nf)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nf][e] = decay * st[nf][e] + (ds[0][nf][e] + ds[1][nf][e]);
      put_state();
    }
  }
  if (has_state) {
#pragma unroll
    for (int nf = 0; nf < kNf; ++nf)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = w * 16 + gq + (e >> 1) * 8, col = c0 + nf * 8 + 2 * cq + (e & 1);
        if (col < dv) S[static_cast<int64_t>(d) * dv + col] = st[nf][e];
      }
  }
}

template <int DK, int NV>
void launch_state(const bf16* v, int64_t ldv, float* state_pool, const int32_t* slot,
                  const int32_t* first_row, const int32_t* chunk_start, int64_t count,
                  const uint8_t* ws, bf16* out, int64_t ldo, int64_t hv, int64_t dv,
                  cudaStream_t stream) {
  constexpr int bytes = StateSmem<DK, NV>::total;
  set_max_dynamic_smem(gdn_chunk_state_kernel<DK, NV>, bytes);
  // 16-byte copies of V rows when every 8-column group starts 16-byte
  // aligned and lies wholly inside or outside dv; bf16 pairs for the output.
  const bool vec_v = reinterpret_cast<uintptr_t>(v) % 16 == 0 && ldv % 8 == 0 && dv % 8 == 0;
  const bool pair_out = reinterpret_cast<uintptr_t>(out) % 4 == 0 && ldo % 2 == 0 && dv % 2 == 0;
  // Value tiles fastest: the blocks of one (item, head) read the same
  // workspace records at about the same time (L2).
  const dim3 grid(static_cast<unsigned>((dv + NV - 1) / NV), static_cast<unsigned>(hv),
                  static_cast<unsigned>(count));
  gdn_chunk_state_kernel<DK, NV><<<grid, kStateThreads, bytes, stream>>>(
      v, ldv, state_pool, slot, first_row, chunk_start, out, ldo, static_cast<int>(hv),
      static_cast<int>(dv), ws, vec_v, pair_out);
  QTK_CUDA_CHECK_LAUNCH();
}

template <int DK>
void launch_chunked(const bf16* q, int64_t ldq, const bf16* k, int64_t ldk, const bf16* v,
                    int64_t ldv, const float* g, const float* beta, float* state_pool,
                    const int32_t* slot, const int32_t* first_row, const int32_t* chunk_start,
                    int64_t count, int64_t total_chunks, uint8_t* ws, bf16* out, int64_t ldo,
                    int64_t hk, int64_t hv, int64_t dv, cudaStream_t stream) {
  const size_t bytes = PrepSmem<DK>::total;
  // note: more than the default 48 KiB of dynamic shared memory (72 KiB at
  // Dk 128, three blocks per SM); the attribute is set once per device.
  set_max_dynamic_smem(gdn_chunk_prep_kernel<DK>, static_cast<int>(bytes));
  // 16-byte loads of q and k rows when every row starts 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(k) % 16 == 0 && ldq % 8 == 0 && ldk % 8 == 0;
  gdn_chunk_prep_kernel<DK>
      <<<dim3(static_cast<unsigned>(total_chunks), static_cast<unsigned>(hv)), kPrepThreads, bytes,
         stream>>>(q, ldq, k, ldk, g, beta, first_row, chunk_start, static_cast<int>(count),
                   static_cast<int>(hk), static_cast<int>(hv), ws, vec);
  QTK_CUDA_CHECK_LAUNCH();
  if (gdn_chunked_state_columns(count, hv, dv) == 16)
    launch_state<DK, 16>(v, ldv, state_pool, slot, first_row, chunk_start, count, ws, out, ldo, hv,
                         dv, stream);
  else
    launch_state<DK, 32>(v, ldv, state_pool, slot, first_row, chunk_start, count, ws, out, ldo, hv,
                         dv, stream);
}

template <class T>
__global__ void copy_rows_kernel(const T* __restrict__ src, int64_t lds,
                                 const int32_t* __restrict__ src_rows, T* __restrict__ dst,
                                 int64_t ldd, const int32_t* __restrict__ dst_rows, int64_t cols) {
  const int64_t i = blockIdx.x;
  const int64_t sr = src_rows ? src_rows[i] : i, dr = dst_rows ? dst_rows[i] : i;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[dr * ldd + c] = src[sr * lds + c];
}

}  // namespace

int64_t gdn_chunked_workspace_bytes(int64_t total_chunks, int64_t hv, int64_t dk) {
  int64_t rec = 0;
  switch (dk) {
    case 16:
      rec = Rec<16>::bytes;
      break;
    case 32:
      rec = Rec<32>::bytes;
      break;
    case 64:
      rec = Rec<64>::bytes;
      break;
    case 128:
      rec = Rec<128>::bytes;
      break;
    default:
      fail_message("gated_delta_rule_chunked: key head dim " + std::to_string(dk) +
                   " is not supported (expected 16, 32, 64 or 128)");
  }
  return total_chunks * hv * rec;
}

int gdn_chunked_state_columns(int64_t count, int64_t hv, int64_t dv) {
  // QTK_GDN_STATE_COLUMNS=16 or 32 fixes the width (A/B measurements; the
  // results are the same bits).
  static const int forced = tuning().gdn_state_columns;
  if (forced == 16 || forced == 32) return forced;
  return (dv + 31) / 32 * hv * count < sm_count() ? 16 : 32;
}

void gated_delta_rule_chunked(const bf16* q, int64_t ldq, const bf16* k, int64_t ldk, const bf16* v,
                              int64_t ldv, const float* g, const float* beta, float* state_pool,
                              const int32_t* slot, const int32_t* first_row,
                              const int32_t* chunk_start, int64_t count, int64_t total_chunks,
                              void* workspace, bf16* out, int64_t ldo, int64_t hk, int64_t hv,
                              int64_t dk, int64_t dv, cudaStream_t stream) {
  if (hk <= 0 || hv % hk != 0)
    fail_message("gated_delta_rule_chunked: " + std::to_string(hv) + " value heads over " +
                 std::to_string(hk) + " key heads (must divide)");
  (void)gdn_chunked_workspace_bytes(0, hv, dk);  // rejects an unsupported dk
  if (count == 0 || total_chunks == 0) return;
  auto* ws = static_cast<uint8_t*>(workspace);
  switch (dk) {
    case 16:
      return launch_chunked<16>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                chunk_start, count, total_chunks, ws, out, ldo, hk, hv, dv, stream);
    case 32:
      return launch_chunked<32>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                chunk_start, count, total_chunks, ws, out, ldo, hk, hv, dv, stream);
    case 64:
      return launch_chunked<64>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                chunk_start, count, total_chunks, ws, out, ldo, hk, hv, dv, stream);
    default:
      return launch_chunked<128>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                 chunk_start, count, total_chunks, ws, out, ldo, hk, hv, dv,
                                 stream);
  }
}

template <class T>
void copy_rows(const T* src, int64_t lds, const int32_t* src_rows, T* dst, int64_t ldd,
               const int32_t* dst_rows, int64_t n, int64_t cols, cudaStream_t stream) {
  if (n == 0 || cols == 0) return;
  copy_rows_kernel<T>
      <<<static_cast<unsigned>(n), 256, 0, stream>>>(src, lds, src_rows, dst, ldd, dst_rows, cols);
  QTK_CUDA_CHECK_LAUNCH();
}

template void copy_rows<float>(const float*, int64_t, const int32_t*, float*, int64_t,
                               const int32_t*, int64_t, int64_t, cudaStream_t);
template void copy_rows<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const int32_t*,
                                       __nv_bfloat16*, int64_t, const int32_t*, int64_t, int64_t,
                                       cudaStream_t);

}  // namespace qtk::cuda
