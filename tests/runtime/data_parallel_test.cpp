// `generate --devices LIST` through the real program, on the CPU (one worker
// process per entry): the merged file is the single run's byte for byte, a
// --shard K/N spread over devices is that shard's file and meta, bad lists
// and combinations are refused with one line and no output, and a failed
// or interrupted fan-out leaves no OUT and finishes with --resume.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "kernels/cpu_features.h"
#include "runtime/data_parallel.h"
#include "tests/runtime/output_faults.h"
#include "tests/runtime/test_util.h"

namespace qtk::rt_test {
namespace {

namespace fs = std::filesystem;

// The golden prompts of a fixture model and a malformed line (its error
// line must land where the single run puts it).
std::string prompts_of(const std::string& model) {
  return golden_prompts(load_json(src(model + "/golden.json"))) + "not json\n";
}

// Files in the work directory whose names start with `prefix`.
std::vector<std::string> files_starting(const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(work_dir())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

size_t count_lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

struct Job {
  std::string pack, prompts, full;  // the single run's results: `full`
  int status = -1;
};

// A single run of a fixture model's golden prompts, once per process.
const Job& job_of(const std::string& model) {
  static std::map<std::string, Job> jobs;
  if (auto it = jobs.find(model); it != jobs.end()) return it->second;
  Job j;
  std::string tag = model;
  std::replace(tag.begin(), tag.end(), '/', '_');
  j.pack = pack_of(model);
  j.prompts = fmt::format("{}/dp_{}.jsonl", work_dir(), tag);
  write_text(j.prompts, prompts_of(model));
  j.full = fmt::format("{}/dp_{}_full.jsonl", work_dir(), tag);
  const RunResult r = generate(j.pack, j.prompts, j.full, "--margins --threads 2");
  EXPECT_EQ(r.status, 3) << r.err;  // the malformed line
  j.status = r.status;
  return jobs[model] = j;
}

// The meta fields `merge` requires to agree, and the prompts' digests.
const char* const kSameAsOneRun[] = {
    "/pack/digest",         "/settings/max_tokens_default",
    "/settings/ignore_eos", "/settings/margins",
    "/settings/device",     "/settings/precision",
    "/input_line_xxh64",    "/settings/chat_template",
    "/input_lines",
};

TEST(DataParallel, CpuWorkersGiveTheSingleRunByteForByte) {
  for (const std::string model :
       {"tests/data/models/qwen3-tiny", "tests/data/models/qwen3.5-tiny"}) {
    const Job& j = job_of(model);
    const auto one = load_json(j.full + ".meta.json");
    for (const std::string devices : {"0,1", "0,1,2"}) {
      SCOPED_TRACE(model + " --devices " + devices);
      const std::string name = fmt::format("dp_out_{}_{}", fs::path(model).filename().string(),
                                           std::count(devices.begin(), devices.end(), ',') + 1);
      const std::string out = work_dir() + "/" + name + ".jsonl";
      const RunResult r =
          generate(j.pack, j.prompts, out, "--margins --threads 2 --devices " + devices);
      ASSERT_EQ(r.status, j.status) << r.err;
      EXPECT_EQ(read_text(out), read_text(j.full));
      EXPECT_NE(r.err.find("merged into " + out), std::string::npos) << r.err;
      const auto meta = load_json(out + ".meta.json");
      EXPECT_EQ(meta["status"], "complete");
      EXPECT_FALSE(meta.contains("shard"));
      const std::vector<int> want =
          devices == "0,1" ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
      EXPECT_EQ(meta["devices"], nlohmann::json(want));
      // The merged stats add up the workers' token counts; each worker's
      // own stats stay with its merged_from entry.
      EXPECT_EQ(meta["stats"]["generated_tokens"], one["stats"]["generated_tokens"]);
      EXPECT_EQ(meta["stats"]["prompt_tokens"], one["stats"]["prompt_tokens"]);
      ASSERT_EQ(meta["merged_from"].size(), want.size());
      for (const auto& part : meta["merged_from"])
        EXPECT_TRUE(part["stats"].contains("decode_seconds")) << part.dump();
      for (const char* field : kSameAsOneRun) {
        const nlohmann::json::json_pointer p(field);
        EXPECT_EQ(meta.value(p, nlohmann::json()), one.value(p, nlohmann::json())) << field;
      }
      // The parts are gone: only OUT and its header remain.
      EXPECT_EQ(files_starting(name),
                (std::vector<std::string>{name + ".jsonl", name + ".jsonl.meta.json"}));
    }
  }
}

// CPU workers share the machine's memory: each gets its part as its
// QTK_MEM_AVAILABLE (the memory its default KV cache fits into), recorded in
// the header's tuning; the results are the single run's, byte for byte.
TEST(DataParallel, CpuWorkersShareTheMemoryAvailable) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_mem.jsonl";
  const RunResult r = run(fmt::format(
      "QTK_MEM_AVAILABLE=300000000 {} --model {} --batch {} --out {} --margins --threads 2 "
      "--devices 0,1,2",
      QTK_GENERATE_BIN, j.pack, j.prompts, out));
  ASSERT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  const auto meta = load_json(out + ".meta.json");
  EXPECT_EQ(meta["tuning"]["QTK_MEM_AVAILABLE"], 100000000);
  ASSERT_EQ(meta["merged_from"].size(), 3u);
}

// Workers that all fail at their start leave no part: the parent says
// nothing was written (not that parts stay for --resume), and a cause the
// parent can see (a QTK_CPU_PATH this CPU cannot run) is one line before any
// worker starts.
TEST(DataParallel, WorkersThatAllFailAtTheStartLeaveNothingAndSaySo) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_none.jsonl";
  const RunResult r =
      run(fmt::format("QTK_MEM_AVAILABLE=1 {} --model {} --batch {} --out {} --devices 0,1",
                      QTK_GENERATE_BIN, j.pack, j.prompts, out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("no worker wrote results, nothing was written"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--resume"), std::string::npos) << r.err;
  EXPECT_TRUE(files_starting("dp_none").empty());
  // A path name no CPU has, and (where this CPU lacks one) a real path it
  // cannot run: each one line from the parent.
  std::vector<std::string> paths = {"nonesuch"};
  for (const CpuPath c : kAllCpuPaths)
    if (!cpu_path_supported(c)) paths.emplace_back(cpu_path_name(c));
  std::printf("[ paths ] QTK_CPU_PATH values refused up front here: %zu\n", paths.size());
  for (const std::string& path : paths) {
    const RunResult p =
        run(fmt::format("QTK_CPU_PATH={} {} --model {} --batch {} --out {} --devices 0,1", path,
                        QTK_GENERATE_BIN, j.pack, j.prompts, out));
    EXPECT_EQ(p.status, 1) << p.err;
    EXPECT_EQ(count_lines(p.err), 1u) << p.err;
    EXPECT_NE(p.err.find("QTK_CPU_PATH"), std::string::npos) << p.err;
    EXPECT_TRUE(files_starting("dp_none").empty());
  }
}

TEST(DataParallel, OneDeviceIsAPlainRun) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_one.jsonl";
  const RunResult r = generate(j.pack, j.prompts, out, "--margins --threads 2 --devices 5");
  ASSERT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  EXPECT_EQ(files_starting("dp_one"),
            (std::vector<std::string>{"dp_one.jsonl", "dp_one.jsonl.meta.json"}));
}

// What a killed parent's merge left (its staging and temporary files, named
// with its pid) is removed by the next --devices run on OUT, as a plain run
// removes its own.
TEST(DataParallel, StaleTemporariesOfAKilledParentAreRemoved) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_stale.jsonl";
  const pid_t dead = dead_pid();
  const std::vector<std::string> stale = {fmt::format("dp_stale.jsonl.merge.{}", dead),
                                          fmt::format("dp_stale.jsonl.meta.json.tmp.{}", dead)};
  for (const std::string& name : stale) write_text(work_dir() + "/" + name, "left\n");
  const RunResult r = generate(j.pack, j.prompts, out, "--margins --threads 2 --devices 0,1");
  ASSERT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  for (const std::string& name : stale)
    EXPECT_NE(r.err.find(fmt::format("generate: removed stale temporary file {}/{} left by pid {}",
                                     work_dir(), name, dead)),
              std::string::npos)
        << r.err;
  EXPECT_EQ(files_starting("dp_stale"),
            (std::vector<std::string>{"dp_stale.jsonl", "dp_stale.jsonl.meta.json"}));
}

// An OUT whose own derived names fit but whose parts' (OUT.part-k-of-M and
// the names derived from it) do not is refused by the parent with one line
// before any worker starts: nothing is written, no parts are promised.
TEST(DataParallel, PartNamesTooLongAreRefusedBeforeTheWorkers) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string d = work_dir() + "/dp_longname";
  std::filesystem::create_directories(d);
  const std::string name = std::string(214, 'd') + ".jsonl";  // 220 bytes
  const RunResult r = generate(j.pack, j.prompts, d + "/" + name, "--margins --devices 0,1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err.rfind(fmt::format("generate: --out {}/{}: the name is too long for the files "
                                    "generate writes beside it: {}.part-0-of-2",
                                    d, name, name),
                        0),
            0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("--resume"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(d));
}

