// SIGINT/SIGTERM/SIGHUP handling for `convert`: the handler only records the
// signal; the writer and the archive extractor poll interrupted() between
// chunks and throw, so the normal unwinding removes the temporary pack and
// the extraction directory. The program then re-raises the signal so its
// exit status says it was killed.
//
// note: a signal handler can only reach static storage, so the state here is
// process-wide by necessity; InterruptScope installs and removes it.
#pragma once

#include <string>

namespace qtk {

class InterruptScope {
 public:
  // Installs the handlers and makes SIGXFSZ non-fatal, so that writing past
  // `ulimit -f` fails with EFBIG (and is reported) instead of killing us.
  InterruptScope();
  // Restores the previous dispositions.
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// The signal number received since the scope was installed, or 0.
int interrupt_signal();

// Throws qtk::Error("... interrupted by SIGINT") when a signal arrived.
void check_interrupted(const std::string& what);

// Files a second signal (the user pressing Ctrl-C again while we clean up)
// unlinks before the process exits at once. At most 4 paths; longer paths
// than PATH_MAX are not registered.
void register_emergency_unlink(const std::string& path);
void unregister_emergency_unlink(const std::string& path);

// With the default disposition restored, raises the recorded signal (if any).
void reraise_interrupt();

}  // namespace qtk
