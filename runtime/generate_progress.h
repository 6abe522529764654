// generate's --progress line: lines done, token rates and an ETA computed
// from tokens (prompt tokens to prefill plus tokens to generate), not from
// finished lines, which arrive in bursts and say little about long prompts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "runtime/scheduler.h"

namespace qtk {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;

  // `total_lines` lines to write; `work_tokens`: the most tokens the run can
  // process (each runnable prompt plus its generation budget, capped by the
  // context); finished() lowers it when a sequence stops early.
  Progress(bool on, int64_t total_lines, int64_t work_tokens)
      : on_(on), total_(total_lines), work_(work_tokens), start_(Clock::now()), last_(start_) {}
  // note: a run that ends by an exception (an error, a signal) leaves the
  // line it drew open; its message must start on a line of its own.
  ~Progress() {
    if (open_) std::fputc('\n', stderr);
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A sequence stopped `unused` tokens before its budget (a stop token).
  void finished_early(int64_t unused) { work_ -= unused; }

  void update(int64_t done_lines, const SchedulerStats& st, bool final) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!final && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double sec = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const int64_t done_tokens = st.prompt_tokens + st.generated_tokens;
    // note: rate of all tokens so far times the tokens left; prefill tokens
    // are cheaper than decode ones, so early in a prefill-heavy run the ETA
    // is low, then settles as the mix is seen.
    const std::string eta =
        done_tokens > 0
            ? fmt::format("{:.0f}s",
                          sec * static_cast<double>(std::max<int64_t>(0, work_ - done_tokens)) /
                              static_cast<double>(done_tokens))
            : std::string("?");
    std::fprintf(stderr,
                 "\rgenerate: %lld/%lld done | %lld/%lld tokens | prompt %.0f tok/s | gen %.0f "
                 "tok/s | ETA %s   %s",
                 static_cast<long long>(done_lines), static_cast<long long>(total_),
                 static_cast<long long>(done_tokens), static_cast<long long>(work_),
                 static_cast<double>(st.prompt_tokens) / sec,
                 static_cast<double>(st.generated_tokens) / sec, eta.c_str(), final ? "\n" : "");
    std::fflush(stderr);
    open_ = !final;
  }

 private:
  bool on_;
  bool open_ = false;  // a progress line is drawn and not yet ended
  int64_t total_, work_;
  Clock::time_point start_, last_;
};

}  // namespace qtk
