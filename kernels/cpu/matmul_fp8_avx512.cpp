// AVX-512 FP8 matmul path (compiled with -mavx512f -mavx512bw -mavx512vl -mfma).
// note: see matmul_paths.h for why nothing here may be shared with other files.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/matmul_fp8_paths.h"

namespace qtk::cpu {

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 4;  // rows of x per register tile
constexpr int kMaxCols = 6;  // weight rows (output columns) per register tile
constexpr int64_t kColumnBlock = 96;
// note: tiles, blocks, the k order and the lane tree are those of the
// f32-weight tile in matmul_avx512.cpp, so every output has that path's
// arithmetic; only the weight load differs.

// note: decoding 16 e4m3 bytes. Sign-extending a byte b to 32 bits and
// shifting left by 20 puts its 7 exponent+mantissa bits at float bits 20..26
// and copies of its sign at bits 27..31; masking with 0x87F00000 keeps the
// sign at bit 31. Read as a float that is e4m3(b) * 2^-120 exactly, for
// normal values (exponent field e -> e) and subnormals alike (mantissa m at
// exponent field 0 is the float subnormal m * 2^-129 = (m * 2^-9) * 2^-120).
// So e4m3(b) * s = raw * (s * 2^120): for |s| < 2^8 the factor s * 2^120 is
// an exact finite float (a power-of-two scaling), and the one multiply rounds
// the same real number fp8 x s once, as the scalar path's lut[b] * s does.
// For larger scales (big_scales) the decode first multiplies by 2^120
// (exact) and then by s: the same single rounding, one more multiply.
// Bytes 0x7F / 0xFF (NaN in e4m3fn) are set to NaN explicitly.
inline __m512 decode_raw(__m128i bytes) {
  const __m512i v = _mm512_slli_epi32(_mm512_cvtepi8_epi32(bytes), 20);
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0x87F00000u))));
}

template <bool kBig>
inline __m512 weight(__m128i bytes, __m512 s) {
  const __m512 raw = decode_raw(bytes);
  __m512 w;
  if constexpr (kBig) {
    w = _mm512_mul_ps(_mm512_mul_ps(raw, _mm512_set1_ps(0x1p120f)), s);
  } else {
    w = _mm512_mul_ps(raw, s);
  }
  // note: the NaN test on the 16 bytes (xmm ops, cheaper than on the
  // widened zmm lanes).
  const __mmask16 nan =
      _mm_cmpeq_epi8_mask(_mm_and_si128(bytes, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
  return _mm512_mask_blend_ps(nan, w, _mm512_set1_ps(__builtin_nanf("")));
}

inline float reduce16(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

struct Args {
  const float* x;
  int64_t ldx;
  const uint8_t* wq;
  const float* scale;
  int64_t sld, br, bc;
  float* y;
  int64_t ldy, K;
};

template <bool kBig, int MR, int NR>
void tile(const Args& a, const float* x, float* y, int64_t n) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int64_t K = a.K;
  const uint8_t* w0 = a.wq + n * K;
  const float* srow[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) srow[j] = a.scale + ((n + j) / a.br) * a.sld;
  // note: the next tile's rows are prefetched into L2 while this one
  // computes, as in matmul_avx512.cpp (changes no arithmetic).
  const char* next = reinterpret_cast<const char*>(w0 + NR * K);
  constexpr int64_t kNextBytesPerStep = NR * kLanes;
  for (int64_t kb = 0; kb < K; kb += a.bc) {
    const float f = kBig ? 1.0f : 0x1p120f;
    __m512 s[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) s[j] = _mm512_set1_ps(srow[j][kb / a.bc] * f);
    const int64_t ke = kb + a.bc < K ? kb + a.bc : K;
    int64_t k = kb;
    for (; k + kLanes <= ke; k += kLanes, next += kNextBytesPerStep) {
      for (int64_t b = 0; b < kNextBytesPerStep; b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
      __m512 wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        wv[j] =
            weight<kBig>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w0 + j * K + k)), s[j]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        __m512 xv = _mm512_loadu_ps(x + i * a.ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
    if (k < ke) {
      // note: the K tail (only in the last block): masked lanes get weight
      // +0 and x +0, as the f32 path's masked loads give, so each adds +0.
      const __mmask16 mask = static_cast<__mmask16>((1u << (ke - k)) - 1u);
      __m512 wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        wv[j] = _mm512_maskz_mov_ps(mask,
                                    weight<kBig>(_mm_maskz_loadu_epi8(mask, w0 + j * K + k), s[j]));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * a.ldx + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * a.ldy + n + j] = reduce16(acc[i][j]);
  }
}

using TileFn = void (*)(const Args&, const float*, float*, int64_t);

template <bool kBig, int MR>
TileFn tile_for_cols(int nr) {
  switch (nr) {
    case 1:
      return tile<kBig, MR, 1>;
    case 2:
      return tile<kBig, MR, 2>;
    case 3:
      return tile<kBig, MR, 3>;
    case 4:
      return tile<kBig, MR, 4>;
    case 5:
      return tile<kBig, MR, 5>;
    default:
      return tile<kBig, MR, 6>;
  }
}

template <bool kBig>
TileFn tile_for(int mr, int nr) {
  switch (mr) {
    case 1:
      return tile_for_cols<kBig, 1>(nr);
    case 2:
      return tile_for_cols<kBig, 2>(nr);
    case 3:
      return tile_for_cols<kBig, 3>(nr);
    default:
      return tile_for_cols<kBig, 4>(nr);
  }
}

template <bool kBig>
void cols(const Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  for (int64_t nb = n_begin; nb < n_end; nb += kColumnBlock) {
    const int64_t ne = nb + kColumnBlock < n_end ? nb + kColumnBlock : n_end;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int mr = static_cast<int>(M - m < kMaxRows ? M - m : kMaxRows);
      for (int64_t n = nb; n < ne; n += kMaxCols) {
        const int nr = static_cast<int>(ne - n < kMaxCols ? ne - n : kMaxCols);
        tile_for<kBig>(mr, nr)(a, a.x + m * a.ldx, a.y + m * a.ldy, n);
      }
    }
  }
}

}  // namespace

void matmul_fp8_cols_avx512(const float* x, int64_t ldx, const uint8_t* wq, const float* scale,
                            int64_t sld, int64_t br, int64_t bc, float* y, int64_t ldy, int64_t M,
                            int64_t K, int64_t n_begin, int64_t n_end, bool big_scales) {
  const Args a{x, ldx, wq, scale, sld, br, bc, y, ldy, K};
  if (big_scales) {
    cols<true>(a, M, n_begin, n_end);
  } else {
    cols<false>(a, M, n_begin, n_end);
  }
}

}  // namespace qtk::cpu
