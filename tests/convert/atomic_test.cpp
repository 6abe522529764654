// The atomic-output guarantee: on a forced failure no OUT is created or
// replaced and no temporary file is left; an existing OUT is kept without
// --force and replaced with it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "convert/convert.h"
#include "convert_test_util.h"
#include "core/interrupt.h"
#include "pack/pack.h"

namespace qtk {
namespace {

using testing::quote;
using testing::run_shell;
using testing::TempDir;

const std::string kModel = "samples/qwen3.5-sample";  // ~12 MB pack

std::string cli(const std::string& in, const std::string& out, const std::string& flags = "") {
  return std::string(QTK_CONVERT_BIN) + " " + quote(in) + " " + quote(out) + " " + flags;
}

TEST(Atomic, FileSizeLimitFailsCleanly) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  // note: bash's ulimit -f counts 1024-byte blocks: 2 MB, far below the pack.
  const auto r = run_shell("ulimit -f 2048; exec " + cli(testing::source_path(kModel), out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_TRUE(tmp.listing().empty()) << "left behind: " << *tmp.listing().begin();
}

TEST(Atomic, FileSizeLimitKeepsExistingOutput) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  testing::write_file(out, "previous content");
  const auto r =
      run_shell("ulimit -f 2048; exec " + cli(testing::source_path(kModel), out, "--force"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(testing::read_file(out), "previous content");
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});
}

TEST(Atomic, UnwritableDestination) {
  TempDir tmp;
  // note: tests may run as root, which ignores directory permissions; a
  // directory on a read-only file system (/proc) fails for everyone.
  const std::string out = ::geteuid() == 0 ? "/proc/qtk-convert-test.pack" : tmp.file("ro/m.pack");
  if (::geteuid() != 0) {
    std::filesystem::create_directories(tmp.file("ro"));
    std::filesystem::permissions(
        tmp.file("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  }
  const auto r = run_shell(cli(testing::source_path(kModel), out));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("temporary file"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Atomic, ExistingOutputNeedsForce) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  testing::write_file(out, "previous content");
  const auto r = run_shell(cli(testing::source_path(kModel), out));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(testing::read_file(out), "previous content");
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});

  const auto forced = run_shell(cli(testing::source_path(kModel), out, "--force"));
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_NO_THROW(Pack::open(out));
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});
}

// --force never replaces what the pack is converted from: OUT as one of the
// input directory's files or as the input archive is refused, untouched,
// and no temporary file is left.
TEST(Atomic, ForceDoesNotReplaceTheInput) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  std::filesystem::copy(testing::source_path(kModel), dir,
                        std::filesystem::copy_options::recursive);
  const auto in_dir = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      names.insert(e.path().filename().string());
    return names;
  };
  const std::set<std::string> before = in_dir();
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json"}) {
    const std::string victim = dir + "/" + name;
    const std::string content = testing::read_file(victim);
    const auto r = run_shell(cli(dir, victim, "--force"));
    EXPECT_EQ(r.status, 1) << name << ": " << r.err;
    EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("a file of the input checkpoint"), std::string::npos) << r.err;
    EXPECT_EQ(testing::read_file(victim), content) << name;
    EXPECT_EQ(in_dir(), before);
  }
  // An archive as its own output.
  const std::string tar = tmp.file("ckpt.tar");
  ASSERT_EQ(run_shell("tar -cf " + quote(tar) + " -C " + quote(tmp.str()) + " ckpt").status, 0);
  const std::string content = testing::read_file(tar);
  const auto r = run_shell(cli(tar, tar, "--force"));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("is the input itself"), std::string::npos) << r.err;
  EXPECT_EQ(testing::read_file(tar), content);
  // A new pack inside the input directory is fine.
  const auto ok = run_shell(cli(dir, dir + "/m.pack"));
  EXPECT_EQ(ok.status, 0) << ok.err;
}

