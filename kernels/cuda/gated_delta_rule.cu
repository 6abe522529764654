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
// The fused gated norm's cluster: a head's column tiles, at most 8 (the
// portable cluster size), so Dv <= 256.
constexpr int kGdnMaxCluster = 8;

// Block (sequence, value head, tile of 32 value columns) = blockIdx.x, the
// tile fastest, then the head, then the sequence; 4 warps. Lane l owns
// column j = tile*32 + l; warp w owns key rows w*R .. w*R+R-1 (R = Dk/4), so
// each thread keeps R state values of S[Dk, Dv] in registers for the whole
// chunk: the state is read once and written once per call.
// kNorm (with kRaw): the ceil(Dv / 32) tile blocks of a (sequence, head) run
// as one cluster; each token's outputs, rounded to T as stored, go through
// Qwen3.5's gated RMSNorm (dev::gated_norm_inv / gated_norm_out,
// gated_rmsnorm's arithmetic, the head's row read from the cluster's blocks'
// shared memory) before they are written: one launch fewer per GDN layer,
// the same bits.
// note: the tile index varies fastest: the ceil(Dv / 32) blocks of one
// (sequence, head) start together and read its contiguous Dk x Dv state
// together. With the tile slowest (a (sequence, head, tile) grid), each
// block read 128 bytes of every 512-byte state row while the rest of the
// row waited for a later wave: BM_GatedDeltaRule at 128 sequences 104 ->
// 96.9 us on an H100, Qwen3.5-0.8B batch-128 decode +2.6%.
// note: f32 state: the recurrence multiplies and accumulates over thousands of
// steps, and bf16 state would drift visibly within a few hundred tokens.
// note: fixed order: each column's k^T S and q^T S are 4 per-warp serial sums
// over the warp's rows, added warp 0 + 1 + 2 + 3. The order depends only on
// Dk, so a row's result does not depend on the batch.
// kRaw (gated_delta_rule_fused): q and k arrive before their l2norm and the
// gates as the projection's a, b columns; each block normalises the key
// head's q and k rows and computes its head's g and beta per token, with
// l2norm_heads' and gdn_gates' arithmetic (the sum of squares of lane l over
// columns l, l + 32, ... in order, then warp_sum; values rounded to T as
// those kernels store them), so the results are the unfused calls' bits.
template <class T, int R, bool kRaw, bool kNorm>
__global__ void __launch_bounds__(kGdnWarps * 32)
    gdn_recurrent_kernel(const T* __restrict__ q, int64_t ldq, const T* __restrict__ k, int64_t ldk,
                         const T* __restrict__ v, int64_t ldv, const float* __restrict__ g,
                         const float* __restrict__ beta, float* state_pool,
                         const int32_t* __restrict__ slot, const int32_t* __restrict__ q_start,
                         T* __restrict__ out, int64_t ldo, int hk, int hv, int dv,
                         GdnRawInput<T> raw) {
  constexpr int DK = kGdnWarps * R;
  __shared__ float qs[2][DK], ks[2][DK];
  __shared__ float pkv[kGdnWarps][kGdnCols], po[kGdnWarps][kGdnCols];
  __shared__ float ys[kNorm ? kGdnCols : 1];  // kNorm: the tile's outputs as stored
  const int tiles = (dv + kGdnCols - 1) / kGdnCols;
  const int s = static_cast<int>(blockIdx.x / (tiles * hv)),
            h = static_cast<int>(blockIdx.x / tiles % hv);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int j = static_cast<int>(blockIdx.x % tiles) * kGdnCols + lane;
  const bool active = j < dv;
  const int kh = h / (hv / hk);
  float* S = state_pool + (static_cast<int64_t>(slot[s]) * hv + h) * DK * dv;

  // note: the state is read before the wait for the previous kernel (PDL),
  // so its bytes, most of this kernel's traffic, stream in while that kernel
  // finishes. Safe: the pool is written only by this layer's GDN kernels, and
  // the launch right before a recurrent one never is one (causal_conv1d, or
  // copy_rows after the chunked form); kernels further back have completed
  // before this one starts (launch.cuh). The slots are step inputs.
  float st[R];
#pragma unroll
  for (int r = 0; r < R; ++r) st[r] = active ? S[(w * R + r) * dv + j] : 0.0f;
  const float norm_w = kNorm && active ? raw.norm[j] : 0.0f;
  pdl_begin();

  const int t0 = q_start[s], t1 = q_start[s + 1];
  // note: token t+1's inputs are loaded into registers while token t is
  // computed (the loop is latency-bound: one token after another).
  constexpr int kPer = (DK + kGdnWarps * 32 - 1) / (kGdnWarps * 32);
  float qn[kPer], kn[kPer], vn = 0.0f, gn = 0.0f, bn = 0.0f, zn = 0.0f;
  auto load = [&](int t) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int i = threadIdx.x + e * kGdnWarps * 32;
      qn[e] = i < DK ? to_f(q[static_cast<int64_t>(t) * ldq + kh * DK + i]) : 0.0f;
      kn[e] = i < DK ? to_f(k[static_cast<int64_t>(t) * ldk + kh * DK + i]) : 0.0f;
    }
    if constexpr (kRaw) {
      gdn_gate_values(to_f(raw.a[static_cast<int64_t>(t) * raw.lda + h]),
                      to_f(raw.b[static_cast<int64_t>(t) * raw.ldb + h]), raw.A[h], raw.dt_bias[h],
                      gn, bn);
    } else {
      gn = g[static_cast<int64_t>(t) * hv + h];
      bn = beta[static_cast<int64_t>(t) * hv + h];
    }
    vn = active ? to_f(v[static_cast<int64_t>(t) * ldv + h * dv + j]) : 0.0f;
    if constexpr (kNorm)
      zn = active ? to_f(raw.z[static_cast<int64_t>(t) * raw.ldz + h * dv + j]) : 0.0f;
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
    const float vj = vn, zj = zn;
    if (t + 1 < t1) load(t + 1);
    __syncthreads();
    // kRaw: the l2norm factors of this token's q and k rows (every warp
    // computes both, from the raw rows in shared memory), applied as each
    // value is read, rounded to T as l2norm_heads stores it.
    float inv_q = 1.0f, inv_k = 1.0f;
    if constexpr (kRaw) {
      float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
      for (int c = lane; c < DK; c += 32) {
        const float a = qs[buf][c], b2 = ks[buf][c];
        ssq += a * a;
        ssk += b2 * b2;
      }
      inv_q = rsqrtf(warp_sum(ssq) + raw.eps) * raw.q_scale;
      inv_k = rsqrtf(warp_sum(ssk) + raw.eps) * 1.0f;
    }
    auto qv = [&](int i) {
      if constexpr (kRaw) return to_f(from_f<T>(qs[buf][i] * inv_q));
      return qs[buf][i];
    };
    auto kv_ = [&](int i) {
      if constexpr (kRaw) return to_f(from_f<T>(ks[buf][i] * inv_k));
      return ks[buf][i];
    };
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      st[r] *= decay;
      acc += kv_(w * R + r) * st[r];
    }
    pkv[w][lane] = acc;
    __syncthreads();
    const float kv = ((pkv[0][lane] + pkv[1][lane]) + pkv[2][lane]) + pkv[3][lane];
    const float delta = (vj - kv) * b;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      st[r] += kv_(w * R + r) * delta;
      o += qv(w * R + r) * st[r];
    }
    po[w][lane] = o;
    __syncthreads();
    const T y = from_f<T>(((po[0][lane] + po[1][lane]) + po[2][lane]) + po[3][lane]);
    if constexpr (kNorm) {
      // Each tile's outputs as stored, then every block's warp 0 norms the
      // head's whole row, value c from tile block c / 32 of the cluster (the
      // same sum in every block), and writes its tile. The second barrier
      // keeps every ys as it is until all blocks have read it.
      if (w == 0) ys[lane] = active ? to_f(y) : 0.0f;
      cluster_barrier();
      if (w == 0) {
        const float inv = gated_norm_inv(
            [&](int c) { return cluster_load(&ys[c % kGdnCols], c / kGdnCols); }, dv, raw.norm_eps);
        if (active)
          out[static_cast<int64_t>(t) * ldo + h * dv + j] =
              from_f<T>(gated_norm_out(norm_w, ys[lane], inv, zj));
      }
      cluster_barrier();
    } else if (w == 0 && active) {
      out[static_cast<int64_t>(t) * ldo + h * dv + j] = y;
    }
  }
  if (active) {
#pragma unroll
    for (int r = 0; r < R; ++r) S[(w * R + r) * dv + j] = st[r];
  }
}

