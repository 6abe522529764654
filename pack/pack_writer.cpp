#include "pack/pack_writer.h"

#include <unistd.h>
#include <zip.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/interrupt.h"
#include "pack/crc32.h"
#include "pack/pack_checksum.h"
#include "pack/pack_zip.h"

// libzip computes the CRC-32 of every STORED entry with zlib's crc32() as the
// data passes through, and has no way to take a precomputed one: add_data()
// in zip_close.c (1.7.3, and upstream as of 2026) always layers
// zip_source_crc over a STORED source, whatever the source's stat reports.
// Defining crc32 here, in every program that writes packs, binds libzip's
// calls (and zlib's own) to qtk::crc32_update, which computes the same
// function (tests/convert/crc32_test.cpp checks it against zlib's), so the
// packs are the same bytes.
// note: ELF symbol interposition: the executable's definition comes first in
// the global lookup scope, and ld exports it because libzip.so refers to it.
// Measured on a Qwen3-30B-A3B-shaped checkpoint (bench/convert/profile.sh):
// zlib's crc32 was 12-13 % of convert's CPU samples, this one is 3 %.
extern "C" {
unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int len);
unsigned long crc32_z(unsigned long crc, const unsigned char* buf, size_t len);

unsigned long crc32(unsigned long crc, const unsigned char* buf, unsigned int len) {
  if (buf == nullptr) return 0;  // zlib: crc32(x, NULL, n) is the initial value
  return qtk::crc32_update(static_cast<uint32_t>(crc), buf, len);
}

unsigned long crc32_z(unsigned long crc, const unsigned char* buf, size_t len) {
  if (buf == nullptr) return 0;
  return qtk::crc32_update(static_cast<uint32_t>(crc), buf, len);
}
}

namespace qtk {

namespace {

using namespace zipfmt;

// note: a fixed timestamp (1980-01-01, the earliest DOS date) makes packs of
// the same input byte-identical, so their checksums can be compared.
constexpr time_t kFixedMtime = 315532800 + 12 * 3600;

// note: 4 MiB batches turn libzip's 8 KiB writes into few large pwrite()s.
// With the background writer, 2, 4 and 8 MiB batches converted the 6.2 GB
// Qwen3-30B-A3B-shaped checkpoint to /dev/shm in the same time (6.3-6.5 s,
// noisy 2-vCPU box); smaller batches keep peak RSS lower.
constexpr size_t kSinkBuffer = 4u << 20;

constexpr uint64_t kProgressStep = 256u << 20;

class BytesSource final : public EntrySource {
 public:
  explicit BytesSource(std::string b) : bytes_(std::move(b)) {}
  uint64_t size() const override { return bytes_.size(); }
  void rewind() override { pos_ = 0; }
  size_t read(uint8_t* dst, size_t len) override {
    const size_t n = std::min(len, bytes_.size() - pos_);
    std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }

 private:
  std::string bytes_;
  size_t pos_ = 0;
};

// Shared state of one write() call, reached from libzip's callbacks.
struct WriteState {
  std::string path;
  std::exception_ptr error;  // first exception thrown inside a callback
  uint64_t data_done = 0, data_total = 0, next_report = kProgressStep;
  std::function<void(uint64_t, uint64_t)>* progress = nullptr;
  std::vector<WrittenEntry> written;
  size_t regular_entries = 0;  // entries before the last one
};

// Writes batches with pwrite() on a second thread, one at a time in the
// order given, so the kernel's copy into the page cache (the largest cost of
// convert, about half its CPU samples) overlaps the reading, conversion and
// checksums of the next batch. The same writes at the same offsets in the
// same order as writing in place: the same file.
class BackgroundWriter {
 public:
  BackgroundWriter(int fd, const std::string& path) : fd_(fd), path_(path) {
    thread_ = std::thread([this] { run(); });
  }
  ~BackgroundWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;  // on failure: queued batches are dropped (the output is discarded)
    }
    cv_.notify_all();
    thread_.join();
  }
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Queues `buf` for writing at `offset` (waiting while kMaxQueued are
  // queued); returns an empty buffer (a reused one when there is one).
  std::vector<uint8_t> submit(std::vector<uint8_t> buf, uint64_t offset) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || failed_; });
    throw_if_failed(lock);
    queue_.push_back({std::move(buf), offset});
    cv_.notify_all();
    std::vector<uint8_t> next;
    if (!free_.empty()) {
      next = std::move(free_.back());
      free_.pop_back();
    }
    next.clear();
    return next;
  }

  // Waits until every queued batch is written; throws the first failure.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || failed_; });
    throw_if_failed(lock);
  }

 private:
  // note: two batches queued plus one being written plus the one being
  // filled: 16 MiB of batches. One or two queued made no measurable
  // difference; two absorb a stall of the main thread on a page fault.
  static constexpr size_t kMaxQueued = 2;

  struct Job {
    std::vector<uint8_t> buf;
    uint64_t offset = 0;
  };

  void throw_if_failed(std::unique_lock<std::mutex>& lock) {
    if (!failed_) return;
    const int err = errno_;
    const std::string what = what_;
    lock.unlock();
    errno = err;
    fail_errno(what);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ || failed_) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      int err = 0;
      size_t done = 0;
      while (done < job.buf.size()) {
        const ssize_t n = ::pwrite(fd_, job.buf.data() + done, job.buf.size() - done,
                                   static_cast<off_t>(job.offset + done));
        if (n < 0) {
          if (errno == EINTR) continue;  // the main thread reports interrupts
          err = errno;
          break;
        }
        done += static_cast<size_t>(n);
      }
      lock.lock();
      busy_ = false;
      if (err != 0) {
        failed_ = true;
        errno_ = err;
        what_ = fmt::format("{}: write of {} bytes at offset {} failed", path_,
                            job.buf.size() - done, job.offset + done);
      } else if (free_.size() < kMaxQueued + 1) {
        free_.push_back(std::move(job.buf));
      }
      cv_.notify_all();
    }
  }

  int fd_;
  std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<std::vector<uint8_t>> free_;
  bool busy_ = false, stop_ = false, failed_ = false;
  int errno_ = 0;
  std::string what_;
  std::thread thread_;
};

// The output: a seekable sink over our file descriptor.
struct Sink {
  WriteState* state;
  BackgroundWriter* writer;
  std::vector<uint8_t> buf;
  uint64_t buf_start = 0;
  uint64_t pos = 0;
  uint64_t end = 0;
  zip_error_t error;

  void flush() {
    if (!buf.empty()) {
      const uint64_t at = buf_start;
      buf_start += buf.size();
      buf = writer->submit(std::move(buf), at);
      buf.reserve(kSinkBuffer);
    }
    check_interrupted(state->path);
  }
};

