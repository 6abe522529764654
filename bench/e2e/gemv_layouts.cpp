// gemv_layouts: M = 1 bf16 matmul read patterns on this machine
// (bench/RESULTS.md): a plain AVX-512 read of the buffer, the
// HF-layout 6-row tile with and without software prefetch (the kernel
// before the tile order), and the tile-order layout (kernels/matmul_tiled.h) with and
// without prefetch, each over 768 MiB so every byte comes from memory; and
// the tile-order loop reading x from a 4 KiB window (wrong arithmetic,
// timing only: shows the cost of the x row leaving L1 at K = 3072).
//
//   gemv_layouts [K=1024] [threads=1] [hugepages=1]   → one line per variant, GB/s
//
// note: standalone on purpose (its own copies of the loops, not the
// library's), so that variants can differ in one thing only.
#include <immintrin.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static inline __m512 ldw(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline float red(__m512 v) { return _mm512_reduce_add_ps(v); }

// Prefetches bytes [0, n) of p, one line per 64 bytes; HINT 0:T0 1:T1 2:NTA.
template <int HINT>
static inline void prefetch_lines(const char* p, int n) {
  for (int b = 0; b < n; b += 64) {
    if (HINT == 0)
      _mm_prefetch(p + b, _MM_HINT_T0);
    else if (HINT == 1)
      _mm_prefetch(p + b, _MM_HINT_T1);
    else
      _mm_prefetch(p + b, _MM_HINT_NTA);
  }
}

// PF: prefetch distance in tiles (0 = none); HINT 0:T0 1:T1 2:NTA
template <int NR, int PF, int HINT>
void gemv(const float* x, const uint16_t* w, float* y, int64_t n0, int64_t n1, int64_t K) {
  for (int64_t n = n0; n + NR <= n1; n += NR) {
    __m512 acc[NR];
    for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
    const uint16_t* t = w + n * K;
    const char* next = (const char*)(t + PF * NR * K);
    for (int64_t k = 0; k < K; k += 16, next += NR * 32) {
      if (PF) prefetch_lines<HINT>(next, NR * 32);
      __m512 xv = _mm512_loadu_ps(x + k);
      for (int j = 0; j < NR; ++j) acc[j] = _mm512_fmadd_ps(xv, ldw(t + j * K + k), acc[j]);
    }
    for (int j = 0; j < NR; ++j) y[n + j] = red(acc[j]);
  }
}

// tile-order layout: tile t of NR rows stored as [K/16][NR][16]
template <int NR, int PFB, int HINT>
void gemvp(const float* x, const uint16_t* w, float* y, int64_t n0, int64_t n1, int64_t K) {
  for (int64_t n = n0; n + NR <= n1; n += NR) {
    __m512 acc[NR];
    for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
    const uint16_t* t = w + n * K;
    for (int64_t k = 0; k < K; k += 16, t += NR * 16) {
      if (PFB) prefetch_lines<HINT>((const char*)t + PFB, NR * 32);
      __m512 xv = _mm512_loadu_ps(x + k);
      for (int j = 0; j < NR; ++j) acc[j] = _mm512_fmadd_ps(xv, ldw(t + j * 16), acc[j]);
    }
    for (int j = 0; j < NR; ++j) y[n + j] = red(acc[j]);
  }
}

template <int NR>
void gemvp_smallx(const float* x, const uint16_t* w, float* y, int64_t n0, int64_t n1, int64_t K) {
  for (int64_t n = n0; n + NR <= n1; n += NR) {
    __m512 acc[NR];
    for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
    const uint16_t* t = w + n * K;
    for (int64_t k = 0; k < K; k += 16, t += NR * 16) {
      __m512 xv = _mm512_loadu_ps(x + (k & 1023));
      for (int j = 0; j < NR; ++j) acc[j] = _mm512_fmadd_ps(xv, ldw(t + j * 16), acc[j]);
    }
    for (int j = 0; j < NR; ++j) y[n + j] = red(acc[j]);
  }
}
// sequential sum probe (avx512)
void probe(const float*, const uint16_t* w, float* y, int64_t n0, int64_t n1, int64_t K) {
  const __m512i* p = (const __m512i*)(w + n0 * K);
  const __m512i* e = (const __m512i*)(w + n1 * K);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (; p + 4 <= e; p += 4) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 1));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 2));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 3));
  }
  y[n0] = (float)_mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

