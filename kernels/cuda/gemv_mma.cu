// Skinny tensor-core products (declared in kernels/cuda/gemv_mma.h).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv_mma.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace qtk::cuda {
namespace {

using namespace dev;
using bf16 = __nv_bfloat16;

constexpr int kKT = 128;             // k per pipeline stage
constexpr int kLd = kKT + 8;         // bf16 per shared row: ldmatrix rows hit distinct banks
constexpr int kVec = 8;              // bf16 per 16-byte copy
constexpr int kChunks = kKT / kVec;  // 16-byte copies per row and stage
constexpr int kStages = 8;

// note: the work split. The accumulation of one output is a single chain of
// K/16 mma steps (that order is what makes the kernel bit-equal to
// cuBLASLt's), so parallelism comes only from the outputs: each warp owns 8
// of them (the mma's n8 side holds the weight rows; the m16 side holds the
// m <= MT token rows, the rest zero), i.e. N/8 independent chains. A block
// of WB warps shares each stage's copy of the token rows. Weight bytes in
// flight: kStages - 1 stages of WB * 8 rows x 128 columns per block.
// note: a dependent k16 step costs ~34 ns on the H100, so a product takes at
// least K/16 x 34 ns whatever N is (K 3072: 6.4 us; cuBLASLt's M = 1
// kernels the same): at decode, K and not the weight bytes bounds o_proj
// and down_proj.
// How the token rows reach the product: streamed per stage with the
// weights (kStreamX), or computed once into shared memory before the loop
// from the add + RMSNorm in front (kAddRmsNorm).
constexpr int kStreamX = 0, kAddRmsNorm = 1;

// note: a sliced product (kS > 1 slices of K, below) runs each warp's chain
// over K / kS only, so a slice needs fewer stages (K 4096 in 4 slices: 8
// stages of 128), and fewer stages fit more blocks on an SM: 6 when the
// token rows stream with the weights (2 blocks of 104 KB per SM), 4 behind
// the fused add + RMSNorm, whose resident rows take shared memory too.
template <int kS, int kPro>
constexpr int stage_count() {
  return kS == 1 ? kStages : kPro == kStreamX ? 6 : 4;
}

// note: K slices. With kS = 1 each output is one chain over the whole K
// (above). With kS > 1 (kS = WB) the block's kS warps take the kS equal
// slices of K of the same 8 outputs: warp s runs the chain over slice s
// from zero, and the block adds the slice sums in slice order,
// ((s0 + s1) + s2) + s3, before rounding: the order of slice_sum (below)
// over cuBLASLt's strided-batched product of the same slices (gemm.cpp).
// Each chain is kS times shorter and there are kS times as many warps.
template <int WB, int MT, int kPro, int kS = 1>
constexpr int stage_rows() {
  return WB * 8 + (kPro != kStreamX ? 0 : kS * MT);  // weight rows first, then token rows
}
// The token rows of the fused variants stay in shared memory for the whole
// K (computed once, before the loop; zero from k to the stage width).
__host__ __device__ inline int64_t resident_ld(int64_t k) { return (k + kKT - 1) / kKT * kKT + 8; }
template <int WB, int MT, int kPro, int kS = 1>
size_t smem_bytes(int64_t k) {
  const size_t stages =
      static_cast<size_t>(stage_count<kS, kPro>()) * stage_rows<WB, MT, kPro, kS>() * kLd;
  return (stages + (kPro != kStreamX ? static_cast<size_t>(MT * resident_ld(k)) : 0)) *
         sizeof(bf16);
}
constexpr size_t kMaxSmem = 220 * 1024;

// The fused variants run kFusedWarps warps per block and hold up to
// kMaxPer columns of a row per thread in registers, so k <= kFusedMaxK.
// note: each row is loaded in one batch, all loads issued before any store
// or arithmetic: a store through a pointer the compiler cannot tell apart
// from the loaded rows would otherwise hold every next load back by a full
// L2 round trip (a first version with scalar load-store loops cost ~15 us
// per launch), and the norm weights, constants, are loaded before the PDL
// wait.
constexpr int kFusedWarps = 4;
constexpr int kFusedThreads = kFusedWarps * 32;
constexpr int kMaxPer = 32;
constexpr int64_t kFusedMaxK = int64_t{kMaxPer} * kFusedThreads;

// note: the fused add + RMSNorm gives, bit for bit, what add_rmsnorm
// (norm.cu) stores: that kernel runs kRmsThreads = 256 threads per row,
// thread t sums the squares of columns t, t + 256, ... in increasing order
// (dev::rms_square_add), each warp adds its 32 sums by the xor butterfly,
// and the 8 warp totals are added in warp order. Here the kFusedThreads
// threads play the 256: thread t is those with ids t + kFusedThreads * j,
// so each physical warp holds whole virtual warps, lane for lane, and runs
// the same butterfly on each. Thread t's columns are t + kFusedThreads * u;
// column u belongs to its virtual thread u % J, and each virtual thread
// meets its columns in increasing order. The row's sums (rounded to bf16,
// as the residual is stored) wait in xres between the two passes; every
// block computes them, block 0 also stores the new residual. nw: this
// thread's norm weights (column u in nw[u]).
__device__ void add_rmsnorm_rows(const AddRmsNormInput& an, const float (&nw)[kMaxPer], int m,
                                 int k, bf16* xres, int ldres) {
  constexpr int kRmsThreads = 256;
  constexpr int J = kRmsThreads / kFusedThreads;  // virtual threads per thread
  static_assert(J * kFusedThreads == kRmsThreads && kMaxPer % J == 0, "virtual threads");
  __shared__ float red[kGemvMaxM][kRmsThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int r = 0; r < m; ++r) {
    const bf16* __restrict__ rr = an.residual + static_cast<int64_t>(r) * an.ldr;
    const bf16* __restrict__ dr = an.delta + static_cast<int64_t>(r) * an.ldd;
    bf16* __restrict__ ro = an.residual_out + static_cast<int64_t>(r) * an.ldo;
    float a[kMaxPer], d[kMaxPer];
#pragma unroll
    for (int u = 0; u < kMaxPer; ++u) {
      const int c = tid + kFusedThreads * u;
      a[u] = c < k ? to_f(rr[c]) : 0.0f;
      d[u] = c < k ? to_f(dr[c]) : 0.0f;
    }
    float ss[J];
#pragma unroll
    for (int j = 0; j < J; ++j) ss[j] = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxPer; ++u) {
      const int c = tid + kFusedThreads * u;
      if (c < k) {
        const bf16 sum = from_f<bf16>(a[u] + d[u]);
        xres[r * ldres + c] = sum;
        if (blockIdx.x == 0) ro[c] = sum;
        ss[u % J] = rms_square_add(ss[u % J], to_f(sum));
      }
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const float t = warp_sum(ss[j]);
      if (lane == 0) red[r][warp + kFusedWarps * j] = t;
    }
  }
  __syncthreads();
  for (int r = 0; r < m; ++r) {
    float ss = 0.0f;
    for (int v = 0; v < kRmsThreads / 32; ++v) ss += red[r][v];
    const float inv = rsqrtf(ss / static_cast<float>(k) + an.eps);
    // Each thread rescales the columns it summed (no barrier needed).
#pragma unroll
    for (int u = 0; u < kMaxPer; ++u) {
      const int c = tid + kFusedThreads * u;
      if (c < k) xres[r * ldres + c] = from_f<bf16>(to_f(xres[r * ldres + c]) * inv * nw[u]);
    }
  }
}

