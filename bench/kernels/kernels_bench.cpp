// Microbenchmarks of the CPU kernels at Qwen3-0.6B / Qwen3.5-0.8B shapes.
//   build-kern/bin/kernels_bench [--benchmark_filter=...]
// Matmul reports bytes of weights streamed (GB/s) and FLOP/s; compare with
// BM_ReadBandwidth, the machine's single-pass read bandwidth in this run.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "kernels/matmul_fp8.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace {

using namespace qtk;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  auto f = random_vec(n, seed, 0.02f);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i], 4);
    h[i] = static_cast<uint16_t>(bits >> 16);
  }
  return h;
}

ThreadPool* pool_for(int threads) {
  static std::unique_ptr<ThreadPool> pools[9];
  if (threads <= 1) return nullptr;
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads, true);
  return pools[threads].get();
}

// Sums a 512 MiB buffer: the read bandwidth ceiling of this machine now.
void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const size_t n = size_t{128} << 20;  // floats
  std::vector<float> buf(n, 1.0f);
  ThreadPool* pool = pool_for(threads);
  std::vector<float> partial(64 * 16);
  for (auto _ : state) {
    parallel_for_tid(pool, static_cast<int64_t>(n / 4096), [&](int64_t b, int64_t e, int tid) {
      float acc[16] = {};
      for (int64_t i = b * 4096; i < e * 4096; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += buf[i + l];
      for (int l = 0; l < 16; ++l) partial[tid * 16 + l] = acc[l];
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->MinTime(0.5);

// f32 multiply-add ceiling of this machine now: 12 independent chains of
// 16-lane FMAs per thread (no memory traffic). Matmul GFLOP/s compare to it.
__attribute__((target("avx512f,fma"), noinline)) float fma_chains(int64_t iters, float seed) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(seed + static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  }
  alignas(64) float out[16];
  __m512 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, a[j]);
  _mm512_store_ps(out, s);
  return out[0] + out[15];
}

void BM_FmaPeak(benchmark::State& state) {
  if (!cpu_path_supported(CpuPath::kAvx512)) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  const int64_t iters = 1 << 20;
  ThreadPool* pool = pool_for(threads);
  std::vector<float> sink(threads);
  for (auto _ : state) {
    parallel_for_tid(pool, threads,
                     [&](int64_t, int64_t, int tid) { sink[tid] += fma_chains(iters, sink[tid]); });
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * threads * iters * 12 * 32,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_FmaPeak)->Arg(1)->Arg(2)->UseRealTime()->MinTime(0.3);

// args: M, N, K, threads, path (0 scalar, 1 avx2, 2 avx512, 3 amx)
void BM_MatmulBf16(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const CpuPath path = static_cast<CpuPath>(state.range(4));
  if (!cpu_path_supported(path)) {
    state.SkipWithError("path not supported on this CPU");
    return;
  }
  // note: several weight copies (> L3) so that every call streams from DRAM,
  // as a decode step does across layers.
  const int copies = static_cast<int>(std::max<int64_t>(1, (96ll << 20) / (N * K * 2)));
  std::vector<std::vector<uint16_t>> w;
  for (int c = 0; c < copies; ++c) w.push_back(random_bf16(N * K, 3 + c));
  auto x = random_vec(M * K, 1);
  std::vector<float> y(M * N);
  ThreadPool* pool = pool_for(threads);
  int c = 0;
  for (auto _ : state) {
    matmul_on_path(path, x.data(), K, w[c].data(), DType::BF16, y.data(), N, M, N, K, pool);
    c = (c + 1) % copies;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * N * K * 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * M * N * K,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * M, benchmark::Counter::kIsRate);
}
void MatmulArgs(benchmark::internal::Benchmark* b) {
  for (int path : {2, 1}) {
    for (int threads : {1, 2}) {
      for (int64_t M : {1, 8, 32, 512}) {
        if (path == 1 && M == 512 && threads == 1) continue;
        b->Args({M, 3072, 1024, threads, path});  // Qwen3-0.6B gate/up-sized
        b->Args({M, 1024, 3072, threads, path});  // down_proj
      }
    }
  }
  b->Args({1, 3072, 1024, 1, 0});
}
BENCHMARK(BM_MatmulBf16)->Apply(MatmulArgs)->UseRealTime()->MinTime(0.3);

// FP8 weights (e4m3 + float32 128x128 block scales, kernels/matmul_fp8.h) at
// the same shapes as BM_MatmulBf16: half the weight bytes per call. Bytes
// counted: the e4m3 weights plus the scales. args as BM_MatmulBf16.
void BM_MatmulFp8(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const CpuPath path = static_cast<CpuPath>(state.range(4));
  if (!cpu_path_supported(path)) {
    state.SkipWithError("path not supported on this CPU");
    return;
  }
  const int64_t scales = ((N + 127) / 128) * ((K + 127) / 128);
  // note: as BM_MatmulBf16, enough copies (96 MiB) that every call streams from DRAM.
  const int copies = static_cast<int>(std::max<int64_t>(1, (96ll << 20) / (N * K)));
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::vector<float>> s;
  uint32_t r = 99;
  for (int c = 0; c < copies; ++c) {
    w.emplace_back(static_cast<size_t>(N * K));
    for (auto& b : w.back()) {
      r ^= r << 13, r ^= r >> 17, r ^= r << 5;
      b = static_cast<uint8_t>(r & 0xFF) == 0x7F ? 0 : static_cast<uint8_t>(r & 0xFF);
    }
    s.emplace_back(static_cast<size_t>(scales), 1e-4f);
  }
  auto x = random_vec(M * K, 1);
  std::vector<float> y(M * N);
  ThreadPool* pool = pool_for(threads);
  int c = 0;
  for (auto _ : state) {
    matmul_fp8_on_path(path, x.data(), K, w[c].data(), s[c].data(), 128, 128, y.data(), N, M, N, K,
                       pool);
    c = (c + 1) % copies;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * (N * K + scales * 4));
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * M * N * K,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_MatmulFp8)->Apply(MatmulArgs)->UseRealTime()->MinTime(0.3);

// avx512 against amx at Qwen3-0.6B shapes, lm_head
// included. args: M, N, K, threads, path (2 avx512, 3 amx).
// note: weights are made once per shape (cheap integer noise, bf16 of
// magnitude ~0.01-0.06) and shared by both paths and every M; enough copies
// that each call streams them from DRAM, as a decode step does.
const std::vector<std::vector<uint16_t>>& shared_weights(int64_t N, int64_t K) {
  static std::vector<std::pair<std::pair<int64_t, int64_t>, std::vector<std::vector<uint16_t>>>>
      cache;
  for (auto& [key, copies] : cache) {
    if (key.first == N && key.second == K) return copies;
  }
  // note: 640 MiB of copies: more than the 300 MiB L3 of the AMX host.
  const int copies = static_cast<int>(std::max<int64_t>(2, (640ll << 20) / (N * K * 2)));
  std::vector<std::vector<uint16_t>> w(copies);
  uint32_t s = 12345;
  for (auto& c : w) {
    c.resize(N * K);
    for (auto& v : c) {
      s ^= s << 13;
      s ^= s >> 17;
      s ^= s << 5;
      // sign, exponent 2^-7..2^-5, 7 random mantissa bits
      v = static_cast<uint16_t>(((s >> 31) << 15) | ((120u + (s >> 8) % 3) << 7) | (s & 0x7F));
    }
  }
  cache.emplace_back(std::make_pair(N, K), std::move(w));
  return cache.back().second;
}

void BM_MatmulPaths(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const CpuPath path = static_cast<CpuPath>(state.range(4));
  if (!cpu_path_supported(path)) {
    state.SkipWithError(("path not supported: missing " + cpu_path_missing(path)).c_str());
    return;
  }
  const auto& w = shared_weights(N, K);
  auto x = random_vec(M * K, 1);
  std::vector<float> y(M * N);
  ThreadPool* pool = pool_for(threads);
  size_t c = 0;
  for (auto _ : state) {
    matmul_on_path(path, x.data(), K, w[c].data(), DType::BF16, y.data(), N, M, N, K, pool);
    c = (c + 1) % w.size();
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * N * K * 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * M * N * K,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
void MatmulPathArgs(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}};
  for (auto& nk : shapes) {
    for (int64_t M : {1, 8, 32, 128, 512}) {
      for (int path : {2, 3}) b->Args({M, nk[0], nk[1], 2, path});
    }
  }
}
BENCHMARK(BM_MatmulPaths)->Apply(MatmulPathArgs)->UseRealTime()->MinTime(0.2);

// AMX tile-multiply ceiling on this machine now: 4 independent C tiles,
// TDPBF16PS on tiles held in registers (loads = 0), or with 4 tile loads
// per 4 multiplies from a buffer of buf_kib (the pattern of the amx matmul's
// inner loop: 16 KiB stays in L1, 512 KiB in L2). args: threads, loads,
// buf_kib. Raw bf16 GFLOP/s (16 x 16 x 32 x 2 per instruction); the amx
// matmul's useful share is 15/16 (one of 16 columns is padding) / 3 (parts).
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

__attribute__((noinline)) void amx_tdp_loop(int64_t iters, const char* buf, int64_t buf_bytes,
                                            bool loads) {
  AmxConfig cfg;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  __asm__ volatile(
      "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
      "tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7" ::);
  int64_t off = 0;
  const int64_t stride = 64;
  for (int64_t i = 0; i < iters; ++i) {
    if (loads) {
      const char* p = buf + off;
      __asm__ volatile(
          "tileloadd (%0,%1,1), %%tmm4\n\ttileloadd 1024(%0,%1,1), %%tmm5\n\t"
          "tileloadd 2048(%0,%1,1), %%tmm6\n\ttileloadd 3072(%0,%1,1), %%tmm7" ::"r"(p),
          "r"(stride)
          : "memory");
      off += 4096;
      if (off + 4096 > buf_bytes) off = 0;
    }
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
  __asm__ volatile("tilerelease" ::: "memory");
}

void BM_AmxTdpPeak(benchmark::State& state) {
  if (!cpu_path_supported(CpuPath::kAmx)) {
    state.SkipWithError(("needs AMX: missing " + cpu_path_missing(CpuPath::kAmx)).c_str());
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  const bool loads = state.range(1) != 0;
  const int64_t buf_bytes = state.range(2) << 10;
  ThreadPool* pool = pool_for(threads);
  std::vector<std::vector<char>> bufs(threads, std::vector<char>(buf_bytes, 0));
  const int64_t iters = 1 << 14;
  for (auto _ : state) {
    parallel_for_tid(pool, threads, [&](int64_t, int64_t, int tid) {
      amx_tdp_loop(iters, bufs[tid].data(), buf_bytes, loads);
    });
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * threads * iters * 4 * 16384.0,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AmxTdpPeak)
    ->Args({1, 0, 16})
    ->Args({2, 0, 16})
    ->Args({1, 1, 16})
    ->Args({1, 1, 512})
    ->Args({2, 1, 512})
    ->UseRealTime()
    ->MinTime(0.2);

// The same with other work between calls, as in a decode step (norms,
// attention): gap_us microseconds of AVX-512 FMAs on every thread after each
// matmul. args: M, N, K, path, gap_us (2 threads). Time per call includes
// the gap; compare the two paths at the same gap.
void BM_MatmulGap(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const CpuPath path = static_cast<CpuPath>(state.range(3));
  const int64_t gap_iters = state.range(4) * 400;  // ~2.4 GHz, 6 cycles per iteration
  if (!cpu_path_supported(path)) {
    state.SkipWithError(("path not supported: missing " + cpu_path_missing(path)).c_str());
    return;
  }
  const auto& w = shared_weights(N, K);
  auto x = random_vec(M * K, 1);
  std::vector<float> y(M * N), sink(2);
  ThreadPool* pool = pool_for(2);
  size_t c = 0;
  for (auto _ : state) {
    matmul_on_path(path, x.data(), K, w[c].data(), DType::BF16, y.data(), N, M, N, K, pool);
    c = (c + 1) % w.size();
    if (gap_iters > 0) {
      parallel_for_tid(pool, 2, [&](int64_t, int64_t, int tid) {
        sink[tid] += fma_chains(gap_iters, sink[tid]);
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * N * K * 2);
}
BENCHMARK(BM_MatmulGap)
    ->ArgsProduct({{1}, {1024, 3072}, {1024}, {2, 3}, {0, 20}})
    ->Args({1, 1024, 3072, 2, 0})
    ->Args({1, 1024, 3072, 3, 0})
    ->Args({1, 1024, 3072, 2, 20})
    ->Args({1, 1024, 3072, 3, 20})
    ->UseRealTime()
    ->MinTime(0.2);

// Paged attention: args num_seqs, q_len, ctx, threads, cold (Qwen3-0.6B:
// Hq 16, Hkv 8, D 128). cold = 1: calls rotate over copies of the cache
// (> L3 in all), so K and V come from DRAM as in a decode step, where a
// layer's cache was last touched a whole step (all weights) earlier.
void BM_PagedAttention(benchmark::State& state) {
  const int64_t seqs = state.range(0), q_len = state.range(1), ctx = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const bool cold = state.range(4) != 0;
  const int64_t Hq = 16, Hkv = 8, D = 128, bs = 16;
  const int64_t blocks_per = (ctx + bs - 1) / bs;
  const int64_t cache_floats = seqs * blocks_per * bs * Hkv * D;
  const int64_t copies = cold ? std::max<int64_t>(2, (128ll << 20) / (cache_floats * 8)) : 1;
  auto k = random_vec(cache_floats * copies, 1);
  auto v = random_vec(cache_floats * copies, 2);
  auto q = random_vec(seqs * q_len * Hq * D, 3);
  std::vector<float> out(q.size());
  std::vector<int32_t> table(seqs * blocks_per), q_start(seqs + 1),
      seq_len(seqs, static_cast<int32_t>(ctx));
  for (int64_t i = 0; i < seqs * blocks_per; ++i) table[i] = static_cast<int32_t>(i);
  for (int64_t s = 0; s <= seqs; ++s) q_start[s] = static_cast<int32_t>(s * q_len);
  AttentionBatch b{seqs, q_start.data(),   seq_len.data(), table.data(), blocks_per,
                   bs,   seqs * blocks_per};
  std::vector<float> scratch(paged_attention_scratch_floats(ctx, threads));
  ThreadPool* pool = pool_for(threads);
  int64_t c = 0;
  for (auto _ : state) {
    paged_attention(q.data(), Hq * D, k.data() + c * cache_floats, v.data() + c * cache_floats,
                    out.data(), Hq * D, b, Hq, Hkv, D, 0.088f, scratch.data(), pool);
    c = (c + 1) % copies;
  }
  // FLOPs: QK and PV, 2*D each per (query, key); causal prefill sees ~half.
  double keys = 0;
  for (int64_t i = 0; i < q_len; ++i) keys += ctx - q_len + i + 1;
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * seqs * Hq * keys * 4.0 * D,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * seqs * q_len, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PagedAttention)
    ->Args({1, 1, 512, 1, 0})
    ->Args({1, 1, 192, 1, 1})
    ->Args({32, 1, 192, 2, 0})
    ->Args({32, 1, 192, 1, 1})
    ->Args({1, 512, 512, 2, 0})
    ->Args({1, 512, 512, 1, 0})
    ->UseRealTime()
    ->MinTime(0.3);

// Gated delta rule, recurrent form: args T (tokens of one sequence), threads.
// Qwen3.5-0.8B: Hk = Hv = 16, Dk = Dv = 128.
void BM_GatedDeltaRule(benchmark::State& state) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const int64_t Hk = 16, Hv = 16, Dk = 128, Dv = 128;
  auto q = random_vec(T * Hk * Dk, 1, 0.08f), k = random_vec(T * Hk * Dk, 2, 0.08f);
  auto v = random_vec(T * Hv * Dv, 3);
  std::vector<float> g(T * Hv, -0.05f), beta(T * Hv, 0.5f), out(T * Hv * Dv);
  std::vector<float> st(Hv * Dk * Dv, 0.0f);
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    gated_delta_rule(q.data(), Hk * Dk, k.data(), Hk * Dk, v.data(), Hv * Dv, g.data(), beta.data(),
                     Hv, st.data(), out.data(), Hv * Dv, T, Hk, Hv, Dk, Dv, pool);
  }
  // ~8 flops per state element per token (decay, 3 multiply-adds).
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * T * Hv * Dk * Dv * 7.0,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * T, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GatedDeltaRule)
    ->Args({1, 1})
    ->Args({64, 1})
    ->Args({512, 1})
    ->Args({512, 2})
    ->UseRealTime()
    ->MinTime(0.3);

// note: a lower bound on the chunked (WY/UT) form of the gated delta rule:
// only its eight GEMMs per chunk and head, with our f32 matmul, for chunk
// length C = state.range(0) (Dk = Dv = 128, 16 heads). Left out: the
// triangular solve, cumulative decays, masks and transposes. If this bound is
// already slower per token than BM_GatedDeltaRule/512, the chunked form
// cannot beat the recurrent one on this CPU. Per chunk and head:
//   K K^T, Q K^T          [C x C], inner Dk
//   W = T (beta K), U = T (beta V), intra = (Q K^T) (U - W S)   [C x D], inner C
//   W S, Q S              [C x Dv], inner Dk
//   S += K^T (U - W S)    [Dk x Dv], inner C
void BM_GdnChunkedGemmLowerBound(benchmark::State& state) {
  const int64_t C = state.range(0), D = 128, heads = 16;
  auto a = random_vec(std::max(C, D) * std::max(C, D), 1);
  auto b = random_vec(std::max(C, D) * std::max(C, D), 2);
  std::vector<float> y(std::max(C, D) * std::max(C, D));
  const int64_t shapes[][3] = {{C, C, D}, {C, C, D}, {C, D, C}, {C, D, C},
                               {C, D, C}, {C, D, D}, {C, D, D}, {D, D, C}};  // M, N, K
  double flops = 0;
  for (auto& s : shapes) flops += 2.0 * s[0] * s[1] * s[2];
  for (auto _ : state) {
    for (int64_t h = 0; h < heads; ++h) {
      for (auto& s : shapes) {
        matmul(a.data(), s[2], b.data(), DType::F32, y.data(), s[1], s[0], s[1], s[2], nullptr);
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * heads * flops,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * C, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GdnChunkedGemmLowerBound)->Arg(32)->Arg(64)->UseRealTime()->MinTime(0.3);

// Causal conv1d of one prefill chunk: Qwen3.5-0.8B conv_dim = 2*16*128 + 16*128 = 6144, K = 4.
void BM_CausalConv1d(benchmark::State& state) {
  const int64_t T = state.range(0), C = 6144, K = 4;
  auto x = random_vec(T * C, 1), w = random_vec(C * K, 2);
  std::vector<float> st(C * (K - 1), 0.0f), y(T * C);
  for (auto _ : state) causal_conv1d(x.data(), C, T, C, w.data(), K, st.data(), y.data(), C, true);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * T, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CausalConv1d)->Arg(1)->Arg(512)->UseRealTime();

void BM_Rmsnorm(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = 1024;
  auto x = random_vec(rows * cols, 1), w = random_vec(cols, 2);
  std::vector<float> y(rows * cols);
  for (auto _ : state) rmsnorm(x.data(), cols, w.data(), y.data(), cols, rows, cols, 1e-6f);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * cols * 8);
}
BENCHMARK(BM_Rmsnorm)->Arg(1)->Arg(512)->UseRealTime();

void BM_Swiglu(benchmark::State& state) {
  const int64_t T = state.range(0), I = 3072;
  auto gu = random_vec(T * 2 * I, 1);
  std::vector<float> out(T * I);
  for (auto _ : state) swiglu(gu.data(), 2 * I, out.data(), I, T, I);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * T * I);
}
BENCHMARK(BM_Swiglu)->Arg(1)->Arg(512)->UseRealTime();

void BM_Rope(benchmark::State& state) {
  const int64_t T = state.range(0), H = 16, D = 128;
  auto x = random_vec(T * H * D, 1);
  std::vector<int32_t> pos(3 * T);
  for (int64_t i = 0; i < 3 * T; ++i) pos[i] = static_cast<int32_t>(i % T);
  for (auto _ : state) rope_apply(x.data(), T, H, D, H * D, pos.data(), D, 1e6, nullptr, 0, false);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * T);
}
BENCHMARK(BM_Rope)->Arg(1)->Arg(512)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
