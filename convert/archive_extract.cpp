#include "convert/archive_extract.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "convert/stale_temporaries.h"
#include "core/error.h"
#include "core/interrupt.h"

namespace qtk {

namespace {

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

const char* kind_name(mode_t type) {
  switch (type) {
    case AE_IFLNK:
      return "a symbolic link";
    case AE_IFCHR:
      return "a character device";
    case AE_IFBLK:
      return "a block device";
    case AE_IFIFO:
      return "a FIFO";
    case AE_IFSOCK:
      return "a socket";
    default:
      return "not a regular file or directory";
  }
}

// libarchive's message for the last error, without the newline some of its
// messages end with (it was printed as a literal "\n" at the end of the line).
std::string libarchive_error(archive* a) {
  const char* m = archive_error_string(a);
  std::string s = m != nullptr ? m : "unknown error";
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// An input file libarchive cannot read as a tar or zip: names what it is when
// that is recognisable, in the words `inspect` uses for the same files (a
// GGUF or safetensors file, a compressed file that holds no tar), else gives
// libarchive's reason.
[[noreturn]] void fail_not_an_archive(const std::string& path, const std::string& why) {
  char head[16] = {};
  size_t n = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    n = std::fread(head, 1, sizeof(head), f);
    std::fclose(f);
  }
  const auto starts_with = [&](std::string_view magic) {
    return n >= magic.size() && std::memcmp(head, magic.data(), magic.size()) == 0;
  };
  if (starts_with("GGUF")) {
    fail(
        "{}: this looks like a GGUF file (llama.cpp's format), not a checkpoint; convert the "
        "Hugging Face checkpoint (safetensors) instead: its directory, or a tar or zip of it",
        path);
  }
  // note: safetensors starts with a little-endian u64 header length, then '{'.
  if (n >= 9 && head[8] == '{' && head[6] == 0 && head[7] == 0) {
    fail(
        "{}: this looks like a safetensors file, not a checkpoint; run convert on its checkpoint "
        "directory (the folder with config.json) or a tar or zip of it",
        path);
  }
  constexpr char kXzMagic[] = {'\xfd', '7', 'z', 'X', 'Z', '\0'};
  const char* compressed = starts_with("\x1f\x8b")           ? "a gzip-compressed file"
                           : starts_with("\x28\xb5\x2f\xfd") ? "a zstd-compressed file"
                           : starts_with(std::string_view(kXzMagic, sizeof(kXzMagic)))
                               ? "an xz-compressed file"
                           : starts_with("BZh") ? "a bzip2-compressed file"
                                                : nullptr;
  if (compressed != nullptr) {
    fail(
        "{}: this is {} that does not hold a tar archive (expected a tar or zip of the "
        "checkpoint directory)",
        path, compressed);
  }
  fail("{}: not a readable tar or zip archive: {}", path, why);
}

// Splits an archive path into safe components; throws on absolute paths and
// "..". "./a//b/" gives {"a", "b"}.
std::vector<std::string> safe_components(const std::string& where, const std::string& path) {
  if (path.empty()) fail("{}: has an empty name", where);
  if (path[0] == '/') fail("{}: is an absolute path", where);
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    const std::string part = path.substr(start, slash - start);
    if (part == "..") fail("{}: has a \"..\" component", where);
    if (!part.empty() && part != ".") parts.push_back(part);
    start = slash + 1;
  }
  return parts;
}

void make_dirs(const std::string& root, const std::vector<std::string>& parts, size_t count,
               const std::string& where) {
  std::string p = root;
  for (size_t i = 0; i < count; ++i) {
    p += "/" + parts[i];
    if (::mkdir(p.c_str(), 0755) != 0) {
      if (errno != EEXIST) fail_errno(fmt::format("{}: cannot create directory", where));
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        fail("{}: \"{}\" is both a file and a directory", where, parts[i]);
    }
  }
}

// note: libarchive's gzip reader does not check a member's trailer (its
// CRC-32 and length: a "TODO" in its source), so a .tar.gz with a flipped
// byte inside decompressed to wrong weights without an error. gzip_damage
// inflates the file with zlib, which does check them, and returns what is
// wrong ("" when every member is sound); extract runs it on the other core.
// Bytes after a member that do not start another (trailing zeros some tools
// append) end the check, as gzip itself ignores them. stop: set when the
// extraction failed first.
std::string gzip_damage(const std::string& path, const std::atomic<bool>& stop) {
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in.fd < 0) return fmt::format("cannot open it: {}", std::strerror(errno));
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return "zlib could not start";
  std::vector<unsigned char> buf(1 << 20), out(1 << 20);
  std::string damage;
  bool member_open = false, between = false;
  for (;;) {
    if (stop.load(std::memory_order_relaxed)) break;
    const ssize_t n = ::read(in.fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      damage = fmt::format("cannot read it: {}", std::strerror(errno));
      break;
    }
    if (n == 0) {
      if (member_open) damage = "the gzip stream ends inside a member (truncated)";
      break;
    }
    z.next_in = buf.data();
    z.avail_in = static_cast<uInt>(n);
    while (z.avail_in > 0 && damage.empty()) {
      if (between && z.next_in[0] != 0x1f) break;  // trailing bytes, not a member
      between = false;
      member_open = true;
      z.next_out = out.data();
      z.avail_out = static_cast<uInt>(out.size());
      const int r = inflate(&z, Z_NO_FLUSH);
      if (r == Z_STREAM_END) {
        member_open = false;
        between = true;
        inflateReset(&z);  // the next member, if any (gzip files may be concatenated)
      } else if (r != Z_OK && r != Z_BUF_ERROR) {
        damage = fmt::format("its gzip data is damaged: {}", z.msg ? z.msg : "zlib error");
      }
    }
    if (!damage.empty() || (between && z.avail_in > 0)) break;
  }
  inflateEnd(&z);
  return damage;
}

