// bench/synth writes checkpoints that the loaders accept, for every fixture
// config, sharded or not, and reproducibly for a given seed.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loaders/checkpoint.h"

namespace qtk {
namespace {

namespace fs = std::filesystem;

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

}  // namespace
}  // namespace qtk
