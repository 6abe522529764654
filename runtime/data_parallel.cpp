#include "runtime/data_parallel.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/mapped_file.h"  // describe_file_type
#include "core/plural.h"
#include "runtime/backend/backend.h"
#include "runtime/host_memory.h"
#include "runtime/prompt_jsonl.h"  // reads_once
#include "runtime/results_file.h"
#include "runtime/shard.h"

extern char** environ;

namespace qtk {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxOrdinal = 4095;
constexpr int kSomeLinesFailed = 3;  // generate's exit status (generate_main.cpp)
// note: this program itself, whatever name or path it was started by (and
// still the same file if the binary is replaced during the run).
constexpr const char* kSelf = "/proc/self/exe";

[[noreturn]] void bad_list(const std::string& text, const std::string& why) {
  fail(
      "--devices: expected distinct device ordinals such as 0,1,3 (non-negative integers, "
      "comma-separated) or all, found \"{}\" ({})",
      text, why);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// How a worker ended, after "failed": "with exit status 1", "killed by SIGKILL".
std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("with exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by " + signal_name(WTERMSIG(status));
  return fmt::format("with wait status {}", status);
}

// One worker process: `generate` with `args`, on `device`.
struct Worker {
  int device = 0;
  std::string what;  // for messages: "device 1 (shard 1/2 into OUT.part-1-of-2)"
  pid_t pid = -1;
  int status = 0;
  bool done = false;
};

// The environment of a worker: ours, with CUDA_VISIBLE_DEVICES set on cuda,
// and QTK_MEM_AVAILABLE set to `memory_share` bytes where that is positive.
// note: CPU workers share one machine's memory, which each would otherwise
// take as its own when it sizes its KV cache (runtime/host_memory.h).
std::vector<std::string> worker_environment(const std::string& device, int ordinal,
                                            int64_t memory_share = 0) {
  std::vector<std::string> env;
  const char* parent = ::getenv("CUDA_VISIBLE_DEVICES");
  for (char** e = environ; *e != nullptr; ++e) {
    if (device == "cuda" && strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0) continue;
    if (memory_share > 0 && strncmp(*e, "QTK_MEM_AVAILABLE=", 18) == 0) continue;
    env.emplace_back(*e);
  }
  if (device == "cuda") env.push_back("CUDA_VISIBLE_DEVICES=" + visible_device_of(ordinal, parent));
  if (memory_share > 0) env.push_back(fmt::format("QTK_MEM_AVAILABLE={}", memory_share));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (std::string& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// The child's side of spawn_worker, between fork and exec.
// note: async-signal-safe calls only (sigaction, sigprocmask, prctl,
// getppid, execve, write, _exit): the parent may have other threads, whose
// locks (malloc's) the child inherits held.
[[noreturn]] void exec_worker(pid_t parent, const sigset_t& mask, char* const* argv,
                              char* const* envp, int report_fd) {
  // The parent's handlers are not the worker's (exec would reset them too;
  // a signal before the exec must not run them in this copy).
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction cur {};
    if (::sigaction(s, nullptr, &cur) != 0 || cur.sa_handler == SIG_IGN ||
        cur.sa_handler == SIG_DFL)
      continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(s, &dfl, nullptr);
  }
  // note: the worker gets SIGTERM when the parent dies (SIGKILL, a crash,
  // the OOM killer), and stops as at a SIGTERM: its part stays for --resume
  // and its lock goes. The setting survives exec. getppid afterwards: a
  // parent that died before the prctl sent nothing, so the child ends here
  // as that SIGTERM would have ended it (no lock or part taken yet).
  int err = 0;
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) err = errno;
  if (err == 0 && ::getppid() != parent) ::_exit(128 + SIGTERM);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  if (err == 0) {
    ::execve(kSelf, argv, envp);
    err = errno;
  }
  [[maybe_unused]] const ssize_t n = ::write(report_fd, &err, sizeof(err));
  ::_exit(127);
}

pid_t spawn_worker(std::vector<std::string> args, std::vector<std::string> env) {
  args.insert(args.begin(), "generate");
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);
  // note: fork and exec, not posix_spawn: the child must set its
  // parent-death signal (prctl) before the exec, and posix_spawn runs no
  // code there. The worker stays in our process group, so a Ctrl-C at the
  // terminal reaches it directly; signals sent to this process alone are
  // forwarded by wait_for_workers. PR_SET_PDEATHSIG follows the thread that
  // forked: this is the main thread, which lives as long as the process.
  int report[2];  // the child's errno when it cannot exec (close-on-exec: nothing on success)
  if (::pipe2(report, O_CLOEXEC) != 0)
    fail_errno(fmt::format("--devices: cannot start a worker process ({})", kSelf));
  const pid_t parent = ::getpid();
  sigset_t all, mask;
  sigfillset(&all);
  // (all signals blocked across the fork: the child installs the defaults first)
  ::pthread_sigmask(SIG_SETMASK, &all, &mask);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(report[0]);
    exec_worker(parent, mask, argv.data(), envp.data(), report[1]);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    errno = fork_errno;
    fail_errno(fmt::format("--devices: cannot start a worker process ({})", kSelf));
  }
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    errno = child_errno;
    fail_errno(fmt::format("--devices: cannot start a worker process ({})", kSelf));
  }
  return pid;
}

