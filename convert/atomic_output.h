// Writes a file so that it either appears complete or not at all.
//
// The data goes to a temporary file created with O_EXCL in the destination's
// directory (".NAME.tmp.<pid>.<random>"); commit() fsyncs it, renames it over
// the destination and fsyncs the directory. Destroying an uncommitted
// AtomicOutput (an exception, a failed write) removes the temporary file, so
// a failure never leaves the destination created, replaced or half-written.
#pragma once

#include <string>

#include "core/output_files.h"  // directory_of, basename_of

namespace qtk {

class AtomicOutput {
 public:
  // Throws qtk::Error when `path` exists and `overwrite` is false, or when
  // the temporary file cannot be created (read-only directory, ...).
  AtomicOutput(const std::string& path, bool overwrite);
  ~AtomicOutput();
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

  // fsync, rename onto path(), fsync the directory. Without `overwrite` the
  // rename refuses to replace a file that appeared in the meantime.
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  std::string dir_;
  bool overwrite_ = false;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace qtk
