// Writes a .pack: a zip archive, written with libzip, whose entries are all
// STORED and whose data all start at a multiple of kPackAlignment (64) bytes.
//
// note: alignment works the way PyTorch's zip writer does it: before each
// local header is written we know its offset (entries are written in order,
// each local header is 30 bytes + name + extra fields, then the data), so we
// add a padding extra field (id kPaddingExtraId, local header only) of the
// size that puts the data on the boundary. The model of libzip's header
// sizes is checked after writing by re-reading the file (Pack::open).
//
// Entry data is pulled from EntrySource objects in chunks while libzip
// writes, so a model is never held in memory; the XXH64 of each entry is
// computed on the way through.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qtk {

// Produces an entry's bytes in order.
class EntrySource {
 public:
  virtual ~EntrySource() = default;
  virtual uint64_t size() const = 0;
  // Back to the first byte (libzip may open a source more than once).
  virtual void rewind() = 0;
  // Copies the next min(len, bytes left) bytes to dst; returns that count.
  virtual size_t read(uint8_t* dst, size_t len) = 0;
};

// An entry held in memory (manifest, tokenizer files).
std::unique_ptr<EntrySource> make_bytes_source(std::string bytes);

struct WrittenEntry {
  std::string name;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH64 of the data
};

class PackWriter {
 public:
  // `fd`: an empty file open for writing; `display_path` names it in errors.
  PackWriter(int fd, std::string display_path);

  // Entries are written in the order they are added.
  void add(std::string name, std::unique_ptr<EntrySource> source);

  // The entry written last, made by `make` once every other entry has been
  // written (so it can record their checksums: the manifest).
  using MakeLast = std::function<std::string(const std::vector<WrittenEntry>& written)>;
  void set_last(std::string name, MakeLast make);

  // Called now and then with bytes of entry data written so far and the
  // total (without the last entry).
  void set_progress(std::function<void(uint64_t done, uint64_t total)> progress);

  // Writes the archive. Returns every entry (the last one included) in order.
  // Throws qtk::Error naming the output on any failure (the source's error,
  // a failed write such as ENOSPC or EFBIG, an interrupt).
  std::vector<WrittenEntry> write();

 private:
  struct Pending {
    std::string name;
    std::unique_ptr<EntrySource> source;
  };
  int fd_;
  std::string path_;
  std::vector<Pending> pending_;
  std::string last_name_;
  MakeLast make_last_;
  std::function<void(uint64_t, uint64_t)> progress_;
};

}  // namespace qtk
