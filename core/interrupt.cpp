#include "core/interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <csignal>

#include "core/error.h"

namespace qtk {

namespace {

// note: SIGPIPE too: a reader that goes away (`convert --progress 2>&1 |
// head`) ended the process at once, leaving its temporary pack behind.
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
constexpr int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);
constexpr int kEmergencySlots = 8;

volatile sig_atomic_t g_signal = 0;
char g_emergency[kEmergencySlots][PATH_MAX];
volatile sig_atomic_t g_emergency_used[kEmergencySlots] = {};
// The pipe the handler wakes wait_for_input with (-1: no scope installed).
volatile sig_atomic_t g_wake_read = -1;
volatile sig_atomic_t g_wake_write = -1;

struct sigaction g_saved[kNumSignals];
bool g_installed[kNumSignals] = {};
struct sigaction g_saved_xfsz;

// "PROG: stopped at once by a second SIGINT" on stderr, with
// async-signal-safe calls only, unless stderr is not ready for it.
void say_stopped_at_once(int sig) {
  struct pollfd p {};
  p.fd = 2;
  p.events = POLLOUT;
  if (::poll(&p, 1, 0) != 1 || (p.revents & POLLOUT) == 0) return;
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  char line[160];
  size_t n = 0;
  for (const char* part : {static_cast<const char*>(program_invocation_short_name),
                           ": stopped at once by a second ", name, "\n"})
    for (; *part != '\0' && n < sizeof(line); ++part) line[n++] = *part;
  [[maybe_unused]] const ssize_t w = ::write(2, line, n);
}

extern "C" void on_signal(int sig) {
  if (g_signal != 0) {
    // (each further write to the closed pipe raises SIGPIPE again: not a
    // second request to stop)
    if (sig == SIGPIPE) return;
    // Second signal: remove what we can with async-signal-safe calls, say
    // so, and end by the signal itself.
    // note: by the signal, not exit(128 + sig): a shell loop around the
    // program stops only when its child was killed by SIGINT. The line is
    // skipped when stderr would block (a reader that stopped reading is
    // what a second signal often answers); the run header is left as it
    // was ("running": --resume accepts it).
    emergency_unlink_now();
    say_stopped_at_once(sig);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    sigset_t self;
    sigemptyset(&self);
    sigaddset(&self, sig);
    sigprocmask(SIG_UNBLOCK, &self, nullptr);
    ::kill(::getpid(), sig);
    ::_exit(128 + sig);
  }
  g_signal = sig;
  // note: after g_signal is set, so that a woken wait_for_input sees it.
  const int wake = g_wake_write;
  if (wake >= 0) {
    const int saved_errno = errno;
    const char byte = 0;
    // (a full pipe already wakes the reader: the result does not matter)
    [[maybe_unused]] const ssize_t n = ::write(wake, &byte, 1);
    errno = saved_errno;
  }
}

}  // namespace

InterruptScope::InterruptScope(Syscalls syscalls) {
  g_signal = 0;
  // note: non-blocking, so that the handler never blocks on a full pipe.
  int wake[2];
  if (g_wake_read < 0 && ::pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
    g_wake_read = wake[0];
    g_wake_write = wake[1];
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // note: without SA_RESTART a blocked read/write returns EINTR promptly.
  sa.sa_flags = syscalls == Syscalls::kRestarted ? SA_RESTART : 0;
  for (int i = 0; i < kNumSignals; ++i) {
    struct sigaction cur {};
    g_installed[i] = sigaction(kSignals[i], nullptr, &cur) == 0 && cur.sa_handler != SIG_IGN &&
                     sigaction(kSignals[i], &sa, &g_saved[i]) == 0;
  }
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGXFSZ, &ign, &g_saved_xfsz);
}

InterruptScope::~InterruptScope() {
  for (int i = 0; i < kNumSignals; ++i)
    if (g_installed[i]) sigaction(kSignals[i], &g_saved[i], nullptr);
  sigaction(SIGXFSZ, &g_saved_xfsz, nullptr);
  // (after the handlers are gone: none writes to the pipe any more)
  const int wake_read = g_wake_read, wake_write = g_wake_write;
  g_wake_read = -1;
  g_wake_write = -1;
  if (wake_read >= 0) ::close(wake_read);
  if (wake_write >= 0) ::close(wake_write);
}

int interrupt_signal() { return g_signal; }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
}

void check_interrupted(const std::string& what) {
  const int sig = g_signal;
  if (sig == 0) return;
  fail("{}: interrupted by {}", what, signal_name(sig));
}

namespace {

// wait_for_input and wait_for_output: poll `fd` for `events` beside the
// handler's wake pipe.
bool wait_for(int fd, short events) {
  while (g_signal == 0) {
    const int wake = g_wake_read;
    struct pollfd p[2] = {{fd, events, 0}, {wake, POLLIN, 0}};
    // note: poll is never restarted after a handler (SA_RESTART or not), and
    // the pipe wakes it also when the signal went to another thread.
    const int n = ::poll(p, wake >= 0 ? 2 : 1, -1);
    if (g_signal != 0) return false;
    if (n < 0 && errno != EINTR) return true;  // the read that follows reports it
    if (n > 0 && p[0].revents != 0) return true;
    if (n > 0 && wake >= 0 && p[1].revents != 0) {
      // (a byte without a signal recorded: a scope's leftover; drained)
      char buf[64];
      while (::read(wake, buf, sizeof(buf)) > 0) {
      }
    }
  }
  return false;
}

}  // namespace

bool wait_for_input(int fd) { return wait_for(fd, POLLIN); }

bool wait_for_output(int fd) { return wait_for(fd, POLLOUT); }

void register_emergency_unlink(const std::string& path) {
  if (path.size() >= PATH_MAX) return;
  for (int i = 0; i < kEmergencySlots; ++i)
    if (g_emergency_used[i] && path == g_emergency[i]) return;
  for (int i = 0; i < kEmergencySlots; ++i) {
    if (!g_emergency_used[i]) {
      memcpy(g_emergency[i], path.c_str(), path.size() + 1);
      g_emergency_used[i] = 1;
      return;
    }
  }
}

void unregister_emergency_unlink(const std::string& path) {
  for (int i = 0; i < kEmergencySlots; ++i)
    if (g_emergency_used[i] && path == g_emergency[i]) g_emergency_used[i] = 0;
}

void emergency_unlink_now() {
  for (int i = 0; i < kEmergencySlots; ++i)
    if (g_emergency_used[i]) ::unlink(g_emergency[i]);
}

void reraise_interrupt() {
  const int sig = g_signal;
  if (sig == 0) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace qtk
