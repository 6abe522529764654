// generate --model X.pack --batch prompts.jsonl --out results.jsonl [options]
#include <csignal>
#include <cstdio>
#include <string>

#include <cxxopts.hpp>
#include <fmt/format.h>

#include "loaders/error.h"
#include "runtime/generate.h"

int main(int argc, char** argv) {
  // note: over a file-size limit (ulimit -f) the kernel would kill us with
  // SIGXFSZ mid-line; ignored, the write fails with EFBIG and is reported as
  // one error line, leaving only complete result lines for --resume.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    cxxopts::Options opts("generate", "Batched greedy generation from a .pack file.");
    qtk::GenerateOptions o;
    opts.add_options()("model", "the .pack file", cxxopts::value<std::string>())(
        "batch", "prompts, one JSON object per line", cxxopts::value<std::string>())(
        "out", "results JSONL (run header: OUT.meta.json)", cxxopts::value<std::string>())(
        "device", "cpu or cuda (builds with QTK_CUDA, on a machine with an NVIDIA GPU)",
        cxxopts::value<std::string>()->default_value("cpu"))(
        "precision", "f32 or bf16 (default: f32 on cpu, its only precision; bf16 on cuda)",
        cxxopts::value<std::string>()->default_value(""))(
        "threads", "worker threads (default: all CPUs available)",
        cxxopts::value<int>()->default_value("0"))(
        "max-tokens",
        "tokens to generate per prompt (default: the pack's max_new_tokens, else 256)",
        cxxopts::value<int64_t>()->default_value("0"))("ignore-eos",
                                                       "do not stop at the model's EOS tokens")(
        "max-num-seqs", "most sequences running at once",
        cxxopts::value<int64_t>()->default_value("64"))(
        "max-batched-tokens",
        "most tokens computed per step (prefill chunks + decode); Qwen3.5 on cuda with bf16 never "
        "splits a prompt's full 64-token chunks, so a budget below 64 is raised to 64 for them",
        cxxopts::value<int64_t>()->default_value("512"))(
        "block-size", "tokens per KV-cache block", cxxopts::value<int64_t>()->default_value("16"))(
        "kv-cache-blocks", "KV-cache blocks (default: sized from the prompts within 4 GiB)",
        cxxopts::value<int64_t>()->default_value("0"))(
        "margins", "write top1_margin (logit(top1) - logit(top2)) per step")(
        "progress", "show a progress line on stderr")(
        "show", "print each prompt and its continuation to stdout")(
        "resume", "continue an interrupted run into the same --out")("h,help", "show this help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
      fmt::print("{}", opts.help());
      return 0;
    }
    for (const char* req : {"model", "batch", "out"}) {
      if (!args.count(req)) throw qtk::Error(fmt::format("missing --{} (see --help)", req));
    }
    if (!args.unmatched().empty()) {
      throw qtk::Error(
          fmt::format("unexpected argument '{}' (see --help)", args.unmatched().front()));
    }
    o.model = args["model"].as<std::string>();
    o.batch = args["batch"].as<std::string>();
    o.out = args["out"].as<std::string>();
    o.device = args["device"].as<std::string>();
    o.precision = args["precision"].as<std::string>();
    o.threads = args["threads"].as<int>();
    o.max_tokens = args["max-tokens"].as<int64_t>();
    o.ignore_eos = args.count("ignore-eos") > 0;
    o.max_num_seqs = args["max-num-seqs"].as<int64_t>();
    o.max_batched_tokens = args["max-batched-tokens"].as<int64_t>();
    o.block_size = args["block-size"].as<int64_t>();
    o.kv_cache_blocks = args["kv-cache-blocks"].as<int64_t>();
    o.margins = args.count("margins") > 0;
    o.progress = args.count("progress") > 0;
    o.show = args.count("show") > 0;
    o.resume = args.count("resume") > 0;
    qtk::run_generate(o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}
