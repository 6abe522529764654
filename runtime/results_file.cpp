#include "runtime/results_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <span>

#include <fmt/format.h>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/json.h"
#include "core/mapped_file.h"  // describe_file_type
#include "core/output_files.h"
#include "core/read_file.h"
#include "pack/pack_checksum.h"
#include "runtime/generate_resume.h"

namespace qtk {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Creates `path` for writing, as a new file: O_EXCL | O_NOFOLLOW, so that
// nothing already there (a symbolic link planted at the name included) is
// written through. remove_first: the name is this process's own (a
// temporary name ending in our pid, or OUT.partial under --force), so a
// file left there is removed first. Returns the fd, or -1 with errno.
int create_new_file(const std::string& path, bool remove_first) {
  if (remove_first) ::unlink(path.c_str());
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

// Overwrites the start of an existing file without growing it, padding with
// spaces (JSON allows trailing whitespace). note: used when a full disk
// refuses a new file: rewriting blocks the file already has needs no space.
bool overwrite_in_place(const std::string& path, std::string data) {
  // note: O_NOFOLLOW: a symbolic link put at the header's name is not
  // written through.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok =
      ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<off_t>(data.size()) <= st.st_size;
  if (ok) {
    data.resize(static_cast<size_t>(st.st_size), ' ');
    if (!data.empty()) data.back() = '\n';
    ok = ::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size());
  }
  ::close(fd);
  return ok;
}

// The short-lived names of a run (see results_file.h), by the file they
// belong to: "<base>.<pattern>", where each '#' in the pattern stands for a
// pid. Used to size-check the names and to find what a killed run left.
constexpr const char* kMetaTemporaries[] = {"tmp.#", "prev.#"};
constexpr const char* kPartialMetaTemporaries[] = {"tmp.#"};
// note: "merge.#.tmp.#": the staging file of an older merge, written through
// a temporary of its own.
constexpr const char* kOutTemporaries[] = {"merge.#", "merge.#.tmp.#"};

std::string with_pid(const std::string& base, std::string_view pattern, pid_t pid) {
  std::string s = base + ".";
  for (char c : pattern) s += c == '#' ? std::to_string(pid) : std::string(1, c);
  return s;
}

}  // namespace

std::string results_digest(std::string_view text) {
  return checksum_hex(xxh64(text.data(), text.size()));
}

ResultsPaths ResultsPaths::of(const std::string& out, const std::string& meta_override) {
  ResultsPaths p;
  p.out = out;
  p.meta = meta_override.empty() ? out + ".meta.json" : meta_override;
  p.meta_given = !meta_override.empty();
  p.partial = out + ".partial";
  p.partial_meta = p.partial + ".meta.json";
  p.lock = out + ".lock";
  return p;
}

void refuse_output_that_is_an_input(const std::string& flag, const std::string& path,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    const char* tool) {
  struct stat o {};
  // note: stat follows symlinks, so a link to the pack is caught too, and
  // a hard link shares the inode.
  if (::stat(path.c_str(), &o) != 0) return;
  for (const auto& [in_flag, in] : inputs) {
    if (in == "-") continue;  // stdin
    struct stat i {};
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino) {
      fail(
          "{}: {} would write {}, which is the {} file {} (the same file, by inode after "
          "symlinks); refusing to overwrite an input",
          flag, tool, path, in_flag, in);
    }
  }
}

namespace {

// The first leading part of `dir` that exists but is not a directory
// (`w/p.jsonl` of `w/p.jsonl/x`), or "" when there is none.
std::string first_non_directory(const std::string& dir, mode_t* mode) {
  for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    const std::string prefix = at == std::string::npos ? dir : dir.substr(0, at);
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      *mode = st.st_mode;
      return prefix;
    }
    if (at == std::string::npos) return {};
  }
}

// An output path given by `flag`: a file name in an existing directory, not
// a directory, not too long. where: how the directory's messages start;
// what: what would be written there.
// label: where set, the file's own messages name it "PATH (label)" instead
// of "flag PATH" (a derived path the user did not give with the flag).
void check_output_path(const char* flag, const std::string& path, const std::string& where,
                       const char* what, const char* label = nullptr) {
  const std::string named =
      label != nullptr ? fmt::format("{} ({})", path, label) : fmt::format("{} {}", flag, path);
  if (path.empty() || path.back() == '/')
    fail("{}: expected a file name, found \"{}\"", flag, path);
  // note: PATH_MAX counts the terminating NUL.
  if (path.size() >= PATH_MAX)
    fail("{}: cannot write {}: the path is {} bytes, longer than the system allows ({} bytes)",
         where, what, path.size(), PATH_MAX - 1);
  struct stat st {};
  const std::string dir = directory_of(path);
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    mode_t mode = 0;
    if (err == ENOTDIR) {
      const std::string file = first_non_directory(dir, &mode);
      if (!file.empty())
        fail("{}: cannot write {}: {} is not a directory (it is {})", where, what, file,
             describe_file_type(mode));
    }
    if (err == ENOENT) fail("{}: cannot write {}: directory {} does not exist", where, what, dir);
    errno = err;
    fail_errno(fmt::format("{}: cannot write {}: cannot reach directory {}", where, what, dir));
  }
  if (!S_ISDIR(st.st_mode))
    fail("{}: cannot write {}: {} is not a directory (it is {})", where, what, dir,
         describe_file_type(st.st_mode));
  if (const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);
      limit > 0 && basename_of(path).size() > static_cast<size_t>(limit))
    fail(
        "{}: cannot write {}: the file name is {} bytes, longer than the file system allows in {} "
        "({} bytes)",
        where, what, basename_of(path).size(), dir, limit);
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail("{}: is a directory; expected a file name", named);
  // note: outputs are written to a temporary file and renamed over the
  // path; a device or FIFO there would be replaced by a plain file.
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("{}: is {}; expected a regular file (or a new file name)", named,
         describe_file_type(st.st_mode));
}

