// Microbenchmarks of the CUDA kernels (issue 9). Times with CUDA events around
// kReps launches (manual time), reports GB/s of the bytes each kernel must
// move and TFLOP/s for GEMMs; BM_Copy measures the device-to-device copy
// ceiling (bytes read + written) in the same run, to compare against.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/tuning.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gdn_chunked.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv_mma.h"
#include "kernels/cuda/warp_matmul.h"

namespace {

using qtk::DType;
using bf16 = __nv_bfloat16;
namespace qc = qtk::cuda;

constexpr int kReps = 20;

// Device buffer filled with random values in [-1, 1) (never zeros: zeros can
// run faster than real data).
template <class T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t count, float lo = -1.0f, float hi = 1.0f) : n(count) {
    QTK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    // A random pattern of up to 1M elements, tiled (filling 1 GiB from the
    // host generator would take seconds).
    std::vector<T> h(std::min<size_t>(n, size_t(1) << 20));
    std::mt19937 rng(static_cast<uint32_t>(count));
    std::uniform_real_distribution<float> d(lo, hi);
    for (auto& x : h) x = static_cast<T>(d(rng));
    for (size_t off = 0; off < n; off += h.size())
      QTK_CUDA_CHECK(cudaMemcpy(p + off, h.data(), std::min(h.size(), n - off) * sizeof(T),
                                cudaMemcpyHostToDevice));
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
};

// Captures kReps calls of fn in a CUDA graph and times its replays with
// events: the device time of the kernels, without host launch overhead (the
// decode step runs as a graph too).
// With use_graph false, the kReps calls are launched eagerly (the copy
// ceiling: a graph's memcpy node measured 2.44 TB/s where an eager
// cudaMemcpyAsync measured 3.00 TB/s on the H100).
void time_kernel(benchmark::State& state, const std::function<void(cudaStream_t)>& fn,
                 bool use_graph = true) {
  cudaStream_t s;
  QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  QTK_CUDA_CHECK(cudaEventCreate(&a));
  QTK_CUDA_CHECK(cudaEventCreate(&b));
  fn(s);  // warm-up outside the graph: module load, GEMM plan creation
  QTK_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (use_graph) {
    QTK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kReps; ++i) fn(s);
    QTK_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    QTK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    QTK_CUDA_CHECK(cudaGraphLaunch(exec, s));
    QTK_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  for (auto _ : state) {
    QTK_CUDA_CHECK(cudaEventRecord(a, s));
    if (use_graph) {
      QTK_CUDA_CHECK(cudaGraphLaunch(exec, s));
    } else {
      for (int i = 0; i < kReps; ++i) fn(s);
    }
    QTK_CUDA_CHECK(cudaEventRecord(b, s));
    QTK_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    QTK_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    state.SetIterationTime(ms / 1e3 / kReps);
  }
  QTK_CUDA_CHECK(cudaGetLastError());
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
}

void set_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void set_flops(benchmark::State& state, double flops) {
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Copy(benchmark::State& state) {
  const size_t bytes = size_t(1) << 30;
  Buf<uint8_t> src(bytes, 0, 255), dst(bytes, 0, 255);
  time_kernel(
      state,
      [&](cudaStream_t s) {
        QTK_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s));
      },
      /*use_graph=*/false);
  set_bytes(state, 2.0 * bytes);  // read + write
}
BENCHMARK(BM_Copy)->UseManualTime()->Unit(benchmark::kMicrosecond);