// Waits for every worker; forwards SIGINT/SIGTERM/SIGHUP received meanwhile
// to those still running. `on_done` runs as each one ends. Returns the
// signal received, or 0. The caller holds an InterruptScope from before the
// first worker starts, so that no signal is lost in between.
int wait_for_workers(std::vector<Worker>& workers, const std::function<void(Worker&)>& on_done) {
  int forwarded = 0;
  size_t running = workers.size();
  while (running > 0) {
    if (const int sig = interrupt_signal(); sig != 0 && forwarded == 0) {
      for (Worker& w : workers)
        if (!w.done) ::kill(w.pid, sig);
      forwarded = sig;
    }
    bool reaped = false;
    for (Worker& w : workers) {
      if (w.done) continue;
      const pid_t r = ::waitpid(w.pid, &w.status, WNOHANG);
      if (r == w.pid) {
        w.done = true;
        --running;
        reaped = true;
        on_done(w);
      }
    }
    // note: polling (a signal interrupts the sleep) rather than a blocking
    // wait, so that a signal arriving just before the wait is still
    // forwarded at once.
    if (!reaped && running > 0) ::usleep(50 * 1000);
  }
  return forwarded;
}

bool succeeded(const Worker& w) {
  return WIFEXITED(w.status) && (WEXITSTATUS(w.status) == 0 || WEXITSTATUS(w.status) == 3);
}

// The workers' failures as one message (they each printed their own error
// line above), or "" when all succeeded.
std::string failures(const std::vector<Worker>& workers) {
  std::string s;
  for (const Worker& w : workers)
    if (!succeeded(w))
      s += fmt::format("{}the worker on {} failed {}", s.empty() ? "" : "; ", w.what,
                       describe_status(w.status));
  return s;
}

// The flags of `job` but those named in `drop`.
std::vector<std::string> flags_but(const DataParallelJob& job, const std::set<std::string>& drop) {
  std::vector<std::string> args;
  for (const auto& [name, arg] : job.flags)
    if (!drop.count(name)) args.push_back(arg);
  return args;
}

std::string device_list(const std::vector<int>& devices) {
  return fmt::format("{}", fmt::join(devices, ","));
}

// The combinations a --devices run refuses, checked before anything else.
void refuse_combinations(const GenerateOptions& o) {
  // note: a worker sees one GPU; a split model needs N of them per worker.
  if (o.tensor_parallel > 1)
    fail(
        "--devices with --tensor-parallel {}: each worker runs on one device; expected one of "
        "the two (a model split over GPUs 0..{} runs without --devices)",
        o.tensor_parallel, o.tensor_parallel - 1);
  if (o.tune_only) return;
  if (o.out == "-")
    fail(
        "--devices: expected --out FILE (the workers' parts are merged into it), found --out - "
        "(stdout)");
  if (o.batch == "-")
    fail("--devices: expected --batch FILE (every worker reads it), found --batch - (stdin)");
  struct stat st {};
  if (reads_once(o.batch) && ::stat(o.batch.c_str(), &st) == 0)
    fail(
        "--devices: expected --batch FILE, a regular file (every worker reads it), found {} "
        "({})",
        describe_file_type(st.st_mode), o.batch);
  if (o.show)
    fail(
        "--devices with --show: the workers' continuations would interleave on stdout; expected "
        "one of them");
}

// On the CPU each worker gets an equal part of the threads.
int worker_threads(const GenerateOptions& o, size_t workers) {
  const int all = o.threads > 0 ? o.threads : default_thread_count();
  return std::max(1, all / static_cast<int>(workers));
}

