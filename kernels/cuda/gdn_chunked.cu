// Gated delta rule, chunked (WY) form over full 64-token chunks, updating the
// f32 state pool in place (declared in kernels/cuda/gdn_chunked.h).
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_chunked.h"

namespace qtk::cuda {
namespace {

using namespace dev;

constexpr int kC = static_cast<int>(kGdnChunk);  // tokens per chunk
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 32;              // value columns per block: one per lane
constexpr int kRowsPer = kC / kWarps;  // chunk rows per thread in the column products
constexpr int kB = 16;                 // block size of the blocked triangular inverse
// note: row stride of the 64 x 64 matrices: a multiple of 4 (float4 rows)
// that shifts each row by 4 banks.
constexpr int kLd = kC + 4;

// Shared memory of one block, offsets in floats.
template <int DK>
struct Smem {
  static constexpr int ks = 0;                // f32 [64][DK] keys of the chunk (swizzled)
  static constexpr int qs = ks + kC * DK;     // f32 [64][DK] queries (swizzled)
  static constexpr int am = qs + kC * DK;     // f32 [64][68] A (strictly lower)
  static constexpr int pm = am + kC * kLd;    // f32 [64][68] P (lower with the diagonal, 0 above)
  static constexpr int tm = pm + kC * kLd;    // f32 [64][68] T = (I + A)^-1 (0 above)
  static constexpr int st = tm + kC * kLd;    // f32 [DK][32] the state tile S
  static constexpr int rs = st + DK * kCols;  // f32 [64][32] r = beta (v - e^gcum K S)
  static constexpr int us = rs + kC * kCols;  // f32 [64][32] new_v = T r
  static constexpr int gc = us + kC * kCols;  // f32 [64] g, then gcum
  static constexpr int eg = gc + kC;          // f32 [64] e^gcum_i
  static constexpr int kd = eg + kC;          // f32 [64] e^(gcum_63 - gcum_j)
  static constexpr int bt = kd + kC;          // f32 [64] beta
  static constexpr int total = bt + kC;
};

// note: q and k rows live in shared memory as float4 groups whose order is
// XOR-swizzled by (row / 4): the 4 x 4 tiles of (2) read 8 different rows at
// the same d at once, and without the swizzle those share one bank group.
template <int DK>
__device__ __forceinline__ int swz(int row, int d4) {
  constexpr int kMask = (DK / 4 < 8 ? DK / 4 : 8) - 1;
  return row * DK + ((d4 ^ ((row >> 2) & kMask)) << 2);
}

// Elements 4*g4 .. 4*g4+3 of a 16-byte group of T (4 f32 or 8 bf16) as f32
// (exact: a bf16 is the high half of its f32).
template <class T>
__device__ __forceinline__ float4 unpack4(const uint4& raw, int g4) {
  if constexpr (std::is_same_v<T, float>) {
    return make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z),
                       __uint_as_float(raw.w));
  } else {
    const unsigned a = g4 == 0 ? raw.x : raw.z, b = g4 == 0 ? raw.y : raw.w;
    return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u),
                       __uint_as_float(b << 16), __uint_as_float(b & 0xffff0000u));
  }
}

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
// triangular, by forward substitution),
//   W = T diag(beta gamma) K,  U = T diag(beta) V,  new_v = U - W S.
// note: the kernel forms new_v = T r with r = beta (V - gamma (K S)): the
// same product with the 64 x 64 solve applied once to r instead of to beta V
// and beta gamma K separately (W itself is never stored).
// Then, with P = [(q_i . k_j) e^{gcum_i - gcum_j}] for j <= i (0 above),
//   O = diag(gamma) Q S + P new_v,
//   S' = gamma_63 S + sum_j e^{gcum_63 - gcum_j} k_j new_v_j^T.
// Every exponent is <= 0 (g < 0), so nothing overflows and nothing divides
// by a decay that may have underflowed.
//
// Block (item, value head h, tile of 32 value columns), 256 threads. Per
// chunk: (0) q, k, g, beta of the chunk to shared memory as f32; (1) gcum;
// (2) A and P in 4 x 4 register tiles (136 lower tiles, one per thread; the
// other 120 threads zero the upper tiles); (3) T blockwise: the four 16 x 16
// diagonal blocks by forward substitution, then the blocks below them by
// T_rc = -T_rr sum_{c<=k<r} A_rk T_kc, one block diagonal after the other;
// (4) per column (lane) and 8 rows per warp: K S and Q S, then r; (5) new_v =
// T r; (6) O; (7) S' (each thread owns Dk/8 rows of its column). The state
// tile stays in shared memory across the item's chunks (read and written
// once per launch).
// note: fixed order: every sum runs in an order fixed by Dk, the chunk row
// and the column alone (ascending index; the zero entries above the diagonal
// of P and T are added like the others), so the result does not depend on the
// batch or the grid.
template <class T, int DK>
__global__ void __launch_bounds__(kThreads)
    gdn_chunked_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k, int64_t ldk,
                       const T* __restrict__ v, int64_t ldv, const float* __restrict__ g,
                       const float* __restrict__ beta, float* state_pool,
                       const int32_t* __restrict__ slot, const int32_t* __restrict__ first_row,
                       const int32_t* __restrict__ num_chunks, T* __restrict__ out, int64_t ldo,
                       int hk, int hv, int dv, bool vec) {
  using L = Smem<DK>;
  constexpr int DR = DK / kWarps;  // state rows per thread in (7)
  constexpr int D4 = DK / 4;       // float4 groups per q/k row
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  float* Ks = sm + L::ks;
  float* Qs = sm + L::qs;
  float* Am = sm + L::am;
  float* Pm = sm + L::pm;
  float* Tm = sm + L::tm;
  float* St = sm + L::st;
  float* Rs = sm + L::rs;
  float* Us = sm + L::us;
  float* Gc = sm + L::gc;
  float* Eg = sm + L::eg;
  float* Kd = sm + L::kd;
  float* Bt = sm + L::bt;

  const int item = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int col = blockIdx.z * kCols + lane;
  const bool active = col < dv;
  const int kh = h / (hv / hk);
  float* S = state_pool + (static_cast<int64_t>(slot[item]) * hv + h) * DK * dv;

  for (int d = w; d < DK; d += kWarps) St[d * kCols + lane] = active ? S[d * dv + col] : 0.0f;

  // note: the next chunk's inputs are loaded into registers while this chunk
  // is computed (one block per SM: registers are free, load latency is not):
  // q and k as 16-byte groups when `vec` (aligned rows), v, g and beta.
  constexpr int kVec = 16 / sizeof(T);     // elements per 16-byte group
  constexpr int kGroups = kC * DK / kVec;  // groups per chunk of q (or k)
  constexpr int kIter = (kGroups + kThreads - 1) / kThreads;
  uint4 kn[kIter], qn[kIter];
  T vn[kRowsPer];
  float gn = 0.0f, bn = 0.0f;
  auto fetch = [&](int64_t rn) {
    if (vec) {
#pragma unroll
      for (int it = 0; it < kIter; ++it) {
        const int e = tid + it * kThreads;
        if (e < kGroups) {
          const int i = e / (DK / kVec), d = (e % (DK / kVec)) * kVec;
          kn[it] = *reinterpret_cast<const uint4*>(k + (rn + i) * ldk + kh * DK + d);
          qn[it] = *reinterpret_cast<const uint4*>(q + (rn + i) * ldq + kh * DK + d);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPer; ++rr)
      vn[rr] = active ? v[(rn + w + kWarps * rr) * ldv + static_cast<int64_t>(h) * dv + col]
                      : from_f<T>(0.0f);
    if (tid < kC) {
      gn = g[(rn + tid) * hv + h];
      bn = beta[(rn + tid) * hv + h];
    }
  };

  const int n_chunks = num_chunks[item];
  if (n_chunks > 0) fetch(first_row[item]);
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t r0 = static_cast<int64_t>(first_row[item]) + static_cast<int64_t>(c) * kC;
    // (0) The chunk's q, k (f32, swizzled), g and beta to shared memory, v
    // to registers; then the next chunk's loads are issued.
    if (vec) {
#pragma unroll
      for (int it = 0; it < kIter; ++it) {
        const int e = tid + it * kThreads;
        if (e < kGroups) {
          const int i = e / (DK / kVec), d4 = (e % (DK / kVec)) * (kVec / 4);
#pragma unroll
          for (int g4 = 0; g4 < kVec / 4; ++g4) {
            *reinterpret_cast<float4*>(Ks + swz<DK>(i, d4 + g4)) = unpack4<T>(kn[it], g4);
            *reinterpret_cast<float4*>(Qs + swz<DK>(i, d4 + g4)) = unpack4<T>(qn[it], g4);
          }
        }
      }
    } else {
      for (int e = tid; e < kC * DK; e += kThreads) {
        const int i = e / DK, d = e % DK;
        const int at = swz<DK>(i, d >> 2) + (d & 3);
        Ks[at] = to_f(k[(r0 + i) * ldk + kh * DK + d]);
        Qs[at] = to_f(q[(r0 + i) * ldq + kh * DK + d]);
      }
    }
    if (tid < kC) {
      Gc[tid] = gn;
      Bt[tid] = bn;
    }
    float vcur[kRowsPer];
#pragma unroll
    for (int rr = 0; rr < kRowsPer; ++rr) vcur[rr] = to_f(vn[rr]);
    if (c + 1 < n_chunks) fetch(r0 + kC);
    __syncthreads();
    // (1) gcum: one serial sum (fixed order).
    if (tid == 0) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        acc += Gc[i];
        Gc[i] = acc;
      }
    }
    __syncthreads();
    if (tid < kC) {
      Eg[tid] = expf(Gc[tid]);
      Kd[tid] = expf(Gc[kC - 1] - Gc[tid]);
    }
    // (2) A and P in 4 x 4 tiles: thread p < 136 takes lower tile (ti, tj),
    // tj <= ti, enumerated row by row; the others zero the 120 upper tiles.
    if (tid < 136) {
      int ti = 0, p = tid;
      while (p > ti) p -= ++ti;  // row ti holds tiles 0..ti
      const int tj = p;
      float kk[4][4], qk[4][4];
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) kk[x][y] = qk[x][y] = 0.0f;
#pragma unroll 2
      for (int d4 = 0; d4 < D4; ++d4) {
        float4 ki[4], qi[4], kj[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          ki[x] = *reinterpret_cast<const float4*>(Ks + swz<DK>(4 * ti + x, d4));
          qi[x] = *reinterpret_cast<const float4*>(Qs + swz<DK>(4 * ti + x, d4));
          kj[x] = *reinterpret_cast<const float4*>(Ks + swz<DK>(4 * tj + x, d4));
        }
#pragma unroll
        for (int x = 0; x < 4; ++x)
#pragma unroll
          for (int y = 0; y < 4; ++y) {
            kk[x][y] += ki[x].x * kj[y].x;
            kk[x][y] += ki[x].y * kj[y].y;
            kk[x][y] += ki[x].z * kj[y].z;
            kk[x][y] += ki[x].w * kj[y].w;
            qk[x][y] += qi[x].x * kj[y].x;
            qk[x][y] += qi[x].y * kj[y].y;
            qk[x][y] += qi[x].z * kj[y].z;
            qk[x][y] += qi[x].w * kj[y].w;
          }
      }
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int i = 4 * ti + x;
        float a4[4], p4[4];
#pragma unroll
        for (int y = 0; y < 4; ++y) {
          const int j = 4 * tj + y;
          const float decay = j <= i ? expf(Gc[i] - Gc[j]) : 0.0f;
          p4[y] = j <= i ? qk[x][y] * decay : 0.0f;
          a4[y] = j < i ? Bt[i] * kk[x][y] * decay : 0.0f;
        }
        *reinterpret_cast<float4*>(Pm + i * kLd + 4 * tj) = make_float4(p4[0], p4[1], p4[2], p4[3]);
        *reinterpret_cast<float4*>(Am + i * kLd + 4 * tj) = make_float4(a4[0], a4[1], a4[2], a4[3]);
      }
    } else {
      int tj = 1, p = tid - 136;  // upper tile (ti, tj), ti < tj, column by column
      while (p >= tj) p -= tj++;
      const int ti = p;
      const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        *reinterpret_cast<float4*>(Pm + (4 * ti + x) * kLd + 4 * tj) = z;
        *reinterpret_cast<float4*>(Am + (4 * ti + x) * kLd + 4 * tj) = z;
        *reinterpret_cast<float4*>(Tm + (4 * ti + x) * kLd + 4 * tj) = z;
      }
    }
    __syncthreads();
    // (3a) The diagonal 16 x 16 blocks of T, column m of block b by thread
    // 16 b + m: t_i = 0 (i < m), 1 (i = m), -sum_{m<=j<i} A_ij t_j (i > m).
    if (tid < kC) {
      const int b0 = (tid >> 4) * kB, m = b0 + (tid & (kB - 1));
      for (int i = b0; i < m; ++i) Tm[i * kLd + m] = 0.0f;
      Tm[m * kLd + m] = 1.0f;
      for (int i = m + 1; i < b0 + kB; ++i) {
        float acc = 0.0f;
        for (int j = m; j < i; ++j) acc += Am[i * kLd + j] * Tm[j * kLd + m];
        Tm[i * kLd + m] = -acc;
      }
    }
    __syncthreads();
    // (3b) Blocks below the diagonal, block diagonal dist = 1, 2, 3:
    // M = sum_{c<=k<r} A_rk T_kc (ascending k, z), then T_rc = -T_rr M. Thread
    // (x, y) = (tid / 16, tid % 16) computes element (x, y) of each block.
    {
      const int x = tid >> 4, y = tid & (kB - 1);
      float* Mb = Rs;  // scratch [3][16][16] (r is formed later in (4))
      for (int dist = 1; dist < kC / kB; ++dist) {
        for (int cb = 0; cb + dist < kC / kB; ++cb) {
          const int rb = cb + dist;
          float acc = 0.0f;
          for (int kb = cb; kb < rb; ++kb)
#pragma unroll
            for (int z = 0; z < kB; ++z)
              acc += Am[(rb * kB + x) * kLd + kb * kB + z] * Tm[(kb * kB + z) * kLd + cb * kB + y];
          Mb[(cb * kB + x) * kB + y] = acc;
        }
        __syncthreads();
        for (int cb = 0; cb + dist < kC / kB; ++cb) {
          const int rb = cb + dist;
          float acc = 0.0f;
#pragma unroll
          for (int z = 0; z < kB; ++z)
            acc += Tm[(rb * kB + x) * kLd + rb * kB + z] * Mb[(cb * kB + z) * kB + y];
          Tm[(rb * kB + x) * kLd + cb * kB + y] = -acc;
        }
        __syncthreads();
      }
    }
    // (4) K S and Q S for rows i = w + 8 rr of column `lane`; r.
    float qs_acc[kRowsPer];
    {
      float ks_acc[kRowsPer];
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) ks_acc[rr] = qs_acc[rr] = 0.0f;
      for (int d4 = 0; d4 < D4; ++d4) {
        const int d = 4 * d4;
        const float s0 = St[(d + 0) * kCols + lane], s1 = St[(d + 1) * kCols + lane];
        const float s2 = St[(d + 2) * kCols + lane], s3 = St[(d + 3) * kCols + lane];
#pragma unroll
        for (int rr = 0; rr < kRowsPer; ++rr) {
          const int i = w + kWarps * rr;
          const float4 kv = *reinterpret_cast<const float4*>(Ks + swz<DK>(i, d4));
          const float4 qv = *reinterpret_cast<const float4*>(Qs + swz<DK>(i, d4));
          ks_acc[rr] += kv.x * s0;
          ks_acc[rr] += kv.y * s1;
          ks_acc[rr] += kv.z * s2;
          ks_acc[rr] += kv.w * s3;
          qs_acc[rr] += qv.x * s0;
          qs_acc[rr] += qv.y * s1;
          qs_acc[rr] += qv.z * s2;
          qs_acc[rr] += qv.w * s3;
        }
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) {
        const int i = w + kWarps * rr;
        Rs[i * kCols + lane] = Bt[i] * (vcur[rr] - Eg[i] * ks_acc[rr]);
      }
    }
    __syncthreads();
    // (5) new_v = T r over all 64 j (T is 0 above its unit diagonal).
    // (6) O = diag(gamma) Q S + P new_v (P is 0 above the diagonal).
    // Both read rows of T / P as float4 (broadcast) and 4 values of r / new_v.
    {
      float acc[kRowsPer];
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) acc[rr] = 0.0f;
      for (int j = 0; j < kC; j += 4) {
        const float r_0 = Rs[(j + 0) * kCols + lane], r_1 = Rs[(j + 1) * kCols + lane];
        const float r_2 = Rs[(j + 2) * kCols + lane], r_3 = Rs[(j + 3) * kCols + lane];
#pragma unroll
        for (int rr = 0; rr < kRowsPer; ++rr) {
          const float4 t4 = *reinterpret_cast<const float4*>(Tm + (w + kWarps * rr) * kLd + j);
          acc[rr] += t4.x * r_0;
          acc[rr] += t4.y * r_1;
          acc[rr] += t4.z * r_2;
          acc[rr] += t4.w * r_3;
        }
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) Us[(w + kWarps * rr) * kCols + lane] = acc[rr];
    }
    __syncthreads();
    {
      float acc[kRowsPer];
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) acc[rr] = 0.0f;
      for (int j = 0; j < kC; j += 4) {
        const float u_0 = Us[(j + 0) * kCols + lane], u_1 = Us[(j + 1) * kCols + lane];
        const float u_2 = Us[(j + 2) * kCols + lane], u_3 = Us[(j + 3) * kCols + lane];
#pragma unroll
        for (int rr = 0; rr < kRowsPer; ++rr) {
          const float4 p4 = *reinterpret_cast<const float4*>(Pm + (w + kWarps * rr) * kLd + j);
          acc[rr] += p4.x * u_0;
          acc[rr] += p4.y * u_1;
          acc[rr] += p4.z * u_2;
          acc[rr] += p4.w * u_3;
        }
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) {
        const int i = w + kWarps * rr;
        const float o = Eg[i] * qs_acc[rr] + acc[rr];
        if (active) out[(r0 + i) * ldo + static_cast<int64_t>(h) * dv + col] = from_f<T>(o);
      }
    }
    // (7) S' = gamma_63 S + sum_j k_j (e^{gcum_63 - gcum_j} new_v_j); this
    // thread owns rows w*DR .. w*DR+DR-1 of column `lane`.
    {
      float acc[DR];
#pragma unroll
      for (int rr = 0; rr < DR; ++rr) acc[rr] = 0.0f;
      for (int j = 0; j < kC; ++j) {
        const float u = Kd[j] * Us[j * kCols + lane];
        if constexpr (DR % 4 == 0) {
#pragma unroll
          for (int rr = 0; rr < DR; rr += 4) {
            const float4 kv = *reinterpret_cast<const float4*>(Ks + swz<DK>(j, (w * DR + rr) >> 2));
            acc[rr + 0] += kv.x * u;
            acc[rr + 1] += kv.y * u;
            acc[rr + 2] += kv.z * u;
            acc[rr + 3] += kv.w * u;
          }
        } else {
#pragma unroll
          for (int rr = 0; rr < DR; ++rr) {
            const int d = w * DR + rr;
            acc[rr] += Ks[swz<DK>(j, d >> 2) + (d & 3)] * u;
          }
        }
      }
      const float decay = Eg[kC - 1];
#pragma unroll
      for (int rr = 0; rr < DR; ++rr) {
        float& s_el = St[(w * DR + rr) * kCols + lane];
        s_el = decay * s_el + acc[rr];
      }
    }
    __syncthreads();
  }
  if (active)
    for (int d = w; d < DK; d += kWarps) S[d * dv + col] = St[d * kCols + lane];
}

