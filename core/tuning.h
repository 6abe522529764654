// Every QTK_* tuning switch of the kernels and backends, in one struct read
// from the environment in one place (Tuning::from_environment) and reached
// through one process-wide accessor (tuning()).
//
// A switch unset or set to "" takes its default. Booleans accept 0 and 1
// only; a bad value is a qtk::Error naming the switch, the values it
// accepts and the text found. generate sets the process-wide value at start
// (set_tuning, with --plan-cache folded in) and writes it whole into the run
// header ("tuning"); other programs and the tests read the environment on
// first use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace qtk {

// Where a switch can change a token or a margin: nowhere, or only on the CPU
// or only on the CUDA device (--resume compares those of the run's device).
enum class TuningEffect { kNone, kCpuResults, kCudaResults };

// One switch as the run header records it.
struct TuningEntry {
  const char* name;                          // the environment variable
  std::variant<int64_t, std::string> value;  // numbers and 0/1 switches as integers
  TuningEffect effect;
};

struct Tuning {
  // Limits of the integer switches.
  static constexpr int kAmxPrefetchModes = 5;  // QTK_AMX_PREFETCH 0..4
  static constexpr int64_t kGemmRefMMax = 65536;
  static constexpr int64_t kFusedMaxMMax =
      16;  // the own GEMV kernel's rows (kernels/cuda/gemv_mma.h)

  // QTK_CPU_PATH: the CPU kernels' SIMD path: scalar | avx2 | avx512 | amx;
  // default "" = the best this CPU supports (kernels/cpu_features.h). A path
  // the CPU cannot run fails at its first use. Changes results (each path
  // has its own reduction order).
  std::string cpu_path;

  // QTK_AMX_PREFETCH: the AMX kernel's weight prefetch mode 0..4
  // (kernels/cpu/matmul_paths.h), default 1. Speed only.
  int amx_prefetch = 1;

  // QTK_TILED: 0 | 1, default 1: on the AVX-512 path, copy bf16 weights into
  // tile order at load (runtime/backend/cpu/tiled_weights.h). Speed and
  // load time only.
  bool tiled = true;

  // QTK_HUGEPAGES: 0 | 1, default 1: move the pack onto 2 MiB transparent
  // huge pages at load (Pack::load_for_cpu). Speed and load time only.
  bool hugepages = true;

  // QTK_GEMM_ALTS: 0 | 1, default 1: the faster GEMM algorithms per M range
  // (verified bit for bit against the plan algorithm on the real weights)
  // and the fused launches; 0 = one cuBLASLt algorithm per shape.
  bool gemm_alternates = true;

  // QTK_GEMM_REF_M: 1..65536, default 128: the M whose cuBLASLt heuristic
  // picks each shape's plan algorithm, the one that fixes the bits.
  int64_t gemm_ref_m = 128;

  // QTK_GEMM_SLICES: 1 | 4, default 4: the K slices of the bf16 -> bf16
  // products with K >= 2048 and N <= 2048 (kernels/cuda/gemm.h): 4 = each output is the
  // sum, in slice order, of 4 chains over K / 4, for every M; 1 = one chain
  // over K. Changes the CUDA bf16 results (another fixed order), never
  // their batch invariance.
  int gemm_slices = 4;

  // QTK_GEMM_FREE: 0 | 1, default 0. 1 = measurement only, NOT batch
  // invariant: every cuBLASLt product takes cuBLASLt's first heuristic
  // algorithm for the call's own M, split-K and a workspace allowed, and
  // none of the own skinny kernels runs (what an engine without the
  // invariance guarantee does); bench/cuda/RESULTS.md compares it with the
  // default. Changes results.
  bool gemm_free = false;

  // QTK_FUSED_MAX_M: 0..16, default 1: the largest M whose decode-step
  // residual add + RMSNorm runs as the next projection's prologue (0 = never).
  int64_t fused_max_m = 1;

  // QTK_MMA_MATMUL: 0 | 1, default 1: with bf16 activations, block-FP8
  // matrices and the experts' products on tensor cores (kernels/cuda/
  // mma_matmul.cuh); 0 = the CUDA-core warp product (warp_matmul.h). Each
  // is batch-invariant; their reduction orders differ, so it changes results.
  bool mma_matmul = true;

  // QTK_MMA_WIDE: 0 | 4 | 32 | 64 | 90, default 0: the tensor-core
  // product's form for more than 16 rows a group (kernels/cuda/
  // mma_matmul.cuh, mma_wgmma.cuh): 0 = chosen per shape, 32 or 64 = the
  // split kernel (its 4 K ranges side by side, 16 warps a block) with that
  // pass height, 4 = the 4-warp wide kernel, 90 = the warpgroup (wgmma)
  // kernel of compute capability 9.0 (elsewhere the per-shape choice). The
  // same sums: speed only.
  int mma_wide = 0;

  // QTK_GDN_CHUNKED: 0 | 1, default 1: Qwen3.5 prompts on CUDA through the
  // chunked gated delta rule; 0 = the recurrent form everywhere.
  bool gdn_chunked = true;

  // QTK_GDN_STATE_COLUMNS: 0 | 16 | 32, default 0 = chosen from the batch and
  // the GPU: the state columns per block of the chunked GDN. Speed only.
  int gdn_state_columns = 0;

  // QTK_PDL: 0 | 1, default 1: programmatic dependent launch (used on
  // compute capability 9.0 only). Speed only.
  bool pdl = true;

  // QTK_CUDA_GRAPHS: 0 | 1, default 1: decode steps replay CUDA graphs;
  // 0 = eager launches of the same kernels. Speed only.
  bool cuda_graphs = true;

  // QTK_PIPELINE: 0 | 1, default 1: the scheduler queues each greedy step on
  // the GPU before it takes the results of the step before (runtime/
  // scheduler.h); 0 = one step at a time. Speed only.
  bool pipeline = true;

  // QTK_MEM_AVAILABLE: bytes, default 0 = read from the system (/proc/meminfo's
  // MemAvailable, lowered to what the cgroup's memory.max leaves): the memory
  // generate may take on the CPU, which its default KV cache fits into
  // (runtime/generate.cpp, fit_cpu_cache). Speed only: the cache's size
  // decides when sequences are preempted, never a result.
  int64_t mem_available = 0;

  // QTK_PLAN_CACHE, the default of generate --plan-cache: the GEMM plan cache
  // file, "off" (none), default "" = a file per GPU and model under
  // $XDG_CACHE_HOME/qtk/plans or ~/.cache/qtk/plans. Start-up time only.
  std::string plan_cache;

  // Reads every switch through `getenv` (the process environment by
  // default); throws qtk::Error for a bad value.
  static Tuning from_environment(const std::function<const char*(const char*)>& getenv = nullptr);

  // Throws qtk::Error when a field is outside its allowed values (for
  // values set in code).
  void validate() const;

  // Every switch, in a fixed order, with its value and effect.
  std::vector<TuningEntry> entries() const;
};

// The names accepted by QTK_CPU_PATH, portable first (the same names as
// kernels/cpu_features.h's cpu_path_name).
extern const char* const kTuningCpuPaths[4];

// The table of switches for a program's --help.
std::string tuning_help();

// The process-wide switches: set_tuning's value, else the environment read
// at the first call (which may throw qtk::Error for a bad value).
const Tuning& tuning();

// Replaces the process-wide switches (validated first). Call it at program
// start: values some kernels read once (the CPU path, the AMX prefetch
// mode, PDL, the GDN state columns) do not change after their first use.
void set_tuning(const Tuning& t);

}  // namespace qtk
