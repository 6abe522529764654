#include "core/interrupt.h"

#include <limits.h>
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
constexpr int kEmergencySlots = 4;

volatile sig_atomic_t g_signal = 0;
char g_emergency[kEmergencySlots][PATH_MAX];
volatile sig_atomic_t g_emergency_used[kEmergencySlots] = {};

struct sigaction g_saved[kNumSignals];
bool g_installed[kNumSignals] = {};
struct sigaction g_saved_xfsz;

extern "C" void on_signal(int sig) {
  if (g_signal != 0) {
    // (each further write to the closed pipe raises SIGPIPE again: not a
    // second request to stop)
    if (sig == SIGPIPE) return;
    // Second signal: remove what we can with async-signal-safe calls and go.
    for (int i = 0; i < kEmergencySlots; ++i)
      if (g_emergency_used[i]) ::unlink(g_emergency[i]);
    ::_exit(128 + sig);
  }
  g_signal = sig;
}

}  // namespace

InterruptScope::InterruptScope(Syscalls syscalls) {
  g_signal = 0;
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

void register_emergency_unlink(const std::string& path) {
  if (path.size() >= PATH_MAX) return;
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

void reraise_interrupt() {
  const int sig = g_signal;
  if (sig == 0) return;
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace qtk
