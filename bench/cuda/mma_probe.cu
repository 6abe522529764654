// mma_probe: two facts about the tensor core's m16n8k16 bf16 -> f32 step
// that bound what a batch-invariant decode GEMV can do (issue 9):
//
//  1. Latency: how long one step of a dependent chain d = a b + d takes
//     (each output of a K-long product is K/16 such steps when its bits
//     must equal cuBLASLt's non-split kernels), next to the issue rate of
//     independent chains.
//  1b. The same for the warpgroup instruction with both operands in shared
//     memory, wgmma.m64n{8,16}k16 (the weight rows on its 64-row side):
//     chains of dependent steps on one accumulator, several accumulators
//     interleaved, and each step waited for.
//  2. Whether the step's accumulator input is added like a separate f32
//     addition: is mma(a, b, c) == fadd_rn(mma(a, b, 0), c) bit for bit? If
//     so, the k16 products could be computed in parallel and only the f32
//     adds chained, with the same bits.
//
// Usage: qtk_mma_probe [trials per scale, default 1000000]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/cuda/probe_check.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace {

using qtk::cuda::dev::mma_bf16;

// CHAINS independent accumulators, each a chain of `steps` dependent mma.
template <int CHAINS>
__global__ void chain_kernel(const uint32_t* in, float* out, int steps, long long* cycles) {
  uint32_t a[4], b0, b1;
  for (int i = 0; i < 4; ++i) a[i] = in[(threadIdx.x * 4 + i) & 63];
  b0 = in[threadIdx.x & 63];
  b1 = in[(threadIdx.x + 7) & 63];
  float acc[CHAINS][4] = {};
  const long long t0 = clock64();
  for (int s = 0; s < steps; s += 16) {
#pragma unroll
    for (int u = 0; u < 16; ++u)
#pragma unroll
      for (int c = 0; c < CHAINS; ++c) mma_bf16(acc[c], a, b0, b1);
  }
  const long long t1 = clock64();
  float sum = 0.0f;
  for (int c = 0; c < CHAINS; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x == 0 && blockIdx.x == 0) *cycles = t1 - t0;
}

// wgmma.m64n8k16 with A from registers (each warp's 16 rows as the
// m16n8k16 A fragment) and B from shared memory.
__device__ __forceinline__ void wgmma_m64n8k16_rs(float (&d)[4], const uint32_t (&a)[4],
                                                  uint64_t b) {
#if QTK_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)
      : "memory");
#endif
}

// A warpgroup's CHAINS accumulators, each a chain of `steps` dependent
// wgmma.m64n(8 kN8)k16 with A (64 x 16) and B (8 kN8 x 16) in shared memory
// as K-major core matrices (kRegA: A from registers, n8 only); kWaitEach:
// every step committed and waited for.
template <int kN8, int CHAINS, bool kWaitEach, bool kRegA = false>
__global__ void wg_chain_kernel(int steps, float* out, long long* cycles) {
  using qtk::cuda::dev::wg_commit;
  __shared__ __align__(128) __nv_bfloat16 a[64 * 16], b[8 * kN8 * 16];
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) a[i] = __float2bfloat16(1e-3f);
  for (int i = threadIdx.x; i < 8 * kN8 * 16; i += blockDim.x) b[i] = __float2bfloat16(1e-3f);
  qtk::cuda::dev::fence_proxy_async_shared();
  __syncthreads();
  const uint64_t da = qtk::cuda::dev::wg_descriptor(qtk::cuda::dev::smem_addr(a), 64 * 16, 128);
  const uint64_t db =
      qtk::cuda::dev::wg_descriptor(qtk::cuda::dev::smem_addr(b), 8 * kN8 * 16, 128);
  float d[CHAINS][4 * kN8];
  for (int c = 0; c < CHAINS; ++c)
    for (int i = 0; i < 4 * kN8; ++i) d[c][i] = 0.0f;
  const long long t0 = clock64();
  // note: groups of 8 steps, as a decode product's stage of 128 k runs them
  // (a fence, the steps, a commit; at most one group left running): with
  // the whole chain as one group, ptxas serialises the steps (C7515).
  for (int s = 0; s < steps; s += 8) {
    qtk::cuda::dev::wg_fence();
#pragma unroll
    for (int u = 0; u < 8; ++u) {
#pragma unroll
      for (int c = 0; c < CHAINS; ++c) {
        if constexpr (kRegA) {
          static_assert(kN8 == 1, "A from registers: n8");
          const uint32_t ar[4] = {0x3a833a83u, 0x3a833a83u, 0x3a833a83u, 0x3a833a83u};
          wgmma_m64n8k16_rs(d[c], ar, db);
        } else {
          qtk::cuda::dev::wgmma_m64nk16_ss<kN8>(d[c], da, db);
        }
      }
      if constexpr (kWaitEach) {
        wg_commit();
        qtk::cuda::dev::wg_wait<0>();
      }
    }
    wg_commit();
    qtk::cuda::dev::wg_wait<1>();
  }
  qtk::cuda::dev::wg_wait<0>();
  for (int c = 0; c < CHAINS; ++c) qtk::cuda::dev::wg_settle(d[c]);
  const long long t1 = clock64();
  float sum = 0.0f;
  for (int c = 0; c < CHAINS; ++c)
    for (int i = 0; i < 4 * kN8; ++i) sum += d[c][i];
  out[threadIdx.x] = sum;
  if (threadIdx.x == 0) *cycles = t1 - t0;
}

