// End-to-end generation speed of the CUDA backend on a pack (random-weight
// real shapes from bench/synth): B prompts of P random tokens, greedy, G
// generated tokens each; and the prefill rate of one 512-token prompt.
//
//   cuda_model_bench --pack X.pack [--precision bf16|f32] [--batches 1,32,128]
//                    [--prompt 128] [--gen 64] [--prefill 512] [--json out.json]
//                    [--host-logits] [--plan-cache FILE|off]
//
// --plan-cache: the GEMM plans read from and saved to FILE (generate's plan
// cache, runtime/backend/cuda/cuda_startup.h; default off: tuned in the
// run). Same-run A/B comparisons share one file, so that both sides run the
// same GEMM algorithms rather than each its own timing's pick.
// note: steps are driven here directly (all prompts in prefill steps of at
// most --max-step-tokens tokens, then one decode token per sequence per step),
// not through the scheduler, so the figures are the model's. Every forward
// ends with the logits on the host (a synchronisation), as in generate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tuning.h"
#include "pack/pack.h"
#include "runtime/backend/cuda/cuda_model.h"
#include "runtime/backend/cuda/cuda_startup.h"
#include "runtime/kv_cache.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: cuda_model_bench --pack X.pack [--precision bf16|f32] [--batches 1,32,128]\n"
    "                        [--prompt 128] [--gen 64] [--prefill 512] [--max-step-tokens 8192]\n"
    "                        [--json out.json] [--host-logits] [--plan-cache FILE|off]\n"
    "B prompts of --prompt random tokens per batch size, --gen greedy tokens each (decode\n"
    "tok/s), then the best of 3 prefills of one --prefill-token prompt (0: none).\n"
    "--plan-cache FILE: GEMM plans read from and saved to FILE (default off: tuned here).\n";

