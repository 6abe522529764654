// Where generate's results go, and how they reach their final name safely.
//
//   OUT               the results, only ever a complete run (renamed into
//                     place when the run completes)
//   OUT.meta.json     the run header of OUT
//   OUT.partial       the results of a run in progress, written line by
//                     line (each line one write(2)); an interrupted run
//                     leaves it for --resume
//   OUT.partial.meta.json  the run header of OUT.partial: "running", then
//                     "failed" (with the error) if the run fails, or
//                     "interrupted" if SIGINT/SIGTERM/SIGHUP stopped it
//                     (SIGKILL leaves "running")
//   OUT.lock          held (flock) by the one generate writing OUT, holding
//                     its pid; removed at exit, also when SIGINT or SIGTERM
//                     stops the run
//
// note: the partial file has a fixed, documented name (not a random temp
// name) because --resume must find it after a kill.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qtk {

// The "results_xxh64" a complete run's header records for its results
// file (checked by merge and --resume).
std::string results_digest(std::string_view text);

struct ResultsPaths {
  std::string out, meta, partial, partial_meta, lock;
  bool meta_given = false;  // --meta named the header's path
  static ResultsPaths of(const std::string& out, const std::string& meta_override);
};

// Fails (qtk::Error) when any file generate may write is, by inode after
// symlinks, one of the `inputs` ({flag, path} pairs: the pack, the prompts,
// the chat template), or when OUT's directory does not exist or OUT is a
// directory, device or FIFO; a --meta path the same way, when it is one of
// the other outputs, and (unless may_replace) when it exists. Called before
// anything is opened for writing.
// tool and out_name: how messages name the program and OUT ("merge", "OUT").
void refuse_outputs_that_are_inputs(const ResultsPaths& paths,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    bool may_replace, const char* tool = "generate",
                                    const char* out_name = "--out");

// Whether two paths name one file: the same path once made absolute and
// normalised, or the same inode (after symlinks) where both exist.
bool same_file(const std::string& a, const std::string& b);

// A --meta path: a file name in an existing directory, not a directory,
// device or FIFO, not one of the `inputs`; unless may_replace (--force,
// --resume), not an existing file.
void check_meta_path(const std::string& meta,
                     const std::vector<std::pair<std::string, std::string>>& inputs,
                     bool may_replace);

// The same check for one output file (`flag`, e.g. "--out X", starts the message).
void refuse_output_that_is_an_input(const std::string& flag, const std::string& path,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    const char* tool = "generate");

// An exclusive flock on OUT.lock for the whole run; a second generate on the
// same OUT fails with a message naming the holder's pid. While it is held,
// SIGINT and SIGTERM (where their disposition is the default) unlink the
// file before they end the process as they otherwise would.
class OutputLock {
 public:
  OutputLock(const std::string& lock_path, const std::string& out);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
  bool armed_ = false;  // this lock has the signal handlers' path slot
};

enum class StartMode { kFresh, kForce, kResume };

// What an existing OUT / OUT.partial means for a run, decided before the
// model is loaded. Fails for an existing output without --force/--resume.
struct ResumeSource {
  bool resume = false;  // continue `path` (else start a new OUT.partial)
  std::string path;     // OUT.partial, or OUT itself (a file from an older qtk)
  std::string meta;     // its run header
};
ResumeSource choose_start(const ResultsPaths& paths, StartMode mode);

// The results file being written. Lines are appended with one write(2) each;
// complete() renames OUT.partial to OUT; destroying it without complete()
// (an exception) cuts the file back to its last complete line and marks its
// run header "failed".
class ResultsWriter {
 public:
  // Starts a new OUT.partial (header written first, status "running").
  ResultsWriter(const ResultsPaths& paths, nlohmann::json meta);
  // Writes to an open stream (`--out -`: stdout); the run header goes to
  // `meta_path` when it is not empty, and nowhere otherwise.
  ResultsWriter(int fd, const std::string& meta_path, nlohmann::json meta);
  // Continues `source` after its first `keep_bytes` bytes.
  ResultsWriter(const ResultsPaths& paths, const ResumeSource& source, nlohmann::json meta,
                uint64_t keep_bytes);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  // Appends `line` + '\n'.
  void append(const std::string& line);
  // fsync, run header "complete" with `stats`, rename into place.
  void complete(const nlohmann::json& stats);
  // Sets a top-level entry of the run header written by complete().
  void set_header(const std::string& key, nlohmann::json value) { meta_[key] = std::move(value); }
  // Records the error that ends the run (kept in the "failed" header).
  void set_failure(const std::string& message) { failure_ = message; }

 private:
  void open_for_append(const std::string& path, uint64_t keep_bytes, bool create);
  void mark_failed() noexcept;

  ResultsPaths paths_;
  std::string work_, work_meta_;  // the file being written and its header
  nlohmann::json meta_;
  int fd_ = -1;
  uint64_t complete_bytes_ = 0;  // bytes up to the last complete line
  bool done_ = false;
  bool stream_ = false;  // fd_ is not ours (stdout): no truncation, rename or close
  std::string failure_;
};

// Replaces `path` atomically: a temporary file beside it, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& data);

// Writes `data` with write(2), retrying only the rest of a short write;
// `what` names the file in an error.
void write_all(int fd, const std::string& data, const std::string& what);

}  // namespace qtk
