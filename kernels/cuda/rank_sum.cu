// The fixed-order sum of the ranks' partials (rank_sum.h).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rank_sum.h"

namespace qtk::cuda {
namespace {

using namespace dev;
constexpr int kThreads = 256;
// note: a grid-stride loop over at most this many blocks (8 per SM of an
// H100's 132 fill it); larger n loops instead of launching more blocks.
constexpr int64_t kMaxBlocks = 1056;

// V consecutive elements moved as one access (16 bytes when V > 1).
template <class Act, int V>
struct alignas(sizeof(Act) * V) Pack {
  Act v[V];
};

// Thread j handles elements [j*V, j*V + V) of every row; each element is
// summed by one thread over the ranks in order 0..ranks-1.
// note: __fadd_rn keeps every step a separate float32 addition rounded to
// nearest (never contracted with anything), the arithmetic of sum_ranks_ref.
template <class Act, int V>
__global__ void sum_ranks_kernel(const Act* __restrict__ gathered, int64_t n, int ranks,
                                 Act* __restrict__ out) {
  pdl_begin();
  using P = Pack<Act, V>;
  const int64_t groups = n / V;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < groups;
       j += stride) {
    const P first = reinterpret_cast<const P*>(gathered)[j];
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = to_f(first.v[k]);
    for (int r = 1; r < ranks; ++r) {
      const P x = reinterpret_cast<const P*>(gathered + static_cast<int64_t>(r) * n)[j];
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = __fadd_rn(acc[k], to_f(x.v[k]));
    }
    P o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_f<Act>(acc[k]);
    reinterpret_cast<P*>(out)[j] = o;
  }
}

template <class Act, int V>
void launch_sum_ranks(const Act* gathered, int64_t n, int ranks, Act* out, cudaStream_t s) {
  const int64_t groups = n / V;
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>(std::max<int64_t>((groups + kThreads - 1) / kThreads, 1), kMaxBlocks));
  launch_kernel(sum_ranks_kernel<Act, V>, blocks, kThreads, 0, s, gathered, n, ranks, out);
}

}  // namespace

template <class Act>
void sum_ranks(const Act* gathered, int64_t n, int ranks, Act* out, cudaStream_t s) {
  if (ranks < 1 || n < 0) fail_message("sum_ranks: needs ranks >= 1 and n >= 0");
  if (n == 0) return;
  // note: the 16-byte form needs every row start aligned, i.e. n a multiple
  // of the pack and both buffers 16-byte aligned (cudaMalloc gives 256);
  // other sizes take the one-element form, with the same arithmetic.
  constexpr int kVec = 16 / static_cast<int>(sizeof(Act));
  const bool vec = n % kVec == 0 && reinterpret_cast<uintptr_t>(gathered) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec)
    launch_sum_ranks<Act, kVec>(gathered, n, ranks, out, s);
  else
    launch_sum_ranks<Act, 1>(gathered, n, ranks, out, s);
}

template void sum_ranks<float>(const float*, int64_t, int, float*, cudaStream_t);
template void sum_ranks<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int, __nv_bfloat16*,
                                       cudaStream_t);

}  // namespace qtk::cuda
