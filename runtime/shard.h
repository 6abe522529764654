// Sharded batch jobs: which input lines one task of a job array runs
// (`generate --shard K/N`), and the checks and interleaving of `merge`.
//
// note: a shard takes the lines whose 0-based position modulo N is K
// (round robin), not a contiguous range: prompt lengths in a golden-file
// batch are often sorted or grouped, and round robin spreads long and short
// prompts evenly over the tasks. The merged file is the single run's file
// byte for byte, because a line's result does not depend on which other
// lines were scheduled with it (the runtime is batch-invariant).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/results_file.h"  // OutputsAtStart

namespace qtk {

struct ShardSpec {
  int64_t index = 0;  // K, 0-based
  int64_t count = 1;  // N
  // Whether 0-based input line `line` belongs to this shard.
  bool owns(int64_t line) const { return line % count == index; }
  // How many of `total` lines this shard owns.
  int64_t lines_of(int64_t total) const {
    return total > index ? (total - index + count - 1) / count : 0;
  }
};

// Parses "K/N" (0 <= K < N <= 1,000,000) or "auto". "auto" reads the task
// index and count from the scheduler's environment, through `getenv`:
// Slurm job arrays (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of
// SLURM_ARRAY_TASK_COUNT) or Kubernetes Indexed Jobs (JOB_COMPLETION_INDEX
// of QTK_SHARD_COUNT, which the job manifest sets from its completions).
// Throws qtk::Error naming `flag` and what was found.
ShardSpec parse_shard(const std::string& flag, const std::string& text,
                      const std::function<const char*(const char*)>& getenv);

// The shard record of a results meta file.
nlohmann::json shard_json(const ShardSpec& s, int64_t lines_total, const std::string& batch_digest);

// merge OUT SHARD...: checks that the shards' meta files (SHARD.meta.json)
// come from one job (same pack digest, prompts digest, result-changing
// settings, shard count), that every shard of 0..N-1 is present once and
// complete with the line count it owns, then writes OUT (the lines in input
// order) and OUT.meta.json atomically. Also refused: OUT (or its meta file)
// being one of the shards' files, and a result line (not an error line)
// for an id that another result line already has. Throws qtk::Error naming
// the shard.
//
// With `as_shard` K/N the shards are the M sub-shards K + N*j (j = 0..M-1)
// of N*M that together own exactly shard K/N's lines (`generate --shard K/N
// --devices` spreads its shard that way): OUT is then shard K/N's results
// file, and its meta carries shard K/N's record, so `merge` takes it as
// that shard later.
struct MergeOptions {
  std::string out;
  std::string meta;  // OUT's run header; empty: OUT.meta.json
  std::vector<std::string> shards;
  bool force = false;  // replace an existing OUT
  // Take OUT.lock for the merge (generate's lock: a merge and a generate, or
  // two merges, never write one OUT at once); false where the caller holds it.
  bool lock = true;
  // What the final move may replace, recorded by a caller that holds
  // OUT.lock (lock = false) when it took it, having decided itself whether
  // an existing OUT may be replaced (a `generate --devices` parent: under
  // --resume the OUT that was there then, under --force anything). Without
  // it the merge records it when it takes the lock and refuses an existing
  // OUT unless `force`. Either way, without force a file that appears at
  // OUT or its header meanwhile is never replaced.
  std::optional<OutputsAtStart> at_start;
  // How the messages of a final move that fails name the work ("appeared
  // while merging (it was not there when the merge started)"; "generating":
  // "... when the run started").
  const char* doing = "merging";
  std::optional<ShardSpec> as_shard;
  nlohmann::json extra = nlohmann::json::object();  // top-level entries added to OUT's meta
};
// What run_merge wrote: the lines, and how many of them are error lines
// ({"id", "error"}: a prompt that failed; `merge` then exits 3, as generate
// does).
struct MergeResult {
  int64_t lines = 0;
  int64_t error_lines = 0;
};
MergeResult run_merge(const MergeOptions& options);

}  // namespace qtk
