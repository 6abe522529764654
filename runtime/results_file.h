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
//   OUT.lock          held (flock) by the one generate or merge writing OUT,
//                     holding its pid; removed at exit, also when SIGINT,
//                     SIGTERM or SIGHUP stops the run. Never a symbolic
//                     link, FIFO or directory: such a file there is refused.
//
// Short-lived names, each ending in the writer's pid (what a SIGKILL leaves
// of them is removed by the next generate or merge that takes OUT.lock,
// once that pid is gone):
//   OUT.meta.json.tmp.PID, OUT.partial.meta.json.tmp.PID   a header being
//                     written, renamed over its name once fsynced
//   OUT.meta.json.prev.PID  a hard link to the previous header while the
//                     new one and its results are moved into place (put
//                     back if the results cannot be)
//   OUT.merge.PID     merge's results before they are moved into place
//
// note: the partial file has a fixed, documented name (not a random temp
// name) because --resume must find it after a kill. Every file is created
// with O_EXCL | O_NOFOLLOW (what is at a pid-named name, or at OUT.partial
// under --force, a symbolic link included, is removed first) and every
// replacement is a rename, so a symbolic link at one of these names is
// replaced, never written through.
#pragma once

#include <sys/types.h>

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
// the chat template), or when OUT's directory does not exist (or is not a
// directory), OUT is a directory, device or FIFO, the path is too long, or a
// name derived from it (OUT.partial.meta.json.tmp.PID, OUT.merge.PID, ...)
// would pass the file system's name length limit; a --meta path the same
// way, when it is one of the other outputs, and (unless may_replace) when it
// exists. Called before anything is opened for writing.
// tool and out_name: how messages name the program and OUT ("merge", "OUT").
void refuse_outputs_that_are_inputs(const ResultsPaths& paths,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    bool may_replace, const char* tool = "generate",
                                    const char* out_name = "--out");

// Fails (qtk::Error) when a name generate (or merge, by `tool`) derives
// from paths.out (the lock, the partial results, the header, their
// pid-named temporaries; paths.out itself where it is not `given`) would
// pass the file system's name length limit or the system's path length
// limit. `given` is the path the user named (paths.out, or the OUT a
// --devices part is named after); `flag` starts the message.
void check_names_beside(const ResultsPaths& paths, const std::string& flag,
                        const std::string& given, const char* tool = "generate");

// Whether two paths name one file: the same path once made absolute and
// normalised, or the same inode (after symlinks) where both exist.
bool same_file(const std::string& a, const std::string& b);

// A --meta path: a file name in an existing directory, not a directory,
// device or FIFO, not one of the `inputs`, its temporary names within the
// name length limit; unless may_replace (--force, --resume), not an existing
// file.
// resumable: the run could be resumed (not --out -), so the refusal of an
// existing file names --resume too.
void check_meta_path(const std::string& meta,
                     const std::vector<std::pair<std::string, std::string>>& inputs,
                     bool may_replace, bool resumable = true);

// The same check for one output file (`flag`, e.g. "--out X", starts the message).
void refuse_output_that_is_an_input(const std::string& flag, const std::string& path,
                                    const std::vector<std::pair<std::string, std::string>>& inputs,
                                    const char* tool = "generate");

// An exclusive flock on OUT.lock for the whole run; a second generate on the
// same OUT fails with a message naming the holder's pid. The file is opened
// with O_NOFOLLOW: a symbolic link, FIFO or directory at its name is refused
// (never followed or truncated), and so is a regular file with more than one
// hard link (another name of OUT, or of any file, which the pid would
// overwrite); a regular file of its own left by a killed run is taken over. While it is held,
// SIGINT, SIGTERM and SIGHUP (where their disposition is the default) unlink the file before they
// end the process as they otherwise would; where the program handles them itself (an
// InterruptScope, installed before or after the lock) the unwinding to the
// destructor removes it. Whatever installed the handlers, the file is on
// core/interrupt's list of files removed when the process ends at once (a
// second signal, a fault in a file mapping) while it is held, and taken off
// it when the lock is released.
class OutputLock {
 public:
  OutputLock(const std::string& lock_path, const std::string& out);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
  bool armed_ = false;  // this lock installed the signal handlers (and has their path slot)
};

// Removes what a killed generate or merge left of its short-lived files
// beside OUT and its header (the names listed at the top of this file) whose
// pid is no longer running and that belong to this user; returns one line
// per file removed, for the caller to print. Called with OUT.lock held (no
// other run writes these names then). Best effort: errors are ignored.
std::vector<std::string> remove_stale_temporaries(const ResultsPaths& paths);

// The same for the temporaries of a --meta header alone (META.tmp.PID,
// META.prev.PID), for `--out - --meta META`, which takes no lock.
// note: safe without the lock: a name is removed only when its pid is no
// longer running, and a live run's pid is in its own names.
std::vector<std::string> remove_stale_meta_temporaries(const std::string& meta);

