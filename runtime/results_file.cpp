#include "runtime/results_file.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/interrupt.h"
#include "pack/pack_checksum.h"
#include "runtime/generate_resume.h"

namespace qtk {

namespace {

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void fsync_directory_of(const std::string& path) {
  const std::string dir = directory_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;  // note: best effort; the data itself was fsynced
  ::fsync(dfd);
  ::close(dfd);
}

// Overwrites the start of an existing file without growing it, padding with
// spaces (JSON allows trailing whitespace). note: used when a full disk
// refuses a new file: rewriting blocks the file already has needs no space.
bool overwrite_in_place(const std::string& path, std::string data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && static_cast<off_t>(data.size()) <= st.st_size;
  if (ok) {
    data.resize(static_cast<size_t>(st.st_size), ' ');
    if (!data.empty()) data.back() = '\n';
    ok = ::pwrite(fd, data.data(), data.size(), 0) == static_cast<ssize_t>(data.size());
  }
  ::close(fd);
  return ok;
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
// An output path given by `flag`: a file name in an existing directory, not
// a directory. where: how the missing-directory message starts; what: what
// would be written there.
void check_output_path(const char* flag, const std::string& path, const std::string& where,
                       const char* what) {
  if (path.empty() || path.back() == '/')
    fail("{}: expected a file name, found \"{}\"", flag, path);
  struct stat st {};
  const std::string dir = directory_of(path);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail("{}: cannot write {}: directory {} does not exist", where, what, dir);
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail("{} {}: is a directory; expected a file name", flag, path);
  // note: outputs are written to a temporary file and renamed over the
  // path; a device or FIFO there would be replaced by a plain file.
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail("{} {}: is {}; expected a regular file (or a new file name)", flag, path,
         S_ISCHR(st.st_mode)    ? "a character device"
         : S_ISBLK(st.st_mode)  ? "a block device"
         : S_ISFIFO(st.st_mode) ? "a FIFO"
         : S_ISSOCK(st.st_mode) ? "a socket"
                                : "not a regular file");
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
                     bool may_replace) {
  check_output_path("--meta", meta, "--meta " + meta, "the run header");
  refuse_output_that_is_an_input("--meta " + meta, meta, inputs);
  struct stat st {};
  if (!may_replace && ::lstat(meta.c_str(), &st) == 0)
    fail(
        "--meta {}: already exists (pass --force to replace it, or --resume to finish the run it "
        "belongs to)",
        meta);
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
  for (const std::string& out : {paths.out, paths.partial, paths.partial_meta, paths.lock})
    refuse_output_that_is_an_input(out_flag, out, inputs, tool);
  if (paths.meta_given) {
    check_meta_path(paths.meta, inputs, may_replace);
  } else {
    check_output_path(out_name, paths.meta, paths.out, "the run header");
    refuse_output_that_is_an_input(out_flag, paths.meta, inputs, tool);
  }
}

namespace {

// ---- the lock file of a run stopped by SIGINT or SIGTERM ----
// note: a signal handler reaches only static storage, so the path is copied
// here beforehand; one OutputLock of a process at a time has the slot.
constexpr int kLockSignals[] = {SIGINT, SIGTERM};
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
// has a handler already (a --devices parent's) unwinds to ~OutputLock.
bool arm_lock_unlink(const std::string& path) {
  if (g_lock_armed || path.size() >= sizeof(g_lock_path)) return false;
  std::memcpy(g_lock_path, path.c_str(), path.size() + 1);
  g_lock_armed = 1;
  struct sigaction sa {};
  sa.sa_handler = unlink_lock_and_reraise;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < kNumLockSignals; ++i) {
    struct sigaction cur {};
    g_lock_installed[i] = ::sigaction(kLockSignals[i], nullptr, &cur) == 0 &&
                          cur.sa_handler == SIG_DFL &&
                          ::sigaction(kLockSignals[i], &sa, &g_lock_saved[i]) == 0;
  }
  return true;
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

}  // namespace

OutputLock::OutputLock(const std::string& lock_path, const std::string& out) : path_(lock_path) {
  // note: the lock file is removed at exit, so a process may lock a file that
  // was just unlinked by the previous holder; the inode check after flock
  // catches that and starts over on the new file.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_errno(fmt::format("{}: cannot create the lock file {}", out, path_));
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
    struct stat by_fd {
    }, by_path{};
    if (::fstat(fd_, &by_fd) == 0 && ::stat(path_.c_str(), &by_path) == 0 &&
        by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino) {
      const std::string pid = fmt::format("{}\n", ::getpid());
      if (::ftruncate(fd_, 0) != 0 ||
          ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        // note: the lock holds without the pid; a second process then says "unknown".
      }
      armed_ = arm_lock_unlink(path_);
      // note: where the signals have a handler already (an InterruptScope:
      // generate's, a --devices parent's) the unwinding removes the file; a
      // second signal ends the process at once, and removes it then.
      if (!armed_) register_emergency_unlink(path_);
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

void write_file_atomic(const std::string& path, const std::string& data) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create it", path));
  try {
    write_all(fd, data, path);
    if (::fsync(fd) != 0) fail_errno(fmt::format("{}: fsync failed", path));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    fail_errno(fmt::format("{}: cannot move the new file into place", path));
  }
}

namespace {
// note: the header of a run in progress is padded with this many spaces
// (JSON allows trailing whitespace): a run that fails on a full disk
// rewrites it in place, and the room keeps its error message there.
constexpr size_t kErrorRoom = 1024;

std::string running_header(const nlohmann::json& meta) {
  return meta.dump(2) + std::string(kErrorRoom, ' ') + "\n";
}

// `text` cut to at most `bytes` bytes at a UTF-8 character boundary.
std::string utf8_prefix(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}
}  // namespace

ResultsWriter::ResultsWriter(const ResultsPaths& paths, nlohmann::json meta)
    : paths_(paths), work_(paths.partial), work_meta_(paths.partial_meta), meta_(std::move(meta)) {
  // note: the header goes first, so a killed run always leaves one for --resume.
  meta_["status"] = "running";
  write_file_atomic(work_meta_, running_header(meta_));
  open_for_append(work_, 0, true);
}

ResultsWriter::ResultsWriter(const ResultsPaths& paths, const ResumeSource& source,
                             nlohmann::json meta, uint64_t keep_bytes)
    : paths_(paths), work_(source.path), work_meta_(source.meta), meta_(std::move(meta)) {
  meta_["status"] = "running";
  write_file_atomic(work_meta_, running_header(meta_));
  open_for_append(work_, keep_bytes, false);
}

ResultsWriter::ResultsWriter(int fd, const std::string& meta_path, nlohmann::json meta)
    : paths_(ResultsPaths::of("-", meta_path)),
      work_("-"),
      work_meta_(meta_path),
      meta_(std::move(meta)),
      fd_(fd),
      stream_(true) {
  meta_["status"] = "running";
  if (!work_meta_.empty()) write_file_atomic(work_meta_, running_header(meta_));
}

void ResultsWriter::open_for_append(const std::string& path, uint64_t keep_bytes, bool create) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0644);
  if (fd_ < 0) {
    mark_failed();
    fail_errno(fmt::format("{}: cannot open the results for writing", paths_.out));
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
  write_all(fd_, data, paths_.out);
  complete_bytes_ += data.size();
}

void ResultsWriter::complete(const nlohmann::json& stats) {
  meta_["status"] = "complete";
  meta_["stats"] = stats;
  if (stream_) {
    if (!work_meta_.empty()) write_file_atomic(work_meta_, meta_.dump(2) + "\n");
    done_ = true;
    return;
  }
  if (::fsync(fd_) != 0) fail_errno(fmt::format("{}: fsync failed", paths_.out));
  // note: the digest of the whole results file lets merge and --resume tell
  // a results file that was edited, or a meta file that is another's.
  const std::string results = read_whole_file(work_, "the results");
  meta_["results_xxh64"] = results_digest(results);
  const std::string text = meta_.dump(2) + "\n";
  // note: the final header is written before the results are renamed: a kill
  // between the two leaves OUT.partial, which --resume then finishes (all
  // its lines are there) and renames.
  write_file_atomic(paths_.meta, text);
  if (work_ != paths_.out) {
    if (::rename(work_.c_str(), paths_.out.c_str()) != 0)
      fail_errno(fmt::format("{}: cannot move the completed results into place", paths_.out));
    ::unlink(work_meta_.c_str());
  }
  fsync_directory_of(paths_.out);
  done_ = true;
}

void ResultsWriter::mark_failed() noexcept {
  try {
    if (stream_ && work_meta_.empty()) return;
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
    try {
      write_file_atomic(work_meta_, meta_.dump(2) + "\n");
    } catch (...) {
      // A full disk: rewrite the header in place, in the room it was
      // written with, the error shortened if it must be.
      for (size_t keep = failure_.size();; keep = keep / 2) {
        if (failure_.empty() || keep < 16) {
          meta_.erase("error");
          overwrite_in_place(work_meta_, meta_.dump(2) + "\n");
          break;
        }
        meta_["error"] = keep < failure_.size() ? utf8_prefix(failure_, keep) + "..." : failure_;
        if (overwrite_in_place(work_meta_, meta_.dump(2) + "\n")) break;
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
