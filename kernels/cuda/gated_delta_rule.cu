// Gated delta rule (Qwen3.5 linear attention), recurrent form over a varlen
// batch, updating the f32 state pool in place.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;

constexpr int kGdnWarps = 4;
constexpr int kGdnCols = 32;

// Block (sequence, value head, tile of 32 value columns); 4 warps. Lane l owns
// column j = tile*32 + l; warp w owns key rows w*R .. w*R+R-1 (R = Dk/4), so
// each thread keeps R state values of S[Dk, Dv] in registers for the whole
// chunk: the state is read once and written once per call.
// note: f32 state: the recurrence multiplies and accumulates over thousands of
// steps, and bf16 state would drift visibly within a few hundred tokens.
// note: fixed order: each column's k^T S and q^T S are 4 per-warp serial sums
// over the warp's rows, added warp 0 + 1 + 2 + 3. The order depends only on
// Dk, so a row's result does not depend on the batch.
template <class T, int R>
__global__ void __launch_bounds__(kGdnWarps * 32)
    gdn_recurrent_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k, int64_t ldk,
                         const T* __restrict__ v, int64_t ldv, const float* __restrict__ g,
                         const float* __restrict__ beta, float* state_pool,
                         const int32_t* __restrict__ slot, const int32_t* __restrict__ q_start,
                         T* __restrict__ out, int64_t ldo, int hk, int hv, int dv) {
  pdl_begin();
  constexpr int DK = kGdnWarps * R;
  __shared__ float qs[2][DK], ks[2][DK];
  __shared__ float pkv[kGdnWarps][kGdnCols], po[kGdnWarps][kGdnCols];
  const int s = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int j = blockIdx.z * kGdnCols + lane;
  const bool active = j < dv;
  const int kh = h / (hv / hk);
  float* S = state_pool + (static_cast<int64_t>(slot[s]) * hv + h) * DK * dv;

  float st[R];
#pragma unroll
  for (int r = 0; r < R; ++r) st[r] = active ? S[(w * R + r) * dv + j] : 0.0f;

  const int t0 = q_start[s], t1 = q_start[s + 1];
  // note: token t+1's inputs are loaded into registers while token t is
  // computed (the loop is latency-bound: one token after another).
  constexpr int kPer = (DK + kGdnWarps * 32 - 1) / (kGdnWarps * 32);
  float qn[kPer], kn[kPer], vn = 0.0f, gn = 0.0f, bn = 0.0f;
  auto load = [&](int t) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int i = threadIdx.x + e * kGdnWarps * 32;
      qn[e] = i < DK ? to_f(q[static_cast<int64_t>(t) * ldq + kh * DK + i]) : 0.0f;
      kn[e] = i < DK ? to_f(k[static_cast<int64_t>(t) * ldk + kh * DK + i]) : 0.0f;
    }
    gn = g[static_cast<int64_t>(t) * hv + h];
    bn = beta[static_cast<int64_t>(t) * hv + h];
    vn = active ? to_f(v[static_cast<int64_t>(t) * ldv + h * dv + j]) : 0.0f;
  };
  if (t0 < t1) load(t0);
  for (int t = t0; t < t1; ++t) {
    const int buf = t & 1;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int i = threadIdx.x + e * kGdnWarps * 32;
      if (i < DK) {
        qs[buf][i] = qn[e];
        ks[buf][i] = kn[e];
      }
    }
    const float decay = expf(gn);
    const float b = bn;
    const float vj = vn;
    if (t + 1 < t1) load(t + 1);
    __syncthreads();
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      st[r] *= decay;
      acc += ks[buf][w * R + r] * st[r];
    }
    pkv[w][lane] = acc;
    __syncthreads();
    const float kv = ((pkv[0][lane] + pkv[1][lane]) + pkv[2][lane]) + pkv[3][lane];
    const float delta = (vj - kv) * b;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      st[r] += ks[buf][w * R + r] * delta;
      o += qs[buf][w * R + r] * st[r];
    }
    po[w][lane] = o;
    __syncthreads();
    if (w == 0 && active)
      out[static_cast<int64_t>(t) * ldo + h * dv + j] =
          from_f<T>(((po[0][lane] + po[1][lane]) + po[2][lane]) + po[3][lane]);
  }
  if (active) {
#pragma unroll
    for (int r = 0; r < R; ++r) S[(w * R + r) * dv + j] = st[r];
  }
}

template <class T, int R>
void launch_gdn(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                const float* g, const float* beta, float* state_pool, const int32_t* slot,
                const int32_t* q_start, int64_t num_seqs, T* out, int64_t ldo, int64_t hk,
                int64_t hv, int64_t dv, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(hv),
                  static_cast<unsigned>((dv + kGdnCols - 1) / kGdnCols));
  launch_kernel(gdn_recurrent_kernel<T, R>, grid, kGdnWarps * 32, 0, stream, q, ldq, k, ldk, v, ldv,
                g, beta, state_pool, slot, q_start, out, ldo, static_cast<int>(hk),
                static_cast<int>(hv), static_cast<int>(dv));
}

}  // namespace

template <class T>
void gated_delta_rule(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                      const float* g, const float* beta, float* state_pool, const int32_t* slot,
                      const int32_t* q_start, int64_t num_seqs, int64_t tokens, T* out, int64_t ldo,
                      int64_t hk, int64_t hv, int64_t dk, int64_t dv, cudaStream_t stream) {
  if (hk <= 0 || hv % hk != 0)
    fail_message("gated_delta_rule: " + std::to_string(hv) + " value heads over " +
                 std::to_string(hk) + " key heads (must divide)");
  if (num_seqs == 0 || tokens == 0) return;
  switch (dk) {
    case 16:
      return launch_gdn<T, 4>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                              out, ldo, hk, hv, dv, stream);
    case 32:
      return launch_gdn<T, 8>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                              out, ldo, hk, hv, dv, stream);
    case 64:
      return launch_gdn<T, 16>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                               out, ldo, hk, hv, dv, stream);
    case 128:
      return launch_gdn<T, 32>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                               out, ldo, hk, hv, dv, stream);
    case 256:
      return launch_gdn<T, 64>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                               out, ldo, hk, hv, dv, stream);
    default:
      fail_message("gated_delta_rule: key head dim " + std::to_string(dk) +
                   " is not supported (expected 16, 32, 64, 128 or 256)");
  }
}

template void gated_delta_rule<float>(const float*, int64_t, const float*, int64_t, const float*,
                                      int64_t, const float*, const float*, float*, const int32_t*,
                                      const int32_t*, int64_t, int64_t, float*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t, cudaStream_t);
template void gated_delta_rule<bf16>(const bf16*, int64_t, const bf16*, int64_t, const bf16*,
                                     int64_t, const float*, const float*, float*, const int32_t*,
                                     const int32_t*, int64_t, int64_t, bf16*, int64_t, int64_t,
                                     int64_t, int64_t, int64_t, cudaStream_t);

}  // namespace qtk::cuda