// Which file was at a path when the run claimed its outputs (by lstat):
// without --force, the final move replaces only that same file.
struct FileAtStart {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  static FileAtStart of(const std::string& path);
};

// What the final move of a run may replace, recorded when it claims its
// outputs (with OUT.lock held, before the model is loaded). With --force
// anything at OUT and its header; otherwise only the file that was there at
// the start (the OUT that --resume finishes an interrupted run into): a
// file that appears while the run works is never replaced.
struct OutputsAtStart {
  bool force = false;
  FileAtStart out, meta;
  static OutputsAtStart of(const ResultsPaths& paths, bool force);
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

// The last step of a run or a merge: its header and results moved into
// place so that OUT and OUT's header stay a pair. In order: the header is
// written to META.tmp.PID and fsynced; the old header, if any, is kept as
// META.prev.PID (a hard link); the header is renamed over META, then the
// results over OUT; if that fails, the old header is put back (or the new
// one removed), so a failure leaves OUT and META as they were. Then the
// directories are fsynced. Without `force` neither move replaces a file that
// was not there at the start (renameat2 RENAME_NOREPLACE, or link() where
// the file system lacks it). A SIGKILL between the two renames leaves the
// new header beside the old OUT (its results_xxh64 says they are not its
// results) and, for generate, OUT.partial for --resume, which completes the
// pair. Throws qtk::Error naming the file; a signal recorded by an
// InterruptScope before the first rename stops it there.
struct FinalMove {
  std::string staged;  // the complete results (fsynced), or "" (none to move)
  std::string out;     // where they go ("-": stdout, only the header moves)
  std::string meta;    // the header's path
  std::string header;  // its text
  bool force = false;
  FileAtStart out_at_start, meta_at_start;
  std::string partial;               // generate: where the results stay after a failure
  std::string remove_after;          // removed once both are in place (OUT.partial.meta.json)
  const char* doing = "generating";  // "appeared while generating"
};
void move_results_into_place(const FinalMove& move);

// The results file being written. Lines are appended with one write(2) each;
// complete() moves OUT.partial and its header into place
// (move_results_into_place); destroying it without complete() (an
// exception) cuts the file back to its last complete line and marks its run
// header "failed".
class ResultsWriter {
 public:
  // Starts a new OUT.partial (header written first, status "running"); with
  // start.force a file at OUT.partial is removed first, otherwise one there
  // is refused. `start` also says what complete() may replace.
  ResultsWriter(const ResultsPaths& paths, const OutputsAtStart& start, nlohmann::json meta);
  // Writes to an open stream (`--out -`: stdout); the run header goes to
  // `meta_path` when it is not empty, and nowhere otherwise.
  // note: only when the run completes, atomically: results on stdout cannot
  // be resumed, so a "running" or "failed" header would only replace the
  // previous one (with `force`) for nothing.
  ResultsWriter(int fd, const std::string& meta_path, nlohmann::json meta, bool force);
  // Continues `source` after its first `keep_bytes` bytes.
  ResultsWriter(const ResultsPaths& paths, const ResumeSource& source, const OutputsAtStart& start,
                nlohmann::json meta, uint64_t keep_bytes);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  // Appends `line` + '\n'.
  void append(const std::string& line);
  // fsync, run header "complete" with `stats`, rename into place.
  void complete(const nlohmann::json& stats);
  // Sets a top-level entry of the run header written by complete().
  void set_header(const std::string& key, nlohmann::json value) { meta_[key] = std::move(value); }
  // Records the error that ends the run and the run's statistics so far
  // (both kept in the "failed" or "interrupted" header).
  void set_failure(const std::string& message, nlohmann::json stats = nullptr) {
    failure_ = message;
    failure_stats_ = std::move(stats);
  }

 private:
  void open_for_append(const std::string& path, uint64_t keep_bytes, bool create);
  void mark_failed() noexcept;

  ResultsPaths paths_;
  OutputsAtStart start_;
  std::string work_, work_meta_;  // the file being written and its header
  nlohmann::json meta_;
  int fd_ = -1;
  uint64_t complete_bytes_ = 0;  // bytes up to the last complete line
  bool done_ = false;
  bool stream_ = false;  // fd_ is not ours (stdout): no truncation, rename or close
  std::string failure_;
  nlohmann::json failure_stats_;
};

// Replaces `path` atomically: a new temporary file beside it (PATH.tmp.PID,
// created with O_EXCL | O_NOFOLLOW), fsync, rename. A symbolic link at
// `path` is replaced, not written through.
void write_file_atomic(const std::string& path, const std::string& data);

// Writes `data` with write(2), retrying only the rest of a short write;
// `what` names the file in an error.
void write_all(int fd, const std::string& data, const std::string& what);

}  // namespace qtk