template <class T, int R, bool kRaw>
void launch_gdn(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                const float* g, const float* beta, float* state_pool, const int32_t* slot,
                const int32_t* q_start, int64_t num_seqs, T* out, int64_t ldo, int64_t hk,
                int64_t hv, int64_t dv, const GdnRawInput<T>& raw, cudaStream_t stream) {
  const int64_t tiles = (dv + kGdnCols - 1) / kGdnCols;
  const dim3 grid(static_cast<unsigned>(num_seqs * hv * tiles));
  if constexpr (kRaw) {
    if (raw.z != nullptr) {
      if (!gdn_norm_fusable(dv))
        fail_message(
            "gated_delta_rule_fused: the gated norm in the launch needs compute "
            "capability 9.0 and a value head dim <= " +
            std::to_string(kGdnMaxCluster * kGdnCols) + ", got " + std::to_string(dv));
      launch_kernel_clusters(gdn_recurrent_kernel<T, R, true, true>, grid, kGdnWarps * 32, 0,
                             dim3(static_cast<unsigned>(tiles)), stream, q, ldq, k, ldk, v, ldv, g,
                             beta, state_pool, slot, q_start, out, ldo, static_cast<int>(hk),
                             static_cast<int>(hv), static_cast<int>(dv), raw);
      return;
    }
  }
  launch_kernel(gdn_recurrent_kernel<T, R, kRaw, false>, grid, kGdnWarps * 32, 0, stream, q, ldq, k,
                ldk, v, ldv, g, beta, state_pool, slot, q_start, out, ldo, static_cast<int>(hk),
                static_cast<int>(hv), static_cast<int>(dv), raw);
}

