// Gated delta rule, chunked (WY) form over full 64-token chunks, updating the
// f32 state pool in place (declared in kernels/cuda/gdn_chunked.h).
#include <string>

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
constexpr int kLd = kC + 1;            // padded row of the 64 x 64 matrices (banks)

// Shared memory of one block, offsets in floats.
template <int DK>
struct Smem {
  static constexpr int ks = 0;                // f32 [64][DK] keys of the chunk
  static constexpr int qs = ks + kC * DK;     // f32 [64][DK] queries
  static constexpr int am = qs + kC * DK;     // f32 [64][65] A (strictly lower)
  static constexpr int pm = am + kC * kLd;    // f32 [64][65] P (lower, with the diagonal)
  static constexpr int tm = pm + kC * kLd;    // f32 [64][65] T = (I + A)^-1
  static constexpr int st = tm + kC * kLd;    // f32 [DK][32] the state tile S
  static constexpr int rs = st + DK * kCols;  // f32 [64][32] r = beta (v - e^gcum K S)
  static constexpr int us = rs + kC * kCols;  // f32 [64][32] new_v = T r
  static constexpr int gc = us + kC * kCols;  // f32 [64] g, then gcum
  static constexpr int eg = gc + kC;          // f32 [64] e^gcum_i
  static constexpr int kd = eg + kC;          // f32 [64] e^(gcum_63 - gcum_j)
  static constexpr int bt = kd + kC;          // f32 [64] beta
  static constexpr int total = bt + kC;
};

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
// (2) A and P, one (i, j) pair per lane; (3) T, column m by 4 lanes; (4) per
// column (lane) and 8 rows per warp: K S and Q S; r; (5) new_v = T r;
// (6) O; (7) S' (each thread owns Dk/8 rows of its column). The state tile
// stays in shared memory across the item's chunks (read and written once).
// note: fixed order: every sum runs in an order fixed by Dk, the chunk row
// and the column alone (the dot products over Dk start at d = j mod 32 and
// wrap, for conflict-free banks; the 4-lane partial sums of (3) are added by
// an xor butterfly), so the result does not depend on the batch or the grid.
template <class T, int DK>
__global__ void __launch_bounds__(kThreads)
    gdn_chunked_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k, int64_t ldk,
                       const T* __restrict__ v, int64_t ldv, const float* __restrict__ g,
                       const float* __restrict__ beta, float* state_pool,
                       const int32_t* __restrict__ slot, const int32_t* __restrict__ first_row,
                       const int32_t* __restrict__ num_chunks, T* __restrict__ out, int64_t ldo,
                       int hk, int hv, int dv) {
  using L = Smem<DK>;
  constexpr int DR = DK / kWarps;  // state rows per thread in (7)
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

  const int n_chunks = num_chunks[item];
  for (int c = 0; c < n_chunks; ++c) {
    const int64_t r0 = static_cast<int64_t>(first_row[item]) + static_cast<int64_t>(c) * kC;
    // (0) The chunk's q, k (f32), g and beta.
    for (int e = tid; e < kC * DK; e += kThreads) {
      const int i = e / DK, d = e % DK;
      Ks[e] = to_f(k[(r0 + i) * ldk + kh * DK + d]);
      Qs[e] = to_f(q[(r0 + i) * ldq + kh * DK + d]);
    }
    if (tid < kC) {
      Gc[tid] = g[(r0 + tid) * hv + h];
      Bt[tid] = beta[(r0 + tid) * hv + h];
    }
    __syncthreads();
    // (1) gcum: one serial sum (fixed order).
    if (tid == 0) {
      float acc = 0.0f;
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
    // (2) A and P over the lower triangle: 96 warp segments of 32 pairs
    // (rows 0..31 one each, rows 32..63 two each), spread over the 8 warps.
    for (int sg = w; sg < 96; sg += kWarps) {
      const int i = sg < 32 ? sg : 32 + ((sg - 32) >> 1);
      const int j = (sg < 32 ? 0 : ((sg - 32) & 1) * 32) + lane;
      if (j <= i) {
        const float* ki = Ks + i * DK;
        const float* kj = Ks + j * DK;
        const float* qi = Qs + i * DK;
        float kk = 0.0f, qk = 0.0f;
#pragma unroll 8
        for (int t = 0; t < DK; ++t) {
          const int d = (t + lane) & (DK - 1);  // DK is a power of two
          kk += ki[d] * kj[d];
          qk += qi[d] * kj[d];
        }
        const float decay = expf(Gc[i] - Gc[j]);
        Pm[i * kLd + j] = qk * decay;
        Am[i * kLd + j] = j < i ? Bt[i] * kk * decay : 0.0f;
      }
    }
    __syncthreads();
    // (3) T = (I + A)^-1 by forward substitution, column m by lanes 4m..4m+3
    // (one warp holds 8 columns): t_i = -sum_{m <= j < i} A_ij t_j for i > m,
    // each lane summing every 4th j, the 4 partials added by a butterfly.
    {
      const int m = tid >> 2, part = tid & 3;
      for (int i = part; i <= m; i += 4) Tm[i * kLd + m] = i == m ? 1.0f : 0.0f;
      __syncwarp();
      for (int i = 1; i < kC; ++i) {
        float acc = 0.0f;
        for (int j = m + part; j < i; j += 4) acc += Am[i * kLd + j] * Tm[j * kLd + m];
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (part == 0 && i > m) Tm[i * kLd + m] = -acc;
        __syncwarp();
      }
    }
    // (4) K S and Q S for rows i = w + 8 rr of column `lane`; r.
    float qs_acc[kRowsPer];
    {
      float ks_acc[kRowsPer];
#pragma unroll
      for (int rr = 0; rr < kRowsPer; ++rr) ks_acc[rr] = qs_acc[rr] = 0.0f;
      for (int d = 0; d < DK; d += 4) {
        const float s0 = St[(d + 0) * kCols + lane], s1 = St[(d + 1) * kCols + lane];
        const float s2 = St[(d + 2) * kCols + lane], s3 = St[(d + 3) * kCols + lane];
#pragma unroll
        for (int rr = 0; rr < kRowsPer; ++rr) {
          const int i = w + kWarps * rr;
          const float4 kv = *reinterpret_cast<const float4*>(Ks + i * DK + d);
          const float4 qv = *reinterpret_cast<const float4*>(Qs + i * DK + d);
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
        const float vi =
            active ? to_f(v[(r0 + i) * ldv + static_cast<int64_t>(h) * dv + col]) : 0.0f;
        Rs[i * kCols + lane] = Bt[i] * (vi - Eg[i] * ks_acc[rr]);
      }
    }
    __syncthreads();
    // (5) new_v = T r (T unit lower triangular: j < i, then + r_i).
#pragma unroll
    for (int rr = 0; rr < kRowsPer; ++rr) {
      const int i = w + kWarps * rr;
      float acc = 0.0f;
      for (int j = 0; j < i; ++j) acc += Tm[i * kLd + j] * Rs[j * kCols + lane];
      Us[i * kCols + lane] = acc + Rs[i * kCols + lane];
    }
    __syncthreads();
    // (6) O = diag(gamma) Q S + P new_v.
#pragma unroll
    for (int rr = 0; rr < kRowsPer; ++rr) {
      const int i = w + kWarps * rr;
      float acc = 0.0f;
      for (int j = 0; j <= i; ++j) acc += Pm[i * kLd + j] * Us[j * kCols + lane];
      const float o = Eg[i] * qs_acc[rr] + acc;
      if (active) out[(r0 + i) * ldo + static_cast<int64_t>(h) * dv + col] = from_f<T>(o);
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
            const float4 kv = *reinterpret_cast<const float4*>(Ks + j * DK + w * DR + rr);
            acc[rr + 0] += kv.x * u;
            acc[rr + 1] += kv.y * u;
            acc[rr + 2] += kv.z * u;
            acc[rr + 3] += kv.w * u;
          }
        } else {
#pragma unroll
          for (int rr = 0; rr < DR; ++rr) acc[rr] += Ks[j * DK + w * DR + rr] * u;
        }
      }
      const float decay = Eg[kC - 1];
#pragma unroll
      for (int rr = 0; rr < DR; ++rr) {
        float& s = St[(w * DR + rr) * kCols + lane];
        s = decay * s + acc[rr];
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
  gdn_chunked_kernel<T, DK><<<grid, kThreads, bytes, stream>>>(
      q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, first_row, num_chunks, out, ldo,
      static_cast<int>(hk), static_cast<int>(hv), static_cast<int>(dv));
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
