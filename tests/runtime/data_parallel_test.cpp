// `generate --devices LIST` through the real program, on the CPU (one worker
// process per entry): the merged file is the single run's byte for byte, a
// --shard K/N spread over devices is that shard's file and meta, bad lists
// and combinations are refused with one line and no output, and a failed
// or interrupted fan-out leaves no OUT and finishes with --resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "runtime/data_parallel.h"
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

TEST(DataParallel, OneDeviceIsAPlainRun) {
  const Job& j = job_of("tests/data/models/qwen3-tiny");
  const std::string out = work_dir() + "/dp_one.jsonl";
  const RunResult r = generate(j.pack, j.prompts, out, "--margins --threads 2 --devices 5");
  ASSERT_EQ(r.status, j.status) << r.err;
  EXPECT_EQ(read_text(out), read_text(j.full));
  EXPECT_EQ(files_starting("dp_one"),
            (std::vector<std::string>{"dp_one.jsonl", "dp_one.jsonl.meta.json"}));
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
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".meta.json"));
  EXPECT_TRUE(fs::exists(out + ".part-0-of-2"));  // the worker that succeeded
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