struct Options {
  std::string pack, precision = "bf16", json, plan_cache = "off";
  std::vector<int64_t> batches = {1, 32, 128};
  int64_t prompt = 128, gen = 64, prefill = 512, max_step_tokens = 8192, block_size = 16;
  bool host_logits = false;  // logits to the host + host argmax (what the scheduler does now)
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

struct Timing {
  double prefill_s = 0, decode_s = 0;
  int64_t steps = 0;
};

// Runs B sequences of `prompt` random tokens and `gen` greedy tokens.
Timing run_batch(qtk::CudaModel& m, int64_t B, int64_t prompt, int64_t gen, int64_t max_step_tokens,
                 int64_t block_size, uint32_t seed, bool host_logits) {
  const int64_t vocab = m.config().vocab_size;
  const int64_t ctx = prompt + gen;
  const int64_t mb = (ctx + block_size - 1) / block_size;
  qtk::KvCache kv(m.cache_spec(), B * mb, block_size, m.uses_host_cache());
  qtk::StatePool states(m.cache_spec().state_floats, B, m.uses_host_cache());
  const int64_t seqs_per_prefill = std::max<int64_t>(1, std::min(B, max_step_tokens / prompt));
  m.reserve(std::max(seqs_per_prefill * prompt, B), B, ctx);
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> toks(B);
  for (auto& t : toks)
    for (int64_t i = 0; i < prompt; ++i) t.push_back(static_cast<int32_t>(rng() % vocab));
  std::vector<float> logits(host_logits ? B * vocab : 0), margins(B);
  std::vector<int32_t> next(B);
  Timing tm;
  // note: decode steps are pipelined as the scheduler runs them
  // (Model::greedy_submit, QTK_PIPELINE): step g + 1 is queued before the
  // ids of step g are read, its tokens fed from them on the device. lens:
  // tokens of each sequence including those still queued.
  const bool piped = !host_logits && qtk::tuning().pipeline;
  std::vector<int64_t> lens(B, prompt);
  enum class Mode { kSync, kSubmit, kSubmitFed };
  // One step over sequences [s0, s1): their prompts, or their next token.
  auto step = [&](int64_t s0, int64_t s1, bool prefill, Mode mode = Mode::kSync) {
    std::vector<int32_t> ids, pos, q_start = {0}, seq_len, bt, slot, feed;
    std::vector<int64_t> slots;
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t len0 = prefill ? 0 : lens[s] - 1;
      const int64_t len1 = lens[s];
      for (int64_t p = len0; p < len1; ++p) {
        const bool fed = mode == Mode::kSubmitFed;  // the previous step's row s - s0
        ids.push_back(fed ? 0 : toks[s][p]);
        feed.push_back(fed ? static_cast<int32_t>(s - s0) : -1);
        pos.push_back(static_cast<int32_t>(p));
        slots.push_back((s * mb + p / block_size) * block_size + p % block_size);
      }
      q_start.push_back(static_cast<int32_t>(ids.size()));
      seq_len.push_back(static_cast<int32_t>(len1));
      for (int64_t b = 0; b < mb; ++b) bt.push_back(static_cast<int32_t>(s * mb + b));
      slot.push_back(static_cast<int32_t>(s));
    }
    const int64_t T = static_cast<int64_t>(ids.size()), S = s1 - s0;
    std::vector<int32_t> positions(3 * T);
    for (int a = 0; a < 3; ++a) std::copy(pos.begin(), pos.end(), positions.begin() + a * T);
    std::vector<uint8_t> want(S, 1);
    // A prefill step holds whole prompts from position 0: their full aligned
    // chunks may take the model's chunked path (what the scheduler allows).
    std::vector<int32_t> aligned(S, 0);
    const int64_t align = m.prefill_alignment();
    if (prefill && align > 1)
      for (int64_t i = 0; i < S; ++i)
        aligned[i] = static_cast<int32_t>((q_start[i + 1] - q_start[i]) / align * align);
    qtk::StepBatch b;
    b.num_seqs = S;
    b.num_tokens = T;
    b.token_ids = ids.data();
    b.positions = positions.data();
    b.q_start = q_start.data();
    b.seq_len = seq_len.data();
    b.block_table = bt.data();
    b.max_blocks = mb;
    b.slot_mapping = slots.data();
    b.state_slot = slot.data();
    b.want_logits = want.data();
    b.num_logits = S;
    b.aligned_tokens = align > 1 ? aligned.data() : nullptr;
    if (mode != Mode::kSync) {
      if (mode == Mode::kSubmitFed) b.feed = feed.data();
      if (!m.greedy_submit(b, kv, states)) qtk::fail("cuda_model_bench: no pipelined path");
      for (int64_t s = s0; s < s1; ++s) ++lens[s];
    } else if (host_logits) {
      m.forward(b, kv, states, logits.data());
      for (int64_t i = 0; i < S; ++i) {
        const float* row = &logits[i * vocab];
        toks[s0 + i].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
      }
    } else {
      m.forward_greedy(b, kv, states, next.data(), margins.data());
      for (int64_t i = 0; i < S; ++i) toks[s0 + i].push_back(next[i]);
    }
    if (mode == Mode::kSync)
      for (int64_t s = s0; s < s1; ++s) lens[s] = static_cast<int64_t>(toks[s].size());
    ++tm.steps;
  };
  auto collect = [&] {
    m.greedy_collect(next.data(), margins.data());
    for (int64_t i = 0; i < B; ++i) toks[i].push_back(next[i]);
  };
  auto t0 = Clock::now();
  for (int64_t s = 0; s < B; s += seqs_per_prefill)
    step(s, std::min(B, s + seqs_per_prefill), true);
  auto t1 = Clock::now();
  if (!piped) {
    for (int64_t g = 1; g < gen; ++g) step(0, B, false);
  } else if (gen > 1) {
    step(0, B, false, Mode::kSubmit);  // the prompts' next tokens are known
    for (int64_t g = 2; g < gen; ++g) {
      step(0, B, false, Mode::kSubmitFed);
      collect();
    }
    collect();
  }
  auto t2 = Clock::now();
  tm.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  tm.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return tm;
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) qtk::fail("cuda_model_bench: {} needs a value", a);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a == "--pack")
      o.pack = next();
    else if (a == "--precision")
      o.precision = next();
    else if (a == "--batches")
      o.batches = parse_list(next());
    else if (a == "--prompt")
      o.prompt = std::stoll(next());
    else if (a == "--gen")
      o.gen = std::stoll(next());
    else if (a == "--prefill")
      o.prefill = std::stoll(next());
    else if (a == "--max-step-tokens")
      o.max_step_tokens = std::stoll(next());
    else if (a == "--json")
      o.json = next();
    else if (a == "--host-logits")
      o.host_logits = true;
    else if (a == "--plan-cache")
      o.plan_cache = next();
    else
      qtk::fail("cuda_model_bench: unknown argument '{}'", a);
  }
  if (o.pack.empty()) qtk::fail("cuda_model_bench: --pack is required");
  auto pack = qtk::Pack::open(o.pack);
  const auto t_load = Clock::now();
  auto model = qtk::load_cuda_model(*pack, qtk::parse_cuda_precision(o.precision));
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  nlohmann::json out = {{"pack", o.pack},
                        {"model", pack->config().hf_architecture},
                        {"precision", o.precision},
                        {"prompt", o.prompt},
                        {"gen", o.gen},
                        {"greedy", o.host_logits ? "host" : "device"},
                        {"upload_s", load_s}};
  std::printf("%s %s, greedy on the %s: weights uploaded in %.2f s\n", o.pack.c_str(),
              o.precision.c_str(), o.host_logits ? "host" : "device", load_s);
  // Warm-up: modules, GEMM plans. note: Gemm tunes each M range when a call
  // first needs it; every range is tuned here so that none is tuned inside
  // a timed run.
  qtk::CudaStartup startup(*model, *pack, o.precision, o.plan_cache);
  run_batch(*model, 1, 16, 4, o.max_step_tokens, o.block_size, 7, o.host_logits);
  qtk::tune_remaining_gemm_ranges(*model);
  startup.save();
  out["gemm_plan"] = startup.plan_meta();
  for (int64_t B : o.batches) {
    const Timing t =
        run_batch(*model, B, o.prompt, o.gen, o.max_step_tokens, o.block_size, 1, o.host_logits);
    const double gen_tps = double(B) * o.gen / (t.prefill_s + t.decode_s);
    const double dec_tps = double(B) * (o.gen - 1) / t.decode_s;
    std::printf(
        "batch %4lld: prefill %7.2f ms, decode %8.2f ms (%5.2f ms/step): "
        "%9.0f gen tok/s (incl. prefill), %9.0f decode tok/s\n",
        static_cast<long long>(B), t.prefill_s * 1e3, t.decode_s * 1e3,
        t.decode_s * 1e3 / (o.gen - 1), gen_tps, dec_tps);
    out["batches"].push_back({{"batch", B},
                              {"prefill_s", t.prefill_s},
                              {"decode_s", t.decode_s},
                              {"gen_tok_s", gen_tps},
                              {"decode_tok_s", dec_tps}});
  }
  if (o.prefill > 0) {
    run_batch(*model, 1, o.prefill, 1, o.max_step_tokens, o.block_size, 3,
              o.host_logits);  // warm-up
    double best = 1e30;
    for (int r = 0; r < 3; ++r)
      best = std::min(best, run_batch(*model, 1, o.prefill, 1, o.max_step_tokens, o.block_size,
                                      4 + r, o.host_logits)
                                .prefill_s);
    std::printf("prefill pp%lld: %.2f ms, %.0f tok/s (best of 3)\n",
                static_cast<long long>(o.prefill), best * 1e3, o.prefill / best);
    out["prefill"] = {{"tokens", o.prefill}, {"s", best}, {"tok_s", o.prefill / best}};
  }
  if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // (messages of this file's own checks already start with the tool's name)
    const std::string m = e.what();
    std::fprintf(stderr, "%s%s\n",
                 m.rfind("cuda_model_bench:", 0) == 0 ? "" : "cuda_model_bench: ", m.c_str());
    return 1;
  }
}