// GEMM y[M,N] = x[M,K] w[N,K]^T. Args: M, N, K, bf16 (1) or f32 (0), and
// the M whose cuBLASLt heuristic fixes the algorithm (128 is what
// the models use; 1 measures the decode-first alternative).
void BM_Gemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const bool bf = state.range(3) == 1;
  const int64_t ref_m = state.range(4);
  static qc::Gemm gemm_128(128), gemm_1(1);
  qc::Gemm& gemm = ref_m == 1 ? gemm_1 : gemm_128;
  const size_t es = bf ? 2 : 4;
  void *x, *w, *y;
  QTK_CUDA_CHECK(cudaMalloc(&x, M * K * es));
  QTK_CUDA_CHECK(cudaMalloc(&w, N * K * es));
  QTK_CUDA_CHECK(cudaMalloc(&y, M * N * es));
  {
    Buf<float> xr(M * K), wr(N * K);
    if (bf) {
      qc::convert_f32_to_bf16(xr.p, static_cast<bf16*>(x), M * K, nullptr);
      qc::convert_f32_to_bf16(wr.p, static_cast<bf16*>(w), N * K, nullptr);
    } else {
      QTK_CUDA_CHECK(cudaMemcpy(x, xr.p, M * K * 4, cudaMemcpyDeviceToDevice));
      QTK_CUDA_CHECK(cudaMemcpy(w, wr.p, N * K * 4, cudaMemcpyDeviceToDevice));
    }
    QTK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const DType t = bf ? DType::BF16 : DType::F32;
  try {
    time_kernel(state, [&](cudaStream_t s) { gemm.run(x, K, w, K, y, N, M, N, K, t, t, s); });
    set_flops(state, 2.0 * M * N * K);
    set_bytes(state, double(es) * (M * K + N * K + M * N));
    state.SetLabel(gemm.describe(N, K, K, K, N, t, t));
  } catch (const std::exception& e) {
    // An algorithm fixed from another M's heuristic may refuse this M.
    cudaGetLastError();
    state.SkipWithError(e.what());
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}
// Qwen3-0.6B projections (qkv 4096x1024, gate_up 6144x1024, down 1024x3072,
// lm_head 151936x1024) at decode and prefill M; Qwen3-8B gate_up; the peak.
BENCHMARK(BM_Gemm)
    ->ArgsProduct({{1, 32, 128, 512}, {4096, 6144}, {1024}, {1}, {128}})
    ->Args({1, 1024, 3072, 1, 128})
    ->Args({128, 1024, 3072, 1, 128})
    ->Args({512, 1024, 3072, 1, 128})
    ->Args({1, 151936, 1024, 1, 128})
    ->Args({128, 151936, 1024, 1, 128})
    ->Args({1, 24576, 4096, 1, 128})
    ->Args({128, 24576, 4096, 1, 128})
    ->Args({512, 24576, 4096, 1, 128})
    ->ArgsProduct({{32, 64, 256}, {24576}, {4096}, {1}, {128}})
    ->ArgsProduct({{32, 64, 128, 256, 512}, {6144}, {4096}, {1}, {128}})
    ->ArgsProduct({{32, 64, 128, 256, 512}, {4096}, {12288}, {1}, {128}})
    ->ArgsProduct({{128, 512}, {1536}, {2048}, {1}, {128}})
    ->Args({8192, 8192, 8192, 1, 128})
    ->Args({1, 6144, 1024, 0, 128})
    ->Args({128, 6144, 1024, 0, 128})
    ->Args({512, 6144, 1024, 0, 128})
    ->ArgsProduct({{1, 128, 512}, {4096, 6144}, {1024}, {1}, {1}})
    ->Args({1, 1024, 3072, 1, 1})
    ->Args({512, 1024, 3072, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The own skinny product (gemv_mma.cu) alone. Args: M, N, K, warps per
// block. note: each call reads another copy of the weights (>= 128 MB in
// all), so the weights come from DRAM as in a decode step, never from the
// 50 MB L2 left warm by the previous call.
void BM_Gemv(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const int warps = static_cast<int>(state.range(3));
  const int64_t copies = std::max<int64_t>(1, ((int64_t{128} << 20) + N * K * 2 - 1) / (N * K * 2));
  Buf<float> xf(M * K), wf(N * K);
  bf16 *x, *w, *y;
  QTK_CUDA_CHECK(cudaMalloc(&x, M * K * 2));
  QTK_CUDA_CHECK(cudaMalloc(&w, copies * N * K * 2));
  QTK_CUDA_CHECK(cudaMalloc(&y, M * N * 2));
  qc::convert_f32_to_bf16(xf.p, x, M * K, nullptr);
  for (int64_t c = 0; c < copies; ++c) qc::convert_f32_to_bf16(wf.p, w + c * N * K, N * K, nullptr);
  QTK_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t call = 0;
  time_kernel(state, [&](cudaStream_t s) {
    qc::gemv_bf16<bf16>(x, K, w + (call++ % copies) * N * K, K, y, N, M, N, K, s, warps);
  });
  set_bytes(state, 2.0 * (M * K + N * K + M * N));
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}
// Qwen3-0.6B qkv, o, gate_up, down and a 16384-column lm_head block;
// Qwen3-8B gate_up and down.
BENCHMARK(BM_Gemv)
    ->ArgsProduct({{1}, {4096}, {1024}, {1, 2, 4}})
    ->ArgsProduct({{1}, {1024}, {2048}, {1, 2, 4}})
    ->ArgsProduct({{1}, {6144}, {1024}, {1, 2, 4}})
    ->ArgsProduct({{1}, {1024}, {3072}, {1, 2, 4}})
    ->ArgsProduct({{1}, {16384}, {1024}, {1, 2, 4}})
    ->ArgsProduct({{1, 8, 16}, {24576}, {4096}, {2}})
    ->Args({1, 4096, 12288, 2})
    ->Args({16, 6144, 1024, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The weight product of FP8 matrices and experts (kernels/cuda/warp_matmul.h)
// with bf16 activations: Args M, N, K, fp8 (0: bf16 weights), tensor cores
// (1: the mma form, kernels/cuda/mma_matmul.cuh; 0: the warp product,
// QTK_MMA_MATMUL=0). Weight copies rotate through >= 128 MB, so the weights
// come from DRAM as in a decode step; GB/s counts the weight bytes once.
void BM_WeightMatmul(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const bool fp8 = state.range(3) != 0;
  qtk::Tuning t = qtk::tuning();
  const qtk::Tuning saved = t;
  t.mma_matmul = state.range(4) != 0;
  qtk::set_tuning(t);
  const int64_t wbytes = N * K * (fp8 ? 1 : 2);
  const int64_t copies = std::max<int64_t>(1, ((int64_t{128} << 20) + wbytes - 1) / wbytes);
  Buf<float> xf(M * K), wf(N * K);
  bf16 *x, *wd = nullptr, *y;
  uint8_t* wq = nullptr;
  float* scale = nullptr;
  QTK_CUDA_CHECK(cudaMalloc(&x, M * K * 2));
  QTK_CUDA_CHECK(cudaMalloc(&y, M * N * 2));
  qc::convert_f32_to_bf16(xf.p, x, M * K, nullptr);
  const int64_t srows = (N + 127) / 128, scols = (K + 127) / 128;
  if (fp8) {
    // note: random bytes with the NaN codes (0x7F, 0xFF) cleared to 0x7E.
    std::vector<uint8_t> h(static_cast<size_t>(wbytes));
    std::mt19937 rng(7);
    for (auto& b : h) {
      b = static_cast<uint8_t>(rng());
      if ((b & 0x7F) == 0x7F) b &= 0xFE;
    }
    QTK_CUDA_CHECK(cudaMalloc(&wq, copies * wbytes));
    for (int64_t c = 0; c < copies; ++c)
      QTK_CUDA_CHECK(cudaMemcpy(wq + c * wbytes, h.data(), wbytes, cudaMemcpyHostToDevice));
    Buf<float> sc(copies * srows * scols, 0.01f, 0.1f);
    QTK_CUDA_CHECK(cudaMalloc(&scale, copies * srows * scols * 4));
    QTK_CUDA_CHECK(cudaMemcpy(scale, sc.p, copies * srows * scols * 4, cudaMemcpyDeviceToDevice));
  } else {
    QTK_CUDA_CHECK(cudaMalloc(&wd, copies * wbytes));
    for (int64_t c = 0; c < copies; ++c)
      qc::convert_f32_to_bf16(wf.p, wd + c * N * K, N * K, nullptr);
  }
  QTK_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t call = 0;
  time_kernel(state, [&](cudaStream_t s) {
    const int64_t c = call++ % copies;
    qc::WeightRef<bf16> w;
    if (fp8) {
      w.fp8 = wq + c * wbytes;
      w.scale = scale + c * srows * scols;
      w.block_rows = 128;
      w.block_cols = 128;
    } else {
      w.dense = wd + c * N * K;
    }
    qc::warp_matmul<bf16, bf16>(x, K, w, y, N, M, N, K, s);
  });
  set_bytes(state, static_cast<double>(wbytes));
  set_flops(state, 2.0 * M * N * K);
  qtk::set_tuning(saved);
  cudaFree(x);
  cudaFree(y);
  cudaFree(wd);
  cudaFree(wq);
  cudaFree(scale);
}
// Qwen3-8B qkv (6144 x 4096), gate_up (24576 x 4096) and down (4096 x 12288);
// a Qwen3-30B-A3B expert's gate_up (1536 x 2048), bf16. The tensor-core
// form alone at the batched M (QTK_MMA_WIDE picks its form above 16 rows),
// next to BM_Gemm's bf16 products of the same shapes.
BENCHMARK(BM_WeightMatmul)
    ->ArgsProduct({{1, 16, 128}, {6144}, {4096}, {1}, {0, 1}})
    ->ArgsProduct({{1, 128}, {24576}, {4096}, {1}, {0, 1}})
    ->ArgsProduct({{1, 128}, {4096}, {12288}, {1}, {0, 1}})
    ->ArgsProduct({{1, 8, 64}, {1536}, {2048}, {0}, {0, 1}})
    ->ArgsProduct({{32, 64, 256, 512}, {6144, 24576}, {4096}, {1}, {1}})
    ->ArgsProduct({{32, 64, 256, 512}, {4096}, {12288}, {1}, {1}})
    ->ArgsProduct({{128, 512}, {1536}, {2048}, {0}, {1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Paged attention, decode: Args batch, context, head dim; Hq/Hkv 16/8 (D 128)
// or 8/2 (D 256); bf16 cache, block size 16.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t B = state.range(0), L = state.range(1), D = state.range(2);
  const int64_t hq = D == 128 ? 16 : 8, hkv = D == 128 ? 8 : 2, bs = 16;
  const int64_t nb = (L + bs - 1) / bs, blocks = B * nb;
  Buf<bf16> q(B * hq * D), kc(blocks * bs * hkv * D), vc(blocks * bs * hkv * D), out(B * hq * D);
  std::vector<int32_t> qs(B + 1), sl(B, static_cast<int32_t>(L)), bt(B * nb);
  for (int64_t i = 0; i <= B; ++i) qs[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < B * nb; ++i) bt[i] = static_cast<int32_t>((i * 7919) % blocks);
  int32_t *qsd, *sld, *btd;
  QTK_CUDA_CHECK(cudaMalloc(&qsd, qs.size() * 4));
  QTK_CUDA_CHECK(cudaMalloc(&sld, sl.size() * 4));
  QTK_CUDA_CHECK(cudaMalloc(&btd, bt.size() * 4));
  cudaMemcpy(qsd, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sld, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(btd, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice);
  qc::AttentionBatch b;
  b.num_seqs = B;
  b.q_start = qsd;
  b.seq_len = sld;
  b.block_table = btd;
  b.max_blocks = nb;
  b.block_size = bs;
  b.total_tokens = B;
  b.max_seq_len = L;
  // The split workspace, as the model gives it (decode rows over key tiles).
  Buf<float> partials(qc::attention_partials_floats(B * hq, D));
  b.partials = partials.p;
  b.partial_rows = B * hq;
  time_kernel(state, [&](cudaStream_t s) {
    qc::paged_attention<bf16>(q.p, hq * D, kc.p, vc.p, out.p, hq * D, b, hq, hkv, D,
                              1.0f / std::sqrt(float(D)), s);
  });
  set_bytes(state, 2.0 * B * L * hkv * D * 2);  // K and V once each
  cudaFree(qsd);
  cudaFree(sld);
  cudaFree(btd);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{1, 32, 128}, {192, 1024}, {128, 256}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Paged attention, prefill of one prompt: Args tokens, head dim.
void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t T = state.range(0), D = state.range(1);
  const int64_t hq = D == 128 ? 16 : 8, hkv = D == 128 ? 8 : 2, bs = 16, nb = (T + bs - 1) / bs;
  Buf<bf16> q(T * hq * D), kc(nb * bs * hkv * D), vc(nb * bs * hkv * D), out(T * hq * D);
  std::vector<int32_t> qs = {0, static_cast<int32_t>(T)}, sl = {static_cast<int32_t>(T)}, bt(nb);
  for (int64_t i = 0; i < nb; ++i) bt[i] = static_cast<int32_t>(i);
  int32_t *qsd, *sld, *btd;
  QTK_CUDA_CHECK(cudaMalloc(&qsd, 8));
  QTK_CUDA_CHECK(cudaMalloc(&sld, 4));
  QTK_CUDA_CHECK(cudaMalloc(&btd, nb * 4));
  cudaMemcpy(qsd, qs.data(), 8, cudaMemcpyHostToDevice);
  cudaMemcpy(sld, sl.data(), 4, cudaMemcpyHostToDevice);
  cudaMemcpy(btd, bt.data(), nb * 4, cudaMemcpyHostToDevice);
  qc::AttentionBatch b;
  b.num_seqs = 1;
  b.q_start = qsd;
  b.seq_len = sld;
  b.block_table = btd;
  b.max_blocks = nb;
  b.block_size = bs;
  b.total_tokens = T;
  b.max_seq_len = T;
  time_kernel(state, [&](cudaStream_t s) {
    qc::paged_attention<bf16>(q.p, hq * D, kc.p, vc.p, out.p, hq * D, b, hq, hkv, D,
                              1.0f / std::sqrt(float(D)), s);
  });
  set_flops(state, 4.0 * hq * D * (T * (T + 1) / 2.0));  // QK^T and PV, causal
  state.counters["tok/s"] =
      benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(qsd);
  cudaFree(sld);
  cudaFree(btd);
}
BENCHMARK(BM_AttentionPrefill)
    ->Args({512, 128})
    ->Args({512, 256})
    ->Args({2048, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Gated delta rule: Args sequences, tokens per sequence; Qwen3.5-0.8B heads
// (Hk = Hv = 16, Dk = Dv = 128), bf16 activations, f32 state.
void BM_GatedDeltaRule(benchmark::State& state) {
  const int64_t S = state.range(0), n = state.range(1), T = S * n;
  const int64_t hk = 16, hv = 16, dk = 128, dv = 128;
  Buf<bf16> q(T * hk * dk, -0.08f, 0.08f), k(T * hk * dk, -0.08f, 0.08f), v(T * hv * dv),
      out(T * hv * dv);
  Buf<float> g(T * hv, -0.5f, -0.01f), beta(T * hv, 0.1f, 0.9f), st(S * hv * dk * dv, -0.1f, 0.1f);
  std::vector<int32_t> qs(S + 1), sl(S);
  for (int64_t i = 0; i <= S; ++i) qs[i] = static_cast<int32_t>(i * n);
  for (int64_t i = 0; i < S; ++i) sl[i] = static_cast<int32_t>(i);
  int32_t *qsd, *sld;
  QTK_CUDA_CHECK(cudaMalloc(&qsd, qs.size() * 4));
  QTK_CUDA_CHECK(cudaMalloc(&sld, sl.size() * 4));
  cudaMemcpy(qsd, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sld, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice);
  time_kernel(state, [&](cudaStream_t s) {
    qc::gated_delta_rule<bf16>(q.p, hk * dk, k.p, hk * dk, v.p, hv * dv, g.p, beta.p, st.p, sld,
                               qsd, S, T, out.p, hv * dv, hk, hv, dk, dv, s);
  });
  set_bytes(state, 2.0 * S * hv * dk * dv * 4 + double(T) * (2 * hk * dk + 2 * hv * dv) * 2);
  state.counters["tok/s"] =
      benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(qsd);
  cudaFree(sld);
}
BENCHMARK(BM_GatedDeltaRule)
    ->Args({1, 1})
    ->Args({32, 1})
    ->Args({128, 1})
    ->Args({1, 512})
    ->Args({8, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The chunked GDN kernel on the same shapes as BM_GatedDeltaRule (Qwen3.5-0.8B
// heads): Args sequences, tokens per sequence (a multiple of 64: all chunks full).
void BM_GatedDeltaRuleChunked(benchmark::State& state) {
  const int64_t S = state.range(0), n = state.range(1), T = S * n;
  const int64_t hk = 16, hv = 16, dk = 128, dv = 128;
  Buf<bf16> q(T * hk * dk, -0.08f, 0.08f), k(T * hk * dk, -0.08f, 0.08f), v(T * hv * dv),
      out(T * hv * dv);
  Buf<float> g(T * hv, -0.5f, -0.01f), beta(T * hv, 0.1f, 0.9f), st(S * hv * dk * dv, -0.1f, 0.1f);
  const int64_t per = n / qc::kGdnChunk, total = S * per;
  std::vector<int32_t> first(S), start(S + 1), sl(S);
  for (int64_t i = 0; i < S; ++i) {
    first[i] = static_cast<int32_t>(i * n);
    sl[i] = static_cast<int32_t>(i);
  }
  for (int64_t i = 0; i <= S; ++i) start[i] = static_cast<int32_t>(i * per);
  int32_t* d;
  QTK_CUDA_CHECK(cudaMalloc(&d, (3 * S + 1) * 4));
  cudaMemcpy(d, sl.data(), S * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d + S, first.data(), S * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d + 2 * S, start.data(), (S + 1) * 4, cudaMemcpyHostToDevice);
  void* ws;
  QTK_CUDA_CHECK(cudaMalloc(&ws, qc::gdn_chunked_workspace_bytes(total, hv, dk)));
  time_kernel(state, [&](cudaStream_t s) {
    qc::gated_delta_rule_chunked(q.p, hk * dk, k.p, hk * dk, v.p, hv * dv, g.p, beta.p, st.p, d,
                                 d + S, d + 2 * S, S, total, ws, out.p, hv * dv, hk, hv, dk, dv, s);
  });
  set_bytes(state, 2.0 * S * hv * dk * dv * 4 + double(T) * (2 * hk * dk + 2 * hv * dv) * 2);
  state.counters["tok/s"] =
      benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(d);
  cudaFree(ws);
}
BENCHMARK(BM_GatedDeltaRuleChunked)
    ->Args({1, 512})
    ->Args({8, 512})
    ->Args({64, 128})  // a prefill step of 64 prompts of 128 tokens (batch 128 e2e)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Conv1d (C = 6144, K = 4, Qwen3.5-0.8B): Args sequences, tokens per sequence,
// 1 to force the two-kernel form on short runs (0: the form causal_conv1d picks).
void BM_Conv1d(benchmark::State& state) {
  const int64_t S = state.range(0), n = state.range(1), T = S * n, C = 6144, K = 4;
  const int64_t max_run = state.range(2) != 0 ? std::max(n, qc::kConvShortRunMax + 1) : n;
  Buf<bf16> x(T * C), y(T * C);
  Buf<float> w(C * K), st(S * C * (K - 1));
  std::vector<int32_t> qs(S + 1), sl(S);
  for (int64_t i = 0; i <= S; ++i) qs[i] = static_cast<int32_t>(i * n);
  for (int64_t i = 0; i < S; ++i) sl[i] = static_cast<int32_t>(i);
  int32_t *qsd, *sld;
  QTK_CUDA_CHECK(cudaMalloc(&qsd, qs.size() * 4));
  QTK_CUDA_CHECK(cudaMalloc(&sld, sl.size() * 4));
  cudaMemcpy(qsd, qs.data(), qs.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(sld, sl.data(), sl.size() * 4, cudaMemcpyHostToDevice);
  time_kernel(state, [&](cudaStream_t s) {
    qc::causal_conv1d<bf16>(x.p, C, y.p, C, C, w.p, K, st.p, sld, qsd, S, T, max_run, true, s);
  });
  set_bytes(state, 2.0 * T * C * 2 + 2.0 * S * C * (K - 1) * 4);
  cudaFree(qsd);
  cudaFree(sld);
}
BENCHMARK(BM_Conv1d)
    ->Args({1, 1, 0})
    ->Args({1, 1, 1})
    ->Args({128, 1, 0})
    ->Args({128, 1, 1})
    ->Args({1, 512, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Fused residual add + RMSNorm, bf16: Args rows, hidden.
void BM_AddRmsNorm(benchmark::State& state) {
  const int64_t R = state.range(0), H = state.range(1);
  Buf<bf16> r(R * H), x(R * H), y(R * H);
  Buf<float> w(H, 0.5f, 1.5f);
  time_kernel(state, [&](cudaStream_t s) {
    qc::add_rmsnorm<bf16>(r.p, H, x.p, H, w.p, y.p, H, R, H, 1e-6f, s);
  });
  set_bytes(state, 4.0 * R * H * 2);  // read r, x; write r, y
}
BENCHMARK(BM_AddRmsNorm)
    ->Args({1, 1024})
    ->Args({128, 1024})
    ->Args({4096, 1024})
    ->Args({4096, 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_Swiglu(benchmark::State& state) {
  const int64_t T = state.range(0), I = state.range(1);
  Buf<bf16> gu(T * 2 * I), out(T * I);
  time_kernel(state, [&](cudaStream_t s) { qc::swiglu<bf16>(gu.p, 2 * I, out.p, I, T, I, s); });
  set_bytes(state, 3.0 * T * I * 2);
}
BENCHMARK(BM_Swiglu)
    ->Args({128, 3072})
    ->Args({4096, 3072})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// q/k norm + M-RoPE in place (Qwen3.5-0.8B attention: 8 heads of 256, rotary 64).
void BM_QkNormRope(benchmark::State& state) {
  const int64_t T = state.range(0), H = 8, D = 256;
  Buf<bf16> x(T * H * D);
  Buf<float> w(D, 0.5f, 1.5f);
  std::vector<int32_t> pos(3 * T);
  for (int64_t i = 0; i < 3 * T; ++i) pos[i] = static_cast<int32_t>(i % T);
  int32_t* pd;
  QTK_CUDA_CHECK(cudaMalloc(&pd, pos.size() * 4));
  cudaMemcpy(pd, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice);
  qc::RopeParams p;
  p.rotary_dim = 64;
  p.theta = 1e7;
  p.sections[0] = 11;
  p.sections[1] = 11;
  p.sections[2] = 10;
  p.n_sections = 3;
  p.interleaved = true;
  time_kernel(state, [&](cudaStream_t s) {
    qc::qk_norm_rope<bf16>(x.p, H * D, T, H, D, w.p, 1e-6f, pd, p, s);
  });
  set_bytes(state, 2.0 * T * H * D * 2);
  cudaFree(pd);
}
BENCHMARK(BM_QkNormRope)->Arg(128)->Arg(4096)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_Argmax(benchmark::State& state) {
  const int64_t R = state.range(0), V = 151936;
  Buf<float> logits(R * V, -10, 10), margin(R);
  Buf<int32_t> ids(R, 0, 1);
  time_kernel(state,
              [&](cudaStream_t s) { qc::argmax_rows(logits.p, V, R, V, ids.p, margin.p, s); });
  set_bytes(state, 4.0 * R * V);
}
BENCHMARK(BM_Argmax)->Arg(1)->Arg(128)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
