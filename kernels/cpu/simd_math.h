// Portable, vectorisable float math used by the element-wise kernels
// (internal to qtk_kernels).
//
// note: determinism across ISAs: these functions use only +, -, *, /,
// comparisons and bit casts, each rounded separately (the library is built
// with -ffp-contract=off), so the compiler's choice of SSE, AVX2 or AVX-512
// for a loop (see QTK_CLONES) cannot change a single bit of the result.
#pragma once

#include <cstdint>
#include <cstring>

// Builds a function for several ISAs and picks one at load time (GCC ifunc).
// Only for loops whose lanes are independent (see the note above).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(QTK_NO_CLONES)
#define QTK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define QTK_CLONES
#endif

namespace qtk::cpu {

// exp(x) for float, max error about 2 ulp (checked in tests/kernels), no
// libm call so that loops over it vectorise. Inputs below -87.3 give about
// 1e-38 instead of a denormal or 0, inputs above 88.3 saturate to exp(88.3).
__attribute__((always_inline)) inline float exp_poly(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  float kf = x * 1.44269504f;
  int32_t ki = static_cast<int32_t>(kf + (kf >= 0.0f ? 0.5f : -0.5f));
  float k = static_cast<float>(ki);
  // Cody-Waite: ln2 = hi + lo, hi with few mantissa bits so k*hi is exact.
  float r = x - k * 0.693145752f;
  r = r - k * 1.42860682e-6f;
  // Taylor series of exp on |r| <= 0.35, Horner form (degree 7).
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t bits = static_cast<uint32_t>(ki + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

__attribute__((always_inline)) inline float sigmoid_poly(float x) {
  return 1.0f / (1.0f + exp_poly(-x));
}

__attribute__((always_inline)) inline float silu_poly(float x) { return x / (1.0f + exp_poly(-x)); }

}  // namespace qtk::cpu