using Fn = void (*)(const float*, const uint16_t*, float*, int64_t, int64_t, int64_t);

int main(int argc, char** argv) {
  const bool help = argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
  int64_t K = argc > 1 ? atoll(argv[1]) : 1024;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  int huge = argc > 3 ? atoi(argv[3]) : 1;
  if (help || argc > 4 || K < 48 || K > (int64_t{1} << 20) || threads < 1 || threads > 1024) {
    std::fprintf(help ? stdout : stderr,
                 "usage: gemv_layouts [K=1024, 48..2^20] [threads=1] [hugepages=1]: GB/s of M = 1 "
                 "bf16 read patterns\n");
    return help ? 0 : 1;
  }
  size_t bytes = size_t(768) << 20;
  int64_t N = bytes / 2 / K / 48 * 48;
  bytes = N * K * 2;
  uint16_t* w = (uint16_t*)aligned_alloc(2 << 20, bytes);
  if (huge) madvise(w, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / 2; ++i) w[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 256);
  std::vector<float> x(K, 0.5f), y(N);
  struct V {
    const char* name;
    Fn fn;
  };
  V vs[] = {
      {"probe", probe},
      {"HF nr6 pf1 T1", gemv<6, 1, 1>},
      {"nr6 none", gemv<6, 0, 1>},
      {"nr6 pf2 T1", gemv<6, 2, 1>},
      {"nr6 pf1 T0", gemv<6, 1, 0>},
      {"nr6 pf1 NTA", gemv<6, 1, 2>},
      {"nr4 pf1 T1", gemv<4, 1, 1>},
      {"nr4 none", gemv<4, 0, 1>},
      {"nr8 pf1 T1", gemv<8, 1, 1>},
      {"nr2 pf1 T1", gemv<2, 1, 1>},
      {"nr2 none", gemv<2, 0, 1>},
      {"nr6 pf3 T1", gemv<6, 3, 1>},
      {"packed6 none", gemvp<6, 0, 1>},
      {"packed6 pf 1K T0", gemvp<6, 1024, 0>},
      {"packed6 pf 2K T0", gemvp<6, 2048, 0>},
      {"packed6 pf 4K T1", gemvp<6, 4096, 1>},
      {"packed6 pf 12K T1", gemvp<6, 12288, 1>},
      {"packed6 pf 24K T1", gemvp<6, 24576, 1>},
      {"packed6 small x (wrong math)", gemvp_smallx<6>},
      {"packed6 nta 1K", gemvp<6, 1024, 2>},
      {"packed6 nta 4K", gemvp<6, 4096, 2>},
  };
  for (int rep = 0; rep < 3; ++rep) {
    for (auto& v : vs) {
      double best = 1e9;
      for (int it = 0; it < 3; ++it) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> th;
        for (int t = 1; t < threads; ++t)
          th.emplace_back([&, t] {
            int64_t a = N * t / threads / 48 * 48,
                    b = t + 1 == threads ? N : N * (t + 1) / threads / 48 * 48;
            v.fn(x.data(), w, y.data(), a, b, K);
          });
        v.fn(x.data(), w, y.data(), 0, threads == 1 ? N : N / threads / 48 * 48, K);
        for (auto& t : th) t.join();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      printf("K %ld thr %d huge %d %-22s %6.2f GB/s\n", K, threads, huge, v.name,
             bytes / best / 1e9);
    }
    printf("\n");
  }
}