TEST(DataParallel, AShardSpreadOverDevicesIsThatShardsFileAndMeta) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string d = work_dir();
  const RunResult s0 = generate(j.pack, j.prompts, d + "/dps_0.jsonl", "--margins --shard 0/2");
  const RunResult s1 = generate(j.pack, j.prompts, d + "/dps_1.jsonl", "--margins --shard 1/2");
  ASSERT_TRUE(s0.status == 0 || s0.status == 3) << s0.err;
  ASSERT_TRUE(s1.status == 0 || s1.status == 3) << s1.err;
  const std::string out = d + "/dps_1_dp.jsonl";
  const RunResult r = generate(j.pack, j.prompts, out, "--margins --shard 1/2 --devices 0,1,2");
  ASSERT_EQ(r.status, s1.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(d + "/dps_1.jsonl"));
  const auto meta = load_json(out + ".meta.json");
  EXPECT_EQ(meta["shard"], load_json(d + "/dps_1.jsonl.meta.json")["shard"]);
  // `merge` takes it as shard 1/2.
  const std::string merged = d + "/dps_merged.jsonl";
  const RunResult m = run(fmt::format("{} {} {}/dps_0.jsonl {}", QTK_MERGE_BIN, merged, d, out));
  // (3, as generate's, when the batch has error lines)
  ASSERT_EQ(m.status, s0.status == 3 || s1.status == 3 ? 3 : 0) << m.err;
  EXPECT_EQ(read_text(merged), read_text(j.full));
  // A retried task (the same command) finds its shard complete and keeps it.
  const RunResult again = generate(j.pack, j.prompts, out, "--margins --shard 1/2 --devices 0,1,2");
  EXPECT_EQ(again.status, s1.status) << again.err;
  EXPECT_NE(again.err.find("already complete"), std::string::npos) << again.err;
  EXPECT_EQ(read_text(out), read_text(d + "/dps_1.jsonl"));
}

