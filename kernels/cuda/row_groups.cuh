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
  // The groups were written two or more launches before this one on the
  // stream, not by the launch right before it: a block may read them (L2,
  // ld.cg) before its dependency wait. note: with PDL a launch starts only
  // once every block of the one before has passed its own wait, which
  // returns once the launch before that one has completed and its memory
  // is visible (kernels/cuda/launch.cuh).
  bool settled = false;
};

// The group of block row blockIdx.y (without offsets: group 0); false when
// the slot has no group. note: the group arrays are read through L2
// (ld.cg), never a stale L1 line, so that a block may read settled groups
// before its dependency wait.
__device__ __forceinline__ bool group_slot(const RowGroups& rg, int& grp) {
  grp = rg.offsets == nullptr ? 0 : __ldcg(rg.active + blockIdx.y);
  return grp >= 0;
}

// Group grp's rows r0 .. r1-1 (without offsets: 0 .. rows-1).
__device__ __forceinline__ void group_span(const RowGroups& rg, int grp, int& r0, int& r1) {
  r0 = rg.offsets == nullptr ? 0 : __ldcg(rg.offsets + grp);
  r1 = rg.offsets == nullptr ? rg.rows : __ldcg(rg.offsets + grp + 1);
}

// Both: the slot's group and its rows; false when the slot has no group.
__device__ __forceinline__ bool group_rows(const RowGroups& rg, int& grp, int& r0, int& r1) {
  if (!group_slot(rg, grp)) return false;
  group_span(rg, grp, r0, r1);
  return true;
}

}  // namespace qtk::cuda::dev
