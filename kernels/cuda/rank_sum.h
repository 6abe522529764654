// The fixed-order sum of tensor-parallel partial results: after an all-gather
// every rank holds the N ranks' partials as rows of one buffer, and each rank
// adds them up itself with the same kernel, so every rank gets the same bits.
//
// note: why not ncclAllReduce. NCCL chooses its algorithm (ring, tree, NVLS)
// and chunking by size and topology, and does not promise an order of the
// additions, so its sum may differ between ranks, runs, sizes and NCCL
// versions. Gathering the partials and summing them in rank order makes the
// result a function of the partials alone: identical on every rank, from run
// to run and whatever the machine. The cost is (N-1)*n elements more traffic
// than a reduce-scatter based all-reduce; for the activations of one step
// (a few MB at most) the launch latency dominates either way.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace qtk::cuda {

// out[i] = Act( ((g[0][i] + g[1][i]) + g[2][i]) + ... + g[ranks-1][i] ), i < n,
// where g[r][i] = gathered[r * n + i] converted to float32, every addition a
// float32 addition rounded to nearest, and the total rounded to Act once.
// Act = float or __nv_bfloat16. gathered: device [ranks][n] contiguous; out:
// device [n], must not overlap gathered. Any n >= 0 and ranks >= 1; rows
// whose start is 16-byte aligned (n a multiple of 16 / sizeof(Act) and both
// pointers 16-byte aligned) are read and written 16 bytes at a time. No
// allocation, no synchronisation: capturable in a CUDA graph.
template <class Act>
void sum_ranks(const Act* gathered, int64_t n, int ranks, Act* out, cudaStream_t s);

// The host statement of the same arithmetic (the tests compare sum_ranks to
// it bit for bit): one float32 accumulator per element, ranks in order.
// note: the accumulator starts at row 0's value rather than at 0.0f, so that
// one rank gives its input back unchanged (0.0f + -0.0f would be +0.0f); the
// kernel does the same.
template <class Act>
void sum_ranks_ref(const Act* gathered, int64_t n, int ranks, Act* out) {
  static_assert(std::is_same_v<Act, float> || std::is_same_v<Act, __nv_bfloat16>);
  auto to_f = [](Act x) -> float {
    if constexpr (std::is_same_v<Act, float>)
      return x;
    else
      return __bfloat162float(x);
  };
  for (int64_t i = 0; i < n; ++i) {
    float acc = to_f(gathered[i]);
    for (int r = 1; r < ranks; ++r) acc += to_f(gathered[static_cast<int64_t>(r) * n + i]);
    if constexpr (std::is_same_v<Act, float>)
      out[i] = acc;
    else
      out[i] = __float2bfloat16_rn(acc);
  }
}

}  // namespace qtk::cuda
