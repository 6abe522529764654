// The one-time work of `generate --device cuda` that users wait for before
// the first token: the GEMM plan cache (plan_cache.h) that lets a run skip
// the tuning of its GEMM algorithms, and the start-up timings written to
// the run header. No CUDA header here (generate.cpp includes it).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/backend/cuda/plan_cache.h"

namespace qtk {

class CudaModel;
class Model;
class Pack;

// Tunes every GEMM M range of the shape classes the model has met so far
// that is not decided yet (cuda::Gemm::tune_remaining), on a stream of its
// own; the model's work must be complete. For benchmarks that time steps
// after a warm-up: ranges are otherwise tuned when a step first needs them.
void tune_remaining_gemm_ranges(CudaModel& model);

// One run's use of the plan cache.
//   plan_cache "":    the default location, default_plan_cache_dir()/<key hash>.json
//   plan_cache "off": tune from scratch, read and write nothing
//   otherwise:        that file
// The constructor reads the file and hands its records to the model's Gemm
// (a missing, corrupt or foreign file: one line on stderr, then tuning as
// without a cache); save() writes what this run added. The cache never
// changes a result (cuda::Gemm::preload).
class CudaStartup {
 public:
  CudaStartup(CudaModel& model, const Pack& pack, const std::string& precision,
              const std::string& plan_cache);

  // generate --tune-only: runs one short synthetic request through the
  // model (a prefill step and a decode step, which meet every GEMM shape
  // class), then tunes every M range not decided yet, so that the file
  // covers any later run of this model shape; saves and says on stderr
  // what it did.
  void tune_only();
  // Its parts, for a tensor-parallel model whose ranks each hold a
  // CudaStartup: the synthetic request through `model` (the whole model,
  // whose ranks step together), then on each rank tune_remaining(), then on
  // rank 0 save_and_report().
  static void run_tuning_request(Model& model);
  bool tunes();  // the model has GEMM ranges to tune (alternate algorithms on)
  void tune_remaining();
  void save_and_report();

  // Writes the cache file when this run decided something the file did not
  // hold (merged with what the file holds now). A failure is a warning on
  // stderr, never an error of the run.
  void save();

  // The run header's "gemm_plan" (file, key, cached or tuned, counts) and
  // "startup" (seconds of context creation, upload, cache read, tuning,
  // graph capture) entries.
  nlohmann::json plan_meta() const;
  nlohmann::json startup_meta() const;
  // At the end of a run: save(), then both entries into the run header.
  void finish(nlohmann::json& meta);

  const std::string& path() const { return path_; }  // empty when off

 private:
  CudaModel& model_;
  std::string pack_digest_;
  std::string path_;        // the cache file; empty: not used
  std::string off_reason_;  // why no file is used
  PlanCacheKey key_;
  PlanCacheLoad load_;
  double read_seconds_ = 0;
  bool written_ = false;
  std::string write_error_;
};

}  // namespace qtk