template <class T, int DK>
void launch_chunked(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                    const float* g, const float* beta, float* state_pool, const int32_t* slot,
                    const int32_t* first_row, const int32_t* num_chunks, int64_t count, T* out,
                    int64_t ldo, int64_t hk, int64_t hv, int64_t dv, cudaStream_t stream) {
  const size_t bytes = Smem<DK>::total * sizeof(float);
  // note: more than the default 48 KiB of dynamic shared memory (149 KiB at
  // Dk 128); the attribute is set once per instantiation, outside any capture.
  static const bool attr_set = [&] {
    QTK_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunked_kernel<T, DK>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
    return true;
  }();
  (void)attr_set;
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(hv),
                  static_cast<unsigned>((dv + kCols - 1) / kCols));
  // 16-byte loads of q and k rows when every row starts 16-byte aligned.
  constexpr int64_t kVec = 16 / sizeof(T);
  const bool vec = reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(k) % 16 == 0 && ldq % kVec == 0 && ldk % kVec == 0 &&
                   DK % kVec == 0;
  gdn_chunked_kernel<T, DK><<<grid, kThreads, bytes, stream>>>(
      q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row, num_chunks, out, ldo,
      static_cast<int>(hk), static_cast<int>(hv), static_cast<int>(dv), vec);
  QTK_CUDA_CHECK_LAUNCH();
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

