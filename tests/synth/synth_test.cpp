// bench/synth writes checkpoints that the loaders accept, for every fixture
// config, sharded or not, and reproducibly for a given seed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loaders/checkpoint.h"
#include "tests/badinput/run_util.h"

namespace qtk {
namespace {

namespace fs = std::filesystem;

const std::string kTinyConfig =
    std::string(QTK_SOURCE_DIR) + "/tests/data/models/qwen3-tiny/config.json";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path run_synth(const std::string& model, const std::string& extra, const std::string& tag) {
  const fs::path out =
      fs::temp_directory_path() / ("qtk-synth-test-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string cmd = std::string(QTK_BIN_DIR) + "/synth " + QTK_SOURCE_DIR +
                          "/tests/data/models/" + model + "/config.json " + out.string() + " " +
                          extra + " 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

class SynthTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthTest, CheckpointLoadsWithExpectedShapes) {
  const fs::path one = run_synth(GetParam(), "--seed 7", "one");
  const fs::path sharded = run_synth(GetParam(), "--seed 7 --shard-mb 0", "again");
  auto a = Checkpoint::open(one.string());
  auto b = Checkpoint::open(sharded.string());
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const auto& x = a->tensors()[i].view;
    const auto& y = b->tensors()[i].view;
    ASSERT_EQ(x.nbytes(), y.nbytes());
    // Same seed, same bytes.
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes())) << a->tensors()[i].name;
  }
  fs::remove_all(one);
  fs::remove_all(sharded);
}

TEST_P(SynthTest, ShardedOutputLoads) {
  // A tiny shard size forces one shard per tensor or so, with an index file.
  const fs::path out = run_synth(GetParam(), "--seed 3 --shard-mb 1 --dtype f32", "sharded");
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json") ||
              fs::exists(out / "model.safetensors"));
  auto c = Checkpoint::open(out.string());
  EXPECT_GT(c->tensors().size(), 10u);
  EXPECT_EQ(c->tensors()[0].view.dtype, DType::F32);
  fs::remove_all(out);
}

TEST(Synth, DifferentSeedsDiffer) {
  const fs::path a = run_synth("qwen3-tiny", "--seed 1", "s1");
  const fs::path b = run_synth("qwen3-tiny", "--seed 2", "s2");
  EXPECT_NE(read_file(a / "model.safetensors"), read_file(b / "model.safetensors"));
  fs::remove_all(a);
  fs::remove_all(b);
}

// --fp8: the layer projections are F8_E4M3 with paired float32 block scales
// (validated by the loader), sharded or not, for the plain and the nested
// (text_config) config layouts; the GDN in_proj_a/b and the embedding stay bf16.
TEST(Synth, Fp8CheckpointLoads) {
  for (const char* model : {"qwen3-tiny", "qwen3.5-tiny-vlm"}) {
    for (const char* shard : {"", " --shard-mb 1"}) {
      SCOPED_TRACE(std::string(model) + shard);
      const fs::path out = run_synth(model, std::string("--seed 4 --fp8") + shard, "fp8");
      auto c = Checkpoint::open(out.string());
      EXPECT_TRUE(c->config().fp8.enabled);
      int fp8 = 0;
      for (const auto& t : c->tensors()) {
        if (t.view.dtype != DType::F8_E4M3) continue;
        ++fp8;
        EXPECT_NE(t.scale.data, nullptr) << t.name;
        EXPECT_EQ(t.name.find("in_proj_a"), std::string::npos) << t.name;
        EXPECT_EQ(t.name.find("in_proj_b"), std::string::npos) << t.name;
      }
      EXPECT_GT(fp8, 0);
      EXPECT_EQ(c->find("embed_tokens.weight")->view.dtype, DType::BF16);
      fs::remove_all(out);
    }
  }
}

