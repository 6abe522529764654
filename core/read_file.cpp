#include "core/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "core/error.h"

namespace qtk {

namespace {

// Closes the descriptor it holds (not standard input).
struct Fd {
  int fd = -1;
  bool owned = false;
  ~Fd() {
    if (owned && fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_file_text(const std::string& path, std::string_view what, uint64_t max_bytes) {
  const std::string name = path == "-" ? "standard input" : path;
  Fd f;
  if (path == "-") {
    f.fd = STDIN_FILENO;
  } else {
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) fail_errno(fmt::format("{}: cannot open {} for reading", name, what));
    f.owned = true;
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_errno(fmt::format("{}: cannot read {}", name, what));
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory; expected {}", name, what);
  const bool sized = S_ISREG(st.st_mode);
  if (sized && static_cast<uint64_t>(st.st_size) > max_bytes)
    fail("{}: expected {} of at most {} bytes, found {} bytes", name, what, max_bytes,
         static_cast<uint64_t>(st.st_size));
  std::string text;
  if (sized) text.reserve(static_cast<size_t>(st.st_size));
  // note: read to the end, not to st_size: a file that grows while it is
  // read (or a pipe) is read whole; the cap still applies.
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt::format("{}: cannot read {}", name, what));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes)
      fail("{}: expected {} of at most {} bytes, found more", name, what, max_bytes);
  }
  return text;
}

}  // namespace qtk
