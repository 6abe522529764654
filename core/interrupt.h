// SIGINT/SIGTERM/SIGHUP/SIGPIPE handling for `convert` and `generate`: the handler
// only records the signal; convert's writer and archive extractor poll it
// between chunks, generate between steps, and throw, so the normal
// unwinding removes the temporary pack and the extraction directory, or
// marks generate's partial run "interrupted". The program then re-raises the
// signal so its exit status says it was killed. A second signal ends the
// process at once: the registered files unlinked, one line on stderr
// ("PROG: stopped at once by a second SIGINT") unless stderr would block,
// and the process killed by that signal.
//
// A program blocked reading its input (a pipe, a FIFO, a terminal) waits in
// wait_for_input, which a signal wakes whichever thread it was delivered to
// and whether or not system calls restart (the handler writes to a pipe that
// wait_for_input polls beside the input).
//
// note: a signal handler can only reach static storage, so the state here is
// process-wide by necessity; InterruptScope installs and removes it.
#pragma once

#include <string>

namespace qtk {

class InterruptScope {
 public:
  enum class Syscalls { kInterrupted, kRestarted };
  // Installs the handlers and makes SIGXFSZ non-fatal, so that writing past
  // `ulimit -f` fails with EFBIG (and is reported) instead of killing us.
  // A signal the process ignores stays ignored (nohup's SIGHUP, SIGINT of a
  // shell's background job). kInterrupted: a blocking call returns EINTR at
  // the signal (convert's reads and writes stop promptly); kRestarted: calls
  // restart (generate, whose libraries do not all retry on EINTR).
  explicit InterruptScope(Syscalls syscalls = Syscalls::kInterrupted);
  // Restores the previous dispositions.
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The signal number received since the scope was installed, or 0.
int interrupt_signal();

// "SIGTERM" for SIGTERM; the number for a signal without a name.
std::string signal_name(int sig);

// Throws qtk::Error("... interrupted by SIGINT") when a signal arrived.
void check_interrupted(const std::string& what);

// Waits until `fd` has something to read (data, its end, an error) and
// returns true, or returns false as soon as a signal is recorded (also one
// recorded before the call). Without an InterruptScope it only waits for `fd`.
bool wait_for_input(int fd);

// The same for writing: waits until `fd` takes at least PIPE_BUF bytes
// without blocking (poll POLLOUT: a pipe with a free buffer, any regular
// file or terminal) or a signal is recorded; false when a signal was.
bool wait_for_output(int fd);

// Files a second signal (the user pressing Ctrl-C again while we clean up)
// or a fault in a file mapping (core/mapped_file.h) unlinks before the
// process exits at once. At most 8 paths; longer paths than PATH_MAX are not
// registered; a path registered twice takes one slot.
void register_emergency_unlink(const std::string& path);
void unregister_emergency_unlink(const std::string& path);

// Unlinks the registered files now. Async-signal-safe: for a signal handler
// that ends the process at once.
void emergency_unlink_now();

// With the default disposition restored, raises the recorded signal (if any).
void reraise_interrupt();

}  // namespace qtk
