#include "tests/fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace qtk::fuzz {

namespace {

[[noreturn]] void harness_failed(const std::string& what) {
  std::perror(("fuzz harness: " + what).c_str());
  std::abort();
}

void remove_scratch_dir();

std::string make_scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/qtk-fuzz-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) harness_failed("mkdtemp " + pattern);
  return pattern;
}

void remove_scratch_dir() {
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir(), ec);
}

}  // namespace

const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string d = make_scratch_dir();
    return d;
  }();
  static const bool registered = [] { return std::atexit(remove_scratch_dir) == 0; }();
  (void)registered;
  return dir;
}

std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) harness_failed("open " + path);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0) harness_failed("write " + path);
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) harness_failed("close " + path);
  return path;
}

void link_scratch_file(const std::string& link, const std::string& target) {
  const std::string path = scratch_dir() + "/" + link;
  if (::access(path.c_str(), F_OK) == 0) return;
  if (::symlink(target.c_str(), path.c_str()) != 0) harness_failed("symlink " + path);
}

void fuzz_check_failed(std::string_view what) {
  std::fprintf(stderr, "fuzz invariant broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

}  // namespace qtk::fuzz
