#include "core/stdout_check.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace qtk {

namespace {

// errno of the first failed write_stdout(), 0 when none failed.
// note: the stream's error flag says that a write failed but not why; errno
// is only meaningful right after the failing call, so it is kept here.
int g_first_errno = 0;

}  // namespace

void write_stdout(std::string_view text) {
  if (text.empty()) return;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() && g_first_errno == 0)
    g_first_errno = errno != 0 ? errno : EIO;
}

void flush_stdout() {
  errno = 0;
  if (std::fflush(stdout) != 0 && g_first_errno == 0) g_first_errno = errno != 0 ? errno : EIO;
}

void finish_stdout() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int flush_errno = errno;
  if (flushed && !std::ferror(stdout) && g_first_errno == 0) return;
  const int e = g_first_errno != 0 ? g_first_errno : flush_errno;
  // note: a write that failed inside another stdio call (printf) sets the
  // error flag with no errno we can still trust: said as such.
  fail("cannot write to standard output: {}",
       e != 0 ? std::strerror(e) : "a write failed (reason unknown)");
}

void open_closed_standard_fds(std::initializer_list<int> fds) {
  for (const int fd : fds) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd < 0 || null_fd == fd) continue;
    // (another standard descriptor was closed too and got it)
    ::dup2(null_fd, fd);
    ::close(null_fd);
  }
}

void ignore_file_size_signal() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace qtk
