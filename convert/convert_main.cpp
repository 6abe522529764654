// convert INPUT OUT.pack [--dtype keep|bf16|f16|f32] [--force] [--progress]
#include <fmt/format.h>
#include <cxxopts.hpp>

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include "convert/atomic_output.h"
#include "convert/convert.h"
#include "convert/stale_temporaries.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/stdout_check.h"
#include "loaders/cli_args.h"

namespace {

// One line on stderr, whatever a library put in the message.
void print_error(const char* what) {
  std::string line = std::string("convert: ") + what;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // note: before anything is opened: with stderr closed (`2>&-`) the first
  // file opened, the temporary pack, would get fd 2 and the --progress
  // lines would be written into it.
  qtk::open_closed_standard_fds({0, 1, 2});
  int status = 0;
  std::string wrote;  // the last --progress line, printed once the scope is gone
  {
    qtk::InterruptScope interrupts;
    try {
      cxxopts::Options options(
          "convert",
          "Convert a Qwen3 / Qwen3.5 Hugging Face checkpoint into one .pack file.\nExit status: "
          "0 OUT.pack was written; 1 it was not (one line on stderr says why; an existing OUT.pack "
          "is left as it was, and no temporary file remains), except when only the final fsync "
          "of OUT's directory failed: then the line says the pack is in place; on SIGINT or "
          "SIGTERM it removes its temporary files and ends by that signal.");
      options.positional_help("INPUT OUT.pack");
      options.add_options()("dtype", "matrix dtype: keep, bf16, f16 or f32",
                            cxxopts::value<std::string>()->default_value("keep"))(
          "force", "replace OUT.pack if it exists")("progress", "print progress on stderr")(
          "max-unpacked-bytes", "archive input: cap on unpacked bytes (K/M/G/T suffixes)",
          cxxopts::value<std::string>()->default_value("256G"))(
          "max-entries", "archive input: cap on the number of entries",
          cxxopts::value<std::string>()->default_value("100000"))(
          "input", "checkpoint directory or .tar/.tar.gz/.tar.zst/.zip",
          cxxopts::value<std::string>())("output", "the .pack to write",
                                         cxxopts::value<std::string>())("h,help", "show this help");
      options.parse_positional({"input", "output"});
      const auto args = qtk::cli::parse_flags(options, argc, argv);
      if (args.count("help")) {
        // note: help lost to a full disk or /dev/full is an error, not exit 0.
        qtk::write_stdout(options.help() + "\n");
        qtk::finish_stdout();
        return 0;
      }
      if (!args.count("input") || !args.count("output"))
        qtk::fail(
            "usage: convert INPUT OUT.pack [--dtype keep|bf16|f16|f32] [--force] [--progress] "
            "[--max-unpacked-bytes N] [--max-entries N]");
      qtk::cli::no_extra_arguments(args);
      qtk::ConvertOptions opt;
      opt.input = args["input"].as<std::string>();
      opt.output = args["output"].as<std::string>();
      opt.matrix_dtype = qtk::parse_matrix_dtype(args["dtype"].as<std::string>());
      opt.force = args.count("force") > 0;
      opt.limits.max_bytes = qtk::cli::parse_size_flag(
          "--max-unpacked-bytes", args["max-unpacked-bytes"].as<std::string>());
      opt.limits.max_entries =
          qtk::cli::parse_size_flag("--max-entries", args["max-entries"].as<std::string>());
      if (args.count("progress"))
        opt.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
      // note: a convert killed with SIGKILL cannot remove its temporary pack
      // or extraction directory; the next convert into the directory does.
      for (const std::string& line : qtk::remove_stale_temporaries(qtk::directory_of(opt.output)))
        std::fprintf(stderr, "convert: %s\n", line.c_str());
      const auto r = qtk::convert_checkpoint(opt);
      if (args.count("progress"))
        wrote = fmt::format("convert: wrote {}: {} tensors, {:.1f} MB", opt.output, r.tensors,
                            static_cast<double>(r.pack_bytes) / 1e6);
    } catch (const qtk::Error& e) {
      print_error(e.what());
      status = 1;
    } catch (const cxxopts::exceptions::exception& e) {
      print_error(e.what());
      status = 1;
    } catch (const std::exception& e) {
      print_error((std::string("internal error: ") + e.what()).c_str());
      status = 1;
    }
  }
  // (a signal that came during the run, even one that came after the pack
  // was renamed into place, ends the process as it did the run)
  qtk::reraise_interrupt();
  if (!wrote.empty()) {
    // note: the pack is in place, so a stderr reader that is gone by now
    // (`convert --progress 2>&1 | head -1`) costs this line only: with
    // SIGPIPE ignored the write fails with EPIPE, and the exit status stays
    // 0 (written) instead of death by SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    std::fprintf(stderr, "%s\n", wrote.c_str());
  }
  return status;
}
