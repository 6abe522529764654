// What Gemm's tuning decided for a shape class, as plain values that can be
// stored and read back (runtime/backend/cuda/plan_cache.h keeps them in a JSON file
// so that a later run skips the search). Host code only: no CUDA header, and
// C++17 (nvcc-compiled files may include it through gemm.h).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.h"

namespace qtk::cuda {

// A cuBLASLt algorithm (cublasLtMatmulAlgo_t: 8 x uint64, documented as
// trivially serializable for the same cuBLASLt version) as its bytes.
using LtAlgoBytes = std::array<uint64_t, 8>;

// The open end of the last M range.
inline constexpr int64_t kGemmOpenRangeEnd = std::numeric_limits<int64_t>::max();

// What serves one M range of a shape class.
struct GemmRangeChoice {
  enum class Use {
    kPlan,  // the plan algorithm (no faster bit-equal alternate was found)
    kLt,    // `algo`, a cuBLASLt alternate that gave the plan algorithm's bits
    kOwn,   // the project's skinny kernel (gemv_mma.h), bit-equal and faster
  };
  int64_t lo = 0, hi = 0;  // the M range (hi = kGemmOpenRangeEnd: open)
  Use use = Use::kPlan;
  LtAlgoBytes algo{};      // use == kLt only
  bool own_equal = false;  // the own kernel gave the plan algorithm's bits here (maybe slower)
};

// One shape class (Gemm's plan key) with the algorithm that serves every M
// and the M ranges tuning has decided.
struct GemmPlanRecord {
  int64_t n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0;
  DType in = DType::BF16, out = DType::BF16;
  LtAlgoBytes algo{};                   // the plan algorithm
  std::vector<GemmRangeChoice> ranges;  // decided ranges only; the rest are tuned when used
};

// What tuning cost and where its choices came from, for the run header.
struct GemmTuneStats {
  double seconds = 0;         // spent choosing algorithms (heuristics, checks, verification)
  int64_t ranges_tuned = 0;   // M ranges searched, verified and timed in this process
  int64_t ranges_cached = 0;  // M ranges taken from preloaded records
  int64_t records_stale = 0;  // preloaded records or ranges that did not apply (then tuned)
};

}  // namespace qtk::cuda