// Zeros the columns past k (up to the stage width) of the m rows, then the
// barrier before the product reads them.
// note: rows m.. stay as they are: row t of the mma's A operand reaches
// only output row t, and rows past m are never stored.
template <int kThreads>
__device__ void zero_k_tail(int m, int k, bf16* xres, int ldres) {
  const int tail = ldres - 8 - k;  // k rounded up to the stage width, minus k
  for (int i = threadIdx.x; i < m * tail; i += kThreads)
    xres[(i / tail) * ldres + k + i % tail] = from_f<bf16>(0.0f);
  __syncthreads();
}

// How the outputs leave: stored as they are (kStore), or, for the MLP's
// gate_up product, as SwiGLU activations (kSwigluOut, below).
constexpr int kStore = 0, kSwigluOut = 1;

// note: the SwiGLU epilogue. w is gate_up_proj, bf16 [2 n, k]: gate rows,
// then up rows; y the activations, bf16 [m, n]. Each warp's 8 weight rows
// are the gate rows of 4 activation columns and their 4 up rows, so lane c
// (< 2) holds the gate sums of columns 2c, 2c + 1 and lane c + 2 their up
// sums; each sum is rounded to bf16 as the gate_up buffer would store it,
// then swiglu's formula: the bits of gemv_bf16<bf16> into gate_up followed
// by swiglu (elementwise.cu), in one launch and without the gate_up buffer.
template <int WB, int MT, int kPro, class OUT, int kEpi = kStore, int kS = 1,
          bool kMultiGroup = false>
