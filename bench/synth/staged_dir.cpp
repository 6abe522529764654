#include "bench/synth/staged_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/output_files.h"

namespace qtk::synth {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempMarker = ".synth-tmp.";
constexpr std::string_view kOldMarker = ".synth-old.";

enum class State { kMissing, kEmptyDir, kNonEmptyDir };

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "of another kind";
}

// The entry names of a directory, sorted ("." and ".." left out).
std::vector<std::string> entries_of(const std::string& path, const std::string& shown) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) fail_errno(fmt::format("{}: cannot read the directory", shown));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// "config.json, model.safetensors and 4 more".
std::string some_names(const std::vector<std::string>& names) {
  const size_t shown = std::min<size_t>(names.size(), 3);
  std::string s;
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

// What is at `path` now. A non-directory is refused whatever the flags: it
// is not a checkpoint synth would replace.
State state_of(const std::string& path, const std::string& shown,
               std::vector<std::string>* names = nullptr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return State::kMissing;
    fail_errno(fmt::format("{}: cannot check the output directory", shown));
  }
  if (!S_ISDIR(st.st_mode))
    fail(
        "{}: exists and is {}, not a directory; expected a new path, an empty directory or "
        "(with --force) a checkpoint directory to replace; not replacing it",
        shown, kind_of(st.st_mode));
  std::vector<std::string> found = entries_of(path, shown);
  const State s = found.empty() ? State::kEmptyDir : State::kNonEmptyDir;
  if (names) *names = std::move(found);
  return s;
}

std::string random_hex() {
  static std::random_device rd;
  return fmt::format("{:08x}", rd());
}

// Removes the temporary directories of synth runs that are gone.
std::vector<std::string> remove_stale(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    const long pid = temp_owner_pid(name, kTempMarker);
    if (pid <= 0 || pid == ::getpid()) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;
    if (process_running(pid)) continue;
    std::error_code ec;
    fs::remove_all(path, ec);
    if (!ec)
      removed.push_back(fmt::format(
          "removed stale temporary directory {} left by pid {}, which is no longer running", path,
          pid));
  }
  return removed;
}

}  // namespace

StagedDirectory::StagedDirectory(const std::string& out, bool force) : out_(out), force_(force) {
  fs::path p(out);
  // "a/b/" names the directory b: drop the trailing separators.
  while (p.has_relative_path() && !p.has_filename()) p = p.parent_path();
  // note: ".", ".." or "a/.." have no name of their own to put a sibling
  // beside: they are resolved to the directory they name.
  if (p.filename() == "." || p.filename() == "..") p = fs::weakly_canonical(fs::absolute(p));
  if (!p.has_relative_path() || p.filename().empty())
    fail("{}: expected a directory to create or replace, not the root directory", out);
  target_ = p.string();
  name_ = p.filename().string();
  dir_ = p.has_parent_path() ? p.parent_path().string() : std::string(".");

  std::vector<std::string> names;
  if (state_of(target_, out_, &names) == State::kNonEmptyDir && !force_)
    fail(
        "{}: is a directory that is not empty (it holds {}); expected a new or empty directory "
        "(pass --force to replace it)",
        out_, some_names(names));

  // The missing parent directories, outermost first (removed again on failure).
  std::vector<fs::path> missing;
  for (fs::path cur = dir_; !cur.empty(); cur = cur.parent_path()) {
    struct stat st {};
    if (::lstat(cur.c_str(), &st) == 0) break;
    missing.push_back(cur);
    if (cur == cur.parent_path()) break;
  }
  try {
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0777) != 0) {
        if (errno == EEXIST) continue;
        fail_errno(fmt::format("{}: cannot create the directory {}", out_, it->string()));
      }
      created_.push_back(it->string());
    }
    notes_ = remove_stale(dir_);
    const std::string prefix = temp_name_prefix(dir_, name_, kTempMarker);
    for (int attempt = 0; attempt < 16 && temp_.empty(); ++attempt) {
      const std::string name = prefix + random_hex();
      // note: 0777 less the umask, as the directory synth created in place.
      if (::mkdir(name.c_str(), 0777) == 0)
        temp_ = name;
      else if (errno != EEXIST)
        fail_errno(fmt::format("{}: cannot create a temporary directory in {}", out_, dir_));
    }
    if (temp_.empty()) fail("{}: cannot find a free temporary directory name in {}", out_, dir_);
  } catch (...) {
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
    throw;
  }
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code ec;
  if (!temp_.empty()) fs::remove_all(temp_, ec);
  // (only while empty: something else may have been put there meanwhile)
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());
}