// --tune-only on every device at once: each tunes its own GPU.
int tune_every_device(const DataParallelJob& job) {
  InterruptScope interrupts;
  std::vector<Worker> workers;
  for (int d : job.devices) {
    Worker w;
    w.device = d;
    w.what = fmt::format("device {}", d);
    w.pid = spawn_worker(flags_but(job, {}), worker_environment(job.options.device, d));
    workers.push_back(w);
  }
  if (const int sig = wait_for_workers(workers, [](Worker&) {}))
    fail("--devices {} --tune-only: interrupted by {}", device_list(job.devices), signal_name(sig));
  if (const std::string f = failures(workers); !f.empty())
    fail("--devices {} --tune-only: {}", device_list(job.devices), f);
  return 0;
}

// One device: the run itself, on that device.
int run_on_one_device(const DataParallelJob& job) {
  const GenerateOptions& o = job.options;
  if (o.device == "cuda") {
    // note: exec, not a worker: this process becomes the run, so signals,
    // exit status and output are a plain run's. CUDA_VISIBLE_DEVICES must
    // be set before the CUDA runtime starts, which checking the ordinal
    // already did in this process.
    std::vector<std::string> args = flags_but(job, {});
    args.insert(args.begin(), "generate");
    std::vector<std::string> env = worker_environment(o.device, job.devices[0]);
    std::vector<char*> argv = c_strings(args), envp = c_strings(env);
    std::fflush(nullptr);
    ::execve(kSelf, argv.data(), envp.data());
    fail_errno(
        fmt::format("--devices: cannot start the run on device {} ({})", job.devices[0], kSelf));
  }
  const GenerateSummary s = run_generate(o);
  std::fprintf(stderr, "%s\n", summary_line(s).c_str());
  return s.failed_lines > 0 ? kSomeLinesFailed : 0;
}

}  // namespace

std::vector<int> parse_devices(const std::string& text, const std::string& device,
                               const std::function<int()>& cuda_count) {
  if (text == "all") {
    if (device != "cuda")
      fail(
          "--devices all: counts the CUDA devices; expected --device cuda, or on --device {} a "
          "list of worker numbers such as 0,1 (one worker process each), found --device {}",
          device, device);
    const int n = cuda_count();
    std::vector<int> all(static_cast<size_t>(std::max(0, n)));
    for (int i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
    if (all.empty()) fail("--devices all: expected at least one CUDA device, found none");
    return all;
  }
  if (text.empty()) bad_list(text, "an empty list");
  std::vector<int> devices;
  std::set<int> seen;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty()) bad_list(text, "an empty entry");
    if (ec != std::errc() || end != item.data() + item.size() || v < 0 || v > kMaxOrdinal)
      bad_list(text, fmt::format("\"{}\" is not an ordinal 0..{}", item, kMaxOrdinal));
    if (!seen.insert(v).second) bad_list(text, fmt::format("{} is given twice", v));
    devices.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (device == "cuda") {
    const int n = cuda_count();
    for (int d : devices)
      if (d >= n)
        fail(
            "--devices {}: expected CUDA device ordinals below {} (the devices this process "
            "sees), found {}",
            text, n, d);
  }
  return devices;
}

std::string visible_device_of(int ordinal, const char* parent) {
  if (parent == nullptr || *parent == '\0') return std::to_string(ordinal);
  std::string_view list(parent);
  for (int i = 0; i < ordinal; ++i) {
    const size_t comma = list.find(',');
    if (comma == std::string_view::npos) return std::to_string(ordinal);  // not reached: checked
    list.remove_prefix(comma + 1);
  }
  return std::string(list.substr(0, list.find(',')));
}

void refuse_parts_of_another_count(const std::string& out, int64_t count) {
  namespace fs = std::filesystem;
  const fs::path out_path(out);
  const std::string prefix = out_path.filename().string() + ".part-";
  std::error_code ec;
  const fs::path dir = out_path.has_parent_path() ? out_path.parent_path() : fs::path(".");
  std::set<std::string> found;
  int64_t other = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long long k = -1, m = -1;
    int used = 0;
    if (std::sscanf(name.c_str() + prefix.size(), "%lld-of-%lld%n", &k, &m, &used) != 2) continue;
    if (m == count || m < 2 || k < 0 || k >= m) continue;
    other = m;
    found.insert(name);
  }
  if (found.empty()) return;
  fail(
      "{}: {} holds {} of a --devices run over {} devices ({}{}); this run on {} would neither "
      "finish nor remove them: give {} devices with --resume to finish that run, or remove them",
      count > 1 ? "--devices" : "--out", dir.string(),
      count_of(static_cast<int64_t>(found.size()), "file"), other, *found.begin(),
      found.size() > 1 ? ", ..." : "", count_of(count, "device"), other);
}

