#include "tests/badinput/run_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace qtk::testing {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void die(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

std::vector<char*> c_argv(std::vector<std::string>& args) {
  std::vector<char*> v;
  for (auto& a : args) v.push_back(a.data());
  v.push_back(nullptr);
  return v;
}

// argv run through /bin/sh -c 'PREFIX exec "$0" "$@"' when a prefix is given.
std::vector<std::string> with_shell(const std::vector<std::string>& argv, const std::string& prefix) {
  if (prefix.empty()) return argv;
  std::vector<std::string> out = {"/bin/sh", "-c", prefix + " exec \"$0\" \"$@\""};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace

RunResult run_program(const std::vector<std::string>& argv_in, const std::string& stdin_path,
                      int timeout_s, const std::string& shell_prefix) {
  std::vector<std::string> args = with_shell(argv_in, shell_prefix);
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) die("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    const int in = ::open(stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY);
    if (in < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    auto cv = c_argv(args);
    ::execv(cv[0], cv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  RunResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) die("poll");
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) die("waitpid");
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

pid_t spawn_program(const std::vector<std::string>& argv) {
  std::vector<std::string> args = argv;
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    auto cv = c_argv(args);
    ::execv(cv[0], cv.data());
    ::_exit(127);
  }
  return pid;
}

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/qtk-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) die("mkdtemp");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  // note: make everything writable first so a test that chmod-ed a
  // directory read-only still cleans up.
  for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::end(it); it.increment(ec))
    if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(path_, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void copy_dir_files(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    const std::string dst = to + "/" + e.path().filename().string();
    fs::copy_file(e.path(), dst, fs::copy_options::overwrite_existing);
    fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write);
  }
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string source_path(const std::string& rel) { return std::string(QTK_SOURCE_DIR) + "/" + rel; }
std::string model_fixture(const std::string& name) { return source_path("tests/data/models/" + name); }
std::string program(const std::string& name) { return std::string(QTK_BIN_DIR) + "/" + name; }

SafetensorsParts read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  SafetensorsParts p;
  p.header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  p.data = bytes.substr(8 + n);
  return p;
}

std::string build_safetensors_raw(const std::string& header_text, const std::string& data) {
  std::string h = header_text;
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

std::string build_safetensors(const nlohmann::ordered_json& header, const std::string& data) {
  return build_safetensors_raw(header.dump(), data);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split_lines(const std::string& text, bool* partial) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(pos));
      if (partial) *partial = true;
      return lines;
    }
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (partial) *partial = false;
  return lines;
}

void expect_clean_failure(const RunResult& r, const std::string& program_name,
                          const std::vector<std::string>& needles) {
  EXPECT_FALSE(r.timed_out) << program_name << " did not finish";
  EXPECT_EQ(r.signal, 0) << program_name << " died of signal " << r.signal << "; stderr:\n" << r.err;
  EXPECT_EQ(r.exit_code, 1) << "stderr:\n" << r.err;
  // One line: exactly one '\n', at the end.
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr is not one line:\n" << r.err;
  EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "stderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind(program_name + ": ", 0), 0u) << "stderr does not start with '" << program_name
                                                     << ": ':\n" << r.err;
  const std::string l = lower(r.err);
  for (const std::string& n : needles)
    EXPECT_NE(l.find(lower(n)), std::string::npos) << "stderr does not mention \"" << n << "\":\n" << r.err;
}

void expect_no_output(const std::string& dir, const std::string& name,
                      const std::vector<std::string>& allowed) {
  EXPECT_FALSE(file_exists(dir + "/" + name)) << name << " was left in " << dir;
  for (const std::string& f : list_dir(dir)) {
    if (f == name) continue;
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), f), allowed.end())
        << "unexpected file left in " << dir << ": " << f;
  }
}

}  // namespace qtk::testing