bool starts_as_gzip(const std::string& path) {
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  unsigned char magic[2] = {0, 0};
  return in.fd >= 0 && ::read(in.fd, magic, 2) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

}  // namespace

ExtractedArchive::ExtractedArchive(const std::string& archive_path, const std::string& parent_dir,
                                   const ArchiveLimits& limits) {
  // note: the name carries our pid, so that a later convert can tell a
  // leftover of a killed run from the directory of a running one.
  std::string templ = extract_dir_template(parent_dir);
  if (::mkdtemp(templ.data()) == nullptr)
    fail_errno(
        fmt::format("{}: cannot create a temporary directory in {}", archive_path, parent_dir));
  temp_dir_ = templ;
  try {
    extract(archive_path, limits);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir_, ec);
    throw;
  }
}

ExtractedArchive::~ExtractedArchive() {
  std::error_code ec;
  std::filesystem::remove_all(temp_dir_, ec);
}

void ExtractedArchive::extract(const std::string& path, const ArchiveLimits& limits) {
  std::atomic<bool> stop{false};
  std::future<std::string> gzip_check;
  if (starts_as_gzip(path))
    gzip_check = std::async(std::launch::async, [&path, &stop] { return gzip_damage(path, stop); });
  struct StopCheck {
    std::atomic<bool>& stop;
    std::future<std::string>& check;
    ~StopCheck() {
      stop = true;
      if (check.valid()) check.wait();
    }
  } stop_check{stop, gzip_check};
  extract_entries(path, limits);
  if (gzip_check.valid()) {
    const std::string damage = gzip_check.get();
    if (!damage.empty()) fail("{}: {}", path, damage);
  }
}