__global__ void __launch_bounds__(WB * 32)
    gemv_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t ldw,
                OUT* __restrict__ y, int64_t ldy, int m, int n, int k, AddRmsNormInput an) {
  static_assert(kEpi == kStore || std::is_same_v<OUT, bf16>, "SwiGLU activations are bf16");
  static_assert(kS == 1 || (kS == WB && kEpi == kStore), "K slices: one warp per slice, stored");
  constexpr int kThreads = WB * 32;
  constexpr int kStagesHere = stage_count<kS, kPro>();
  constexpr int kRows = stage_rows<WB, MT, kPro, kS>();
  constexpr int kWCopies = WB * 8 * kChunks / kThreads;  // = 4: weight copies per thread
  constexpr int kXCopies = kPro != kStreamX ? 0 : kS * MT * kChunks / kThreads;  // token-row copies
  static_assert(kWCopies * kThreads == WB * 8 * kChunks, "weight copies split evenly");
  static_assert(kPro != kStreamX || kXCopies * kThreads == kS * MT * kChunks,
                "token copies split evenly");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sm = reinterpret_cast<bf16*>(smem_raw);  // bf16 [kStagesHere][kRows][kLd]
  bf16* xres = sm + kStagesHere * kRows * kLd;   // resident rows: bf16 [MT][resident_ld(k)]
  const int ldres = static_cast<int>(resident_ld(k));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // kStore: output n0 + t is weight row n0 + t of the block's WB * 8 (kS >
  // 1: of its 8, each warp's stage rows the same 8 rows in its slice);
  // kSwigluOut: the block's WB * 4 activation columns from a0.
  const int n0 = blockIdx.x * (WB * 8 / kS), a0 = blockIdx.x * (WB * 4);
  // kS > 1: k is a multiple of kS * kKT (gemv_slices_supported); slice s is
  // k columns [s * klen, (s + 1) * klen).
  const int klen = k / kS;
  const int tiles = (klen + kKT - 1) / kKT;
  // note: kMultiGroup, the plain stored product (streamed token rows,
  // kStore, one chain per output) on fewer blocks than it has row groups of
  // WB * 8 outputs: block b takes groups b, b + gridDim.x, ... in turn, and
  // its ring runs on from one group's last stage into the next group's
  // first (a "unit" is one stage of one group), so its loads never drain
  // between groups. Each output is the same chain either way (launch()
  // picks the form and the grid).
  static_assert(!kMultiGroup || (kPro == kStreamX && kEpi == kStore && kS == 1),
                "row groups in turn: the plain stored product only");
  const int64_t group_rows = WB * 8 / kS;  // outputs per row group
  const int groups = kMultiGroup ? static_cast<int>((n + group_rows - 1) / group_rows) : 1;
  const int my_groups =
      kMultiGroup ? (groups - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                        static_cast<int>(gridDim.x)
                  : 1;
  const int units = my_groups * tiles;
  const int64_t group_step = static_cast<int64_t>(gridDim.x) * group_rows;  // rows between groups

  // This thread's copies: copy j of a stage is row (tid + j * kThreads) /
  // kChunks, 16-byte column (tid % kChunks) (kThreads is a multiple of 16).
  const int cv = tid % kChunks;
  const bf16* wsrc[kWCopies];
  bool wok[kWCopies];
  int64_t wrow[kWCopies];  // kMultiGroup: the copy's weight row in the block's first group
#pragma unroll
  for (int j = 0; j < kWCopies; ++j) {
    const int r = (tid + j * kThreads) / kChunks;
    int64_t row = n0 + (kS > 1 ? r % 8 : r);
    wrow[j] = row;
    if constexpr (kEpi == kSwigluOut) {
      const int col = a0 + r / 8 * 4 + r % 4;  // warp r / 8, its tile row r % 8
      wok[j] = col < n;
      row = col + (r % 8 >= 4 ? n : 0);
    } else {
      wok[j] = row < n;
    }
    const int64_t slice0 = kS > 1 ? static_cast<int64_t>(r / 8) * klen : 0;
    wsrc[j] = w + (wok[j] ? row * ldw + slice0 : 0) + cv * kVec;
  }
  // Unit u: stage kt = u % tiles of the block's group u / tiles (its rows
  // `shift` past the first group's), into ring slot u % kStagesHere.
  // note: the loop below keeps kt and shift as running counters, not a
  // division per unit.
  auto issue_w = [&](int u, int kt, int64_t shift) {
    bf16* st = sm + (u % kStagesHere) * kRows * kLd;
    const int kk = kt * kKT + cv * kVec;
#pragma unroll
    for (int j = 0; j < kWCopies; ++j) {
      const int r = (tid + j * kThreads) / kChunks;
      const bool ok = kMultiGroup ? wrow[j] + shift < n : wok[j];
      const bf16* src = kMultiGroup ? w + (ok ? (wrow[j] + shift) * ldw : 0) + cv * kVec : wsrc[j];
      cp_async_16(smem_addr(st + r * kLd + cv * kVec), src + kt * kKT, ok && kk < klen);
    }
  };
  // kS > 1: the stage's token rows are kS groups of MT, group s slice s.
  auto issue_x = [&](int u, int kt) {
    bf16* st = sm + (u % kStagesHere) * kRows * kLd + WB * 8 * kLd;
    const int kk = kt * kKT + cv * kVec;
#pragma unroll
    for (int j = 0; j < kXCopies; ++j) {
      const int r = (tid + j * kThreads) / kChunks;
      const int t = r % MT, s = r / MT;
      const bool ok = t < m && kk < klen;
      cp_async_16(smem_addr(st + r * kLd + cv * kVec),
                  x + (ok ? t * ldx + static_cast<int64_t>(s) * klen + kk : 0), ok);
    }
  };

  // note: the weights are constants, so their first stages are fetched
  // into shared memory before the wait for the previous kernel (PDL), while
  // the producer of x still runs. Only x waits.
  // note: an L2 prefetch of the block's whole weight panel here
  // (cp.async.bulk.prefetch.L2) was tried and made every shape slower from
  // DRAM (H100, BM_Gemv: N 24576 K 4096 70 -> 98 us, N 6144 K 1024 5.1 ->
  // 6.1 us) and the Qwen3-0.6B batch-1 step 1.15 -> 1.26 ms.
#pragma unroll
  for (int s = 0; s < kStagesHere - 1; ++s)
    if (s < units)
      issue_w(s, kMultiGroup ? s % tiles : s, kMultiGroup ? (s / tiles) * group_step : 0);
  float nw[kMaxPer];  // kAddRmsNorm: this thread's norm weights
  if constexpr (kPro == kAddRmsNorm) {
#pragma unroll
    for (int u = 0; u < kMaxPer; ++u) {
      const int c = tid + kFusedThreads * u;
      nw[u] = c < k ? an.weight[c] : 0.0f;
    }
  }
  pdl_begin();
  static_assert(kPro == kStreamX || kThreads == kFusedThreads, "fused variants: 4 warps");
  if constexpr (kPro == kAddRmsNorm) add_rmsnorm_rows(an, nw, m, k, xres, ldres);
  if constexpr (kPro != kStreamX) zero_k_tail<kThreads>(m, k, xres, ldres);
    // Commit groups: group 0 holds the weight stages above and x stage 0;
    // group s holds x stage s; then each group one whole stage.
#pragma unroll
  for (int s = 0; s < kStagesHere - 1; ++s) {
    if constexpr (kPro == kStreamX)
      if (s < units) issue_x(s, kMultiGroup ? s % tiles : s);
    cp_async_commit();
  }

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // C fragment: d0 (token g, output 2c), d1 (g, 2c+1), d2 (g+8, 2c), d3 (g+8, 2c+1).
  const int g = lane >> 2, c = lane & 3;
  // kMultiGroup: the outputs of the block's group `it` (kStore, one chain each).
  auto store_group = [&](int it) {
    const int64_t col = n0 + warp * 8 + 2 * c + it * group_step;
    auto put = [&](int row, int64_t cc, float v) {
      if (row < m && cc < n) {
        if constexpr (std::is_same_v<OUT, float>)
          y[static_cast<int64_t>(row) * ldy + cc] = v;
        else
          y[static_cast<int64_t>(row) * ldy + cc] = __float2bfloat16_rn(v);
      }
    };
    put(g, col, acc[0]);
    put(g, col + 1, acc[1]);
    if constexpr (MT == 16) {
      put(g + 8, col, acc[2]);
      put(g + 8, col + 1, acc[3]);
    }
  };
  // kMultiGroup: the unit consumed is stage ckt of the block's group cit; the
  // unit issued, kStagesHere - 1 ahead, stage ikt with its rows ishift on.
  int ckt = 0, cit = 0, ikt = 0;
  int64_t ishift = 0;
  if constexpr (kMultiGroup) {
    ikt = (kStagesHere - 1) % tiles;
    ishift = ((kStagesHere - 1) / tiles) * group_step;
  }
  for (int u = 0; u < units; ++u) {
    const int kt = kMultiGroup ? ckt : u;
    cp_async_wait<kStagesHere - 2>();  // unit u landed (this thread's copies)
    __syncthreads();                   // ... and every thread's; unit u - 1's slot is free
    if (u + kStagesHere - 1 < units) {
      const int ik = kMultiGroup ? ikt : u + kStagesHere - 1;
      issue_w(u + kStagesHere - 1, ik, ishift);
      if constexpr (kPro == kStreamX) issue_x(u + kStagesHere - 1, ik);
    }
    if constexpr (kMultiGroup) {
      if (++ikt == tiles) {
        ikt = 0;
        ishift += group_step;
      }
    }
    cp_async_commit();
    const bf16* ws = sm + (u % kStagesHere) * kRows * kLd + warp * 8 * kLd;
    // The token rows of this stage (kS > 1: of this warp's slice): row r at
    // xs + r * ldxs.
    const bf16* xs = kPro != kStreamX ? xres + (kS > 1 ? warp * klen : 0) + kt * kKT
                                      : sm + (u % kStagesHere) * kRows * kLd +
                                            (WB * 8 + (kS > 1 ? warp * MT : 0)) * kLd;
    const int ldxs = kPro != kStreamX ? ldres : kLd;
    // note: zero-filled k past the end add +0 products, as any kernel's
    // zero-padded K tail does.
    // note: all fragments of the stage are loaded before its mma chain: the
    // asm statements keep their order, and a load between two mma steps
    // would add its latency to every step of the chain.
    uint32_t a[kKT / 16][4], b[kKT / 16][2];
#pragma unroll
    for (int kk = 0; kk < kKT / 16; ++kk) {
      if constexpr (MT == 16) {
        ldmatrix_x4(a[kk], smem_addr(xs + (lane & 15) * ldxs + kk * 16 + (lane >> 4) * 8));
      } else {  // token rows 8..15 are zero
        uint32_t a2[2];
        ldmatrix_x2(a2, smem_addr(xs + (lane & 7) * ldxs + kk * 16 + ((lane >> 3) & 1) * 8));
        a[kk][0] = a2[0];
        a[kk][1] = 0u;
        a[kk][2] = a2[1];
        a[kk][3] = 0u;
      }
      ldmatrix_x2(b[kk], smem_addr(ws + (lane & 7) * kLd + kk * 16 + ((lane >> 3) & 1) * 8));
    }
#pragma unroll
    for (int kk = 0; kk < kKT / 16; ++kk) mma_bf16(acc, a[kk], b[kk][0], b[kk][1]);
    if constexpr (kMultiGroup) {
      if (ckt == tiles - 1) {
        store_group(cit);
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
      }
      if (++ckt == tiles) {
        ckt = 0;
        ++cit;
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (kMultiGroup) return;
  if constexpr (kS > 1) {
    // The slice sums in slice order, by warp 0.
    __shared__ float4 part[kS][32];
    part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int s = 1; s < kS; ++s) {
      const float4 p = part[s][lane];
      acc[0] = __fadd_rn(acc[0], p.x);
      acc[1] = __fadd_rn(acc[1], p.y);
      acc[2] = __fadd_rn(acc[2], p.z);
      acc[3] = __fadd_rn(acc[3], p.w);
    }
  }
  const int col = n0 + (kS > 1 ? 0 : warp * 8) + 2 * c;
  auto put = [&](int row, int cc, float v) {
    if (row < m && cc < n) {
      if constexpr (std::is_same_v<OUT, float>)
        y[static_cast<int64_t>(row) * ldy + cc] = v;
      else
        y[static_cast<int64_t>(row) * ldy + cc] = __float2bfloat16_rn(v);
    }
  };
  if constexpr (kEpi == kSwigluOut) {
    float up[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) up[i] = __shfl_xor_sync(0xffffffffu, acc[i], 2);
    if (c >= 2) return;
    const int a = a0 + warp * 4 + 2 * c;
    auto act = [&](int row, int cc, float gs, float us) {
      if (row < m && cc < n)
        y[static_cast<int64_t>(row) * ldy + cc] =
            from_f<bf16>(silu(to_f(__float2bfloat16_rn(gs))) * to_f(__float2bfloat16_rn(us)));
    };
    act(g, a, acc[0], up[0]);
    act(g, a + 1, acc[1], up[1]);
    if constexpr (MT == 16) {
      act(g + 8, a, acc[2], up[2]);
      act(g + 8, a + 1, acc[3], up[3]);
    }
    return;
  }
  put(g, col, acc[0]);
  put(g, col + 1, acc[1]);
  if constexpr (MT == 16) {
    put(g + 8, col, acc[2]);
    put(g + 8, col + 1, acc[3]);
  }
}

std::atomic<int> g_grid_limit{0};  // set_gemv_grid_limit

// The blocks of `kernel` that fit the current GPU at once (occupancy x SMs),
// remembered per kernel, device and shared-memory size.
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem) {
  struct Known {
    const void* kernel;
    int device;
    size_t smem;
    int blocks;
  };
  thread_local std::vector<Known> known;
  int device = 0;
  QTK_CUDA_CHECK(cudaGetDevice(&device));
  const void* key = reinterpret_cast<const void*>(kernel);
  for (const Known& e : known)
    if (e.kernel == key && e.device == device && e.smem == smem) return e.blocks;
  int per_sm = 0;
  QTK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int blocks = std::max(1, per_sm) * sm_count();
  known.push_back({key, device, smem, blocks});
  return blocks;
}

template <int WB, int MT, int kPro, class OUT, int kEpi = kStore, int kS = 1>
void launch(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, OUT* y, int64_t ldy, int64_t m,
            int64_t n, int64_t k, const AddRmsNormInput& an, cudaStream_t stream) {
  auto* kernel = gemv_kernel<WB, MT, kPro, OUT, kEpi, kS>;
  set_max_dynamic_smem(kernel, static_cast<int>(kMaxSmem));
  const int per_block = kEpi == kSwigluOut ? WB * 4 : WB * 8 / kS;  // outputs per block
  const unsigned blocks = static_cast<unsigned>((n + per_block - 1) / per_block);
  if constexpr (kPro == kStreamX && kEpi == kStore && kS == 1 && WB == 4) {
    // note: a product of many more row groups than fit the GPU at once (a
    // vocabulary-wide lm_head: 4,748 groups of 32 rows against 264
    // resident blocks on an H200) runs on the resident blocks, each taking
    // groups in turn with its ring running on across them (gemv_kernel's
    // kMultiGroup): one block per group paid its ramp (launch, first loads,
    // the ring's drain) ~18 times per block slot. Same bits either way.
    // H200, batch 1, Qwen3-0.6B's lm_head (K 1024) 88.1 -> 78.2 us under a
    // kernel trace (84 -> 94% of the copy rate), the step 1,315-1,319 ->
    // 1,326-1,328 tok/s.
    // note: only where a group's weights are at most 64 KB (K <= 1024): the
    // Qwen3-30B-A3B cut's lm_head (K 2048) was at 97% of the copy rate
    // already and gained nothing (2,413-2,418 vs 2,424-2,429 tok/s).
    // note: a kernel of its own, so that every other product runs the
    // one-group code unchanged (a first form shared the loop and cost the
    // 30B-A3B cut's one-group lm_head 4.4% of its step).
    auto* multi = gemv_kernel<WB, MT, kPro, OUT, kEpi, kS, true>;
    set_max_dynamic_smem(multi, static_cast<int>(kMaxSmem));  // (before the occupancy query too)
    const int limit = g_grid_limit.load(std::memory_order_relaxed);
    unsigned grid = 0;
    if (limit > 0) {
      grid = std::min<unsigned>(blocks, static_cast<unsigned>(limit));
    } else if (limit == 0 && WB * 8 * k * 2 <= 64 * 1024) {
      const int resident = resident_blocks(multi, WB * 32, smem_bytes<WB, MT, kPro, kS>(k));
      if (blocks > 4u * static_cast<unsigned>(resident)) grid = static_cast<unsigned>(resident);
    }
    if (grid > 0) {
      launch_kernel(multi, grid, WB * 32, smem_bytes<WB, MT, kPro, kS>(k), stream, x, ldx, w, ldw,
                    y, ldy, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), an);
      return;
    }
  }
  launch_kernel(kernel, blocks, WB * 32, smem_bytes<WB, MT, kPro, kS>(k), stream, x, ldx, w, ldw, y,
                ldy, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), an);
}