// --threads N: each piece from its own stream, so the files do not depend
// on N; they load, sharded or not.
TEST(Synth, ThreadedOutputIsTheSameForAnyThreadCount) {
  for (const char* extra : {"", " --fp8", " --fp8 --shard-mb 1", " --dtype f32"}) {
    SCOPED_TRACE(extra);
    const fs::path a =
        run_synth("qwen3.5-moe-tiny-vlm", std::string("--seed 9 --threads 1") + extra, "t1");
    const fs::path b =
        run_synth("qwen3.5-moe-tiny-vlm", std::string("--seed 9 --threads 5") + extra, "t5");
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(a)) files.push_back(e.path().filename());
    ASSERT_FALSE(files.empty());
    for (const auto& f : files) EXPECT_EQ(read_file(a / f), read_file(b / f)) << f;
    auto c = Checkpoint::open(b.string());
    EXPECT_GT(c->tensors().size(), 10u);
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

// --experts per-expert --fp8: a Qwen3.5-MoE checkpoint in the FP8 releases'
// layout, its routed experts FP8 (the default hub layout keeps them fused bf16).
TEST(Synth, PerExpertFp8Experts) {
  const fs::path out =
      run_synth("qwen3.5-moe-tiny-vlm", "--seed 2 --fp8 --experts per-expert --threads 2", "pe");
  auto c = Checkpoint::open(out.string());
  int experts = 0;
  for (const auto& t : c->tensors()) {
    if (t.name.find("mlp.experts.") == std::string::npos) continue;
    ++experts;
    EXPECT_EQ(t.view.dtype, DType::F8_E4M3) << t.name;
    EXPECT_NE(t.scale.data, nullptr) << t.name;
  }
  EXPECT_GT(experts, 0);
  fs::remove_all(out);
  const fs::path hub = run_synth("qwen3.5-moe-tiny-vlm", "--seed 2 --fp8", "hub");
  auto h = Checkpoint::open(hub.string());
  for (const auto& t : h->tensors()) {
    if (t.name.find("mlp.experts.") != std::string::npos) {
      EXPECT_EQ(t.view.dtype, DType::BF16) << t.name;
    }
  }
  fs::remove_all(hub);
}

// --dry-run writes nothing and prints the bytes the files' tensors take.
TEST(Synth, DryRunPrintsTheSize) {
  const fs::path out = fs::temp_directory_path() / ("qtk-synth-dry-" + std::to_string(::getpid()));
  const std::string cmd = std::string(QTK_BIN_DIR) + "/synth " + QTK_SOURCE_DIR +
                          "/tests/data/models/qwen3-tiny/config.json " + out.string() +
                          " --fp8 --dry-run";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
  ASSERT_EQ(::pclose(p), 0);
  EXPECT_FALSE(fs::exists(out));
  const std::string text(buf, n);
  const auto at = text.find("\"bytes\":");
  ASSERT_NE(at, std::string::npos) << text;
  const int64_t bytes = std::stoll(text.substr(at + 8));
  const fs::path real = run_synth("qwen3-tiny", "--fp8", "dry");
  const std::string file = read_file(real / "model.safetensors");
  uint64_t header = 0;
  std::memcpy(&header, file.data(), 8);
  EXPECT_EQ(static_cast<int64_t>(file.size() - 8 - header), bytes);
  fs::remove_all(real);
}

// Writes nothing to stdout that is lost unreported: --dry-run's JSON on a
// full device is one error line and exit 1 (it was exit 0).
TEST(Synth, DryRunToAFullDeviceFails) {
  const testing::RunResult r =
      testing::run_program({"/bin/sh", "-c", "exec \"$0\" \"$1\" out --dry-run > /dev/full",
                            testing::program("synth"), kTinyConfig});
  testing::expect_clean_failure(r, "synth",
                                {"cannot write to standard output: No space left on device"});
}

TEST(Synth, BadConfigFailsWithMessage) {
  const std::string cmd =
      std::string(QTK_BIN_DIR) + "/synth /nonexistent/config.json /tmp/x 2>/dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SynthTest,
                         ::testing::Values("qwen3-tiny", "qwen3-tiny-sharded-f32", "qwen3.5-tiny",
                                           "qwen3.5-tiny-vlm", "qwen3-moe-tiny",
                                           "qwen3.5-moe-tiny-vlm"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// synth follows the toolkit's flag rules: one line on stderr, exit 1, and a
// flag given twice with two values refused (it took the last one).
TEST(SynthFlags, BadFlagsAreOneLineAndExitOne) {
  const std::string bin = std::string(QTK_BIN_DIR) + "/synth ";
  const std::string config =
      std::string(QTK_SOURCE_DIR) + "/tests/data/models/qwen3-tiny/config.json ";
  const fs::path err = fs::temp_directory_path() / ("qtk-synth-err-" + std::to_string(::getpid()));
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {config + "o --dry-run --dtype bf16 --dtype f32",
            "synth: --dtype: given twice, as \"bf16\" and \"f32\"; expected one value"},
           {config + "o --dry-run --bogus", "synth: --bogus: unknown flag (see --help)"},
           {config + "o --dry-run --dtype f16",
            "synth: --dtype: expected bf16 or f32, found \"f16\""},
           {config + "--dry-run", "synth: usage: synth CONFIG.json OUT_DIR"},
           {config + "o --dry-run --threads -1", "synth: --threads: expected 0..1024"}}) {
    const int rc = std::system((bin + args + " > /dev/null 2> " + err.string()).c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << args;
    const std::string text = read_file(err);
    EXPECT_EQ(text.rfind(says, 0), 0u) << args << ": " << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
  fs::remove(err);
}

// ---- OUT_DIR: written whole or not at all --------------------------------

using testing::expect_clean_failure;
using testing::list_dir;
using testing::program;
using testing::RunResult;
using testing::TempDir;

// Every file of a directory (not recursive) with its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const std::string& name : list_dir(dir)) files[name] = testing::read_file(dir + "/" + name);
  return files;
}

RunResult synth(std::vector<std::string> args, const std::string& shell_prefix = "") {
  args.insert(args.begin(), program("synth"));
  return testing::run_program(args, "", 120, shell_prefix);
}

// A real checkpoint directory (samples/qwen3-sample) at `dir`.
void copy_sample(const std::string& dir) {
  testing::copy_dir_files(testing::source_path("samples/qwen3-sample"), dir);
}

// The audit's case: synth over a checkpoint wrote config.json and
// model.safetensors over it and kept the old tokenizer, generation config and
// golden file beside them, a mixed checkpoint, with exit 0.
TEST(SynthOutput, RefusesANonEmptyDirectoryAndLeavesItAsItWas) {
  TempDir t;
  copy_sample(t / "real");
  const auto before = snapshot(t / "real");
  const RunResult r = synth({kTinyConfig, t / "real"});
  expect_clean_failure(r, "synth", {t / "real", "not empty", "config.json", "--force"});
  EXPECT_EQ(snapshot(t / "real"), before);
  EXPECT_EQ(list_dir(t.path()), std::vector<std::string>{"real"});
}

// --force replaces the whole directory: no file of the old checkpoint is
// left beside the new one, and the files are those of a fresh directory.
TEST(SynthOutput, ForceReplacesTheWholeDirectory) {
  TempDir t;
  copy_sample(t / "real");
  const RunResult r = synth({kTinyConfig, t / "real", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(list_dir(t / "real"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(list_dir(t.path()), std::vector<std::string>{"real"});  // nothing left beside it
  const RunResult fresh = synth({kTinyConfig, t / "fresh"});
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(snapshot(t / "real"), snapshot(t / "fresh"));
  EXPECT_EQ(testing::read_file(t / "real/config.json"), testing::read_file(kTinyConfig));
}

// Unsharded over sharded: the old shards and index went away with --force
// (they stayed beside the new file, and a loader would read the index).
TEST(SynthOutput, UnshardedOverShardedLeavesNoOldShard) {
  TempDir t;
  const std::string vlm = testing::model_fixture("qwen3.5-tiny-vlm") + "/config.json";
  RunResult r = synth({vlm, t / "ck", "--shard-mb", "1", "--dtype", "f32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GT(list_dir(t / "ck").size(), 3u);  // shards and an index
  r = synth({vlm, t / "ck"});
  expect_clean_failure(r, "synth", {"not empty", "--force"});
  r = synth({vlm, t / "ck", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(list_dir(t / "ck"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(Checkpoint::open(t / "ck")->shards().size(), 1u);
}

// A new path (with missing parents) or an empty directory is written
// without --force; anything but a directory is never replaced.
TEST(SynthOutput, NewOrEmptyDirectoriesAreWrittenOthersRefused) {
  TempDir t;
  fs::create_directory(t / "empty");
  RunResult r = synth({kTinyConfig, t / "empty"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(list_dir(t / "empty"), (std::vector<std::string>{"config.json", "model.safetensors"}));
  r = synth({kTinyConfig, t / "a/b/ck"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(list_dir(t / "a/b/ck").size(), 2u);
  testing::write_file(t / "file", "not a checkpoint");
  fs::create_symlink("empty", t / "link");
  for (const char* name : {"file", "link"}) {
    r = synth({kTinyConfig, t / name, "--force"});
    expect_clean_failure(r, "synth", {t / name, "not a directory", "not replacing it"});
  }
  EXPECT_EQ(testing::read_file(t / "file"), "not a checkpoint");
  EXPECT_EQ(list_dir(t.path()), (std::vector<std::string>{"a", "empty", "file", "link"}));
}

// A write that fails (`ulimit -f`: EFBIG, as a full disk's ENOSPC) is one
// line, not "synth: synth: ...", exit 1 and not SIGXFSZ (rc 153), and leaves
// no file: neither a new OUT_DIR nor a temporary directory beside it, and an
// old OUT_DIR as it was.
TEST(SynthOutput, AWriteErrorLeavesNothing) {
  TempDir t;
  copy_sample(t / "old");
  const auto before = snapshot(t / "old");
  // note: /bin/sh's `ulimit -f` counts 512-byte blocks (dash): 1 stops
  // config.json, 64 the weights (the reserved size with --threads).
  for (const char* limit : {"1", "64"}) {
    for (const char* threads : {"0", "2"}) {
      SCOPED_TRACE(std::string("ulimit -f ") + limit + ", --threads " + threads);
      const std::string prefix = std::string("ulimit -f ") + limit + ";";
      RunResult r = synth({kTinyConfig, t / "new", "--threads", threads}, prefix);
      expect_clean_failure(r, "synth", {"File too large", t / "new", "was not created"});
      EXPECT_EQ(r.err.find("synth: synth:"), std::string::npos) << r.err;
      r = synth({kTinyConfig, t / "old", "--threads", threads, "--force"}, prefix);
      expect_clean_failure(r, "synth", {"File too large", t / "old", "left as it was"});
      EXPECT_EQ(list_dir(t.path()), std::vector<std::string>{"old"});
      EXPECT_EQ(snapshot(t / "old"), before);
    }
  }
}

// --dry-run's JSON on stdout past a file-size limit (stdout a file): the
// write fails with EFBIG and synth says so, exit 1, not SIGXFSZ (rc 153).
TEST(SynthOutput, DryRunPastAFileSizeLimitIsAnError) {
  TempDir t;
  const RunResult r =
      synth({kTinyConfig, t / "x", "--dry-run"}, "ulimit -f 0; exec >" + t / "stdout.txt" + ";");
  expect_clean_failure(r, "synth", {"standard output", "File too large"});
}

// Starts synth with SIGINT, SIGTERM and SIGHUP at their defaults (a test
// runner may ignore them, and an ignored signal stays ignored).
pid_t spawn_synth(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {program("synth")};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    const int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    std::vector<char*> cv;
    for (auto& a : argv) cv.push_back(a.data());
    cv.push_back(nullptr);
    ::execv(cv[0], cv.data());
    ::_exit(127);
  }
  return pid;
}

// SIGINT, SIGTERM and SIGHUP while the weights are written: the temporary
// directory is removed, an old OUT_DIR is left as it was, and synth ends by
// that signal.
TEST(SynthOutput, SignalsRemoveTheTemporaryDirectory) {
  TempDir t;
  // note: about 300 MB of bf16 weights: long enough to be stopped while
  // writing (the signal is sent as soon as the temporary directory appears).
  nlohmann::json config = nlohmann::json::parse(testing::read_file(kTinyConfig));
  config.update({{"hidden_size", 1024},
                 {"intermediate_size", 4096},
                 {"num_hidden_layers", 8},
                 {"vocab_size", 32000},
                 {"num_attention_heads", 8},
                 {"num_key_value_heads", 4},
                 {"head_dim", 128},
                 {"layer_types", std::vector<std::string>(8, "full_attention")}});
  fs::create_directory(t / "work");
  const std::string config_path = t / "big.json";
  testing::write_file(config_path, config.dump());
  copy_sample(t / "work/old");
  const auto before = snapshot(t / "work/old");
  int interrupted = 0, runs = 0;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    for (const char* out : {"new", "old"}) {
      for (const char* threads : {"0", "2"}) {
        SCOPED_TRACE(fmt::format("{} into {}, --threads {}", strsignal(sig), out, threads));
        ++runs;
        const pid_t pid = spawn_synth(
            {config_path, t / (std::string("work/") + out), "--force", "--threads", threads});
        // Until the temporary directory appears (or synth is done).
        int status = 0;
        bool exited = false;
        for (int i = 0; i < 20000 && !exited; ++i) {
          bool staged = false;
          for (const std::string& name : list_dir(t / "work"))
            staged |= name.find(".synth-tmp.") != std::string::npos;
          if (staged) break;
          exited = ::waitpid(pid, &status, WNOHANG) == pid;
          if (!exited) ::usleep(200);
        }
        if (!exited) {
          ::kill(pid, sig);
          ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        }
        if (WIFSIGNALED(status)) {
          ++interrupted;
          EXPECT_EQ(WTERMSIG(status), sig);
        } else {
          // It finished first: the whole checkpoint is there.
          ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
          EXPECT_EQ(list_dir(t / (std::string("work/") + out)).size(), 2u);
          fs::remove_all(t / (std::string("work/") + out));
          if (std::string(out) == "old") copy_sample(t / "work/old");
        }
        EXPECT_EQ(list_dir(t / "work"), std::vector<std::string>{"old"});
        EXPECT_EQ(snapshot(t / "work/old"), before);
      }
    }
  }
  EXPECT_GE(interrupted, runs / 2) << "most signals should land while synth writes";
}

// What a SIGKILL leaves (the temporary directory, named with the owner's
// pid) is removed by the next synth writing beside it, which says so; that
// of a running process is kept.
TEST(SynthOutput, TheNextRunRemovesTheLeftoversOfAKilledOne) {
  TempDir t;
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string stale = fmt::format(".ck.synth-tmp.{}.0123abcd", gone);
  const std::string live = fmt::format(".ck.synth-tmp.{}.0123abcd", ::getpid());
  for (const std::string& name : {stale, live}) {
    fs::create_directory(t / name);
    testing::write_file(t / name + "/model.safetensors", "partial");
  }
  const RunResult r = synth({kTinyConfig, t / "other"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("synth: removed stale temporary directory " + t / stale + " left by pid"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(list_dir(t.path()), (std::vector<std::string>{live, "other"}));
}

// stderr's reader gone before synth starts: its only line ("synth: wrote
// ...") comes once OUT_DIR is in place and is lost, and the exit status
// still says written (0), not death by SIGPIPE.
TEST(SynthOutput, ClosedStderrPipeAfterTheCheckpointIsWrittenExitsZero) {
  TempDir t;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // no reader
  const std::string bin = program("synth"), out = t / "ck";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    ::dup2(fds[1], 2);
    ::execl(bin.c_str(), bin.c_str(), kTinyConfig.c_str(), out.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit code");
  EXPECT_EQ(list_dir(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
}

TEST(SynthOutput, HelpDescribesForce) {
  const RunResult r = synth({"--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("synth-tmp"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qtk