TEST(DataParallel, BadListsAndCombinationsAreRefusedWithOneLineAndNoOutput) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  struct Case {
    std::string flags;
    std::vector<std::string> says;  // what the message must hold
  };
  const std::vector<Case> cases = {
      {"--devices 0,0", {"--devices", "expected distinct device ordinals", "\"0,0\"", "twice"}},
      {"--devices -1", {"--devices", "expected distinct device ordinals", "\"-1\""}},
      {"--devices a", {"--devices", "expected distinct device ordinals", "\"a\""}},
      {"--devices ''", {"--devices", "expected distinct device ordinals", "an empty list"}},
      {"--devices 0,,1", {"--devices", "\"0,,1\"", "an empty entry"}},
      {"--devices all", {"--devices all", "expected --device cuda", "found --device cpu"}},
      {"--devices 0,1 --show", {"--devices", "--show"}},
      {"--devices 0,1 --progress --no-progress", {"--progress and --no-progress"}},
  };
  const std::string out = work_dir() + "/dp_bad.jsonl";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const RunResult r = generate(j.pack, j.prompts, out, c.flags);
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    for (const std::string& s : c.says) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
    EXPECT_TRUE(files_starting("dp_bad").empty());
  }
  // --out - and --batch -: nothing to merge into, or to read twice.
  RunResult r = run(fmt::format("{} --model {} --batch {} --out - --devices 0,1", QTK_GENERATE_BIN,
                                j.pack, j.prompts));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--devices: expected --out FILE"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  r = run(fmt::format("{} --model {} --batch - --out {} --devices 0,1 < {}", QTK_GENERATE_BIN,
                      j.pack, out, j.prompts));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--devices: expected --batch FILE"), std::string::npos) << r.err;
  EXPECT_TRUE(files_starting("dp_bad").empty());
  // A FIFO as --batch: every worker reads the file, which a pipe cannot give
  // twice; refused before anything reads it (no writer ever comes here).
  const std::string fifo = work_dir() + "/dp_fifo.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  r = run(fmt::format("timeout -s KILL 30 {} --model {} --batch {} --out {} --devices 0,1",
                      QTK_GENERATE_BIN, j.pack, fifo, out));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("--devices: expected --batch FILE, a regular file (every worker reads it), "
                       "found a FIFO (named pipe) (" +
                       fifo + ")"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(files_starting("dp_bad").empty());
  // A bad input is found before any worker starts: one line, no parts.
  r = generate(work_dir() + "/no-such.pack", j.prompts, out, "--devices 0,1");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("no-such.pack"), std::string::npos) << r.err;
  EXPECT_TRUE(files_starting("dp_bad").empty());
}