template <class T>
void gated_delta_rule_chunked(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v,
                              int64_t ldv, const float* g, const float* beta, float* state_pool,
                              const int32_t* slot, const int32_t* first_row,
                              const int32_t* num_chunks, int64_t count, T* out, int64_t ldo,
                              int64_t hk, int64_t hv, int64_t dk, int64_t dv, cudaStream_t stream) {
  if (hk <= 0 || hv % hk != 0)
    fail_message("gated_delta_rule_chunked: " + std::to_string(hv) + " value heads over " +
                 std::to_string(hk) + " key heads (must divide)");
  if (count == 0) return;
  switch (dk) {
    case 16:
      return launch_chunked<T, 16>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                   num_chunks, count, out, ldo, hk, hv, dv, stream);
    case 32:
      return launch_chunked<T, 32>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                   num_chunks, count, out, ldo, hk, hv, dv, stream);
    case 64:
      return launch_chunked<T, 64>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                   num_chunks, count, out, ldo, hk, hv, dv, stream);
    case 128:
      return launch_chunked<T, 128>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row,
                                    num_chunks, count, out, ldo, hk, hv, dv, stream);
    default:
      fail_message("gated_delta_rule_chunked: key head dim " + std::to_string(dk) +
                   " is not supported (expected 16, 32, 64 or 128)");
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

template void gated_delta_rule_chunked<float>(const float*, int64_t, const float*, int64_t,
                                              const float*, int64_t, const float*, const float*,
                                              float*, const int32_t*, const int32_t*,
                                              const int32_t*, int64_t, float*, int64_t, int64_t,
                                              int64_t, int64_t, int64_t, cudaStream_t);
template void gated_delta_rule_chunked<__nv_bfloat16>(
    const __nv_bfloat16*, int64_t, const __nv_bfloat16*, int64_t, const __nv_bfloat16*, int64_t,
    const float*, const float*, float*, const int32_t*, const int32_t*, const int32_t*, int64_t,
    __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void copy_rows<float>(const float*, int64_t, const int32_t*, float*, int64_t,
                               const int32_t*, int64_t, int64_t, cudaStream_t);
template void copy_rows<__nv_bfloat16>(const __nv_bfloat16*, int64_t, const int32_t*,
                                       __nv_bfloat16*, int64_t, const int32_t*, int64_t, int64_t,
                                       cudaStream_t);

}  // namespace qtk::cuda