// The names `tool` derives from the path the user gave (`given`, named by
// `flag` in messages), each within the file system's name length limit and
// the system's path length limit; else a message naming the derived name,
// its length and the limit.
// note: a valid OUT name near the limit had no room for its derived names:
// the run failed only when it created one, with "File name too long".
void check_derived_names(const std::string& flag, const std::string& given,
                         const std::vector<std::string>& names, const char* tool) {
  // (every derived name is the given path plus a suffix; the longest
  // suffix sets the longest name that fits)
  size_t longest = 0;
  for (const std::string& path : names) longest = std::max(longest, path.size() - given.size());
  for (const std::string& path : names) {
    if (path.size() >= PATH_MAX)
      fail(
          "{}: the path is too long for the files {} writes beside it: {} would be {} bytes, over "
          "the system's limit of {} bytes",
          flag, tool, path, path.size(), PATH_MAX - 1);
    const std::string dir = directory_of(path), name = basename_of(path);
    const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);
    if (limit <= 0 || name.size() <= static_cast<size_t>(limit)) continue;
    fail(
        "{}: the name is too long for the files {} writes beside it: {} would be a {}-byte name, "
        "over the file system's limit of {} bytes (expected a name of at most {} bytes)",
        flag, tool, name, name.size(), limit,
        static_cast<size_t>(limit) > longest ? static_cast<size_t>(limit) - longest : 0);
  }
}

// `base` with each of `patterns` appended, with the widest pid any process
// (this one, a --devices worker, a later --resume) may put there.
template <size_t N>
void add_derived(std::vector<std::string>& names, const std::string& base,
                 const char* const (&patterns)[N]) {
  for (const char* p : patterns)
    names.push_back(with_pid(base, p, static_cast<pid_t>(widest_pid())));
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::absolute(a, ec).lexically_normal() == fs::absolute(b, ec).lexically_normal()) return true;
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void check_meta_path(const std::string& meta,
                     const std::vector<std::pair<std::string, std::string>>& inputs,
                     bool may_replace, bool resumable) {
  check_output_path("--meta", meta, "--meta " + meta, "the run header");
  std::vector<std::string> temporaries;
  add_derived(temporaries, meta, kMetaTemporaries);
  check_derived_names("--meta " + meta, meta, temporaries, "generate");
  refuse_output_that_is_an_input("--meta " + meta, meta, inputs);
  struct stat st {};
  if (!may_replace && ::lstat(meta.c_str(), &st) == 0)
    fail("--meta {}: already exists (pass --force to replace it{})", meta,
         resumable ? ", or --resume to finish the run it belongs to" : "");
}

void check_names_beside(const ResultsPaths& paths, const std::string& flag,
                        const std::string& given, const char* tool) {
  // The names derived from OUT: generate's partial results and their
  // header, merge's staging file, the lock, the default header.
  const bool merge = std::string_view(tool) == "merge";
  std::vector<std::string> derived = {paths.lock};
  if (given != paths.out) derived.push_back(paths.out);
  if (merge) {
    add_derived(derived, paths.out, kOutTemporaries);
  } else {
    derived.push_back(paths.partial);
    derived.push_back(paths.partial_meta);
    add_derived(derived, paths.partial_meta, kPartialMetaTemporaries);
  }
  if (!paths.meta_given) {
    derived.push_back(paths.meta);
    add_derived(derived, paths.meta, kMetaTemporaries);
  }
  check_derived_names(flag, given, derived, tool);
}