// A directory as OUT is named as one, with or without --force.
TEST(Atomic, OutputThatIsADirectory) {
  TempDir tmp;
  std::filesystem::create_directories(tmp.file("d"));
  for (const char* flags : {"", "--force"}) {
    const auto r = run_shell(cli(testing::source_path(kModel), tmp.file("d"), flags));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_NE(r.err.find("is a directory; expected a file name"), std::string::npos) << r.err;
  }
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"d"});
}

// An OUT that is a symbolic link to a missing file is refused before any
// work (it used to fail only at the final rename, "appeared while
// converting"). --force replaces the link itself, as it replaces a link to
// an existing file: nothing is ever written through the link.
TEST(Atomic, DanglingSymlinkOutput) {
  TempDir tmp;
  const std::string out = tmp.file("x.pack");
  const std::string gone = tmp.file("gone.pack");
  std::filesystem::create_symlink(gone, out);
  // An input that fails late: refused at the start means the output is
  // named, not the (broken) checkpoint.
  const std::string dir = tmp.file("broken");
  std::filesystem::create_directories(dir);
  testing::write_file(dir + "/config.json", "{ not json");
  for (const std::string& in : {dir, testing::source_path(kModel)}) {
    const auto r = run_shell(cli(in, out));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(out + ": already exists (a symbolic link to a missing file); pass "
                               "--force to replace it"),
              std::string::npos)
        << r.err;
    EXPECT_TRUE(std::filesystem::is_symlink(out));
    EXPECT_FALSE(std::filesystem::exists(gone));
  }
  EXPECT_EQ(tmp.listing(), (std::set<std::string>{"x.pack", "broken"}));

  const auto forced = run_shell(cli(testing::source_path(kModel), out, "--force"));
  EXPECT_EQ(forced.status, 0) << forced.err;
  EXPECT_FALSE(std::filesystem::is_symlink(out));
  EXPECT_FALSE(std::filesystem::exists(gone));
  EXPECT_NO_THROW(Pack::open(out));

  // A link to an existing file: --force replaces the link, not its target.
  const std::string target = tmp.file("target.pack");
  testing::write_file(target, "previous content");
  std::filesystem::remove(out);
  std::filesystem::create_symlink(target, out);
  const auto kept = run_shell(cli(testing::source_path(kModel), out));
  EXPECT_EQ(kept.status, 1) << kept.err;
  EXPECT_NE(kept.err.find("already exists (pass --force"), std::string::npos) << kept.err;
  const auto replaced = run_shell(cli(testing::source_path(kModel), out, "--force"));
  EXPECT_EQ(replaced.status, 0) << replaced.err;
  EXPECT_FALSE(std::filesystem::is_symlink(out));
  EXPECT_EQ(testing::read_file(target), "previous content");
}

// Any valid output name works, also one whose temporary name
// (".NAME.tmp.<pid>.<hex>") would pass NAME_MAX: the temporary name is cut
// short (at a UTF-8 character boundary) and nothing is left behind.
TEST(Atomic, LongOutputName) {
  TempDir tmp;
  std::string two_byte;  // 250 bytes of "é" and ".pack": 255 bytes
  for (int i = 0; i < 125; ++i) two_byte += "\xc3\xa9";
  for (const std::string& name :
       {std::string(240, 'a') + ".pack", std::string(250, 'b') + ".pack", two_byte + ".pack"}) {
    SCOPED_TRACE(name.size());
    const auto r = run_shell(cli(testing::source_path(kModel), tmp.file(name)));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(tmp.listing(), std::set<std::string>{name});
    EXPECT_NO_THROW(Pack::open(tmp.file(name)));
    std::filesystem::remove(tmp.file(name));
  }
  // A name longer than the directory allows is refused before any work.
  const auto too_long =
      run_shell(cli(testing::source_path(kModel), tmp.file(std::string(256, 'c'))));
  EXPECT_EQ(too_long.status, 1) << too_long.err;
  EXPECT_NE(too_long.err.find("the file name is 256 bytes, longer than"), std::string::npos)
      << too_long.err;
  EXPECT_EQ(testing::count_lines(too_long.err), 1) << too_long.err;
  EXPECT_TRUE(tmp.listing().empty());
  // A shortened temporary name left by a killed convert is still recognised
  // as one of ours and removed by the next convert into the directory.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a pid no process has now
  const std::string tail = ".tmp." + std::to_string(child) + ".0123abcd";
  const std::string stale = "." + std::string(255 - 1 - tail.size(), 'a') + tail;
  ASSERT_EQ(stale.size(), 255u);
  testing::write_file(tmp.file(stale), "left by a killed convert");
  const auto r = run_shell(cli(testing::source_path(kModel), tmp.file("m.pack")));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("removed stale temporary file"), std::string::npos) << r.err;
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});
}

