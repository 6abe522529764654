// Safe extraction of a checkpoint archive (.tar, .tar.gz, .tar.zst, .zip,
// anything libarchive's tar and zip readers accept) into a private
// temporary directory, read as a stream.
//
// Rejected, with a message naming the archive and the entry: absolute paths,
// ".." components, symlinks, hard links, devices, FIFOs, sockets, duplicate
// names, sparse entries, more than max_entries entries, more than max_bytes
// unpacked bytes in total (checked before and while writing, so a bomb is
// stopped early), and an entry whose data is shorter or longer than its
// header says (a truncated archive), a zip entry failing its CRC-32 and a
// gzip stream failing its CRC-32 or length.
#pragma once

#include <cstdint>
#include <string>

namespace qtk {

struct ArchiveLimits {
  uint64_t max_bytes = 256ull << 30;  // total unpacked bytes
  uint64_t max_entries = 100000;
};

class ExtractedArchive {
 public:
  // Extracts `archive` into a new directory under `parent_dir`. On failure
  // the directory is removed before the exception leaves.
  ExtractedArchive(const std::string& archive, const std::string& parent_dir,
                   const ArchiveLimits& limits);
  // Removes the extracted files.
  ~ExtractedArchive();
  ExtractedArchive(const ExtractedArchive&) = delete;
  ExtractedArchive& operator=(const ExtractedArchive&) = delete;

  // The checkpoint directory: the extraction root when config.json is at
  // the top, else the one top-level folder holding one.
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  // The private directory the entries were extracted into.
  const std::string& root() const { return temp_dir_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t entries() const { return entries_; }

 private:
  void extract(const std::string& archive, const ArchiveLimits& limits);
  void extract_entries(const std::string& archive, const ArchiveLimits& limits);
  std::string temp_dir_;
  std::string checkpoint_dir_;
  uint64_t bytes_ = 0;
  uint64_t entries_ = 0;
};

}  // namespace qtk