template <int kPro, class OUT, int kEpi = kStore>
void dispatch(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, OUT* y, int64_t ldy,
              int64_t m, int64_t n, int64_t k, const AddRmsNormInput& an, cudaStream_t stream,
              int warps, int slices = 1) {
  if (warps != 0 && warps != 1 && warps != 2 && warps != 4)
    fail_message("gemv_bf16: warps per block " + std::to_string(warps) +
                 " (expected 0, 1, 2 or 4)");
  if (!gemv_slices_supported(k, slices) || (slices != 1 && kEpi != kStore))
    fail_message("gemv_bf16: " + std::to_string(slices) + " K slices for k " + std::to_string(k) +
                 " (expected 1, or " + std::to_string(kGemvSlices) + " with k a multiple of " +
                 std::to_string(kGemvSlices * kKT) + ")");
  if constexpr (kEpi == kStore) {
    if (slices == kGemvSlices) {
      // (one warp per slice: kGemvSlices warps per block)
      if (m <= 8)
        return launch<kGemvSlices, 8, kPro, OUT, kEpi, kGemvSlices>(x, ldx, w, ldw, y, ldy, m, n, k,
                                                                    an, stream);
      return launch<kGemvSlices, 16, kPro, OUT, kEpi, kGemvSlices>(x, ldx, w, ldw, y, ldy, m, n, k,
                                                                   an, stream);
    }
  }
  // note: 4 warps per block was the fastest or within 4 % of it on every
  // Qwen3-0.6B decode shape but one on the H100 (BM_Gemv 1 / 2 / 4
  // warps: N 1024 K 3072 6.38 / 7.73 / 6.39 us; N 16384 K 1024 14.0 / 13.5
  // / 12.7 us; N 4096 K 1024 3.68 / 3.93 / 4.11 us).
  if constexpr (kPro != kStreamX) {
    if (m <= 8)
      return launch<kFusedWarps, 8, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
    return launch<kFusedWarps, 16, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
  } else {
    if (warps == 0) warps = 4;
    if (m <= 8) {
      if (warps == 1)
        return launch<1, 8, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
      if (warps == 4)
        return launch<4, 8, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
      return launch<2, 8, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
    }
    if (warps == 1)
      return launch<1, 16, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
    if (warps == 4)
      return launch<4, 16, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
    return launch<2, 16, kPro, OUT, kEpi>(x, ldx, w, ldw, y, ldy, m, n, k, an, stream);
  }
}

}  // namespace