TEST(DataParallel, AFailedWorkerLeavesNoOutAndResumeFinishesTheRun) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_fail.jsonl";
  // Worker 1 cannot take its part's lock (a directory is in the way).
  fs::create_directory(out + ".part-1-of-2.lock");
  RunResult r = generate(j.pack, j.prompts, out, "--margins --devices 0,1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("the worker on device 1 (shard 1/2 into " + out +
                       ".part-1-of-2) failed with exit status 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("fix the cause and run the same command with --resume to finish"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".meta.json"));
  EXPECT_TRUE(fs::exists(out + ".part-0-of-2"));  // the worker that succeeded
  // After a failed --force run the advice is not to add --resume (--force
  // with --resume is refused) but to use it instead.
  r = generate(j.pack, j.prompts, out, "--margins --devices 0,1 --force");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("fix the cause and run again with --resume instead of --force to finish"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  fs::remove(out + ".part-1-of-2.lock");
  // Without --resume, the parts left behind are not silently replaced.
  r = generate(j.pack, j.prompts, out, "--margins --devices 0,1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(out + ".part-0-of-2: already exists"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = generate(j.pack, j.prompts, out, "--margins --devices 0,1 --resume");
  EXPECT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  EXPECT_EQ(files_starting("dp_fail"),
            (std::vector<std::string>{"dp_fail.jsonl", "dp_fail.jsonl.meta.json"}));
}

TEST(DataParallel, ResumeAfterAnInterruptedFanOutGivesTheSameFile) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string d = work_dir();
  // A worker killed mid-line: its part is OUT.part-1-of-2.partial, cut inside
  // a line, with a "running" header (what a kill leaves).
  const std::string out = d + "/dp_cut.jsonl", part1 = out + ".part-1-of-2";
  RunResult r = generate(j.pack, j.prompts, part1, "--margins --shard 1/2");
  ASSERT_TRUE(r.status == 0 || r.status == 3) << r.err;
  const std::string done = read_text(part1);
  auto meta = load_json(part1 + ".meta.json");
  meta["status"] = "running";
  write_text(part1 + ".partial.meta.json", meta.dump(2));
  write_text(part1 + ".partial", done.substr(0, done.size() / 2 + 3));
  fs::remove(part1);
  fs::remove(part1 + ".meta.json");
  r = generate(j.pack, j.prompts, out, "--margins --devices 0,1 --resume");
  EXPECT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));

  // A real interrupt: SIGTERM to the parent alone reaches the workers; the
  // run ends with that signal, no OUT, and --resume finishes it.
  std::string big;
  for (int i = 0; i < 64; ++i)
    big += fmt::format(
        "{{\"prompt_token_ids\": [{}, 7, 9], \"max_tokens\": 200, "
        "\"ignore_eos\": true}}\n",
        1 + i % 50);
  // note: the sample model, not the tiny fixture, and 64 x 200 tokens: about
  // a second of work per worker, so the signal (sent as soon as a worker's
  // part appears) lands mid-run.
  const std::string big_pack = pack_of("samples/qwen3.5-sample");
  const std::string prompts = d + "/dp_big.jsonl";
  write_text(prompts, big);
  const std::string single = d + "/dp_big_single.jsonl";
  r = generate(big_pack, prompts, single, "--threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string killed = d + "/dp_killed.jsonl";
  r = run(fmt::format(
      "( {} --model {} --batch {} --out {} --devices 0,1 --threads 2 & p=$!; "
      "while [ ! -e {}.part-1-of-2.partial ] && kill -0 $p 2>/dev/null; do sleep 0.02; done; "
      "kill -TERM $p; wait $p; echo $? > {}.status )",
      QTK_GENERATE_BIN, big_pack, prompts, killed, killed, killed));
  EXPECT_EQ(read_text(killed + ".status"), "143\n") << r.err;
  EXPECT_NE(r.err.find("interrupted by SIGTERM"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(killed + ".part-1-of-2.partial"));
  // Resumed over another number of devices: refused (it would start over and
  // leave the two parts behind), naming them; nothing is removed.
  // A run without --devices (a run on one device) is refused the same way,
  // with --force too.
  for (const char* flags : {"--devices 0,1,2 --threads 2 --resume", "--devices 0 --resume",
                            "--resume", "--force", ""}) {
    r = generate(big_pack, prompts, killed, flags);
    EXPECT_EQ(r.status, 1) << flags << r.err;
    EXPECT_NE(r.err.find("of a --devices run over 2 devices (dp_killed.jsonl.part-"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(std::string_view(flags).find("0,1,2") != std::string_view::npos
                             ? "this run on 3 devices"
                             : "this run on 1 device would"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(killed)) << flags;
    EXPECT_NE(r.err.find("give 2 devices with --resume"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(killed + ".part-1-of-2.partial"));
  }
  r = generate(big_pack, prompts, killed, "--devices 0,1 --threads 2 --resume");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_text(killed), read_text(single));
}

// Whether `pid` is still running (a zombie nobody reaped counts as gone).
bool running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  const std::string stat = read_text(fmt::format("/proc/{}/stat", pid));
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Waits up to 20 s for each of `workers` to end; one that outlives its
// parent is a failure, and is killed.
void expect_workers_end(const std::vector<pid_t>& workers) {
  for (const pid_t w : workers) {
    for (int i = 0; i < 2000 && running(w); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(running(w)) << "worker " << w << " outlived its parent";
    if (running(w)) ::kill(w, SIGKILL);
  }
}

// --resume finishes the two-device run of `prompts` into `out`, which then
// holds what one process writes (into `single`).
void expect_resume_gives_single_run(const std::string& pack, const std::string& prompts,
                                    const std::string& out, const std::string& single) {
  RunResult r = generate(pack, prompts, out, "--devices 0,1 --threads 2 --resume");
  ASSERT_EQ(r.status, 0) << r.err;
  r = generate(pack, prompts, single, "--threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_text(out), read_text(single));
}

// A --devices run whose parent is killed by SIGKILL (it can forward
// nothing) does not leave its workers running: the kernel sends each one
// SIGTERM (PR_SET_PDEATHSIG), which stops it as a SIGTERM does (its part
// marked "interrupted", its lock removed) within moments, and --resume
// finishes the run. (The workers used to run on, re-parented to pid 1, and a
// --resume was refused by their locks.)
TEST(DataParallel, WorkersStopWhenTheParentIsKilled) {
  // note: the sample model and 128 x 200 tokens: seconds of work per
  // worker, so the kill (sent as soon as both parts appear) lands mid-run.
  const std::string pack = pack_of("samples/qwen3.5-sample");
  ASSERT_FALSE(pack.empty());
  std::string text;
  for (int i = 0; i < 128; ++i)
    text += fmt::format(
        "{{\"prompt_token_ids\": [{}, 5, 8], \"max_tokens\": 200, \"ignore_eos\": true}}\n",
        1 + i % 60);
  const std::string d = work_dir();
  const std::string prompts = d + "/dp_orphan.jsonl", out = d + "/dp_orphan_out.jsonl";
  write_text(prompts, text);
  const std::string argv[] = {
      QTK_GENERATE_BIN, "--model", pack,        "--batch", prompts, "--out", out,
      "--devices",      "0,1",     "--threads", "2"};
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::fork();
  if (parent == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0), ::dup2(null, 1), ::dup2(null, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ASSERT_GT(parent, 0);
  // Both workers under way: their parts exist, their locks hold their pids.
  std::vector<pid_t> workers;
  for (int i = 0; i < 6000 && workers.size() < 2; ++i) {
    workers.clear();
    for (int k = 0; k < 2; ++k) {
      const std::string part = fmt::format("{}.part-{}-of-2", out, k);
      const long pid = std::atol(read_text(part + ".lock").c_str());
      if (fs::exists(part + ".partial") && pid > 0) workers.push_back(static_cast<pid_t>(pid));
    }
    if (workers.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(workers.size(), 2u) << "the workers did not start";
  ::kill(parent, SIGKILL);
  int st = 0;
  ASSERT_EQ(::waitpid(parent, &st, 0), parent);
  expect_workers_end(workers);
  for (int k = 0; k < 2; ++k) {
    const std::string part = fmt::format("{}.part-{}-of-2", out, k);
    EXPECT_FALSE(fs::exists(part + ".lock")) << part;
    ASSERT_TRUE(fs::exists(part + ".partial.meta.json")) << part << " finished after the kill";
    const nlohmann::json meta = load_json(part + ".partial.meta.json");
    EXPECT_EQ(meta.value("status", ""), "interrupted") << meta.dump(2);
    EXPECT_NE(meta.value("error", "").find("interrupted by SIGTERM"), std::string::npos)
        << meta.dump(2);
  }
  EXPECT_FALSE(fs::exists(out));
  expect_resume_gives_single_run(pack, prompts, out, d + "/dp_orphan_single.jsonl");
}

// Without --force the merge of a --devices run never replaces a file that
// appeared at OUT, or at its header, while the run worked (another process
// wrote it): the run exits 1 naming it, the file stays as it is, no header
// or OUT is written and the parts stay; the same command with --resume then
// merges them into OUT, replacing what is there then. With --force such a
// file is replaced. (The parent used to merge with force, replacing it.)
TEST(DataParallel, AnOutThatAppearsDuringTheRunIsNotReplaced) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_appear.jsonl", meta = out + ".meta.json";
  const std::vector<std::string> parts = {
      "dp_appear.jsonl.part-0-of-2", "dp_appear.jsonl.part-0-of-2.meta.json",
      "dp_appear.jsonl.part-1-of-2", "dp_appear.jsonl.part-1-of-2.meta.json"};
  auto devices_run = [&](const std::string& faults, const std::string& flags) {
    return run(
        with_faults(faults) +
        fmt::format("{} --model {} --batch {} --out {} --margins --threads 2 --devices 0,1 {}",
                    QTK_GENERATE_BIN, j.pack, j.prompts, out, flags));
  };
  for (const std::string& target : {out, meta}) {
    SCOPED_TRACE(target);
    const std::string name = target.substr(target.rfind('/') + 1);
    RunResult r = devices_run("QTK_FAULT_CREATE_AT_RENAME_TO=" + target, "");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find(fmt::format("generate: {}: appeared while generating (it was not there "
                                     "when the run started); not replacing it",
                                     target)),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(fmt::format("; the parts ({}.part-*-of-2) stay: run the same command "
                                     "with --resume to merge them into {}, replacing what is "
                                     "there then\n",
                                     out, out)),
              std::string::npos)
        << r.err;
    EXPECT_EQ(read_text(target), "appeared\n");
    std::vector<std::string> left = parts;
    left.push_back(name);
    std::sort(left.begin(), left.end());
    EXPECT_EQ(files_starting("dp_appear"), left);
    // --resume merges the parts (the workers find them complete) and
    // replaces what is there now.
    r = devices_run("", "--resume");
    EXPECT_EQ(r.status, j.status) << r.err;
    EXPECT_EQ(read_text(out), read_text(j.full));
    EXPECT_EQ(load_json(meta).value("status", ""), "complete");
    EXPECT_EQ(files_starting("dp_appear"),
              (std::vector<std::string>{"dp_appear.jsonl", "dp_appear.jsonl.meta.json"}));
    fs::remove(out);
    fs::remove(meta);
  }
  // With --force a file that appears at OUT is replaced.
  const RunResult forced = devices_run("QTK_FAULT_CREATE_AT_RENAME_TO=" + out, "--force");
  EXPECT_EQ(forced.status, j.status) << forced.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  EXPECT_EQ(files_starting("dp_appear"),
            (std::vector<std::string>{"dp_appear.jsonl", "dp_appear.jsonl.meta.json"}));
}

// A --devices parent that gets SIGINT twice while its workers cannot end
// (here stopped by SIGSTOP: the first signal is forwarded to them and the
// parent waits) ends at the second signal at once, by that signal, with
// OUT.lock removed; once the workers go on they stop too (the forwarded
// signal, and the parent's death), their parts stay, and --resume finishes
// the run. (OUT.lock used to be left behind: the lock installed its own
// handlers, the parent's InterruptScope replaced them, and the file was not
// on the list of files a second signal removes.)
TEST(DataParallel, SecondSignalEndsTheParentAndRemovesItsLock) {
  const std::string pack = pack_of("tests/data/models/qwen3-tiny");
  ASSERT_FALSE(pack.empty());
  // note: seconds of work per worker, so they are stopped mid-run.
  std::string text;
  for (int i = 0; i < 6000; ++i)
    text += fmt::format(
        "{{\"prompt_token_ids\": [{}, 2, 3], \"max_tokens\": 64, \"ignore_eos\": true}}\n",
        1 + i % 500);
  const std::string d = work_dir();
  const std::string prompts = d + "/dp_sig2.jsonl", out = d + "/dp_sig2_out.jsonl";
  write_text(prompts, text);
  const pid_t parent =
      start_with_default_signals({QTK_GENERATE_BIN, "--model", pack, "--batch", prompts, "--out",
                                  out, "--devices", "0,1", "--threads", "2"});
  ASSERT_GT(parent, 0);
  // Both workers started (their locks hold their pids), then stopped.
  std::vector<pid_t> workers;
  for (int i = 0; i < 3000 && workers.size() < 2; ++i) {
    workers.clear();
    for (int k = 0; k < 2; ++k) {
      const long pid = std::atol(read_text(fmt::format("{}.part-{}-of-2.lock", out, k)).c_str());
      if (pid > 0) workers.push_back(static_cast<pid_t>(pid));
    }
    if (workers.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(workers.size(), 2u) << "the workers did not start";
  for (const pid_t w : workers) ::kill(w, SIGSTOP);
  int st = 0;
  ASSERT_EQ(::waitpid(parent, &st, WNOHANG), 0) << "the parent ended early: status " << st;
  ASSERT_TRUE(fs::exists(out + ".lock"));
  // (forwarded to the stopped workers; the parent waits for them)
  ASSERT_TRUE(still_running_after(parent, SIGINT, &st))
      << "one signal ended the parent: status " << st;
  ::kill(parent, SIGINT);
  const bool ended = ended_within(parent, 20, &st);
  for (const pid_t w : workers) ::kill(w, SIGCONT);
  ASSERT_TRUE(ended) << "a second signal did not end the parent at once";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << "status " << st;
  EXPECT_FALSE(fs::exists(out + ".lock")) << "the lock file was left behind";
  EXPECT_FALSE(fs::exists(out));
  expect_workers_end(workers);
  for (int k = 0; k < 2; ++k)
    EXPECT_FALSE(fs::exists(fmt::format("{}.part-{}-of-2.lock", out, k))) << k;
  expect_resume_gives_single_run(pack, prompts, out, d + "/dp_sig2_single.jsonl");
}

TEST(DataParallel, DeviceListParsing) {
  const auto no_cuda = [] { return 0; };
  const auto two = [] { return 2; };
  EXPECT_EQ(parse_devices("0,1,3", "cpu", no_cuda), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(parse_devices("all", "cuda", two), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_devices("1", "cuda", two), (std::vector<int>{1}));
  EXPECT_THROW(parse_devices("2", "cuda", two), std::exception);
  EXPECT_THROW(parse_devices("all", "cuda", no_cuda), std::exception);
  EXPECT_THROW(parse_devices(" 1", "cpu", no_cuda), std::exception);
  // Ordinals count the devices the parent sees.
  EXPECT_EQ(visible_device_of(1, nullptr), "1");
  EXPECT_EQ(visible_device_of(1, "4,6"), "6");
  EXPECT_EQ(visible_device_of(0, "GPU-abc,GPU-def"), "GPU-abc");
}

}  // namespace
}  // namespace qtk::rt_test
