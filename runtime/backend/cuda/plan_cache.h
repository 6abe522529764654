// The GEMM plan cache: what the CUDA backend's GEMM tuning chose
// (kernels/cuda/gemm_plan.h: per shape class, the plan algorithm and, per M
// range, the alternate that serves it), kept in a JSON file so that a later
// run on the same GPU and software skips the search, the bit-equality
// verification and the timing of candidate algorithms.
//
// Plain host code (no CUDA): the file format, its validation, the key
// comparison and the atomic write. runtime/backend/cuda/cuda_startup.cpp fills the
// key from the device and moves records in and out of cuda::Gemm.
//
// File (format version 1):
//   {"format": "qtk-gemm-plans", "version": 1,
//    "key": {"gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
//            "driver": 12080, "cuda_runtime": 12090, "cublaslt": 120904,
//            "kernels": "<digest of the GEMM sources>", "ref_m": 128,
//            "model": "<architecture, precision and GEMM dimensions>"},
//    "tuned_on": {"pack_digest": "...", "tool_version": "0.1.0"},
//    "plans": [{"n": 3072, "k": 1024, "ldx": 1024, "ldw": 1024, "ldy": 3072,
//               "in": "BF16", "out": "BF16", "algo": "<128 hex digits>",
//               "ranges": [{"lo": 1, "hi": 16, "use": "own", "own_equal": true},
//                          {"lo": 2048, "hi": null, "use": "cublaslt",
//                           "algo": "<128 hex digits>", "own_equal": false}]}]}
// "algo" is a cublasLtMatmulAlgo_t's 8 uint64 words, each as 16 hex digits.
// "tuned_on" is information only: what tuning decides depends on the shapes,
// not on the weights' values (the equality check compares reduction orders),
// so one file serves every pack of the same model shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cuda/gemm_plan.h"

namespace qtk {

// Everything that can change which algorithms exist, what bits they give,
// or what the tuning decides. A file whose key differs in any field is not
// used.
struct PlanCacheKey {
  std::string gpu;                 // the device name
  std::string compute_capability;  // "9.0"
  int64_t driver = 0;              // cudaDriverGetVersion
  int64_t cuda_runtime = 0;        // cudaRuntimeGetVersion
  int64_t cublaslt = 0;            // cublasLtGetVersion
  std::string kernels;             // digest of the GEMM sources of this build (own kernel, rules)
  int64_t ref_m = 0;               // the M whose heuristic gives the plan algorithm
  std::string model;               // architecture, precision and GEMM dimensions
};

nlohmann::json plan_cache_key_json(const PlanCacheKey& key);

// The fields that differ, as "gpu: the file has \"A\", this run \"B\"; ...";
// empty when the keys are equal.
std::string plan_cache_key_mismatch(const PlanCacheKey& file, const PlanCacheKey& run);

// The file name (without directory) for a key: 16 hex digits of a hash of
// its fields, ".json".
std::string plan_cache_file_name(const PlanCacheKey& key);

// $XDG_CACHE_HOME/qtk/plans, else $HOME/.cache/qtk/plans; empty when
// neither variable is set (then there is no default location).
std::string default_plan_cache_dir();

struct PlanCacheContents {
  PlanCacheKey key;
  std::string pack_digest;   // of the pack tuning ran on (information)
  std::string tool_version;  // of the qtk that wrote it (information)
  std::vector<cuda::GemmPlanRecord> plans;
};

// Parses and validates a whole file; throws qtk::Error naming `path`, the
// field, what was expected and what was found. Nothing of an invalid file
// is used.
PlanCacheContents parse_plan_cache(std::string_view text, const std::string& path);
std::string serialize_plan_cache(const PlanCacheContents& contents);

// What a run takes from a cache file.
struct PlanCacheLoad {
  std::vector<cuda::GemmPlanRecord> plans;
  bool found = false;  // the file exists
  bool used = false;   // it parsed and its key matches: `plans` are its records
  std::string note;    // why it was not used (one line for stderr); empty when used
};

// Reads `path` for a run with `key`. Never throws for the file's content or
// absence: a missing, unreadable, corrupt or foreign file gives used =
// false and a note naming the file (the run then tunes from scratch).
PlanCacheLoad load_plan_cache(const std::string& path, const PlanCacheKey& key);

// Writes `contents` to `path` atomically: a temporary file in the same
// directory (created if missing), fsync, rename. Throws qtk::Error naming
// the path when it cannot.
void write_plan_cache(const std::string& path, const PlanCacheContents& contents);

}  // namespace qtk
