// Helpers for the bad-input and fault suites: run the real programs as child
// processes, build crafted inputs in private temporary directories, and check
// the CLI contract for bad input (exit status 1, no signal, ONE stderr line
// prefixed with the program name that names the file and the problem, no
// output file and no temporary file left behind).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace qtk::testing {

struct RunResult {
  int exit_code = -1;  // when the child exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] with the arguments, stdin from `stdin_path` ("" = /dev/null),
// and `shell_prefix` (e.g. "ulimit -f 64;") run by /bin/sh before exec when
// non-empty. Kills it after `timeout_s` seconds.
RunResult run_program(const std::vector<std::string>& argv, const std::string& stdin_path = "",
                      int timeout_s = 120, const std::string& shell_prefix = "");

// Starts argv without waiting (stdout/stderr to /dev/null); returns the pid.
pid_t spawn_program(const std::vector<std::string>& argv);

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
bool file_exists(const std::string& path);
// Copies every regular file of `from` into `to` (created if missing).
void copy_dir_files(const std::string& from, const std::string& to);
// File names in `dir` (not recursive), sorted.
std::vector<std::string> list_dir(const std::string& dir);

// Paths of the project's fixtures and programs.
std::string source_path(const std::string& rel);  // QTK_SOURCE_DIR + "/" + rel
std::string model_fixture(const std::string& name);  // tests/data/models/<name>
std::string program(const std::string& name);      // build*/bin/<name>

// A .safetensors file split into its parts; header keeps key order.
struct SafetensorsParts {
  nlohmann::ordered_json header;
  std::string data;  // the data buffer (everything after the header)
};
SafetensorsParts read_safetensors(const std::string& path);
// 8-byte length + header JSON (padded with spaces to a multiple of 8) + data.
std::string build_safetensors(const nlohmann::ordered_json& header, const std::string& data);
std::string build_safetensors_raw(const std::string& header_text, const std::string& data);

// The CLI contract for bad input. `program_name` is the prefix of the line;
// each of `needles` must appear in it (case-insensitive).
void expect_clean_failure(const RunResult& r, const std::string& program_name,
                          const std::vector<std::string>& needles);
// No file `name` in `dir`, and nothing else in `dir` than `allowed` (so no
// temporary or partial file was left behind).
void expect_no_output(const std::string& dir, const std::string& name,
                      const std::vector<std::string>& allowed);

std::string lower(std::string s);
// Lines of a text (without the '\n'); a trailing part without '\n' is
// returned as the last element with `*partial` set.
std::vector<std::string> split_lines(const std::string& text, bool* partial = nullptr);

}  // namespace qtk::testing
