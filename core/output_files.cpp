#include "core/output_files.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>

#include <fmt/format.h>

namespace qtk {

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool rename_noreplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) return false;
  if (::link(from.c_str(), to.c_str()) == 0) {
    ::unlink(from.c_str());
    return true;
  }
  if (errno != EPERM && errno != ENOTSUP && errno != EMLINK) return false;
  struct stat st {};
  if (::lstat(to.c_str(), &st) == 0) {
    errno = EEXIST;
    return false;
  }
  return ::rename(from.c_str(), to.c_str()) == 0;
}

bool fsync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return false;
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  errno = err;
  return rc == 0;
}

std::string temp_name_prefix(const std::string& dir, const std::string& name,
                             std::string_view marker) {
  const std::string tail = fmt::format("{}{}.", marker, ::getpid());
  const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name_max = limit > 0 ? static_cast<size_t>(limit) : NAME_MAX;
  const size_t fixed = 1 + tail.size() + 8;  // ".", the tail, the hex digits
  size_t keep = name.size();
  if (fixed + keep > name_max) {
    keep = name_max > fixed + 1 ? name_max - fixed : 1;
    while (keep > 1 && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  }
  return fmt::format("{}/.{}{}", dir, name.substr(0, keep), tail);
}

long widest_pid() {
  static const long widest = [] {
    long pid_max = 4194304;  // PID_MAX_LIMIT on 64-bit kernels
    if (std::FILE* f = std::fopen("/proc/sys/kernel/pid_max", "r")) {
      long v = 0;
      if (std::fscanf(f, "%ld", &v) == 1 && v > 1) pid_max = v;
      std::fclose(f);
    }
    return pid_max - 1;
  }();
  return std::max<long>(widest, ::getpid());
}

long parse_pid(std::string_view digits) {
  if (digits.empty() || digits.size() > 9) return 0;
  long v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v;
}

long temp_owner_pid(std::string_view name, std::string_view marker) {
  if (name.size() < 2 || name[0] != '.') return 0;
  const size_t last_dot = name.rfind('.');
  if (last_dot == std::string_view::npos || name.size() - last_dot - 1 != 8) return 0;
  for (char c : name.substr(last_dot + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return 0;
  const std::string_view head = name.substr(0, last_dot);
  const size_t at = head.rfind(marker);
  if (at == std::string_view::npos || at == 0) return 0;
  return parse_pid(head.substr(at + marker.size()));
}

bool process_running(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

}  // namespace qtk
