// Data parallel on one node: `generate --devices LIST` runs one worker
// process per device, each `generate --shard k/M` of the batch into a part
// file next to OUT, and merges the parts into OUT (runtime/shard.h's
// run_merge), byte-identical to a one-device run since the runtime is batch
// invariant.
//
//   OUT.part-k-of-M            worker k's results (a shard; its .meta.json,
//                              .partial and .lock as any generate output)
//   OUT, OUT.meta.json         written by the merge once every worker
//                              succeeded; the parts are then removed
//
// note: workers are processes, not threads of one process: each owns one
// GPU (CUDA_VISIBLE_DEVICES), its own CUDA context, plan cache use and
// memory, and a worker that fails or is killed leaves a part that
// `--resume` continues like any interrupted run. A worker gets SIGTERM when
// the parent dies (PR_SET_PDEATHSIG: also by SIGKILL, which the parent
// cannot forward), so no worker outlives it holding its part's lock.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/generate.h"

namespace qtk {

// The devices of `--devices TEXT`: "0,1,3" (distinct non-negative ordinals)
// or "all" (every CUDA device this process sees; --device cuda only).
// `cuda_count` is asked only on --device cuda (`all`, and to check that an
// ordinal exists). Throws qtk::Error naming --devices, what was expected and
// what was found.
std::vector<int> parse_devices(const std::string& text, const std::string& device,
                               const std::function<int()>& cuda_count);

// The CUDA_VISIBLE_DEVICES of a worker on CUDA device `ordinal`: the
// ordinal-th entry of the parent's CUDA_VISIBLE_DEVICES (`parent`, null when
// unset) so that ordinals count the devices the parent sees, else the
// ordinal itself.
std::string visible_device_of(int ordinal, const char* parent);

struct DataParallelJob {
  GenerateOptions options;  // the run's flags, as read_flags checked them
  std::vector<int> devices;
  // The command line's flags in order, as {name, argument} ("model",
  // "--model=x.pack"), --devices left out. Each worker gets them but for
  // those the parent sets per worker: --out, --meta, --shard, --progress,
  // --resume, --force, and on the CPU --threads.
  std::vector<std::pair<std::string, std::string>> flags;
};

// Runs the job and returns generate's exit status: 0, or 3 when some lines
// got an error line. One device: on the CPU, the run itself; on CUDA, this
// process becomes the run on that device (exec with CUDA_VISIBLE_DEVICES).
// Two or more refuse --out -, --batch - (or a pipe or FIFO) and --show.
// Throws qtk::Error for bad flags or inputs (before any worker starts, with
// no output written), for a worker that failed (naming its device and exit
// status, after the others finished; the parts stay for --resume), and when
// a signal stopped the run (it is forwarded to every worker first; the
// caller re-raises it, core/interrupt.h).
int run_data_parallel(const DataParallelJob& job);

// Refuses to start while OUT's directory holds parts of a --devices run over
// another number of devices (OUT.part-K-of-M..., M != `count`; a run without
// --devices is a run on 1): this run would neither finish nor remove them,
// and --resume would silently start over. note: never deleted, also not with
// --force: they may be the only copy of hours of results.
void refuse_parts_of_another_count(const std::string& out, int64_t count);

}  // namespace qtk
