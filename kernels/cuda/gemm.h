// cuBLASLt matrix product with a fixed algorithm per shape class, so that the
// result of each row does not depend on how many rows are in the call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "core/dtype.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/gemv_mma.h"

namespace qtk::cuda {

class Gemm {
 public:
  // note: batch invariance. The algorithm (kernel, tile, stages, swizzle) of
  // a shape class (N, K, strides, dtypes) is chosen ONCE, from cuBLASLt's
  // heuristic for M = ref_m, and then used for every M. Split-K is disabled
  // (CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 1, reduction scheme NONE) and no
  // workspace is given, so no algorithm can split the K reduction across
  // blocks. Each output element is then reduced over K in the same order in
  // a 1-row call and in an M-row call (tested bit for bit in tests/cuda).
  // ref_m = 0: tuning().gemm_ref_m (QTK_GEMM_REF_M, default 128; core/tuning.h).
  // note: the algorithm is checked (cublasLtMatmulAlgoCheck) at M = 1 and
  // M = ref_m only. With ref_m = 128 every product of the tests (M up to
  // 512) and of the H100 end-to-end runs (M up to 8192) ran. ref_m = 1 is for
  // experiments: on the H100 its f32 algorithm refused M > 1 (status 15),
  // and for bf16 it was 9% faster at M = 1 but 22% slower at batch 128 and
  // 18% slower in prefill (bench/HISTORY.md, run 6).
  // note: speed without giving that up: a shape class may also hold a faster
  // algorithm for each of the M ranges 1..16, 17..64, 65..511, 512..2047 and
  // 2048.., each used only after it gave the plan algorithm's output bit for
  // bit on this GPU (gemm.cpp, verify_alternates). QTK_GEMM_ALTS=0 turns
  // them off.
  // note: K slices. slices = 4 (0: tuning().gemm_slices, QTK_GEMM_SLICES)
  // fixes another order for the bf16 -> bf16 products with K >= kSliceMinK
  // (K a multiple of 512) and N <= kSliceMaxN: each output is the sum, in slice order, of 4
  // chains over the K / 4 slices, for every M (cuBLASLt's plan algorithm on
  // the slices as one strided-batched call, then slice_sum; the own skinny
  // kernel with one warp per slice: gemv_mma.h). At decode the K chain, not
  // the weight bytes, bounds o_proj and down_proj at M = 1 (gemv_mma.cu);
  // slices cut the chain 4 times and put 4 times the warps on the product.
  // note: only narrow outputs: a chain of K / 16 steps at ~34 ns outlasts
  // the N x K x 2 weight bytes at ~3 TB/s only for N below ~3,000. Wider
  // products gain nothing at M = 1 (Qwen3-30B-A3B's qkv, N 5120 K 2048,
  // with the fused add + RMSNorm: 15.3 us sliced vs 13.5 us, ncu on an H100)
  // and would pay in prefill for the f32 slice products (4 x M x N x 4
  // bytes written and read: for a Qwen3-8B layer at M 8192, ~5 GB).
  explicit Gemm(int64_t ref_m = 0, int slices = 0);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[M, N] (row stride ldy) = x[M, K] (ldx) * w[N, K]^T (ldw), row-major,
  // w in the HF layout [out, in]. in: BF16 (x and w) or F32 (x and w);
  // out: F32, or BF16 with BF16 inputs. Accumulation and scaling in f32
  // (CUBLAS_COMPUTE_32F: no TF32 for f32 inputs). Pointers 16-byte aligned.
  void run(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int64_t m,
           int64_t n, int64_t k, DType in, DType out, cudaStream_t stream);

  // The decode step's "add, then norm, then project" in one launch: with
  // the normed rows h = rmsnorm(residual + delta) * weight (add_rmsnorm's
  // bits) and residual_out = residual + delta, y = h w^T. Only bf16 inputs,
  // M <= QTK_FUSED_MAX_M (default 1, at most 16), and a shape class (x
  // stride an.ldd) whose small-M range the own skinny kernel serves
  // bit-equal to the plan algorithm (gemv_mma.h); then
  // the output is bit for bit add_rmsnorm followed by run(). Returns false,
  // having launched nothing, otherwise (the caller runs the two steps).
  bool run_add_rmsnorm(const AddRmsNormInput& an, const void* w, int64_t ldw, void* y, int64_t ldy,
                       int64_t m, int64_t n, int64_t k, DType out, cudaStream_t stream);

  // run() on the own skinny kernel, whether or not it timed faster than the
  // plan algorithm, where it is bit-equal to it (M <= 16, bf16); false,
  // having launched nothing, otherwise. For a product right behind one of
  // the own launches: its weights stream in while that launch finishes
  // (PDL), which the per-shape timing of kernels alone does not see.
  bool run_own(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
               int64_t m, int64_t n, int64_t k, DType out, cudaStream_t stream);

