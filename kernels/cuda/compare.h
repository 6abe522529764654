// Bitwise comparison of two device matrices, without copying them to the
// host (Gemm's verification of alternate algorithms).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qtk::cuda {

// Adds to *count (device memory) the number of 16-bit words that differ
// between a and b over `rows` rows of row_bytes bytes each, row r starting
// at byte r * pitch_bytes of both. row_bytes and pitch_bytes must be even and
// a, b 2-byte aligned (every f32 or bf16 matrix is). An ordinary launch on
// `stream`: it runs after the work queued before it; no synchronisation.
void count_differing_words(const void* a, const void* b, int64_t rows, int64_t row_bytes,
                           int64_t pitch_bytes, unsigned long long* count, cudaStream_t stream);

}  // namespace qtk::cuda
