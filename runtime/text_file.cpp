#include "runtime/text_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "loaders/error.h"

namespace qtk {

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno(fmt::format("{}: cannot open {} for reading", path, what));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail_errno(fmt::format("{}: cannot read {}", path, what));
  return ss.str();
}

std::vector<std::string_view> split_text_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

namespace {

void write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt::format("{}: write failed", path));
    }
    done += static_cast<size_t>(n);
  }
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void replace_file_atomically(const std::string& path, const std::string& data) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create a temp file next to it", path));
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
    ::unlink(tmp.c_str());
    fail_errno(fmt::format("{}: cannot rename the temp file into place", path));
  }
  // note: the rename is durable only once the directory entry is on disk.
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace qtk