void ExtractedArchive::extract_entries(const std::string& path, const ArchiveLimits& limits) {
  std::unique_ptr<archive, ArchiveCloser> a(archive_read_new());
  if (!a) fail("{}: libarchive: out of memory", path);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_zip(a.get());
  // note: 1 MiB blocks keep the syscall count low for multi-GB shards.
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 20) != ARCHIVE_OK)
    fail_not_an_archive(path, libarchive_error(a.get()));

  std::set<std::string> seen;
  for (;;) {
    check_interrupted(path);
    archive_entry* e = nullptr;
    const int rc = archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
      if (entries_ == 0) fail_not_an_archive(path, libarchive_error(a.get()));
      fail("{}: archive is damaged after {} entries: {}", path, entries_,
           libarchive_error(a.get()));
    }
    const char* raw = archive_entry_pathname(e);
    const std::string name = raw ? raw : "";
    const std::string where = fmt::format("{}: entry \"{}\"", path, name);
    if (++entries_ > limits.max_entries)
      fail("{}: holds more than {} entries (the limit; see --max-entries)", path,
           limits.max_entries);
    const auto parts = safe_components(where, name);
    if (archive_entry_hardlink(e) != nullptr)
      fail("{}: is a hard link; links are not accepted", where);
    if (archive_entry_symlink(e) != nullptr)
      fail("{}: is a symbolic link; links are not accepted", where);
    const mode_t type = archive_entry_filetype(e);
    if (type != AE_IFREG && type != AE_IFDIR)
      fail("{}: is {}; only files and directories are accepted", where, kind_name(type));
    if (archive_entry_sparse_count(e) > 0) fail("{}: is a sparse file; not accepted", where);
    std::string key;
    for (const auto& p : parts) key += "/" + p;
    if (key.empty()) {
      if (type == AE_IFDIR) continue;  // "./" itself
      fail("{}: has no usable name", where);
    }
    if (!seen.insert(key).second) fail("{}: appears twice in the archive", where);

    if (type == AE_IFDIR) {
      make_dirs(temp_dir_, parts, parts.size(), where);
      continue;
    }
    make_dirs(temp_dir_, parts, parts.size() - 1, where);
    const bool sized = archive_entry_size_is_set(e);
    const uint64_t declared = sized ? static_cast<uint64_t>(archive_entry_size(e)) : 0;
    if (sized && declared > limits.max_bytes - std::min(bytes_, limits.max_bytes))
      fail(
          "{}: unpacking its {} bytes would exceed the limit of {} bytes in total (see "
          "--max-unpacked-bytes)",
          where, declared, limits.max_bytes);

    Fd out;
    const std::string dest = temp_dir_ + key;
    out.fd = ::open(dest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (out.fd < 0) fail_errno(fmt::format("{}: cannot create {}", where, dest));
    uint64_t written = 0;
    for (;;) {
      check_interrupted(path);
      const void* buf = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      const int r = archive_read_data_block(a.get(), &buf, &len, &offset);
      if (r == ARCHIVE_EOF) break;
      // note: libarchive reports a zip entry whose data fails its CRC-32 as
      // a warning, after handing over the data: damaged weights, so an error.
      if (r == ARCHIVE_WARN) fail("{}: its data is damaged: {}", where, libarchive_error(a.get()));
      if (r != ARCHIVE_OK)
        fail("{}: cannot read its data (truncated or damaged archive?): {}", where,
             libarchive_error(a.get()));
      if (offset < 0 || static_cast<uint64_t>(offset) != written)
        fail("{}: data has holes (offset {} after {} bytes); not accepted", where, offset, written);
      if (len > limits.max_bytes - std::min(bytes_ + written, limits.max_bytes))
        fail("{}: unpacking exceeds the limit of {} bytes in total (see --max-unpacked-bytes)",
             where, limits.max_bytes);
      const auto* p = static_cast<const uint8_t*>(buf);
      size_t done = 0;
      while (done < len) {
        const ssize_t n = ::write(out.fd, p + done, len - done);
        if (n < 0) {
          if (errno == EINTR) {
            check_interrupted(path);
            continue;
          }
          fail_errno(fmt::format("{}: cannot write {}", where, dest));
        }
        done += static_cast<size_t>(n);
      }
      written += len;
    }
    if (sized && written != declared)
      fail("{}: header says {} bytes but the archive holds {} (truncated archive?)", where,
           declared, written);
    bytes_ += written;
  }

  // Where the checkpoint is.
  struct stat st {};
  if (::stat((temp_dir_ + "/config.json").c_str(), &st) == 0) {
    checkpoint_dir_ = temp_dir_;
    return;
  }
  std::vector<std::string> top;
  for (const auto& d : std::filesystem::directory_iterator(temp_dir_))
    top.push_back(d.path().filename().string());
  // note: the one top-level folder holding a config.json is the checkpoint,
  // whatever files lie beside it (a README.md, a LICENSE); more than one
  // checkpoint (a/config.json, b/config.json) is named as such: which one
  // to convert is the user's choice, not ours.
  std::vector<std::string> with_config;
  for (const std::string& t : top)
    if (std::filesystem::is_directory(temp_dir_ + "/" + t) &&
        ::stat((temp_dir_ + "/" + t + "/config.json").c_str(), &st) == 0)
      with_config.push_back(t + "/");
  if (with_config.size() == 1) {
    checkpoint_dir_ = temp_dir_ + "/" + with_config[0].substr(0, with_config[0].size() - 1);
    return;
  }
  if (with_config.size() > 1) {
    std::sort(with_config.begin(), with_config.end());
    std::string folders;
    for (const std::string& f : with_config) folders += (folders.empty() ? "" : ", ") + f;
    fail(
        "{}: holds {} checkpoints (a config.json in each of the folders {}); expected one, at its "
        "top level or in a single top-level folder (convert each from its own archive or "
        "directory)",
        path, with_config.size(), folders);
  }
  fail("{}: holds no config.json at its top level or in a single top-level folder", path);
}

}  // namespace qtk