void refuse_outputs_that_are_inputs(const ResultsPaths& paths,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    bool may_replace, const char* tool, const char* out_name) {
  check_output_path(out_name, paths.out, paths.out, "the results");
  if (paths.meta_given) {
    check_output_path("--meta", paths.meta, "--meta " + paths.meta, "the run header");
    for (const auto& [what, other] : {std::pair<const char*, std::string>{"--out", paths.out},
                                      {"the partial results", paths.partial},
                                      {"the partial results' header", paths.partial_meta},
                                      {"the lock file", paths.lock}})
      if (same_file(paths.meta, other))
        fail("--meta {}: is the same file as {} ({}); the run header needs a path of its own",
             paths.meta, what, other);
  }
  const std::string out_flag = std::string(out_name) + " " + paths.out;
  check_names_beside(paths, out_flag, paths.out, tool);
  for (const std::string& out : {paths.out, paths.partial, paths.partial_meta, paths.lock})
    refuse_output_that_is_an_input(out_flag, out, inputs, tool);
  if (paths.meta_given) {
    check_meta_path(paths.meta, inputs, may_replace);
  } else {
    check_output_path(out_name, paths.meta, paths.out, "the run header", "OUT's run header");
    refuse_output_that_is_an_input(out_flag, paths.meta, inputs, tool);
  }
}