using bf16 = __nv_bfloat16;

bool gemv_bf16_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, int64_t m,
                         int64_t k) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= kGemvMaxM && k % kVec == 0 && ldx % kVec == 0 && ldw % kVec == 0 &&
         aligned(x) && aligned(w) && k < (int64_t{1} << 30);
}

void set_gemv_grid_limit(int blocks) { g_grid_limit.store(std::max(-1, blocks)); }

bool gemv_slices_supported(int64_t k, int slices) {
  return slices == 1 || (slices == kGemvSlices && k % (slices * kKT) == 0);
}

template <class OUT>
void gemv_bf16(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, OUT* y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, cudaStream_t stream, int warps, int slices) {
  if (m <= 0 || n <= 0) return;
  if (!gemv_bf16_supported(x, ldx, w, ldw, m, k))
    fail_message("gemv_bf16: unsupported call (m " + std::to_string(m) + ", k " +
                 std::to_string(k) + "; m <= 16, k and strides multiples of 8, aligned pointers)");
  dispatch<kStreamX, OUT>(x, ldx, w, ldw, y, ldy, m, n, k, AddRmsNormInput{}, stream, warps,
                          slices);
}

bool add_rmsnorm_gemv_supported(const AddRmsNormInput& an, const void* w, int64_t ldw, int64_t m,
                                int64_t k) {
  if (!gemv_bf16_supported(an.delta, an.ldd, w, ldw, m, k)) return false;
  if (k > kFusedMaxK || smem_bytes<kFusedWarps, 16, kAddRmsNorm>(k) > kMaxSmem) return false;
  // note: every block reads the old residual while block 0 writes the new
  // one, so the two must not overlap.
  const auto* a = reinterpret_cast<const char*>(an.residual);
  const auto* b = reinterpret_cast<const char*>(an.residual_out);
  const int64_t span = ((m - 1) * std::max(an.ldr, an.ldo) + k) * 2;
  return an.residual != nullptr && an.residual_out != nullptr && an.weight != nullptr &&
         (b >= a + span || a >= b + span);
}

