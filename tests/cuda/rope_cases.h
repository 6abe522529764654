// The RoPE settings the GPU tests use: Qwen3's and Qwen3.5's.
#pragma once

#include "kernels/cuda/cuda_kernels.h"

namespace qtk::cuda::test {

// Qwen3-like RoPE: rotary 128, theta 1e6.
inline RopeParams plain_rope() {
  RopeParams p;
  p.rotary_dim = 128;
  p.theta = 1e6;
  return p;
}

// Qwen3.5-0.8B: head 256, partial 0.25 (rotary 64), theta 1e7, M-RoPE
// sections [11, 11, 10] interleaved.
inline RopeParams qwen35_mrope() {
  RopeParams p;
  p.rotary_dim = 64;
  p.theta = 1e7;
  p.sections[0] = 11;
  p.sections[1] = 11;
  p.sections[2] = 10;
  p.n_sections = 3;
  p.interleaved = true;
  return p;
}

}  // namespace qtk::cuda::test
