// Where the rows of a grouped weight product come from (warp_matmul.cuh,
// mma_matmul.cuh): one group of `rows`, or the experts' groups of a
// mixture-of-experts block (kernels/cuda/moe.h).
#pragma once

#include <cstdint>

namespace qtk::cuda::dev {

// Where a block's rows come from.
struct RowGroups {
  const int32_t* offsets = nullptr;     // [G + 1] group g's rows; nullptr: one group of `rows`
  const int32_t* active = nullptr;      // [gridDim.y] the group of each block row; -1: none
  const int32_t* row_source = nullptr;  // x row of each row; nullptr: the row itself
  int rows = 0;                         // the rows (without offsets); with them, all groups' rows
};

}  // namespace qtk::cuda::dev