  // The MLP's "project to gate and up, then SwiGLU" (gemv_swiglu_out_bf16):
  // act = swiglu(x w^T), w gate_up_proj bf16 [2 inter, k], act bf16 [m,
  // inter]. Only at M <= 16 and where the own skinny kernel serves the
  // gate_up product's shape class (n 2 inter, output stride ld_gate_up)
  // bit-equal to its plan algorithm; then act is bit for bit run() into a
  // gate_up buffer of stride ld_gate_up followed by swiglu. Returns false,
  // having launched nothing, otherwise. run_add_rmsnorm_swiglu_out: the same
  // behind the fused add + RMSNorm, at M <= QTK_FUSED_MAX_M.
  bool run_swiglu_out(const void* x, int64_t ldx, const void* w, int64_t ldw, void* act,
                      int64_t ldact, int64_t m, int64_t inter, int64_t k, int64_t ld_gate_up,
                      cudaStream_t stream);
  bool run_add_rmsnorm_swiglu_out(const AddRmsNormInput& an, const void* w, int64_t ldw, void* act,
                                  int64_t ldact, int64_t m, int64_t inter, int64_t k,
                                  int64_t ld_gate_up, cudaStream_t stream);

  // A short description of the algorithm fixed for a shape class (for logs).
  std::string describe(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in,
                       DType out);

  // ---- tuning that outlives the process (runtime/backend/cuda/plan_cache.h) ----
  // Each alternate M range is searched, verified and timed the first time a
  // call falls into it (outside graph capture). records() returns what was
  // decided so far (plus preloaded records not met yet); preload() hands
  // such records to a later process, whose ranges then skip the search. A
  // record applies only where this process picks the same plan algorithm and
  // cuBLASLt still accepts the recorded alternate; anything else is tuned
  // as without it (stats().records_stale counts those). Preloading never
  // changes a result: every choice it restores gave the plan algorithm's
  // bits when it was verified (gemm.cpp, apply_record).
  void preload(const std::vector<GemmPlanRecord>& records);
  std::vector<GemmPlanRecord> records() const;
  // Searches and verifies every range not decided yet, of every shape class
  // met so far, on the weights of its first call (generate --tune-only).
  void tune_remaining(cudaStream_t stream);
  const GemmTuneStats& stats() const { return stats_; }
  bool alternates() const { return alternates_; }  // false under QTK_GEMM_ALTS=0
  int64_t ref_m() const { return ref_m_; }
  int slices() const { return slices_; }
  // The K slices of a shape class's products (1 or slices()).
  int slices_for(int64_t n, int64_t k, DType in, DType out) const;
  static constexpr int64_t kSliceMinK = 2048;
  static constexpr int64_t kSliceMaxN = 2048;
  // QTK_GEMM_FREE (core/tuning.h): measurement only, not batch invariant.
  bool free_mode() const { return free_ != nullptr; }

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
  Plan& plan(int64_t n, int64_t k, int64_t ldx, int64_t ldw, int64_t ldy, DType in, DType out);
  void init_ranges(Plan& p);
  // Search (find_candidates) and verification (verify_range) of one range,
  // skipped inside a graph capture; tune_range does both and counts them.
  struct PlanAlt;  // one alternate M range of a Plan (gemm.cpp)
  void tune_range(Plan& p, PlanAlt& alt, const void* w, cudaStream_t stream);
  void find_candidates(Plan& p, PlanAlt& alt);
  void verify_range(Plan& p, PlanAlt& alt, const void* w, cudaStream_t stream);
  void apply_record(Plan& p, const GemmPlanRecord& r);
  // QTK_GEMM_FREE: the product on cuBLASLt's first heuristic algorithm for
  // this M (split-K and free_->work allowed), cached per shape and M.
  struct Free;
  void run_free(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy,
                int64_t m, int64_t n, int64_t k, DType in, DType out, cudaStream_t stream);
  // algo: a cublasLtMatmulAlgo_t (cuBLASLt's header stays out of this one).
  bool runs_over_range(Plan& p, const PlanAlt& alt, const void* algo);
  // y = the product of m rows on cuBLASLt algorithm `algo` (sliced plans:
  // the batched call into work_, then slice_sum); false if cuBLASLt refused.
  bool lt_run(Plan& p, const void* algo, const void* x, const void* w, void* y, int64_t m,
              cudaStream_t stream);
  // True when the own skinny kernel gave the plan algorithm's bits for the
  // small-M range holding m of this bf16 shape class (verifying it first).
  bool own_bit_equal(int64_t m, int64_t n, int64_t k, int64_t ldx, const void* w, int64_t ldw,
                     int64_t ldy, DType out, cudaStream_t stream);

  static constexpr int64_t kSmallMaxM = 16;   // the smallest alternate range: 1..16
  static constexpr int64_t kLargeMinM = 512;  // the prefill ranges: 512..2047 and
  static constexpr int64_t kHugeMinM = 2048;  // 2048..

  int64_t ref_m_;
  int slices_;
  void* work_ = nullptr;  // f32 slice products of sliced plans (kSliceWorkBytes, gemm.cpp)
  bool alternates_;
  int64_t fused_max_m_;     // QTK_FUSED_MAX_M: the fused add + RMSNorm launches only up to this M
  void* handle_ = nullptr;  // cublasLtHandle_t
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, GemmPlanRecord> presets_;  // preloaded, applied when the shape class is met
  GemmTuneStats stats_;
  std::unique_ptr<Free> free_;  // QTK_GEMM_FREE=1 only
};

}  // namespace qtk::cuda