template <int kN8, int CHAINS, bool kWaitEach, bool kRegA = false>
void time_wg_chain(float* out, long long* cyc_d) {
  const int steps = 1 << 14;
  wg_chain_kernel<kN8, CHAINS, kWaitEach, kRegA><<<1, 128>>>(steps, out, cyc_d);  // warm
  wg_chain_kernel<kN8, CHAINS, kWaitEach, kRegA><<<1, 128>>>(steps, out, cyc_d);
  QTK_PROBE_CHECK(cudaDeviceSynchronize());
  long long cyc = 0;
  QTK_PROBE_CHECK(cudaMemcpy(&cyc, cyc_d, sizeof cyc, cudaMemcpyDeviceToHost));
  std::printf(
      "wgmma m64n%dk16 (A from %s, B from shared memory), chains %d%s: %.2f cycles per "
      "step of each chain\n",
      8 * kN8, kRegA ? "registers" : "shared memory", CHAINS,
      kWaitEach ? ", each step waited for" : "", double(cyc) / steps);
}

// Trial t: A (16x16) in a[t] as its 4 fragment registers per lane, B in b,
// C (16x8) in c. Writes mma(A, B, C) to d1 and mma(A, B, 0) + C to d2.
__global__ void split_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d1,
                             float* d2, int trials) {
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  for (int t = warp; t < trials; t += warps) {
    uint32_t af[4];
    for (int i = 0; i < 4; ++i) af[i] = a[(int64_t(t) * 32 + lane) * 4 + i];
    const uint32_t b0 = b[(int64_t(t) * 32 + lane) * 2], b1 = b[(int64_t(t) * 32 + lane) * 2 + 1];
    float acc[4], zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < 4; ++i) acc[i] = c[(int64_t(t) * 32 + lane) * 4 + i];
    const float cc[4] = {acc[0], acc[1], acc[2], acc[3]};
    mma_bf16(acc, af, b0, b1);
    mma_bf16(zero, af, b0, b1);
    for (int i = 0; i < 4; ++i) {
      d1[(int64_t(t) * 32 + lane) * 4 + i] = acc[i];
      d2[(int64_t(t) * 32 + lane) * 4 + i] = __fadd_rn(zero[i], cc[i]);
    }
  }
}

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

