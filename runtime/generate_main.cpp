// generate --model X.pack --batch prompts.jsonl --out results.jsonl [options]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/stdout_check.h"
#include "core/tuning.h"
#include "loaders/cli_args.h"
#include "runtime/backend/backend.h"
#include "runtime/data_parallel.h"
#include "runtime/generate.h"

// Exit statuses: 0 every line has a result, 1 the run failed (one line on
// stderr), 3 the run completed but some lines got an {"id", "error"} line.
constexpr int kSomeLinesFailed = 3;

namespace {

// generate's flags and their help.
cxxopts::Options generate_flags() {
  cxxopts::Options opts("generate",
                        "Batched greedy generation from a .pack file.\nExit status: 0 every line "
                        "has a result, 1 the run failed, 3 some lines got an error line.");
  opts.add_options()("model", "the .pack file (a regular file: it is mapped into memory)",
                     cxxopts::value<std::string>())(
      "batch", "prompts, one JSON object per line (- reads stdin; a pipe or FIFO works too)",
      cxxopts::value<std::string>())(
      "out", "results JSONL (run header: OUT.meta.json); - writes them to stdout",
      cxxopts::value<std::string>())(
      "meta",
      "the run header's path (default OUT.meta.json; with --out -, no header unless given, and "
      "then written only when the run completes)",
      cxxopts::value<std::string>())(
      "device", "cpu or cuda (builds with QTK_CUDA, on a machine with an NVIDIA GPU)",
      cxxopts::value<std::string>()->default_value("cpu"))(
      "precision", "f32 or bf16 (default: f32 on cpu, its only precision; bf16 on cuda)",
      cxxopts::value<std::string>())("threads",
                                     "worker threads (default, and 0: all CPUs available)",
                                     cxxopts::value<std::string>())(
      "max-tokens",
      "tokens to generate per prompt (default, and 0: the pack's max_new_tokens, else 256); a "
      "line's max_tokens overrides it; a prompt plus its output stops at the model's context "
      "(max_position_embeddings, shown by inspect)",
      cxxopts::value<std::string>())(
      "ignore-eos",
      "do not stop at the model's EOS tokens, on every line (a line's "
      "\"ignore_eos\": true does it for that line; false does not "
      "undo the flag)")("max-num-seqs", "most sequences running at once",
                        cxxopts::value<std::string>()->default_value("64"))(
      "max-batched-tokens",
      "most tokens computed per step (prefill chunks + decode); Qwen3.5 on cuda with bf16 never "
      "splits a prompt's full 64-token chunks, so a budget below 64 is raised to 64 for them",
      cxxopts::value<std::string>()->default_value("512"))(
      "block-size", "tokens per KV-cache block",
      cxxopts::value<std::string>()->default_value("16"))(
      "kv-cache-blocks",
      "KV-cache blocks (default, and 0: what the requests need at once, within 4 GiB and, on the "
      "CPU, half the memory available, never less than the longest request needs)",
      cxxopts::value<std::string>())("margins",
                                     "write top1_margin (logit(top1) - logit(top2)) per step")(
      "logprobs",
      "write the K most likely tokens per step with their log-probabilities (0: off, up to 20; "
      "--device cpu)",
      cxxopts::value<std::string>()->default_value("0"))("progress",
                                                         "show a progress line on stderr")(
      "no-progress", "never show the progress line (default: shown when stderr is a terminal)")(
      "show", "print each prompt and its continuation to stdout")(
      "resume", "continue an interrupted run (OUT.partial, or OUT) into --out")(
      "force",
      "replace an existing --out (it stays until the new run completes); without it an --out or "
      "header that appears while the run works is never replaced")(
      "allow-unknown-fields",
      "ignore request fields generate does not know (default: such a line gets an error)")(
      "no-verify", "skip checking every tensor's XXH64 checksum at load")(
      "shard",
      "run shard K of N (0-based) of the batch: the lines whose position modulo N is K; "
      "`auto` takes K and N from a Slurm job array or a Kubernetes Indexed Job. Implies "
      "--resume; a complete shard is not redone. Join the shards with `merge`.",
      cxxopts::value<std::string>())(
      "devices",
      "run on these devices at once: LIST = device ordinals such as 0,1,3, or all (every CUDA "
      "device). Each device runs one worker process of generate over its shard of the batch "
      "(--shard k/M, into OUT.part-k-of-M; with --shard K/N the sub-shards K+N*k of N*M) and "
      "the parts are merged into OUT, byte-identical to a one-device run, and removed. On "
      "cuda a worker sees only its GPU (CUDA_VISIBLE_DEVICES); on the CPU, --devices runs one "
      "worker process per entry with --threads/M threads each (useful to test the fan-out and "
      "on multi-socket machines; `all` is refused). Workers show no progress line; with "
      "--progress a line is printed as each worker ends. A failed or interrupted worker leaves "
      "no OUT: its part stays, and the same command with --resume finishes the run. With two or "
      "more devices, not with --out -, --batch - (or a pipe) or --show; with --tune-only every "
      "device tunes. A worker whose parent dies (even by SIGKILL) gets SIGTERM and stops.",
      cxxopts::value<std::string>())(
      "plan-cache",
      "with --device cuda: the GEMM plan cache file, or 'off' (default: "
      "$QTK_PLAN_CACHE if set, else a file per GPU and model under "
      "$XDG_CACHE_HOME/qtk/plans or ~/.cache/qtk/plans)",
      cxxopts::value<std::string>())(
      "tensor-parallel",
      "split the model over N ranks (heads and widths / N, one all-reduce per block in a fixed "
      "rank order): with --device cuda one rank per GPU (GPUs 0..N-1 of CUDA_VISIBLE_DEVICES), "
      "for models larger than one GPU; with --device cpu N ranks emulated in one process (a "
      "check of the split, not a speed-up). A TP-N result is compared with a TP-1 result by the "
      "near-tie rule (the partial sums are added in another order)",
      cxxopts::value<std::string>()->default_value("1"))(
      "tune-only",
      "with --device cuda: tune the GEMM plans of the model, write the plan cache and exit "
      "(no --batch or --out)")(
      "chat-template",
      "Jinja chat template for \"messages\" lines (default: the pack's chat_template.jinja or "
      "tokenizer_config.json's chat_template); a regular file",
      cxxopts::value<std::string>())("h,help", "show this help");
  return opts;
}

// The flags checked and turned into GenerateOptions.
qtk::GenerateOptions read_flags(const cxxopts::Options& opts, const cxxopts::ParseResult& args) {
  qtk::GenerateOptions o;
  o.tune_only = args.count("tune-only") > 0;
  for (const char* req : {"model", "batch", "out"})
    if (!o.tune_only || std::string_view(req) == "model") qtk::cli::require_flag(opts, args, req);
  qtk::cli::no_extra_arguments(args);
  // note: the upper bounds are far above any useful setting; past them the
  // run would overflow its sizes or exhaust memory instead of failing here.
  // note: flags whose help says what their absence means have no cxxopts
  // default (its "(default: 0)" beside ours read as a contradiction); absent,
  // they read as this empty or zero value.
  auto text = [&args](const std::string& name, const char* absent = "") {
    return args.count(name) || args[name].has_default() ? args[name].as<std::string>()
                                                        : std::string(absent);
  };
  auto int_flag = [&args, &text](const std::string& name, int64_t min, int64_t max,
                                 const char* expected) {
    return qtk::cli::parse_int_flag("--" + name, text(name, "0"), min, max, expected);
  };
  constexpr const char* kPositive = "a positive integer";
  o.model = args["model"].as<std::string>();
  if (args.count("batch")) o.batch = args["batch"].as<std::string>();
  if (args.count("out")) o.out = args["out"].as<std::string>();
  o.meta = text("meta");
  o.device =
      qtk::cli::parse_choice_flag("--device", args["device"].as<std::string>(), {"cpu", "cuda"});
  o.precision = text("precision");
  if (!o.precision.empty())  // "" = the device's default
    qtk::cli::parse_choice_flag("--precision", o.precision, {"f32", "bf16"});
  o.threads =
      static_cast<int>(int_flag("threads", 0, 1024, "0 (all CPUs) or a positive thread count"));
  o.max_tokens = int_flag("max-tokens", 0, std::numeric_limits<int64_t>::max(),
                          "0 (the pack's default) or a positive integer");
  o.ignore_eos = args.count("ignore-eos") > 0;
  o.max_num_seqs = int_flag("max-num-seqs", 1, 65536, kPositive);
  o.max_batched_tokens = int_flag("max-batched-tokens", 1, 1 << 20, kPositive);
  o.block_size = int_flag("block-size", 1, 65536, kPositive);
  o.kv_cache_blocks = int_flag("kv-cache-blocks", 0, std::numeric_limits<int32_t>::max(),
                               "0 (sized from the prompts) or a positive integer");
  o.margins = args.count("margins") > 0;
  o.logprobs =
      static_cast<int>(int_flag("logprobs", 0, qtk::kMaxLogprobs, "0 (off) or a token count"));
  o.progress = args.count("progress") > 0;
  o.no_progress = args.count("no-progress") > 0;
  o.show = args.count("show") > 0;
  o.resume = args.count("resume") > 0;
  if (args.count("shard")) {
    o.shard = args["shard"].as<std::string>();
    // note: an empty value (a job script's unset variable) would otherwise
    // read as no --shard at all: every task would run the whole batch.
    if (o.shard.empty()) qtk::fail("--shard: expected K/N or auto, found an empty value");
  }
  o.tensor_parallel =
      static_cast<int>(int_flag("tensor-parallel", 1, 64, "a rank count from 1 to 64"));
  o.force = args.count("force") > 0;
  o.allow_unknown_fields = args.count("allow-unknown-fields") > 0;
  o.verify = args.count("no-verify") == 0;
  o.chat_template = text("chat-template");
  // note: an empty value (a job script's unset variable) would otherwise
  // read as the flag not given: --chat-template "" rendered with the pack's
  // template instead.
  for (const auto& [name, value] : {std::pair<const char*, const std::string&>{"model", o.model},
                                    {"batch", o.batch},
                                    {"meta", o.meta},
                                    {"chat-template", o.chat_template}})
    if (args.count(name) && value.empty())
      qtk::fail("--{}: expected a file name, found an empty value", name);
  return o;
}

// The flags as given, for the workers of a --devices run: {name, argument}
// in command-line order, --devices left out.
std::vector<std::pair<std::string, std::string>> worker_flags(const cxxopts::Options& opts,
                                                              const cxxopts::ParseResult& args) {
  std::set<std::string> switches;
  for (const std::string& group : opts.groups())
    for (const cxxopts::HelpOptionDetails& d : opts.group_help(group).options)
      if (d.is_boolean)
        for (const std::string& l : d.l) switches.insert(l);
  std::vector<std::pair<std::string, std::string>> flags;
  for (const cxxopts::KeyValue& kv : args.arguments()) {
    if (kv.key() == "devices") continue;
    // note: a switch takes no value (loaders/cli_args.h refuses --switch=x).
    flags.emplace_back(
        kv.key(), switches.count(kv.key()) ? "--" + kv.key() : "--" + kv.key() + "=" + kv.value());
  }
  return flags;
}

// The QTK_* switches, read and checked once for the whole run.
void set_run_tuning(const cxxopts::ParseResult& args) {
  // note: QTK_PLAN_CACHE is --plan-cache's default (a whole test suite or
  // benchmark can run with the cache off or in a scratch file); the value
  // used is written to the run header with the other switches.
  qtk::Tuning tuning = qtk::Tuning::from_environment();
  if (const std::string flag = args.count("plan-cache") ? args["plan-cache"].as<std::string>() : "";
      !flag.empty())
    tuning.plan_cache = flag;
  qtk::set_tuning(tuning);
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  try {
    cxxopts::Options opts = generate_flags();
    auto args = qtk::cli::parse_flags(opts, argc, argv);
    if (args.count("help")) {
      qtk::write_stdout(fmt::format("{}\n{}", opts.help(), qtk::tuning_help()));
      qtk::finish_stdout();
      return 0;
    }
    const qtk::GenerateOptions o = read_flags(opts, args);
    set_run_tuning(args);
    if (args.count("devices")) {
      qtk::DataParallelJob job;
      job.options = o;
      job.devices = qtk::parse_devices(args["devices"].as<std::string>(), o.device,
                                       [] { return qtk::cuda_device_count(); });
      job.flags = worker_flags(opts, args);
      return qtk::run_data_parallel(job);
    }
    const qtk::GenerateSummary s = qtk::run_generate(o);
    if (o.show) {
      try {
        qtk::finish_stdout();
      } catch (const qtk::Error& e) {
        std::fprintf(stderr, "generate: %s (--show); the results in %s are complete\n", e.what(),
                     o.out.c_str());
        return 1;
      }
    }
    if (o.tune_only) return 0;
    std::fprintf(stderr, "%s\n", qtk::summary_line(s).c_str());
    // note: 3, not 0, when any line got an error line: a golden file with
    // failed lines must not pass a script's `&&` as a complete one.
    return s.failed_lines > 0 ? kSomeLinesFailed : 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "generate: out of memory (std::bad_alloc); if a large --kv-cache-blocks, "
                 "--max-batched-tokens or --max-num-seqs was given, lower it\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // note: over a file-size limit (ulimit -f) the kernel would kill us with
  // SIGXFSZ mid-line; ignored, the write fails with EFBIG and is reported as
  // one error line, leaving only complete result lines for --resume.
  qtk::ignore_file_size_signal();
  const int status = run(argc, argv);
  // A --devices run stopped by a signal (forwarded to its workers) ends
  // with that signal, as a plain run killed by it does.
  qtk::reraise_interrupt();
  return status;
}