zip_int64_t sink_callback(void* userdata, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
  Sink& s = *static_cast<Sink*>(userdata);
  try {
    switch (cmd) {
      case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_WRITABLE;
      case ZIP_SOURCE_STAT:
        // note: "does not exist yet" makes zip_open_from_source start a new archive.
        zip_error_set(&s.error, ZIP_ER_READ, ENOENT);
        return -1;
      case ZIP_SOURCE_BEGIN_WRITE:
        s.pos = s.end = s.buf_start = 0;
        s.buf.clear();
        s.buf.reserve(kSinkBuffer);
        return 0;
      case ZIP_SOURCE_WRITE: {
        if (s.pos != s.buf_start + s.buf.size()) {
          s.flush();
          s.buf_start = s.pos;
        }
        const auto* p = static_cast<const uint8_t*>(data);
        s.buf.insert(s.buf.end(), p, p + len);
        s.pos += len;
        if (s.pos > s.end) s.end = s.pos;
        if (s.buf.size() >= kSinkBuffer) s.flush();
        return static_cast<zip_int64_t>(len);
      }
      case ZIP_SOURCE_SEEK_WRITE: {
        const zip_int64_t to = zip_source_seek_compute_offset(s.pos, s.end, data, len, &s.error);
        if (to < 0) return -1;
        s.flush();
        s.pos = s.buf_start = static_cast<uint64_t>(to);
        return 0;
      }
      case ZIP_SOURCE_TELL_WRITE:
        return static_cast<zip_int64_t>(s.pos);
      case ZIP_SOURCE_COMMIT_WRITE:
        s.flush();
        s.writer->drain();
        return 0;
      case ZIP_SOURCE_ROLLBACK_WRITE:
      case ZIP_SOURCE_REMOVE:
      case ZIP_SOURCE_FREE:
        return 0;
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&s.error, data, len);
      default:
        zip_error_set(&s.error, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  } catch (...) {
    if (!s.state->error) s.state->error = std::current_exception();
    zip_error_set(&s.error, ZIP_ER_WRITE, EIO);
    return -1;
  }
}

// One entry's data, read by libzip.
struct EntryCtx {
  WriteState* state;
  std::string name;
  EntrySource* source = nullptr;         // regular entries
  PackWriter::MakeLast* make = nullptr;  // the last entry
  std::unique_ptr<EntrySource> made;
  Xxh64 hash;
  uint64_t read_bytes = 0;
  bool recorded = false;
  zip_error_t error;

  EntrySource* src() {
    if (source == nullptr) {
      // note: libzip stats each source right before writing its entry, so
      // every other entry is complete by the time the last one is made.
      if (state->written.size() != state->regular_entries)
        fail("{}: internal error: manifest requested before all entries were written", state->path);
      if (!made) made = make_bytes_source((*make)(state->written));
      source = made.get();
    }
    return source;
  }
};

zip_int64_t entry_callback(void* userdata, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
  EntryCtx& e = *static_cast<EntryCtx*>(userdata);
  try {
    switch (cmd) {
      case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_READABLE;
      case ZIP_SOURCE_STAT: {
        auto* st = ZIP_SOURCE_GET_ARGS(zip_stat_t, data, len, &e.error);
        if (st == nullptr) return -1;
        zip_stat_init(st);
        st->valid = ZIP_STAT_SIZE | ZIP_STAT_MTIME;
        st->size = e.src()->size();
        st->mtime = kFixedMtime;
        return sizeof(zip_stat_t);
      }
      case ZIP_SOURCE_OPEN:
        e.src()->rewind();
        e.hash.reset();
        e.read_bytes = 0;
        return 0;
      case ZIP_SOURCE_READ: {
        check_interrupted(e.state->path);
        const size_t n = e.src()->read(static_cast<uint8_t*>(data), len);
        e.hash.update(data, n);
        e.read_bytes += n;
        if (e.make == nullptr) {
          WriteState& w = *e.state;
          w.data_done += n;
          if (w.progress && *w.progress && w.data_done >= w.next_report) {
            (*w.progress)(w.data_done, w.data_total);
            w.next_report = w.data_done + kProgressStep;
          }
        }
        if (n == 0) {
          if (e.read_bytes != e.src()->size())
            fail("{}: entry \"{}\": source produced {} bytes, expected {}", e.state->path, e.name,
                 e.read_bytes, e.src()->size());
        }
        return static_cast<zip_int64_t>(n);
      }
      case ZIP_SOURCE_CLOSE:
        if (!e.recorded && e.read_bytes == e.src()->size()) {
          e.state->written.push_back({e.name, e.read_bytes, e.hash.digest()});
          e.recorded = true;
        }
        return 0;
      case ZIP_SOURCE_FREE:
        return 0;
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&e.error, data, len);
      default:
        zip_error_set(&e.error, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  } catch (...) {
    if (!e.state->error) e.state->error = std::current_exception();
    zip_error_set(&e.error, ZIP_ER_READ, EIO);
    return -1;
  }
}

// Bytes libzip puts in a local header before the extra fields we add: the
// fixed part, the name, and a zip64 extra field when the size needs one
// (mirrors _zip_dirent_write of libzip 1.7 for STORED entries of known size).
uint64_t local_header_base(const std::string& name, uint64_t size) {
  uint64_t n = kLocalHeaderSize + name.size();
  if (size > 0xFFFFFFFFull)
    n += 4 + 16;
  else if (size == 0xFFFFFFFFull)
    n += 4;
  return n;
}

}  // namespace

std::unique_ptr<EntrySource> make_bytes_source(std::string bytes) {
  return std::make_unique<BytesSource>(std::move(bytes));
}

PackWriter::PackWriter(int fd, std::string display_path)
    : fd_(fd), path_(std::move(display_path)) {}

void PackWriter::add(std::string name, std::unique_ptr<EntrySource> source) {
  pending_.push_back({std::move(name), std::move(source)});
}

void PackWriter::set_last(std::string name, MakeLast make) {
  last_name_ = std::move(name);
  make_last_ = std::move(make);
}

void PackWriter::set_progress(std::function<void(uint64_t, uint64_t)> progress) {
  progress_ = std::move(progress);
}

std::vector<WrittenEntry> PackWriter::write() {
  if (!make_last_) fail("{}: internal error: no last entry (manifest) set", path_);
  for (const auto& p : pending_)
    for (unsigned char c : p.name)
      if (c < 0x20 || c >= 0x7F)
        fail("{}: entry name \"{}\" must be printable ASCII", path_, p.name);

  WriteState state;
  state.path = path_;
  state.progress = &progress_;
  state.written.reserve(pending_.size() + 1);
  state.regular_entries = pending_.size();
  for (const auto& p : pending_) state.data_total += p.source->size();

  BackgroundWriter bg(fd_, path_);
  Sink sink{&state, &bg, {}, 0, 0, 0, {}};
  zip_error_init(&sink.error);
  std::vector<std::unique_ptr<EntryCtx>> ctxs;

  zip_error_t err;
  zip_error_init(&err);
  zip_source_t* out = zip_source_function_create(sink_callback, &sink, &err);
  if (out == nullptr) fail("{}: libzip: {}", path_, zip_error_strerror(&err));
  zip_t* za = zip_open_from_source(out, ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (za == nullptr) {
    zip_source_free(out);
    const std::string msg = zip_error_strerror(&err);
    zip_error_fini(&err);
    fail("{}: libzip cannot start the archive: {}", path_, msg);
  }
  zip_error_fini(&err);

  auto abandon = [&](const std::string& what) {
    const std::string msg = zip_strerror(za);
    zip_discard(za);
    if (state.error) std::rethrow_exception(state.error);
    fail("{}: {}: {}", path_, what, msg);
  };

  uint64_t offset = 0;
  auto add_entry = [&](const std::string& name, uint64_t size, std::unique_ptr<EntryCtx> ctx) {
    zip_source_t* src = zip_source_function(za, entry_callback, ctx.get());
    if (src == nullptr) abandon("libzip cannot create a source for \"" + name + "\"");
    const zip_int64_t idx = zip_file_add(za, name.c_str(), src, ZIP_FL_ENC_GUESS);
    if (idx < 0) {
      zip_source_free(src);
      abandon("libzip cannot add entry \"" + name + "\"");
    }
    ctxs.push_back(std::move(ctx));
    const auto i = static_cast<zip_uint64_t>(idx);
    if (zip_set_file_compression(za, i, ZIP_CM_STORE, 0) != 0 ||
        zip_file_set_mtime(za, i, kFixedMtime, 0) != 0)
      abandon("libzip cannot set up entry \"" + name + "\"");
    const uint64_t base = offset + local_header_base(name, size);
    uint64_t pad = (kPackAlignment - base % kPackAlignment) % kPackAlignment;
    if (pad != 0 && pad < 4) pad += kPackAlignment;  // an extra field needs a 4-byte header
    if (pad != 0) {
      const std::vector<uint8_t> zeros(pad - 4, 0);
      if (zip_file_extra_field_set(za, i, kPaddingExtraId, ZIP_EXTRA_FIELD_NEW, zeros.data(),
                                   static_cast<zip_uint16_t>(zeros.size()), ZIP_FL_LOCAL) != 0)
        abandon("libzip cannot add the padding field to \"" + name + "\"");
    }
    offset = base + pad + size;
  };

  for (auto& p : pending_) {
    auto ctx = std::make_unique<EntryCtx>();
    ctx->state = &state;
    ctx->name = p.name;
    ctx->source = p.source.get();
    zip_error_init(&ctx->error);
    add_entry(p.name, p.source->size(), std::move(ctx));
  }
  {
    auto ctx = std::make_unique<EntryCtx>();
    ctx->state = &state;
    ctx->name = last_name_;
    ctx->make = &make_last_;
    zip_error_init(&ctx->error);
    // note: the last entry is made later; it is small (< 4 GiB), so its
    // local header has no zip64 field and its padding depends only on the
    // offset, which is known now.
    add_entry(last_name_, 0, std::move(ctx));
  }

  if (zip_close(za) != 0) abandon("writing the archive failed");
  if (state.error) std::rethrow_exception(state.error);
  if (state.written.size() != pending_.size() + 1)
    fail("{}: internal error: {} of {} entries were written", path_, state.written.size(),
         pending_.size() + 1);
  for (auto& c : ctxs) zip_error_fini(&c->error);
  zip_error_fini(&sink.error);
  return state.written;
}

}  // namespace qtk