namespace {

// ---- the lock file of a run stopped by SIGINT, SIGTERM or SIGHUP ----
// note: a signal handler reaches only static storage, so the path is copied
// here beforehand; one OutputLock of a process at a time has the slot.
constexpr int kLockSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr size_t kNumLockSignals = sizeof(kLockSignals) / sizeof(kLockSignals[0]);
char g_lock_path[PATH_MAX];
volatile sig_atomic_t g_lock_armed = 0;
bool g_lock_installed[kNumLockSignals] = {};
struct sigaction g_lock_saved[kNumLockSignals];

// Removes the lock file and ends the process by the same signal, with its
// default disposition, as it would have ended without the handler (the
// partial results file stays as the kill leaves it, for --resume).
// note: async-signal-safe calls only (unlink, sigaction, raise); the
// signal stays blocked until the handler returns, and is then delivered.
extern "C" void unlink_lock_and_reraise(int sig) {
  const int saved_errno = errno;
  if (g_lock_armed) ::unlink(g_lock_path);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

// Installs the handler for each signal whose disposition is the default: an
// ignored signal stays ignored (a background job of a shell), and one that
// has a handler already (an InterruptScope's) unwinds to ~OutputLock.
// Returns whether it installed any, and so holds the slot; where it
// installed none the slot stays free (for a lock that may need it).
bool arm_lock_unlink(const std::string& path) {
  if (g_lock_armed || path.size() >= sizeof(g_lock_path)) return false;
  std::memcpy(g_lock_path, path.c_str(), path.size() + 1);
  // note: set before the first handler is installed, so that a signal
  // arriving at once finds the path.
  g_lock_armed = 1;
  struct sigaction sa {};
  sa.sa_handler = unlink_lock_and_reraise;
  sigemptyset(&sa.sa_mask);
  bool any = false;
  for (size_t i = 0; i < kNumLockSignals; ++i) {
    struct sigaction cur {};
    g_lock_installed[i] = ::sigaction(kLockSignals[i], nullptr, &cur) == 0 &&
                          cur.sa_handler == SIG_DFL &&
                          ::sigaction(kLockSignals[i], &sa, &g_lock_saved[i]) == 0;
    any = any || g_lock_installed[i];
  }
  if (!any) g_lock_armed = 0;
  return any;
}

// Gives the signals their previous dispositions back, where the handler is
// still ours, and empties the slot. Called before the lock file is unlinked:
// after that the path may be a file another run holds.
void disarm_lock_unlink() {
  for (size_t i = 0; i < kNumLockSignals; ++i) {
    struct sigaction cur {};
    if (g_lock_installed[i] && ::sigaction(kLockSignals[i], nullptr, &cur) == 0 &&
        cur.sa_handler == unlink_lock_and_reraise)
      ::sigaction(kLockSignals[i], &g_lock_saved[i], nullptr);
    g_lock_installed[i] = false;
  }
  g_lock_armed = 0;
}

// note: one message for whatever is at the lock's name that is not a
// regular file: the lock is never written through a link (a link to
// another file would be truncated), and a FIFO or directory cannot hold it.
[[noreturn]] void refuse_lock_file(const std::string& out, const std::string& lock, mode_t mode) {
  fail(
      "{}: the lock file {} is {}; expected a regular file or no file there (generate and merge "
      "create it; remove it)",
      out, lock, describe_file_type(mode));
}

}  // namespace

OutputLock::OutputLock(const std::string& lock_path, const std::string& out) : path_(lock_path) {
  // note: the lock file is removed at exit, so a process may lock a file that
  // was just unlinked by the previous holder; the inode check after flock
  // catches that and starts over on the new file.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // note: O_NOFOLLOW: a symbolic link at the name fails (ELOOP) instead of
    // having its target truncated; O_NONBLOCK: opening a FIFO never waits.
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat by_fd {};
    if (fd_ < 0) {
      const int err = errno;
      if (struct stat st{}; ::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        refuse_lock_file(out, path_, st.st_mode);
      errno = err;
      fail_errno(fmt::format("{}: cannot create the lock file {}", out, path_));
    }
    if (::fstat(fd_, &by_fd) == 0 && !S_ISREG(by_fd.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      refuse_lock_file(out, path_, by_fd.st_mode);
    }
    // note: O_NOFOLLOW does not see hard links: a lock name that is another
    // name of some file (OUT, OUT.partial, any user file) would have that file
    // truncated and overwritten with the pid below, so only a file of its own
    // is taken; the file is opened without O_TRUNC and emptied only once the
    // lock is held.
    if (by_fd.st_nlink != 1 && S_ISREG(by_fd.st_mode)) {
      const auto links = static_cast<unsigned long>(by_fd.st_nlink);
      ::close(fd_);
      fd_ = -1;
      fail(
          "{}: the lock file {} has {} hard links; expected a file of its own (generate and merge "
          "create it; remove it)",
          out, path_, links);
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) {
        errno = err;
        fail_errno(fmt::format("{}: cannot lock {}", out, path_));
      }
      const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
      fail(
          "{}: another generate (pid {}) is writing these results (it holds {}); wait for it to "
          "finish or stop it",
          out, pid > 0 ? std::to_string(pid) : std::string("unknown"), path_);
    }
    struct stat by_path {};
    if (::lstat(path_.c_str(), &by_path) == 0 && by_fd.st_dev == by_path.st_dev &&
        by_fd.st_ino == by_path.st_ino) {
      const std::string pid = fmt::format("{}\n", ::getpid());
      if (::ftruncate(fd_, 0) != 0 ||
          ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        // note: the lock holds without the pid; a second process then says "unknown".
      }
      armed_ = arm_lock_unlink(path_);
      // note: whatever installed the signal handlers (this lock, or an
      // InterruptScope before or after it: generate's, merge's, a --devices
      // parent's, whose first signal unwinds to the destructor), what ends
      // the process at once (a second signal, a fault in a file mapping:
      // core/interrupt.h, core/mapped_file.h) removes the file too while it
      // is held; the destructor takes it off that list.
      register_emergency_unlink(path_);
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  fail("{}: cannot lock {}: it keeps being replaced", out, path_);
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  if (armed_) disarm_lock_unlink();
  unregister_emergency_unlink(path_);
  ::unlink(path_.c_str());  // note: while still holding the lock (see the constructor)
  ::close(fd_);
}

ResumeSource choose_start(const ResultsPaths& paths, StartMode mode) {
  const bool have_out = exists(paths.out), have_partial = exists(paths.partial);
  switch (mode) {
    case StartMode::kForce:
      return {};
    case StartMode::kFresh:
      if (have_out && have_partial) {
        fail(
            "{}: already exists, and an interrupted run left its first results in {} (pass "
            "--resume to finish that run, or --force to start over)",
            paths.out, paths.partial);
      }
      if (have_out) {
        fail(
            "{}: already exists (pass --force to replace it, or --resume to finish an "
            "interrupted run into it)",
            paths.out);
      }
      if (have_partial) {
        fail(
            "{}: an interrupted run left its first results in {} (pass --resume to finish it, "
            "or --force to start over)",
            paths.out, paths.partial);
      }
      // note: a header with no results beside it is still someone's file
      // (an explicit --meta that exists is refused the same way).
      if (!paths.meta_given && exists(paths.meta)) {
        fail(
            "{}: its run header {} exists already, without the results (pass --force to "
            "replace it)",
            paths.out, paths.meta);
      }
      return {};
    case StartMode::kResume:
      if (have_partial) return {true, paths.partial, paths.partial_meta};
      if (have_out) return {true, paths.out, paths.meta};
      return {};
  }
  return {};
}

namespace {

// Whether `rest` is `pattern` (kMetaTemporaries), each '#' a pid; the pids
// are appended to `pids`.
bool matches(std::string_view rest, std::string_view pattern, std::vector<long>& pids) {
  size_t r = 0;
  for (char c : pattern) {
    if (c != '#') {
      if (r >= rest.size() || rest[r] != c) return false;
      ++r;
      continue;
    }
    long pid = 0;
    size_t digits = 0;
    while (r < rest.size() && rest[r] >= '0' && rest[r] <= '9' && digits < 10) {
      pid = pid * 10 + (rest[r] - '0');
      ++r;
      ++digits;
    }
    // note: generate never writes a pid with leading zeros; such a name is
    // someone else's file and is kept.
    if (digits == 0 || pid <= 0 || rest[r - digits] == '0') return false;
    pids.push_back(pid);
  }
  return r == rest.size();
}

// This process's own names count as running (process_running: a pid that
// may still run keeps its files).
bool running(long pid) { return pid == ::getpid() || process_running(pid); }

}  // namespace

namespace {

// The temporary names of one file: `base` + "." + one of the patterns.
struct TemporaryGroup {
  const std::string* base;
  const char* const* patterns;
  size_t count;
};

std::vector<std::string> remove_stale(std::span<const TemporaryGroup> groups) {
  using Group = TemporaryGroup;
  std::vector<std::string> removed;
  std::vector<std::string> dirs;
  for (const Group& g : groups)
    if (std::find(dirs.begin(), dirs.end(), directory_of(*g.base)) == dirs.end())
      dirs.push_back(directory_of(*g.base));
  for (const std::string& dir : dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      for (const Group& g : groups) {
        if (directory_of(*g.base) != dir) continue;
        const std::string prefix = basename_of(*g.base) + ".";
        if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
        std::vector<long> pids;
        bool ours = false;
        for (size_t i = 0; i < g.count && !ours; ++i) {
          pids.clear();
          ours = matches(name.substr(prefix.size()), g.patterns[i], pids);
        }
        if (!ours || std::any_of(pids.begin(), pids.end(), running)) continue;
        const std::string path = dir == "." && g.base->find('/') == std::string::npos
                                     ? std::string(name)
                                     : dir + "/" + std::string(name);
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::getuid())
          break;
        if (::unlink(path.c_str()) == 0)
          removed.push_back(fmt::format(
              "removed stale temporary file {} left by pid {}, which is no longer running", path,
              pids.back()));
        break;
      }
    }
    ::closedir(d);
  }
  return removed;
}

}  // namespace

std::vector<std::string> remove_stale_temporaries(const ResultsPaths& paths) {
  const TemporaryGroup groups[] = {
      {&paths.out, kOutTemporaries, std::size(kOutTemporaries)},
      {&paths.meta, kMetaTemporaries, std::size(kMetaTemporaries)},
      {&paths.partial_meta, kPartialMetaTemporaries, std::size(kPartialMetaTemporaries)},
  };
  return remove_stale(groups);
}

std::vector<std::string> remove_stale_meta_temporaries(const std::string& meta) {
  const TemporaryGroup groups[] = {{&meta, kMetaTemporaries, std::size(kMetaTemporaries)}};
  return remove_stale(groups);
}

FileAtStart FileAtStart::of(const std::string& path) {
  FileAtStart f;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    f.exists = true;
    f.dev = st.st_dev;
    f.ino = st.st_ino;
  }
  return f;
}

