// Bitwise comparison of two device matrices (compare.h).
#include <algorithm>

#include "kernels/cuda/compare.h"
#include "kernels/cuda/cuda_check.h"

namespace qtk::cuda {
namespace {

constexpr int kThreads = 256;

// Grid: x strides over a row's words, y over the rows; one atomic per thread
// that saw a difference.
__global__ void count_differing_words_kernel(const uint16_t* __restrict__ a,
                                             const uint16_t* __restrict__ b, int64_t rows,
                                             int64_t row_words, int64_t pitch_words,
                                             unsigned long long* count) {
  unsigned long long differ = 0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint16_t* ar = a + r * pitch_words;
    const uint16_t* br = b + r * pitch_words;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < row_words;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x)
      differ += ar[c] != br[c];
  }
  if (differ != 0) atomicAdd(count, differ);
}

}  // namespace

void count_differing_words(const void* a, const void* b, int64_t rows, int64_t row_bytes,
                           int64_t pitch_bytes, unsigned long long* count, cudaStream_t stream) {
  if (rows <= 0 || row_bytes <= 0) return;
  if (row_bytes % 2 != 0 || pitch_bytes % 2 != 0 || pitch_bytes < row_bytes)
    fail_message("count_differing_words: row_bytes and pitch_bytes must be even, pitch >= row");
  const int64_t row_words = row_bytes / 2;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((row_words + kThreads - 1) / kThreads, 64)),
      static_cast<unsigned>(std::min<int64_t>(rows, 1024)));
  count_differing_words_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(a),
                                                              static_cast<const uint16_t*>(b), rows,
                                                              row_words, pitch_bytes / 2, count);
  QTK_CUDA_CHECK_LAUNCH();
}

}  // namespace qtk::cuda
