// lt_algo_probe: every split-K-free cuBLASLt configuration (algorithm id x
// tile x stages) of a bf16 product shape, checked bit for bit against the
// shape's plan (Gemm::run) and timed with the weights out of L2, as in a
// decode step. It answers whether the heuristic's few candidates (the only
// ones Gemm::find_alternates considers) leave a faster bit-equal kernel out,
// for the M of batch-32 and batch-128 decode steps (issue 9).
//
// Usage: qtk_lt_algo_probe [M...] [--shape SUBSTRING]   (default: 32 128);
// shapes: the decode products of Qwen3-0.6B and Qwen3.5-0.8B. Also lists,
// per M, what the heuristic offers without workspace and whether each
// offer runs split-K-free and workspace-free at that M.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

std::vector<uint32_t> cap_list(const cublasLtMatmulAlgo_t& algo,
                               cublasLtMatmulAlgoCapAttributes_t a) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, a, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS ||
      bytes == 0)
    return {0};
  std::vector<uint32_t> v(bytes / sizeof(uint32_t));
  cublasLtMatmulAlgoCapGetAttribute(&algo, a, v.data(), bytes, &bytes);
  return v;
}

int probe(int argc, char** argv) {
  std::vector<int64_t> ms;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--shape" && i + 1 < argc)
      only = argv[++i];
    else
      ms.push_back(std::atoll(argv[i]));
  }
  if (ms.empty()) ms = {32, 128};
  const Shape shapes[] = {{"qwen3-0.6b qkv", 4096, 1024},       {"qwen3-0.6b o_proj", 1024, 2048},
                          {"qwen3-0.6b gate_up", 6144, 1024},   {"qwen3-0.6b down", 1024, 3072},
                          {"qwen3.5-0.8b gate_up", 7168, 1024}, {"qwen3.5-0.8b down", 1024, 3584},
                          {"lm_head block", 16384, 1024}};
  qtk::cuda::Gemm gemm;
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
  cudaStream_t stream;
  QTK_CUDA_CHECK(cudaStreamCreate(&stream));
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  constexpr size_t kFlush = size_t{64} << 20;
  void* flush = nullptr;
  QTK_CUDA_CHECK(cudaMalloc(&flush, kFlush));
  cudaEvent_t e0, e1;
  QTK_CUDA_CHECK(cudaEventCreate(&e0));
  QTK_CUDA_CHECK(cudaEventCreate(&e1));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);

  int ids[512];
  int nids = 0;
  cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                           CUDA_R_16BF, CUDA_R_16BF, 512, ids, &nids);
  std::printf("%d algorithm ids:", nids);
  for (int i = 0; i < nids; ++i) std::printf(" %d", ids[i]);
  std::printf("\n");

  for (const Shape& s : shapes) {
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    std::vector<__nv_bfloat16> wh(static_cast<size_t>(s.n * s.k)),
        xh(static_cast<size_t>(max_m * s.k));
    for (auto& v : wh) v = __float2bfloat16(nd(rng) * 0.05f);
    for (auto& v : xh) v = __float2bfloat16(nd(rng));
    void *w, *x, *y0, *y1;
    QTK_CUDA_CHECK(cudaMalloc(&w, wh.size() * 2));
    QTK_CUDA_CHECK(cudaMalloc(&x, xh.size() * 2));
    QTK_CUDA_CHECK(cudaMalloc(&y0, static_cast<size_t>(max_m * s.n) * 2));
    QTK_CUDA_CHECK(cudaMalloc(&y1, static_cast<size_t>(max_m * s.n) * 2));
    QTK_CUDA_CHECK(cudaMemcpy(w, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
    QTK_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    // The plan (and its verified alternates) at the largest M settles first.
    gemm.run(x, s.k, w, s.k, y0, s.n, max_m, s.n, s.k, qtk::DType::BF16, qtk::DType::BF16, stream);
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::printf("\n== %s N %ld K %ld: %s\n", s.name, static_cast<long>(s.n), static_cast<long>(s.k),
                gemm.describe(s.n, s.k, s.k, s.k, s.n, qtk::DType::BF16, qtk::DType::BF16).c_str());

    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatrixLayout_t la;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k);

    for (const int64_t m : ms) {
      cublasLtMatrixLayout_t lb, lc;
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k);
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.n, m, s.n);
      auto timed = [&](auto&& run) {
        run();
        float total = 0;
        constexpr int kRuns = 10;
        for (int i = 0; i < kRuns; ++i) {
          QTK_CUDA_CHECK(cudaMemsetAsync(flush, i, kFlush, stream));
          QTK_CUDA_CHECK(cudaEventRecord(e0, stream));
          run();
          QTK_CUDA_CHECK(cudaEventRecord(e1, stream));
          QTK_CUDA_CHECK(cudaEventSynchronize(e1));
          float ms_ = 0;
          QTK_CUDA_CHECK(cudaEventElapsedTime(&ms_, e0, e1));
          total += ms_;
        }
        return 1000.0f * total / kRuns;
      };
      {
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        const uint64_t zero = 0;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &zero,
                                             sizeof(zero));
        cublasLtMatmulHeuristicResult_t res[24];
        int found = 0;
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 24, res, &found);
        std::printf("M %ld heuristic (no workspace): %d offers:", static_cast<long>(m), found);
        for (int i = 0; i < found; ++i) {
          cublasLtMatmulAlgo_t a = res[i].algo;
          int id = -1, tile = -1, st = -1, sk = -1;
          size_t wr = 0;
          cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &wr);
          cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                               sizeof(tile), &wr);
          cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof(st),
                                               &wr);
          cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk),
                                               &wr);
          std::printf(" [algo %d tile %d stages %d splitk %d ws %zu]", id, tile, st, sk,
                      res[i].workspaceSize);
        }
        std::printf("\n");
        cublasLtMatmulPreferenceDestroy(pref);
      }
      std::vector<unsigned char> h0(static_cast<size_t>(m * s.n) * 2), h1(h0.size());
      gemm.run(x, s.k, w, s.k, y0, s.n, m, s.n, s.k, qtk::DType::BF16, qtk::DType::BF16, stream);
      QTK_CUDA_CHECK(cudaMemcpyAsync(h0.data(), y0, h0.size(), cudaMemcpyDeviceToHost, stream));
      QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
      const float plan_us = timed([&] {
        gemm.run(x, s.k, w, s.k, y1, s.n, m, s.n, s.k, qtk::DType::BF16, qtk::DType::BF16, stream);
      });
      const float alpha = 1.0f, beta = 0.0f;
      struct Hit {
        float us;
        int id;
        uint32_t tile, stages;
        uint16_t cluster;
      };
      std::vector<Hit> hits;
      int tried = 0, refused = 0, differ = 0;
      for (int i = 0; i < nids; ++i) {
        cublasLtMatmulAlgo_t base;
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                   CUDA_R_16BF, CUDA_R_16BF, ids[i],
                                   &base) != CUBLAS_STATUS_SUCCESS)
          continue;
        for (uint32_t tile : cap_list(base, CUBLASLT_ALGO_CAP_TILE_IDS))
          for (uint32_t stages : cap_list(base, CUBLASLT_ALGO_CAP_STAGES_IDS))
            for (uint16_t cluster : {uint16_t{0}, uint16_t{2}, uint16_t{3}, uint16_t{5}}) {
              cublasLtMatmulAlgo_t algo = base;
              const int32_t one = 1;
              const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                   sizeof(tile));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                   sizeof(stages));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                                   sizeof(one));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                   &none, sizeof(none));
              if (cluster != 0 && cublasLtMatmulAlgoConfigSetAttribute(
                                      &algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                      sizeof(cluster)) != CUBLAS_STATUS_SUCCESS)
                continue;
              ++tried;
              cublasLtMatmulHeuristicResult_t chk{};
              if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &algo, &chk) !=
                      CUBLAS_STATUS_SUCCESS ||
                  chk.workspaceSize != 0) {
                ++refused;
                continue;
              }
              QTK_CUDA_CHECK(cudaMemsetAsync(y1, 0xff, h1.size(), stream));
              if (cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y1, lc, y1, lc, &algo,
                                 nullptr, 0, stream) != CUBLAS_STATUS_SUCCESS) {
                ++refused;
                continue;
              }
              QTK_CUDA_CHECK(
                  cudaMemcpyAsync(h1.data(), y1, h1.size(), cudaMemcpyDeviceToHost, stream));
              QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
              if (std::memcmp(h0.data(), h1.data(), h0.size()) != 0) {
                ++differ;
                continue;
              }
              const float us = timed([&] {
                cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, y1, lc, y1, lc, &algo,
                               nullptr, 0, stream);
              });
              hits.push_back({us, ids[i], tile, stages, cluster});
            }
      }
      std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.us < b.us; });
      std::printf(
          "M %ld: plan (Gemm::run) %.2f us; %d configurations, %d refused, %d differ, %zu "
          "bit-equal; fastest:",
          static_cast<long>(m), plan_us, tried, refused, differ, hits.size());
      for (size_t i = 0; i < std::min<size_t>(6, hits.size()); ++i)
        std::printf(" [%.2f us algo %d tile %u stages %u cluster %u]", hits[i].us, hits[i].id,
                    hits[i].tile, hits[i].stages, hits[i].cluster);
      std::printf("\n");
      std::fflush(stdout);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(desc);
    QTK_CUDA_CHECK(cudaFree(w));
    QTK_CUDA_CHECK(cudaFree(x));
    QTK_CUDA_CHECK(cudaFree(y0));
    QTK_CUDA_CHECK(cudaFree(y1));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return probe(argc, argv);
  } catch (const std::exception& e) {  // a CUDA or cuBLASLt failure, with its call
    std::fprintf(stderr, "qtk_lt_algo_probe: %s\n", e.what());
    return 1;
  }
}