OutputsAtStart OutputsAtStart::of(const ResultsPaths& paths, bool force) {
  return {force, FileAtStart::of(paths.out), FileAtStart::of(paths.meta)};
}

void write_all(int fd, const std::string& data, const std::string& what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt::format("{}: write failed", what));
    }
    done += static_cast<size_t>(n);
  }
}

namespace {

// A file of ours that is removed (and unregistered from the second-signal
// cleanup) when it goes out of scope, unless release()d.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) { register_emergency_unlink(path_); }
  ~TempFile() {
    if (path_.empty()) return;
    ::unlink(path_.c_str());
    unregister_emergency_unlink(path_);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }
  // The file is no longer at its name (renamed into place): nothing to remove.
  void release() {
    unregister_emergency_unlink(path_);
    path_.clear();
  }

 private:
  std::string path_;
};

// Writes `data` to the new file `tmp` (created as create_new_file does,
// replacing a leftover of our pid) and fsyncs it; `what` names the file the
// temporary stands for in messages. The caller owns the name (TempFile).
void write_new_file(const std::string& tmp, const std::string& data, const std::string& what) {
  const int fd = create_new_file(tmp, /*remove_first=*/true);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create it", what));
  try {
    write_all(fd, data, what);
    if (::fsync(fd) != 0) fail_errno(fmt::format("{}: fsync failed", what));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail_errno(fmt::format("{}: write failed", what));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& data) {
  TempFile tmp(fmt::format("{}.tmp.{}", path, ::getpid()));
  write_new_file(tmp.path(), data, path);
  // note: rename replaces whatever is at `path`, a symbolic link included
  // (the link, never the file it points to).
  if (::rename(tmp.path().c_str(), path.c_str()) != 0)
    fail_errno(fmt::format("{}: cannot move the new file into place", path));
  tmp.release();
}

namespace {

enum class Moved { kDone, kAppeared, kChanged, kFailed /* errno set */ };

// Renames `from` to `to`. With `force`, whatever is at `to` is replaced;
// otherwise only the file that was there at the start (`at_start`), and a
// new name is made with RENAME_NOREPLACE, so that a file appearing there at
// any moment is never replaced.
Moved move_file(const std::string& from, const std::string& to, bool force,
                const FileAtStart& at_start) {
  struct stat now {};
  const bool there = ::lstat(to.c_str(), &now) == 0;
  if (force || there) {
    if (!force && !(at_start.exists && now.st_dev == at_start.dev && now.st_ino == at_start.ino))
      return at_start.exists ? Moved::kChanged : Moved::kAppeared;
    // note: two names of one file (what a kill after the link() below
    // leaves): rename would do nothing and keep both.
    struct stat src {};
    if (there && ::lstat(from.c_str(), &src) == 0 && src.st_dev == now.st_dev &&
        src.st_ino == now.st_ino)
      return ::unlink(from.c_str()) == 0 ? Moved::kDone : Moved::kFailed;
    return ::rename(from.c_str(), to.c_str()) == 0 ? Moved::kDone : Moved::kFailed;
  }
  if (rename_noreplace(from, to)) return Moved::kDone;
  return errno == EEXIST ? Moved::kAppeared : Moved::kFailed;
}

// The header that was at META before the new one replaced it, kept to be
// put back: a hard link (META.prev.PID) where the file system has them,
// else its bytes (or a symbolic link's target).
class HeaderBackup {
 public:
  explicit HeaderBackup(const std::string& meta) : meta_(meta) {
    struct stat st {};
    if (::lstat(meta.c_str(), &st) != 0) return;  // none: "put back" removes the new one
    had_ = true;
    const std::string name = with_pid(meta, kMetaTemporaries[1], ::getpid());
    ::unlink(name.c_str());  // (a leftover of a process that had our pid)
    if (::link(meta.c_str(), name.c_str()) == 0) {
      link_.emplace(name);
      return;
    }
    if (S_ISLNK(st.st_mode)) {
      std::string target(PATH_MAX, '\0');
      const ssize_t n = ::readlink(meta.c_str(), target.data(), target.size());
      if (n > 0) symlink_ = target.substr(0, static_cast<size_t>(n));
    } else if (S_ISREG(st.st_mode)) {
      try {
        bytes_ = read_file_text(meta, "the run header");
      } catch (const Error&) {
      }
    }
  }
  // The pair is in place: the kept header goes.
  void discard() { link_.reset(); }
  // Puts the old header back over the new one; false (errno set) when it
  // cannot.
  bool restore() {
    if (!had_) return ::unlink(meta_.c_str()) == 0 || errno == ENOENT;
    if (link_) {
      if (::rename(link_->path().c_str(), meta_.c_str()) != 0) return false;
      link_->release();
      return true;
    }
    if (symlink_) {
      TempFile tmp(with_pid(meta_, kMetaTemporaries[0], ::getpid()));
      ::unlink(tmp.path().c_str());
      if (::symlink(symlink_->c_str(), tmp.path().c_str()) != 0 ||
          ::rename(tmp.path().c_str(), meta_.c_str()) != 0)
        return false;
      tmp.release();
      return true;
    }
    if (bytes_) {
      try {
        write_file_atomic(meta_, *bytes_);
        return true;
      } catch (const Error&) {
        return false;
      }
    }
    errno = ENOTSUP;  // note: neither a link nor a copy could be made
    return false;
  }

 private:
  std::string meta_;
  bool had_ = false;
  std::optional<TempFile> link_;
  std::optional<std::string> symlink_, bytes_;
};

}  // namespace

void move_results_into_place(const FinalMove& m) {
  const bool to_stdout = m.out == "-";
  const char* run = std::string_view(m.doing) == "merging" ? "merge" : "run";
  // What the messages add about the results after a failure.
  const std::string kept =
      !m.partial.empty()
          ? fmt::format(" ({} keeps the results; --resume finishes the run", m.partial)
          : "";
  const std::string keep_replace =
      !m.partial.empty() ? kept + " into " + m.out + ", replacing what is there then)"
      : to_stdout        ? " (pass --force to replace it; the results went to stdout)"
                         : " (pass --force to replace it)";
  const std::string keep_error = !m.partial.empty() ? kept + ")" : "";
  const std::string as_they_were = to_stdout
                                       ? fmt::format("{} is as it was", m.meta)
                                       : fmt::format("{} and {} are as they were", m.out, m.meta);
  auto not_replacing = [&](const std::string& path, Moved why) {
    return why == Moved::kAppeared
               ? fmt::format(
                     "{}: appeared while {} (it was not there when the {} started); not "
                     "replacing it",
                     path, m.doing, run)
               : fmt::format(
                     "{}: was replaced while {} (it is not the file that was there when "
                     "the {} started); not replacing it",
                     path, m.doing, run);
  };

  TempFile header(with_pid(m.meta, kMetaTemporaries[0], ::getpid()));
  write_new_file(header.path(), m.header, m.meta);
  // note: the last point where a signal stops the move with nothing moved;
  // after the first rename the pair is completed (or put back) first.
  if (const int sig = interrupt_signal())
    fail("{}: interrupted by {} before {} moved into place; {}{}", to_stdout ? m.meta : m.out,
         signal_name(sig), to_stdout ? "the run header was" : "the results were", as_they_were,
         keep_error);
  HeaderBackup backup(m.meta);
  switch (const Moved r = move_file(header.path(), m.meta, m.force, m.meta_at_start)) {
    case Moved::kDone:
      header.release();
      break;
    case Moved::kAppeared:
    case Moved::kChanged:
      fail("{}{}", not_replacing(m.meta, r), keep_replace);
    case Moved::kFailed:
      fail("{}: cannot move the new run header into place: {}; {}{}", m.meta, std::strerror(errno),
           as_they_were, keep_error);
  }
  if (!m.staged.empty()) {
    const Moved r = move_file(m.staged, m.out, m.force, m.out_at_start);
    if (r != Moved::kDone) {
      const int err = errno;
      const bool restored = backup.restore();
      const std::string now =
          restored ? fmt::format("{} and {} are as they were", m.out, m.meta)
                   : fmt::format(
                         "{} is as it was, but {} could not be put back ({}): it is the "
                         "new header, whose results_xxh64 does not match {}",
                         m.out, m.meta, std::strerror(errno), m.out);
      if (r == Moved::kFailed)
        fail("{}: cannot move the completed results into place: {}; {}{}", m.out,
             std::strerror(err), now, keep_error);
      fail("{}; {}{}", not_replacing(m.out, r), now, keep_replace);
    }
  }
  backup.discard();
  if (!m.remove_after.empty()) ::unlink(m.remove_after.c_str());
  // note: by now the results and their header are in place: a failed fsync
  // says so, and that a crash could still undo the renames.
  std::vector<std::string> dirs = {directory_of(m.meta)};
  if (!to_stdout && directory_of(m.out) != dirs[0]) dirs.push_back(directory_of(m.out));
  for (const std::string& dir : dirs)
    if (!fsync_directory(dir))
      fail(
          "{}: {} in place, but the fsync of directory {} failed: {}; a crash could still undo "
          "the move",
          to_stdout ? m.meta : m.out,
          to_stdout ? "the run header is" : "the results and their header are", dir,
          std::strerror(errno));
}

namespace {
// note: the header of a run in progress is padded with this many spaces
// (JSON allows trailing whitespace): a run that fails on a full disk
// rewrites it in place, and the room keeps its error message there.
constexpr size_t kErrorRoom = 1024;

std::string running_header(const nlohmann::json& meta) {
  return json_file_text(meta, 2) + std::string(kErrorRoom, ' ') + "\n";
}

// `text` cut to at most `bytes` bytes at a UTF-8 character boundary.
std::string utf8_prefix(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}
}  // namespace

ResultsWriter::ResultsWriter(const ResultsPaths& paths, const OutputsAtStart& start,
                             nlohmann::json meta)
    : paths_(paths),
      start_(start),
      work_(paths.partial),
      work_meta_(paths.partial_meta),
      meta_(std::move(meta)) {
  // note: the header goes first, so a killed run always leaves one for --resume.
  // (Not over the header of an OUT.partial that appeared since the start:
  // open_for_append refuses that file, and its header stays its own.)
  if (!start_.force && exists(work_))
    fail(
        "{}: appeared after the run started; not replacing it (pass --resume to finish the run "
        "it holds, or --force to start over)",
        work_);
  meta_["status"] = "running";
  write_file_atomic(work_meta_, running_header(meta_));
  open_for_append(work_, 0, true);
}

ResultsWriter::ResultsWriter(const ResultsPaths& paths, const ResumeSource& source,
                             const OutputsAtStart& start, nlohmann::json meta, uint64_t keep_bytes)
    : paths_(paths),
      start_(start),
      work_(source.path),
      work_meta_(source.meta),
      meta_(std::move(meta)) {
  meta_["status"] = "running";
  write_file_atomic(work_meta_, running_header(meta_));
  open_for_append(work_, keep_bytes, false);
}

ResultsWriter::ResultsWriter(int fd, const std::string& meta_path, nlohmann::json meta, bool force)
    : paths_(ResultsPaths::of("-", meta_path)),
      work_("-"),
      work_meta_(meta_path),
      meta_(std::move(meta)),
      fd_(fd),
      stream_(true) {
  // note: without --force an existing --meta file was refused before the
  // run (check_meta_path), so one there at the end appeared meanwhile: it
  // is not replaced.
  start_.force = force;
}

void ResultsWriter::open_for_append(const std::string& path, uint64_t keep_bytes, bool create) {
  // note: O_NOFOLLOW: a symbolic link at the name is never written through.
  // A new OUT.partial is made with O_EXCL: under --force what is there goes
  // first (the run starts over), otherwise a file that appeared there since
  // the start is refused.
  fd_ = create ? create_new_file(path, start_.force)
               : ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd_ < 0) {
    const int err = errno;
    mark_failed();
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      fail(
          "{}: is {}; expected the partial results of {} (a regular file written by generate; "
          "remove it{})",
          path, describe_file_type(st.st_mode), paths_.out,
          create ? "" : ", or pass --force to start over");
    if (create && err == EEXIST)
      fail(
          "{}: appeared after the run started; not replacing it (pass --resume to finish the run "
          "it holds, or --force to start over)",
          path);
    errno = err;
    fail_errno(fmt::format("{}: cannot open the results for writing", paths_.out));
  }
  if (::fstat(fd_, &st) == 0 && !S_ISREG(st.st_mode)) {
    mark_failed();
    fail("{}: is {}; expected the partial results of {} (a regular file written by generate)", path,
         describe_file_type(st.st_mode), paths_.out);
  }
  // Drop a trailing partial line left by a kill.
  if (::ftruncate(fd_, static_cast<off_t>(keep_bytes)) != 0 || ::lseek(fd_, 0, SEEK_END) < 0) {
    mark_failed();
    fail_errno(fmt::format("{}: cannot cut the partial last line", paths_.out));
  }
  complete_bytes_ = keep_bytes;
}

