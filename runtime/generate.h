// The `generate` program's work, as a library call: read a prompt JSONL
// file, run every valid line through the scheduler, and write one result
// line per input line, in input order, each with a single write(2) so that a
// kill at any moment leaves only complete lines (which --resume continues).
// Where the results go and how they reach their name: runtime/results_file.h.
#pragma once

#include <cstdint>
#include <string>

namespace qtk {

inline constexpr int kMaxLogprobs = 20;

struct GenerateOptions {
  std::string model;           // X.pack
  std::string batch;           // prompts.jsonl
  std::string out;             // results.jsonl (meta: out + ".meta.json")
  std::string device = "cpu";  // cpu or cuda
  std::string precision;       // f32 or bf16; empty: f32 on cpu (its only one), bf16 on cuda
  int threads = 0;             // 0: all CPUs this process may use
  int64_t max_tokens = 0;      // 0: the pack's max_new_tokens, else 256
  bool ignore_eos = false;
  int64_t max_num_seqs = 64;
  int64_t max_batched_tokens = 512;
  int64_t block_size = 16;
  int64_t kv_cache_blocks = 0;                // 0: sized from the prompts and a memory budget
  int64_t kv_cache_bytes = int64_t{4} << 30;  // budget used when kv_cache_blocks == 0
  bool margins = false;
  int logprobs = 0;  // top-K (id, logprob) per step; 0: off
  bool progress = false;
  bool no_progress = false;  // never show the progress line, even on a terminal
  bool show = false;
  bool resume = false;
  bool force = false;                 // replace an existing --out
  bool allow_unknown_fields = false;  // ignore request fields generate does not know
  bool verify = true;                 // check every tensor's XXH64 at load
  std::string meta;                   // run header path; empty: out + ".meta.json"
  std::string shard;                  // "K/N" or "auto" (runtime/shard.h); empty: the whole batch
  int tensor_parallel = 1;            // ranks the model is split over (runtime/parallel)
  // --device cuda: --tune-only (tune every GEMM range, write the plan cache,
  // run no prompts). The plan cache file itself is tuning().plan_cache
  // (--plan-cache or QTK_PLAN_CACHE; core/tuning.h).
  bool tune_only = false;
  std::string chat_template;  // a Jinja file for "messages" lines; empty: the pack's template
};

// What a completed run did (for the one-line summary and the exit status).
struct GenerateSummary {
  int64_t lines = 0;         // input lines
  int64_t failed_lines = 0;  // lines that got an {"id", "error"} line
  int64_t resumed_after = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0.0;       // the generation loop
  double wall_seconds = 0.0;  // the whole run, load included
};

// Returns normally when the run completed (bad prompt lines are per-line
// errors, counted in failed_lines). Throws qtk::Error for bad flags, an
// unreadable pack or batch file, or an output that cannot be written / resumed.
GenerateSummary run_generate(const GenerateOptions& options);

// The one-line end-of-run summary printed on stderr.
std::string summary_line(const GenerateSummary& s);

// The checks run_generate makes before it loads the model, without loading
// it: the flags, the device, that the pack opens (checksums are not
// verified), that the batch file (unless --tune-only) is readable and not
// empty, the chat template file is readable, and that no output is an
// input. Throws qtk::Error as run_generate does. A `--devices` parent
// (runtime/data_parallel.h) calls it before starting its workers.
void check_generate_inputs(const GenerateOptions& options);

// The CPU threads a run uses by default: the CPUs this process may run on.
int default_thread_count();

}  // namespace qtk