template <class OUT>
void add_rmsnorm_gemv_bf16(const AddRmsNormInput& an, const bf16* w, int64_t ldw, OUT* y,
                           int64_t ldy, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                           int slices) {
  if (m <= 0 || n <= 0) return;
  if (!add_rmsnorm_gemv_supported(an, w, ldw, m, k))
    fail_message("add_rmsnorm_gemv_bf16: unsupported call (m " + std::to_string(m) + ", k " +
                 std::to_string(k) +
                 "; m <= 16, k <= 4096, k and strides multiples of 8, aligned pointers, "
                 "residual_out apart from residual)");
  dispatch<kAddRmsNorm, OUT>(nullptr, 0, w, ldw, y, ldy, m, n, k, an, stream, 0, slices);
}

void gemv_swiglu_out_bf16(const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, bf16* act,
                          int64_t ldact, int64_t m, int64_t inter, int64_t k, cudaStream_t stream) {
  if (m <= 0 || inter <= 0) return;
  if (!gemv_bf16_supported(x, ldx, w, ldw, m, k))
    fail_message("gemv_swiglu_out_bf16: unsupported call (m " + std::to_string(m) + ", k " +
                 std::to_string(k) + "; m <= 16, k and strides multiples of 8, aligned pointers)");
  dispatch<kStreamX, bf16, kSwigluOut>(x, ldx, w, ldw, act, ldact, m, inter, k, AddRmsNormInput{},
                                       stream, 4);
}