void ResultsWriter::append(const std::string& line) {
  std::string data = line;
  data += '\n';
  if (stream_) {
    // note: a reader that stops reading (`| less` left paused) would block
    // a plain write(2), and the restarted write would make a signal wait
    // for the reader. Pieces of at most PIPE_BUF bytes, each written once
    // poll says the pipe has a free buffer, never block, so a signal stops
    // the run there.
    for (size_t done = 0; done < data.size(); done += PIPE_BUF) {
      if (!wait_for_output(fd_))
        fail("standard output: interrupted by {} while waiting for its reader to take the results",
             signal_name(interrupt_signal()));
      write_all(fd_, data.substr(done, PIPE_BUF), "standard output");
    }
  } else {
    write_all(fd_, data, paths_.out);
  }
  complete_bytes_ += data.size();
}

void ResultsWriter::complete(const nlohmann::json& stats) {
  meta_["status"] = "complete";
  meta_["stats"] = stats;
  FinalMove move;
  move.meta = paths_.meta;
  move.force = start_.force;
  move.meta_at_start = start_.meta;
  move.out_at_start = start_.out;
  if (stream_) {
    // note: the header is the only file of a run on stdout, written now
    // (see the constructor).
    if (!work_meta_.empty()) {
      move.out = "-";
      move.header = json_file_text(meta_, 2) + "\n";
      move_results_into_place(move);
    }
    done_ = true;
    return;
  }
  if (::fsync(fd_) != 0) fail_errno(fmt::format("{}: fsync failed", paths_.out));
  // note: the digest of the whole results file lets merge and --resume tell
  // a results file that was edited, or a meta file that is another's.
  const std::string results = read_file_text(work_, "the results");
  meta_["results_xxh64"] = results_digest(results);
  move.out = paths_.out;
  move.header = json_file_text(meta_, 2) + "\n";
  if (work_ != paths_.out) {
    move.staged = work_;
    move.partial = work_;
    move.remove_after = work_meta_;
  } else {
    // (an older qtk's OUT, resumed in place: its header, rewritten
    // "running" at the start, is this run's own)
    move.force = true;
  }
  // note: a kill before the header's rename leaves OUT.partial and its
  // header "running", which --resume finishes (all its lines are there);
  // one between the two renames leaves the new header beside the old OUT,
  // and OUT.partial, which --resume finishes the same way.
  try {
    move_results_into_place(move);
  } catch (const Error&) {
    // note: once both are in place (a failed directory fsync) there is no
    // partial run left to mark "failed".
    if (work_ != paths_.out && !exists(work_)) done_ = true;
    throw;
  }
  done_ = true;
}