TEST(Atomic, BadInputLeavesNothing) {
  TempDir tmp;
  const std::string dir = tmp.file("broken");
  std::filesystem::create_directories(dir);
  testing::write_file(dir + "/config.json", "{ not json");
  TempDir out_dir;
  const auto r = run_shell(cli(dir, out_dir.file("m.pack")));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  EXPECT_TRUE(out_dir.listing().empty());
}

// `sig` raised `times` times in a forked convert: the run stops at the first
// check, unwinds (removing the temporary file) and the process dies by it.
void expect_signal_stops_convert(int sig, int times) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(sig, SIG_DFL);  // as a shell starts a command
    int code = 0;
    {
      InterruptScope scope;
      for (int i = 0; i < times; ++i) ::raise(sig);  // recorded by the handler
      try {
        ConvertOptions opt;
        opt.input = testing::source_path(kModel);
        opt.output = out;
        convert_checkpoint(opt);
        code = 3;  // must not succeed
      } catch (const Error& e) {
        code = std::string(e.what()).find("interrupted by " + signal_name(sig)) != std::string::npos
                   ? 4
                   : 5;
      }
    }
    reraise_interrupt();
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig)
      << "exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  EXPECT_TRUE(tmp.listing().empty()) << "left behind: " << *tmp.listing().begin();
}

// A signal during conversion: the run stops at the next chunk, unwinds
// (removing the temporary file) and the process dies by that signal.
TEST(Atomic, SignalRemovesTemporaryAndReraises) { expect_signal_stops_convert(SIGTERM, 1); }

// SIGPIPE (`convert --progress 2>&1 | head -1`, the reader gone) stops a run
// the same way; it used to end the process at once, leaving the temporary
// pack behind. The second one (the next write into the closed pipe) is not
// a second request to stop at once.
TEST(Atomic, SigpipeRemovesTemporaryAndReraises) { expect_signal_stops_convert(SIGPIPE, 2); }

// Runs the convert program on kModel into `out` with --progress, its stderr
// set up by `stderr_setup` in the child; returns the wait status.
template <typename Setup>
int run_convert_with_stderr(const std::string& out, Setup stderr_setup) {
  const std::string in = testing::source_path(kModel);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    stderr_setup();
    ::execl(QTK_CONVERT_BIN, QTK_CONVERT_BIN, in.c_str(), out.c_str(), "--progress",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

// The program with its stderr reader gone before it starts: a conversion
// too small for a progress line before the end finishes, and its last line
// ("convert: wrote ...") is lost to the closed pipe; the pack is complete,
// so the exit status is 0 (not death by SIGPIPE, 141, with the pack written),
// and nothing else is left.
TEST(Atomic, ClosedProgressPipeAfterThePackIsWrittenExitsZero) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // no reader
  const int status = run_convert_with_stderr(out, [&] { ::dup2(fds[1], 2); });
  ::close(fds[1]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? "killed by " + signal_name(WTERMSIG(status)) : "exit code");
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});
  EXPECT_NO_THROW(Pack::open(out)->verify());
}

// stderr closed (`2>&-`): the pack is written and complete, exit 0 (no file
// convert opens takes fd 2, where the --progress lines go).
TEST(Atomic, ClosedStderrWithProgressWritesThePack) {
  TempDir tmp;
  const std::string out = tmp.file("m.pack");
  const int status = run_convert_with_stderr(out, [] { ::close(2); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"});
  EXPECT_NO_THROW(Pack::open(out)->verify());
}

}  // namespace
}  // namespace qtk