void add_rmsnorm_gemv_swiglu_out_bf16(const AddRmsNormInput& an, const bf16* w, int64_t ldw,
                                      bf16* act, int64_t ldact, int64_t m, int64_t inter, int64_t k,
                                      cudaStream_t stream) {
  if (m <= 0 || inter <= 0) return;
  if (!add_rmsnorm_gemv_supported(an, w, ldw, m, k))
    fail_message("add_rmsnorm_gemv_swiglu_out_bf16: unsupported call (m " + std::to_string(m) +
                 ", k " + std::to_string(k) +
                 "; m <= 16, k <= 4096, k and strides multiples of 8, aligned pointers, "
                 "residual_out apart from residual)");
  dispatch<kAddRmsNorm, bf16, kSwigluOut>(nullptr, 0, w, ldw, act, ldact, m, inter, k, an, stream,
                                          0);
}

namespace {
// note: 4 outputs per thread (float4 loads of each slice) where n and the
// slice stride allow it; each output the slices added in slice order.
template <class OUT, int kV>
__global__ void slice_sum_kernel(const float* __restrict__ parts, int slices, int64_t stride,
                                 OUT* __restrict__ y, int64_t ldy, int64_t m, int64_t n) {
  pdl_begin();
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kV;
  if (i >= m * n) return;
  const int64_t row = i / n, col = i % n;
  const float* p = parts + i;
  float v[kV];
  if constexpr (kV == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    v[0] = p[0];
  }
  for (int s = 1; s < slices; ++s) {
    if constexpr (kV == 4) {
      const float4 a = *reinterpret_cast<const float4*>(p + s * stride);
      v[0] = __fadd_rn(v[0], a.x), v[1] = __fadd_rn(v[1], a.y);
      v[2] = __fadd_rn(v[2], a.z), v[3] = __fadd_rn(v[3], a.w);
    } else {
      v[0] = __fadd_rn(v[0], p[s * stride]);
    }
  }
  OUT* out = y + row * ldy + col;
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if constexpr (std::is_same_v<OUT, float>)
      out[j] = v[j];
    else
      out[j] = __float2bfloat16_rn(v[j]);
  }
}
}  // namespace