void ResultsWriter::mark_failed() noexcept {
  try {
    // note: a run on stdout writes its header only when it completes.
    if (stream_) return;
    if (fd_ >= 0 && !stream_) {
      // note: a write that failed half-way (a full disk) leaves part of a
      // line; --resume would drop it, but the file should hold only
      // complete lines now.
      if (::ftruncate(fd_, static_cast<off_t>(complete_bytes_)) != 0) {
      }
    }
    // note: a run stopped by a signal is "interrupted" (its lines are good
    // and --resume finishes it), not "failed".
    meta_["status"] = interrupt_signal() != 0 ? "interrupted" : "failed";
    if (!failure_.empty()) meta_["error"] = failure_;
    if (!failure_stats_.is_null()) meta_["stats"] = failure_stats_;
    try {
      write_file_atomic(work_meta_, json_file_text(meta_, 2) + "\n");
    } catch (...) {
      // A full disk: rewrite the header in place, in the room it was
      // written with (without the statistics), the error shortened if it
      // must be.
      meta_.erase("stats");
      for (size_t keep = failure_.size();; keep = keep / 2) {
        if (failure_.empty() || keep < 16) {
          meta_.erase("error");
          overwrite_in_place(work_meta_, json_file_text(meta_, 2) + "\n");
          break;
        }
        meta_["error"] = keep < failure_.size() ? utf8_prefix(failure_, keep) + "..." : failure_;
        if (overwrite_in_place(work_meta_, json_file_text(meta_, 2) + "\n")) break;
      }
    }
  } catch (...) {
  }
}

ResultsWriter::~ResultsWriter() {
  if (!done_) mark_failed();
  if (fd_ >= 0 && !stream_) ::close(fd_);
}

}  // namespace qtk
