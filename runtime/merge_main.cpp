// merge OUT.jsonl SHARD.jsonl... : joins the results of `generate --shard K/N`
// tasks into the file one `generate` run over the whole batch writes.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/plural.h"
#include "core/stdout_check.h"
#include "loaders/cli_args.h"
#include "runtime/shard.h"

namespace {

int run(int argc, char** argv) {
  try {
    // note: SIGINT, SIGTERM and SIGHUP (and SIGPIPE) are recorded and acted
    // on before anything is moved into place: the unwinding removes the
    // staging and temporary files and OUT.lock, and main then ends the
    // process by that signal. A signal the process was started ignoring
    // (nohup's SIGHUP) stays ignored; a second one ends it at once, after
    // unlinking those files.
    qtk::InterruptScope interrupts(qtk::InterruptScope::Syscalls::kRestarted);
    cxxopts::Options opts(
        "merge",
        "Join the results files of `generate --shard K/N` tasks (each with its .meta.json next "
        "to it) into OUT.jsonl, byte-identical to one generate run over the whole batch. "
        "Checks that every shard 0..N-1 is present once, complete, and of the same pack, "
        "prompts file and settings. Exit status: 0, 1 on a refusal (nothing written), 3 when "
        "OUT holds error lines (as generate's). SIGINT, SIGTERM or SIGHUP before OUT is moved "
        "into place stop it with nothing written (it then ends by that signal).");
    opts.positional_help("OUT.jsonl SHARD.jsonl...");
    opts.add_options()("force", "replace an existing OUT.jsonl")("h,help", "show this help")(
        "files", "OUT.jsonl then the shard results", cxxopts::value<std::vector<std::string>>());
    opts.parse_positional({"files"});
    const auto args = qtk::cli::parse_flags(opts, argc, argv);
    if (args.count("help")) {
      // note: help lost to a full disk or /dev/full is an error, not exit 0.
      qtk::write_stdout(opts.help());
      qtk::finish_stdout();
      return 0;
    }
    const auto files = args.count("files") ? args["files"].as<std::vector<std::string>>()
                                           : std::vector<std::string>{};
    if (files.size() < 2) qtk::fail("expected OUT.jsonl and at least one SHARD.jsonl (see --help)");
    qtk::MergeOptions o;
    o.out = files[0];
    o.shards.assign(files.begin() + 1, files.end());
    o.force = args.count("force") > 0;
    const qtk::MergeResult r = qtk::run_merge(o);
    std::fprintf(stderr, "merge: %s -> %s (%s, %s)\n",
                 qtk::count_of(static_cast<int64_t>(o.shards.size()), "shard").c_str(),
                 o.out.c_str(), qtk::count_of(r.lines, "line").c_str(),
                 qtk::count_of(r.error_lines, "error line").c_str());
    // note: generate's exit status: 3 when some prompt got an error line.
    return r.error_lines > 0 ? 3 : 0;
  } catch (const std::exception& e) {
    // note: one line prefixed with the program's name, as generate's,
    // convert's and compare's messages are.
    std::fprintf(stderr, "merge: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // note: over a file-size limit (ulimit -f) the kernel would end merge with
  // SIGXFSZ half-way through a file; ignored, the write fails with EFBIG
  // and is reported like a full disk, and OUT is left as it was.
  qtk::ignore_file_size_signal();
  const int status = run(argc, argv);
  // A merge stopped by a signal ends with that signal, as generate does.
  qtk::reraise_interrupt();
  return status;
}