template <class OUT>
void slice_sum(const float* parts, int slices, int64_t stride, OUT* y, int64_t ldy, int64_t m,
               int64_t n, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  const bool vec =
      n % 4 == 0 && stride % 4 == 0 && ldy % 4 == 0 && reinterpret_cast<uintptr_t>(parts) % 16 == 0;
  const int64_t threads = vec ? m * n / 4 : m * n;
  const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
  if (vec)
    launch_kernel(slice_sum_kernel<OUT, 4>, blocks, 256, 0, stream, parts, slices, stride, y, ldy,
                  m, n);
  else
    launch_kernel(slice_sum_kernel<OUT, 1>, blocks, 256, 0, stream, parts, slices, stride, y, ldy,
                  m, n);
}

template void gemv_bf16<float>(const bf16*, int64_t, const bf16*, int64_t, float*, int64_t, int64_t,
                               int64_t, int64_t, cudaStream_t, int, int);
template void gemv_bf16<bf16>(const bf16*, int64_t, const bf16*, int64_t, bf16*, int64_t, int64_t,
                              int64_t, int64_t, cudaStream_t, int, int);
template void add_rmsnorm_gemv_bf16<float>(const AddRmsNormInput&, const bf16*, int64_t, float*,
                                           int64_t, int64_t, int64_t, int64_t, cudaStream_t, int);
template void add_rmsnorm_gemv_bf16<bf16>(const AddRmsNormInput&, const bf16*, int64_t, bf16*,
                                          int64_t, int64_t, int64_t, int64_t, cudaStream_t, int);
template void slice_sum<float>(const float*, int, int64_t, float*, int64_t, int64_t, int64_t,
                               cudaStream_t);
template void slice_sum<bf16>(const float*, int, int64_t, bf16*, int64_t, int64_t, int64_t,
                              cudaStream_t);

}  // namespace qtk::cuda