void StagedDirectory::commit() {
  // note: a signal that came while the last file was closed stops here,
  // before OUT_DIR is touched.
  check_interrupted(out_);
  std::vector<std::string> names;
  const State now = state_of(target_, out_, &names);
  if (now == State::kNonEmptyDir && !force_)
    fail(
        "{}: files appeared in it while synth was writing (it holds {}); not replacing it (pass "
        "--force)",
        out_, some_names(names));
  if (now == State::kMissing) {
    // note: RENAME_NOREPLACE refuses whatever appeared at OUT_DIR since the
    // check; file systems without it get the plain rename, which replaces
    // only an empty directory.
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == EEXIST)
        fail("{}: appeared while synth was writing; not replacing it (pass --force)", out_);
      if (errno != EINVAL && errno != ENOSYS)
        fail_errno(
            fmt::format("{}: cannot rename the temporary directory {} into place", out_, temp_));
      if (::rename(temp_.c_str(), target_.c_str()) != 0)
        fail_errno(
            fmt::format("{}: cannot rename the temporary directory {} into place", out_, temp_));
    }
    committed_ = true;
    return;
  }
  if (now == State::kEmptyDir) {
    // (rename replaces an empty directory, and refuses one that was filled
    // meanwhile with ENOTEMPTY)
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      if (errno == ENOTEMPTY || errno == EEXIST)
        fail("{}: files appeared in it while synth was writing; not replacing it (pass --force)",
             out_);
      fail_errno(
          fmt::format("{}: cannot rename the temporary directory {} into place", out_, temp_));
    }
    committed_ = true;
    return;
  }
  // --force over a checkpoint: swap, then remove the old one.
  std::string old;
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    old = temp_;
  } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    // note: no atomic swap here: the old one is moved aside first (OUT_DIR
    // is missing until the second rename).
    const std::string prefix = temp_name_prefix(dir_, name_, kOldMarker);
    for (int attempt = 0; attempt < 16 && old.empty(); ++attempt) {
      const std::string name = prefix + random_hex();
      int rc = ::renameat2(AT_FDCWD, target_.c_str(), AT_FDCWD, name.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
        struct stat st {};
        if (::lstat(name.c_str(), &st) == 0)
          errno = EEXIST;  // taken: try another name
        else
          rc = ::rename(target_.c_str(), name.c_str());
      }
      if (rc == 0)
        old = name;
      else if (errno != EEXIST)
        fail_errno(fmt::format("{}: cannot move the previous checkpoint aside to {}", out_, name));
    }
    if (old.empty()) fail("{}: cannot find a free name beside it for the old checkpoint", out_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      const int e = errno;
      // Put the old one back: OUT_DIR as it was.
      const bool restored = ::rename(old.c_str(), target_.c_str()) == 0;
      errno = e;
      fail_errno(
          fmt::format("{}: cannot rename the temporary directory {} into place{}", out_, temp_,
                      restored ? "" : fmt::format(" (the previous checkpoint is in {})", old)));
    }
  } else {
    fail_errno(fmt::format("{}: cannot swap the temporary directory {} into place", out_, temp_));
  }
  committed_ = true;
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec)
    notes_.push_back(fmt::format(
        "{}: replaced, but the previous checkpoint, moved to {}, could not be removed: {}", out_,
        old, ec.message()));
}

}  // namespace qtk::synth
