#include "core/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/interrupt.h"

namespace qtk {

namespace {

// ---- the SIGBUS handler's registry ----
// note: a signal handler can only read static storage, and only with
// async-signal-safe operations: a fixed array of slots, each published by an
// atomic state (lock-free), its message composed when it is registered.
constexpr int kFaultSlots = 1024;
enum SlotState : int { kFree = 0, kBusy = 1, kLive = 2 };

struct FaultSlot {
  std::atomic<int> state{kFree};
  uintptr_t begin = 0, end = 0;
  char* message = nullptr;  // malloc'ed, with its newline: the file is shorter now
  size_t message_size = 0;
  char* io_message = nullptr;  // malloc'ed, with its newline: the file's size is unchanged
  size_t io_message_size = 0;
  char* path = nullptr;  // malloc'ed, NUL-terminated
};

FaultSlot g_fault_slots[kFaultSlots];
std::once_flag g_bus_handler_once;
struct sigaction g_previous_bus;

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// note: async-signal-safe calls only (stat, write, unlink, sigaction, raise, _exit).
extern "C" void on_bus_error(int sig, siginfo_t* info, void* /*context*/) {
  // note: BUS_ADRERR is an access past the end of a mapped file; a memory
  // error (BUS_MCEERR_*) or an alignment fault is no file's doing.
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
    for (FaultSlot& s : g_fault_slots) {
      if (s.state.load(std::memory_order_acquire) != kLive || a < s.begin || a >= s.end) continue;
      // note: a page past the file's end now means it was cut; a page
      // within it is a read that failed (an I/O error: a failing disk or
      // network file system) or a file replaced under the same name.
      struct stat st {};
      const bool cut =
          ::stat(s.path, &st) != 0 || static_cast<uintptr_t>(st.st_size) <= a - s.begin;
      write_all(STDERR_FILENO, cut ? s.message : s.io_message,
                cut ? s.message_size : s.io_message_size);
      // The same files a second SIGINT/SIGTERM removes (the lock file, a
      // temporary output); partial results stay for --resume.
      emergency_unlink_now();
      ::_exit(1);
    }
  }
  // Not a registered mapping: as if this handler were not there. A fault
  // re-runs the access on return and faults again under the previous
  // disposition; a SIGBUS sent by kill is raised again.
  ::sigaction(SIGBUS, &g_previous_bus, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
}

void install_bus_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_bus_error;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, &g_previous_bus);
}

}  // namespace

int register_file_mapping(const void* begin, size_t bytes, const std::string& path) {
  if (begin == nullptr || bytes == 0) return -1;
  std::call_once(g_bus_handler_once, install_bus_handler);
  const std::string text =
      printable_message(fmt::format("{}: the file {} changed while it was being read (it was "
                                    "truncated or replaced in place); nothing further was written",
                                    program_invocation_short_name, path)) +
      "\n";
  const std::string io_text =
      printable_message(fmt::format("{}: cannot read the file {}: reading a page of it failed with "
                                    "its size unchanged (an I/O error, or the file was replaced "
                                    "under its name); nothing further was written",
                                    program_invocation_short_name, path)) +
      "\n";
  for (int i = 0; i < kFaultSlots; ++i) {
    FaultSlot& s = g_fault_slots[i];
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acquire)) continue;
    s.message = static_cast<char*>(std::malloc(text.size()));
    s.io_message = static_cast<char*>(std::malloc(io_text.size()));
    s.path = static_cast<char*>(std::malloc(path.size() + 1));
    if (s.message == nullptr || s.io_message == nullptr || s.path == nullptr) {
      std::free(s.message);
      std::free(s.io_message);
      std::free(s.path);
      s.message = s.io_message = s.path = nullptr;
      s.state.store(kFree, std::memory_order_release);
      return -1;
    }
    std::memcpy(s.message, text.data(), text.size());
    s.message_size = text.size();
    std::memcpy(s.io_message, io_text.data(), io_text.size());
    s.io_message_size = io_text.size();
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.begin = reinterpret_cast<uintptr_t>(begin);
    s.end = s.begin + bytes;
    s.state.store(kLive, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_file_mapping(int slot) {
  if (slot < 0 || slot >= kFaultSlots) return;
  FaultSlot& s = g_fault_slots[slot];
  s.state.store(kBusy, std::memory_order_release);
  std::free(s.message);
  std::free(s.io_message);
  std::free(s.path);
  s.message = s.io_message = s.path = nullptr;
  s.message_size = s.io_message_size = 0;
  s.begin = s.end = 0;
  s.state.store(kFree, std::memory_order_release);
}

const char* describe_file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // note: O_NONBLOCK: opening a FIFO would otherwise wait for a writer
  // (signals included, generate's restart); it is refused below. It changes
  // nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_errno(fmt::format("{}: cannot open", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno(fmt::format("{}: cannot stat", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: expected a regular file (it is mapped into memory), found {}", path,
         describe_file_type(st.st_mode));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno(fmt::format("{}: cannot map {} bytes", path, size_));
    }
    data_ = static_cast<const uint8_t*>(p);
    // note: whole pages: a read anywhere in the last page faults once the
    // file is cut before it.
    const long ps = ::sysconf(_SC_PAGESIZE);
    const size_t page = ps > 0 ? static_cast<size_t>(ps) : 4096;
    fault_slot_ = register_file_mapping(data_, (size_ + page - 1) / page * page, path);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fault_slot_(std::exchange(other.fault_slot_, -1)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fault_slot_ = std::exchange(other.fault_slot_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::reset() {
  // (unregistered first: the range may be reused by another mapping)
  unregister_file_mapping(std::exchange(fault_slot_, -1));
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace qtk
