#include "convert/atomic_output.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/output_files.h"

namespace qtk {

AtomicOutput::AtomicOutput(const std::string& path, bool overwrite)
    : path_(path), dir_(directory_of(path)), overwrite_(overwrite) {
  if (path.empty() || path.back() == '/') fail("{}: output must be a file name", path);
  // note: a name the directory cannot hold failed only at the final rename,
  // after the whole conversion.
  if (const long limit = ::pathconf(dir_.c_str(), _PC_NAME_MAX);
      limit > 0 && basename_of(path).size() > static_cast<size_t>(limit))
    fail("{}: the file name is {} bytes, longer than {} allows ({})", path,
         basename_of(path).size(), dir_, limit);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("{}: is a directory; expected a file name for the pack", path);
    if (!S_ISREG(st.st_mode)) fail("{}: exists and is not a regular file; not replacing it", path);
    if (!overwrite) fail("{}: already exists (pass --force to replace it)", path);
  } else if (const int stat_errno = errno; ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    // note: a symbolic link that leads nowhere (its target missing, or a
    // loop) is still a name in the way: the final rename would refuse it
    // after the whole conversion. With --force it is replaced as any
    // existing OUT is: the rename replaces the link itself, never writes
    // through it (a link to an existing file is replaced the same way).
    if (!overwrite) {
      fail("{}: already exists ({}); pass --force to replace it", path,
           stat_errno == ENOENT ? "a symbolic link to a missing file"
                                : fmt::format("a symbolic link that cannot be followed: {}",
                                              std::strerror(stat_errno)));
    }
  }
  const std::string prefix = temp_name_prefix(dir_, basename_of(path), ".tmp.");
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string name = fmt::format("{}{:08x}", prefix, rd());
    fd_ = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      temp_path_ = name;
      register_emergency_unlink(temp_path_);
      return;
    }
    if (errno != EEXIST)
      fail_errno(fmt::format("{}: cannot create a temporary file in {}", path, dir_));
  }
  fail("{}: cannot find a free temporary file name in {}", path, dir_);
}

AtomicOutput::~AtomicOutput() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    unregister_emergency_unlink(temp_path_);
  }
}

void AtomicOutput::commit() {
  if (::fsync(fd_) != 0) fail_errno(fmt::format("{}: fsync of the temporary file failed", path_));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno(fmt::format("{}: closing the temporary file failed", path_));
  check_interrupted(path_);
  if (overwrite_) {
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
      fail_errno(fmt::format("{}: cannot rename the temporary file into place", path_));
  } else {
    // note: no replacing closes the window between the existence check in
    // the constructor and now.
    if (!rename_noreplace(temp_path_, path_)) {
      if (errno == EEXIST)
        fail("{}: appeared while converting; not replacing it (pass --force)", path_);
      fail_errno(fmt::format("{}: cannot rename the temporary file into place", path_));
    }
  }
  committed_ = true;
  unregister_emergency_unlink(temp_path_);
  // note: by now the file is in place (and a replaced one is gone): a failed
  // directory fsync is still an error, because a crash could undo the
  // rename, but the message says where things stand.
  if (!fsync_directory(dir_))
    fail(
        "{}: written and in place, but the fsync of directory {} failed: {}; a crash could "
        "still undo the rename",
        path_, dir_, std::strerror(errno));
}

}  // namespace qtk