template <int CHAINS>
void time_chain(const uint32_t* in, float* out, long long* cyc_d) {
  const int steps = 1 << 16;
  chain_kernel<CHAINS><<<1, 32>>>(in, out, steps, cyc_d);  // warm
  cudaEvent_t e0, e1;
  QTK_PROBE_CHECK(cudaEventCreate(&e0));
  QTK_PROBE_CHECK(cudaEventCreate(&e1));
  QTK_PROBE_CHECK(cudaEventRecord(e0));
  chain_kernel<CHAINS><<<1, 32>>>(in, out, steps, cyc_d);
  QTK_PROBE_CHECK(cudaEventRecord(e1));
  QTK_PROBE_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  QTK_PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  long long cyc = 0;
  QTK_PROBE_CHECK(cudaMemcpy(&cyc, cyc_d, sizeof cyc, cudaMemcpyDeviceToHost));
  std::printf("chains %d: %.2f cycles and %.2f ns per step of each chain (%d steps, %.3f ms)\n",
              CHAINS, double(cyc) / steps, ms * 1e6 / steps, steps, ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 1000000;
  cudaDeviceProp prop{};
  QTK_PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (cc %d.%d)\n", prop.name, prop.major, prop.minor);

  // 1. Latency and issue rate.
  std::vector<uint32_t> seed(64);
  for (int i = 0; i < 64; ++i)
    seed[i] = (uint32_t(to_bf16_bits(1e-3f)) << 16) | to_bf16_bits(1e-3f);
  uint32_t* in;
  float* out;
  long long* cyc;
  QTK_PROBE_CHECK(cudaMalloc(&in, 64 * 4));
  QTK_PROBE_CHECK(cudaMalloc(&out, 1024 * 4));
  QTK_PROBE_CHECK(cudaMalloc(&cyc, 8));
  QTK_PROBE_CHECK(cudaMemcpy(in, seed.data(), 64 * 4, cudaMemcpyHostToDevice));
  time_chain<1>(in, out, cyc);
  time_chain<2>(in, out, cyc);
  time_chain<4>(in, out, cyc);
  time_chain<8>(in, out, cyc);
  time_wg_chain<1, 1, false>(out, cyc);
  time_wg_chain<1, 2, false>(out, cyc);
  time_wg_chain<1, 4, false>(out, cyc);
  time_wg_chain<2, 1, false>(out, cyc);
  time_wg_chain<1, 1, true>(out, cyc);
  time_wg_chain<1, 1, false, true>(out, cyc);
  time_wg_chain<1, 2, false, true>(out, cyc);

  // 2. mma(a, b, c) against mma(a, b, 0) + c, on several scales of c
  // relative to the products (inputs ~N(0, 1) rounded to bf16).
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t na = int64_t(trials) * 32 * 4, nb = int64_t(trials) * 32 * 2;
  std::vector<uint32_t> ha(na), hb(nb);
  std::vector<float> hc(na), h1(na), h2(na);
  uint32_t *da, *db;
  float *dc, *d1, *d2;
  QTK_PROBE_CHECK(cudaMalloc(&da, na * 4));
  QTK_PROBE_CHECK(cudaMalloc(&db, nb * 4));
  QTK_PROBE_CHECK(cudaMalloc(&dc, na * 4));
  QTK_PROBE_CHECK(cudaMalloc(&d1, na * 4));
  QTK_PROBE_CHECK(cudaMalloc(&d2, na * 4));
  auto pair = [&] { return (uint32_t(to_bf16_bits(nd(rng))) << 16) | to_bf16_bits(nd(rng)); };
  for (auto& v : ha) v = pair();
  for (auto& v : hb) v = pair();
  QTK_PROBE_CHECK(cudaMemcpy(da, ha.data(), na * 4, cudaMemcpyHostToDevice));
  QTK_PROBE_CHECK(cudaMemcpy(db, hb.data(), nb * 4, cudaMemcpyHostToDevice));
  bool all_equal = true;
  for (float scale : {0.0f, 1e-6f, 1e-2f, 1.0f, 4.0f, 64.0f, 1e4f}) {
    for (auto& v : hc) v = nd(rng) * scale;
    QTK_PROBE_CHECK(cudaMemcpy(dc, hc.data(), na * 4, cudaMemcpyHostToDevice));
    split_kernel<<<264, 256>>>(da, db, dc, d1, d2, trials);
    QTK_PROBE_CHECK(cudaGetLastError());
    QTK_PROBE_CHECK(cudaMemcpy(h1.data(), d1, na * 4, cudaMemcpyDeviceToHost));
    QTK_PROBE_CHECK(cudaMemcpy(h2.data(), d2, na * 4, cudaMemcpyDeviceToHost));
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < na; ++i)
      if (std::memcmp(&h1[i], &h2[i], 4) != 0) {
        if (first < 0) first = i;
        ++diff;
      }
    all_equal = all_equal && diff == 0;
    std::printf("c ~ N(0, %g): mma(a,b,c) != mma(a,b,0)+c in %lld of %lld outputs (%.4f%%)", scale,
                static_cast<long long>(diff), static_cast<long long>(na), 100.0 * diff / na);
    if (first >= 0) std::printf("; e.g. c %.9g: %.9g vs %.9g", hc[first], h1[first], h2[first]);
    std::printf("\n");
  }
  std::printf("verdict: the accumulator input %s a separate f32 addition\n",
              all_equal ? "behaves as" : "is NOT");
  return 0;
}
