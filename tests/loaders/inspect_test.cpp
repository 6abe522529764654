// Runs the inspect binary as a child process and checks its output, its exit
// status and its one-line error messages.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tests/loaders/test_util.h"

namespace qtk {
namespace {

using testing::source_path;
using testing::TempDir;

struct ChildRun {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ChildRun run_inspect(const std::string& args) {
  TempDir tmp;
  const std::string cmd = std::string(QTK_INSPECT_BIN) + " " + args + " >" +
                          shell_quote(tmp.file("out")) + " 2>" + shell_quote(tmp.file("err"));
  const int raw = std::system(cmd.c_str());
  ChildRun r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = testing::read_file(tmp.file("out"));
  r.err = testing::read_file(tmp.file("err"));
  return r;
}

size_t lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

TEST(Inspect, VlmPlanAndSkippedGroups) {
  const ChildRun r = run_inspect(shell_quote(source_path("tests/data/models/qwen3.5-tiny-vlm")));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("architecture: Qwen3_5ForConditionalGeneration"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("layer plan: LFLLFL "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  model.visual: 21 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  mtp: 5 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensors: 81, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  BF16: 81 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("linear attention: 2 key heads x 32, 2 value heads x 24, conv kernel 4"),
            std::string::npos)
      << r.out;
}

// Mixture of experts: experts, top-k, renormalisation, shared expert, the
// stored expert layout and the dense layers, for both layouts.
TEST(Inspect, MixtureOfExperts) {
  const ChildRun a = run_inspect(shell_quote(source_path("tests/data/models/qwen3-moe-tiny")));
  ASSERT_EQ(a.status, 0) << a.err;
  for (const char* want :
       {"architecture: Qwen3MoeForCausalLM (model_type qwen3_moe)\n",
        "intermediate_size: 96 (unused: no dense MLP layer)\n",
        "mixture of experts: 8 experts of width 32, top-2 per token, top-k weights renormalised "
        "to sum 1\n",
        "shared expert: none\n",
        "expert tensors: one per expert (mlp.experts.N.{gate,up,down}_proj)\n",
        "mlp plan: EEE  (E = mixture of experts, D = dense MLP); dense layers: none\n",
        "tensors: 102, "})
    EXPECT_NE(a.out.find(want), std::string::npos) << want << " in:\n" << a.out;
  const ChildRun b =
      run_inspect(shell_quote(source_path("tests/data/models/qwen3.5-moe-tiny-vlm")));
  ASSERT_EQ(b.status, 0) << b.err;
  for (const char* want :
       {"architecture: Qwen3_5MoeForConditionalGeneration",
        "mixture of experts: 8 experts of width 32, top-2 per token, top-k weights renormalised",
        "shared expert: width 48, sigmoid gate\n",
        "expert tensors: fused 3-D (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I])\n",
        "mlp plan: EEEE ", "  mtp: "})
    EXPECT_NE(b.out.find(want), std::string::npos) << want << " in:\n" << b.out;
}

TEST(Inspect, ShardedF32AndHybridPlans) {
  const ChildRun a =
      run_inspect(shell_quote(source_path("tests/data/models/qwen3-tiny-sharded-f32")));
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.out.find("layer plan: FFFF "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("  F32: 47 tensors, 932608 bytes"), std::string::npos)
      << a.out;  // index total_size
  EXPECT_NE(a.out.find("skipped groups: none"), std::string::npos) << a.out;
  const ChildRun b = run_inspect(shell_quote(source_path("samples/qwen3.5-sample")));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(b.out.find("layer plan: LLLFLLLF "), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("eos_token_ids: 0;"), std::string::npos) << b.out;
}

TEST(Inspect, MalformedDirectoryExitsOneWithOneLine) {
  TempDir tmp;
  namespace fs = std::filesystem;
  const fs::path dir = tmp.path() / "broken";
  fs::create_directories(dir);
  fs::copy_file(source_path("tests/data/models/qwen3-tiny/config.json"), dir / "config.json");
  testing::write_file((dir / "model.safetensors").string(),
                      testing::safetensors_bytes("{\"a\":", 0));
  const ChildRun r = run_inspect(shell_quote(dir.string()));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");  // no partial output
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("inspect: " + (dir / "model.safetensors").string(), 0), 0u) << r.err;
  EXPECT_NE(r.err.find("invalid JSON"), std::string::npos) << r.err;
}

TEST(Inspect, UsageErrorsExitOneWithOneLine) {
  for (const std::string& args :
       {std::string(""), std::string("/nonexistent/dir"), std::string("--no-such-flag x"),
        "--verify " + shell_quote(source_path("tests/data/models/qwen3-tiny"))}) {
    SCOPED_TRACE(args);
    const ChildRun r = run_inspect(args);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("inspect: ", 0), 0u) << r.err;
  }
}

// A FIFO, socket or device is named for what it is, never "a file"; a
// FIFO is not opened (that would wait for a writer).
TEST(Inspect, NonFilesAreNamed) {
  TempDir tmp;
  const std::string fifo = tmp.file("m.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string sock = tmp.file("s.sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path));
  std::strcpy(addr.sun_path, sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  const struct {
    std::string path, found;
  } cases[] = {{fifo, "found a FIFO (named pipe)"},
               {sock, "found a socket"},
               {"/dev/null", "found a character device"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    const ChildRun r = run_inspect(shell_quote(c.path));
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err, "inspect: " + c.path + ": expected a checkpoint directory or .pack file, " +
                         c.found + "\n");
  }
}

TEST(Inspect, Help) {
  const ChildRun r = run_inspect("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
}

// A summary lost to a full device is an error (exit 1, one line on stderr),
// not exit 0 with nothing written; --help alike.
TEST(Inspect, FullStdoutIsAnError) {
  for (const std::string& args :
       {shell_quote(source_path("tests/data/models/qwen3-tiny")), std::string("--help")}) {
    SCOPED_TRACE(args);
    TempDir tmp;
    const std::string cmd =
        std::string(QTK_INSPECT_BIN) + " " + args + " >/dev/full 2>" + shell_quote(tmp.file("err"));
    const int raw = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 1) << raw;
    EXPECT_EQ(testing::read_file(tmp.file("err")),
              "inspect: cannot write to standard output: No space left on device\n");
  }
}

}  // namespace
}  // namespace qtk
