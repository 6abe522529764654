// Helpers of the tests of how generate and merge treat their output files
// (generate_safety_test.cpp, shard_test.cpp, data_parallel_test.cpp): faults
// injected into the real programs through fault_shim.c, programs started
// with default signal dispositions (and a stderr that blocks them), waits
// for them, directory listings.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tests/runtime/test_util.h"

namespace qtk::rt_test {

// The environment assignments that run a program under tests/runtime/
// fault_shim.c with the faults `faults` ("QTK_FAULT_X=... ..."), to prefix a
// command line given to run().
// note: an ASan build checks that its runtime comes first; the shim does.
inline std::string with_faults(const std::string& faults) {
  return fmt::format("LD_PRELOAD={} ASAN_OPTIONS=verify_asan_link_order=0 {} ", QTK_FAULT_SHIM,
                     faults);
}

// Starts `argv` with SIGINT, SIGTERM and SIGHUP at their default
// dispositions (as from a terminal, whatever the test runner inherited), or
// SIGHUP ignored (as under nohup), `env` ({name, value}) added to the
// environment and stdout and stderr in the files named (or /dev/null);
// stderr on the open descriptor `err_fd` instead where that is given.
inline pid_t start_with_default_signals(
    const std::vector<std::string>& argv, bool nohup = false,
    const std::vector<std::pair<std::string, std::string>>& env = {},
    const std::string& out = "/dev/null", const std::string& err = "/dev/null", int err_fd = -1) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGHUP, nohup ? SIG_IGN : SIG_DFL);
  for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int e = err_fd >= 0 ? err_fd : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(o, 1), ::dup2(e, 2);
  ::execv(args[0], args.data());
  ::_exit(127);
}

// A pipe whose buffer is full and that nobody reads, for a program's
// stderr: its first write there blocks (as behind `2>&1 | less` left
// paused), so that it sits in that write(2), out of reach of its own checks
// for a signal, while the test signals it. Both ends are closed (and the
// write ends with EPIPE, or SIGPIPE) when it goes out of scope.
class FullPipe {
 public:
  FullPipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    // note: the smallest buffer (one page) fills at once; a write of up to
    // PIPE_BUF bytes waits for room for all of it, so after the loops
    // below (4096, then 64 bytes, then 1) no write fits.
    ::fcntl(write_fd_, F_SETPIPE_SZ, 4096);
    ::fcntl(write_fd_, F_SETFL, O_NONBLOCK);
    const std::string chunk(4096, 'x');
    for (const size_t size : {size_t{4096}, size_t{64}, size_t{1}})
      while (::write(write_fd_, chunk.data(), size) > 0) {
      }
    // (the program's writes must block, not fail with EAGAIN: the flag
    // belongs to the open pipe, which the program shares)
    ::fcntl(write_fd_, F_SETFL, 0);
  }
  ~FullPipe() {
    if (read_fd_ >= 0) ::close(read_fd_);
    if (write_fd_ >= 0) ::close(write_fd_);
  }
  FullPipe(const FullPipe&) = delete;
  FullPipe& operator=(const FullPipe&) = delete;
  int write_fd() const { return write_fd_; }

 private:
  int read_fd_ = -1, write_fd_ = -1;
};

// Waits up to `seconds` for `pid` to end; false (and the process killed
// and reaped) when it did not.
inline bool ended_within(pid_t pid, double seconds, int* status) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

// Checks `done()` every 10 ms, at most `tries` times (6000: a minute or a
// little more), until it holds or `pid` ends; false when `pid` ended first
// (reaped, its status in *status), true otherwise (also when time ran out).
template <class Done>
bool running_until(pid_t pid, Done done, int* status, int tries = 6000) {
  for (int i = 0; i < tries && !done(); ++i) {
    if (::waitpid(pid, status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The lines that are complete in `path` ("" when it does not exist).
inline size_t complete_lines(const std::string& path) {
  const std::string text = read_text(path);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// Waits up to a minute until `path` holds `lines` complete lines, or `pid`
// ends; false when it ended first (reaped, its status in *status).
inline bool wait_for_lines(const std::string& path, size_t lines, pid_t pid, int* status) {
  return running_until(
      pid, [&] { return complete_lines(path) >= lines; }, status);
}

// Sends `pid` the signal `sig` and gives it 300 ms to act on it; whether it
// is still running then (its status in *status when not).
inline bool still_running_after(pid_t pid, int sig, int* status) {
  ::kill(pid, sig);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return ::waitpid(pid, status, WNOHANG) == 0;
}

// Waits until the main thread of `pid` has sat in the same system call for
// half a second (/proc/PID/syscall; at least a second when that cannot be
// read), at most 30 s.
inline void wait_until_blocked(pid_t pid) {
  const auto start = std::chrono::steady_clock::now();
  std::string last;
  int same = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::ifstream in(fmt::format("/proc/{}/syscall", pid));
    std::string text;
    std::getline(in, text);
    const std::string call = text.substr(0, text.find(' '));
    if (text.empty() && std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) return;
    same = !call.empty() && call != "running" && call == last ? same + 1 : 0;
    if (same >= 5) return;
    last = call;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The names in `dir` that start with `prefix`, sorted.
inline std::vector<std::string> names_starting(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A pid that no process has: a child that has exited and been waited for.
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

}  // namespace qtk::rt_test