int run_data_parallel(const DataParallelJob& job) {
  const GenerateOptions& o = job.options;
  const auto start = Clock::now();
  check_generate_inputs(o);
  // (one device: the run itself checks, run_generate)
  if (job.devices.size() == 1) return run_on_one_device(job);
  if (o.out != "-" && !o.tune_only)
    refuse_parts_of_another_count(o.out, static_cast<int64_t>(job.devices.size()));
  refuse_combinations(o);
  if (o.tune_only) return tune_every_device(job);

  const bool sharded = !o.shard.empty();
  const ShardSpec shard = sharded ? parse_shard("--shard", o.shard, ::getenv) : ShardSpec{};
  const int64_t m = static_cast<int64_t>(job.devices.size());
  std::vector<std::string> parts;
  for (int64_t k = 0; k < m; ++k) parts.push_back(fmt::format("{}.part-{}-of-{}", o.out, k, m));
  // note: the workers write OUT.part-k-of-M and the names derived from it;
  // one of them past the name length limit fails here, before the lock or any
  // worker, rather than in every worker (which left no parts to --resume).
  for (const std::string& p : parts)
    check_names_beside(ResultsPaths::of(p, ""), "--out " + o.out, o.out);

  const ResultsPaths paths = ResultsPaths::of(o.out, o.meta);
  std::optional<OutputLock> lock(std::in_place, paths.lock, o.out);
  // note: as a plain run's: with the lock held, what a killed run (or a
  // killed parent's merge) left of its temporary files can go.
  for (const std::string& line : remove_stale_temporaries(paths))
    std::fprintf(stderr, "generate: %s\n", line.c_str());
  // What the merge may replace at the end, as a plain run's final move: with
  // --force anything at OUT and its header, otherwise only the files there
  // now (the OUT that --resume finishes into), never one that appears while
  // the workers run or the parts are merged.
  const OutputsAtStart at_start = OutputsAtStart::of(paths, o.force);
  // note: as a plain run's: --shard implies --resume (a retried job-array
  // task runs the same command).
  const StartMode mode = o.force               ? StartMode::kForce
                         : o.resume || sharded ? StartMode::kResume
                                               : StartMode::kFresh;
  // A part's results, complete or partial, on disk.
  const auto part_left = [](const std::string& p) {
    const ResultsPaths pp = ResultsPaths::of(p, "");
    return exists(pp.out) || exists(pp.partial);
  };
  const bool parts_left = std::any_of(parts.begin(), parts.end(), part_left);
  if (mode == StartMode::kFresh)
    for (const std::string& p : parts)
      choose_start(ResultsPaths::of(p, ""), mode);           // fails for a part left behind
  if (mode == StartMode::kFresh) choose_start(paths, mode);  // fails for an existing OUT
  if (mode == StartMode::kResume && !parts_left && (exists(paths.out) || exists(paths.partial))) {
    // note: what is there is a one-device run's (OUT.partial, or OUT
    // complete): it is continued, or checked and left as it is, by that
    // run's own --resume, on the first device.
    lock.reset();
    InterruptScope interrupts;
    std::vector<Worker> workers(1);
    workers[0].device = job.devices[0];
    workers[0].what = fmt::format("device {} (resuming {})", job.devices[0], o.out);
    workers[0].pid = spawn_worker(flags_but(job, {}), worker_environment(o.device, job.devices[0]));
    if (const int sig = wait_for_workers(workers, [](Worker&) {}))
      fail("--devices: interrupted by {}", signal_name(sig));
    if (const std::string f = failures(workers); !f.empty()) fail("--devices: {}", f);
    return WEXITSTATUS(workers[0].status);
  }

  // note: worker k runs shard k/M of the batch, or with --shard K/N the
  // sub-shard K + N*k of N*M: the M sub-shards own exactly shard K/N's lines.
  InterruptScope interrupts;
  std::vector<Worker> workers;
  const int64_t available = o.device == "cpu" ? available_memory_bytes() : -1;
  const int64_t memory_share = available > 0 ? std::max<int64_t>(available / m, 1) : 0;
  const std::set<std::string> replaced = {"out",   "meta",        "shard",  "progress",
                                          "force", "no-progress", "resume", "threads"};
  for (int64_t k = 0; k < m; ++k) {
    const int64_t index = shard.index + shard.count * k, count = shard.count * m;
    std::vector<std::string> args = flags_but(job, replaced);
    args.push_back("--out=" + parts[static_cast<size_t>(k)]);
    args.push_back(fmt::format("--shard={}/{}", index, count));
    args.push_back("--no-progress");
    if (mode == StartMode::kForce) args.push_back("--force");
    if (o.device == "cpu")
      args.push_back(fmt::format("--threads={}", worker_threads(o, job.devices.size())));
    else if (o.threads > 0)
      args.push_back(fmt::format("--threads={}", o.threads));
    Worker w;
    w.device = job.devices[static_cast<size_t>(k)];
    w.what = fmt::format("device {} (shard {}/{} into {})", w.device, index, count,
                         parts[static_cast<size_t>(k)]);
    w.pid = spawn_worker(std::move(args), worker_environment(o.device, w.device, memory_share));
    workers.push_back(std::move(w));
  }
  const bool show_progress = (o.progress || ::isatty(2)) && !o.no_progress;
  size_t finished = 0;
  const int sig = wait_for_workers(workers, [&](Worker& w) {
    ++finished;
    if (!show_progress) return;
    std::fprintf(stderr, "generate: --devices: %zu/%zu workers done: %s %s after %.1f s\n",
                 finished, workers.size(), w.what.c_str(),
                 succeeded(w) ? "finished" : ("failed " + describe_status(w.status)).c_str(),
                 std::chrono::duration<double>(Clock::now() - start).count());
  });
  const std::string kept = fmt::format("{}.part-*-of-{}", o.out, m);
  // note: --force with --resume is refused: after a --force run the advice
  // is to swap the one for the other, not to add --resume.
  const std::string again =
      o.force ? "run again with --resume instead of --force" : "run the same command with --resume";
  if (sig != 0)
    fail(
        "--devices {}: interrupted by {} (forwarded to every worker); the parts ({}) stay: {} to "
        "finish",
        device_list(job.devices), signal_name(sig), kept, again);
  if (const std::string f = failures(workers); !f.empty()) {
    // note: workers that all failed before writing (a cause each meets at
    // its start) leave no part to resume from: say so, not that parts stay.
    if (!std::any_of(parts.begin(), parts.end(), part_left))
      fail(
          "--devices {}: {}; no worker wrote results, nothing was written: fix the cause and run "
          "the command again",
          device_list(job.devices), f);
    fail("--devices {}: {}; no {} was written, the parts ({}) stay: fix the cause and {} to finish",
         device_list(job.devices), f, o.out, kept, again);
  }

  MergeOptions mo;
  mo.out = o.out;
  mo.meta = o.meta;
  mo.shards = parts;
  mo.force = o.force;
  mo.lock = false;         // held above
  mo.at_start = at_start;  // note: OUT was checked above, under OUT.lock
  mo.doing = "generating";
  if (sharded) mo.as_shard = shard;
  mo.extra["devices"] = job.devices;
  int64_t lines = 0;
  try {
    lines = run_merge(mo).lines;
  } catch (const Error& e) {
    // note: the parts are removed only once the merge is in place.
    fail("{}; the parts ({}) stay: {} to merge them into {}, replacing what is there then",
         e.what(), kept, again, o.out);
  }
  for (const std::string& p : parts) {
    std::remove(p.c_str());
    std::remove((p + ".meta.json").c_str());
  }
  const bool some_failed = std::any_of(workers.begin(), workers.end(), [](const Worker& w) {
    return WEXITSTATUS(w.status) == kSomeLinesFailed;
  });
  std::fprintf(
      stderr,
      "generate: --devices %s: %lld lines from %zu workers merged into %s%s; wall time %.2f s\n",
      device_list(job.devices).c_str(), static_cast<long long>(lines), workers.size(),
      o.out.c_str(), some_failed ? " (some lines got an error line)" : "",
      std::chrono::duration<double>(Clock::now() - start).count());
  return some_failed ? kSomeLinesFailed : 0;
}

}  // namespace qtk