template <class T, bool kRaw>
void dispatch_gdn(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                  const float* g, const float* beta, float* state_pool, const int32_t* slot,
                  const int32_t* q_start, int64_t num_seqs, int64_t tokens, T* out, int64_t ldo,
                  int64_t hk, int64_t hv, int64_t dk, int64_t dv, const GdnRawInput<T>& raw,
                  cudaStream_t stream) {
  if (hk <= 0 || hv % hk != 0)
    fail_message("gated_delta_rule: " + std::to_string(hv) + " value heads over " +
                 std::to_string(hk) + " key heads (must divide)");
  if (num_seqs == 0 || tokens == 0) return;
  switch (dk) {
    case 16:
      return launch_gdn<T, 4, kRaw>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start,
                                    num_seqs, out, ldo, hk, hv, dv, raw, stream);
    case 32:
      return launch_gdn<T, 8, kRaw>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start,
                                    num_seqs, out, ldo, hk, hv, dv, raw, stream);
    case 64:
      return launch_gdn<T, 16, kRaw>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start,
                                     num_seqs, out, ldo, hk, hv, dv, raw, stream);
    case 128:
      return launch_gdn<T, 32, kRaw>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start,
                                     num_seqs, out, ldo, hk, hv, dv, raw, stream);
    case 256:
      return launch_gdn<T, 64, kRaw>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start,
                                     num_seqs, out, ldo, hk, hv, dv, raw, stream);
    default:
      fail_message("gated_delta_rule: key head dim " + std::to_string(dk) +
                   " is not supported (expected 16, 32, 64, 128 or 256)");
  }
}

}  // namespace

bool gdn_norm_fusable(int64_t dv) {
  // note: clusters are a compute capability 9.0 feature, the one this
  // library has machine code for (the compute_80 PTX compiles the barrier
  // and the remote loads out).
  return dv <= kGdnMaxCluster * kGdnCols && wgmma_device();
}

template <class T>
void gated_delta_rule(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v, int64_t ldv,
                      const float* g, const float* beta, float* state_pool, const int32_t* slot,
                      const int32_t* q_start, int64_t num_seqs, int64_t tokens, T* out, int64_t ldo,
                      int64_t hk, int64_t hv, int64_t dk, int64_t dv, cudaStream_t stream) {
  dispatch_gdn<T, false>(q, ldq, k, ldk, v, ldv, g, beta, state_pool, slot, q_start, num_seqs,
                         tokens, out, ldo, hk, hv, dk, dv, GdnRawInput<T>{}, stream);
}

template <class T>
void gated_delta_rule_fused(const T* q, int64_t ldq, const T* k, int64_t ldk, const T* v,
                            int64_t ldv, const GdnRawInput<T>& raw, float* state_pool,
                            const int32_t* slot, const int32_t* q_start, int64_t num_seqs,
                            int64_t tokens, T* out, int64_t ldo, int64_t hk, int64_t hv, int64_t dk,
                            int64_t dv, cudaStream_t stream) {
  dispatch_gdn<T, true>(q, ldq, k, ldk, v, ldv, nullptr, nullptr, state_pool, slot, q_start,
                        num_seqs, tokens, out, ldo, hk, hv, dk, dv, raw, stream);
}

template void gated_delta_rule<float>(const float*, int64_t, const float*, int64_t, const float*,
                                      int64_t, const float*, const float*, float*, const int32_t*,
                                      const int32_t*, int64_t, int64_t, float*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t, cudaStream_t);
template void gated_delta_rule_fused<float>(const float*, int64_t, const float*, int64_t,
                                            const float*, int64_t, const GdnRawInput<float>&,
                                            float*, const int32_t*, const int32_t*, int64_t,
                                            int64_t, float*, int64_t, int64_t, int64_t, int64_t,
                                            int64_t, cudaStream_t);
template void gated_delta_rule_fused<bf16>(const bf16*, int64_t, const bf16*, int64_t, const bf16*,
                                           int64_t, const GdnRawInput<bf16>&, float*,
                                           const int32_t*, const int32_t*, int64_t, int64_t, bf16*,
                                           int64_t, int64_t, int64_t, int64_t, int64_t,
                                           cudaStream_t);
template void gated_delta_rule<bf16>(const bf16*, int64_t, const bf16*, int64_t, const bf16*,
                                     int64_t, const float*, const float*, float*, const int32_t*,
                                     const int32_t*, int64_t, int64_t, bf16*, int64_t, int64_t,
                                     int64_t, int64_t, int64_t, cudaStream_t);

}  // namespace qtk::cuda
