// synth's output directory, written so that OUT_DIR holds a whole
// checkpoint or is left as it was.
//
// The files go to a temporary directory beside OUT_DIR,
// ".NAME.synth-tmp.<pid>.<8 hex>" (NAME cut short when the name would pass
// the file system's limit), which commit() renames into place. Destroying
// an uncommitted StagedDirectory (an error, a signal turned into an
// exception) removes it with its files, and the parent directories it
// created.
//
// Replacing a non-empty OUT_DIR (force): the two directories are swapped
// with one rename (RENAME_EXCHANGE), then the old one, now under the
// temporary name, is removed; a crash in between leaves the new OUT_DIR and
// the old checkpoint under the temporary name. Where the file system cannot
// swap, the old one is first renamed to ".NAME.synth-old.<pid>.<8 hex>",
// the new one renamed into place, then the old one removed; a crash between
// the two renames leaves no OUT_DIR, the old checkpoint under the -old name
// and the new one under the -tmp name.
//
// note: a SIGKILL (or a second signal) cannot remove the temporary
// directory; the next synth writing beside it removes those whose owner pid
// is no longer running. A "-old" directory is never removed that way: it
// is the previous checkpoint, left for the user to recover or delete.
#pragma once

#include <string>
#include <vector>

namespace qtk::synth {

class StagedDirectory {
 public:
  // Refuses `out` when it exists and is not a directory (a file, a symbolic
  // link: never replaced), or is a directory with entries and `force` is
  // false; removes stale temporary directories of killed synth runs beside
  // it (see notes()); creates the missing parent directories and the
  // temporary directory.
  StagedDirectory(const std::string& out, bool force);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Where the checkpoint's files are written.
  const std::string& path() const { return temp_; }
  // Lines for stderr: stale temporary directories removed by the
  // constructor, and after commit() a previous checkpoint that could not be
  // removed (the new one is in place all the same).
  const std::vector<std::string>& notes() const { return notes_; }

  // Renames the temporary directory to OUT_DIR, checking OUT_DIR again (it
  // may have appeared or been filled meanwhile: refused without force).
  // Throws qtk::Error when it cannot; OUT_DIR is then as it was.
  void commit();

 private:
  std::string out_;     // as given, for messages
  std::string target_;  // the directory to rename onto (no trailing slash)
  std::string dir_;     // its parent
  std::string name_;    // its last component
  std::string temp_;
  bool force_ = false;
  bool committed_ = false;
  std::vector<std::string> created_;  // parent directories made, outermost first
  std::vector<std::string> notes_;
};

}  // namespace qtk::synth
