#include "runtime/generate.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/plural.h"
#include "core/read_file.h"
#include "core/stdout_check.h"
#include "core/tuning.h"
#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"
#include "pack/pack.h"
#include "pack/pack_checksum.h"
#include "runtime/backend/backend.h"
#include "runtime/data_parallel.h"
#include "runtime/generate_progress.h"
#include "runtime/generate_resume.h"
#include "runtime/host_memory.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "runtime/prompt_jsonl.h"
#include "runtime/results_file.h"
#include "runtime/scheduler.h"
#include "runtime/shard.h"
#include "tokenizer/chat/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace qtk {

namespace {

using Clock = std::chrono::steady_clock;

int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // note: Linux reports KiB
}

// How many of the pack's matrices convert dequantized from block FP8 (the
// "dequantize_fp8" transform's tensors), 0 when none.
size_t dequantized_fp8_matrices(const Pack& pack) {
  const auto& m = pack.manifest();
  if (auto t = m.find("transforms"); t != m.end() && t->is_array())
    for (const auto& x : *t)
      if (x.is_object() && x.value("name", "") == "dequantize_fp8" && x.contains("tensors") &&
          x["tensors"].is_array())
        return x["tensors"].size();
  return 0;
}

std::string weight_dtypes(const Pack& pack) {
  std::set<std::string> names;
  std::set<std::string_view> scales;  // FP8 block scales are not weights of their own
  for (const auto& q : pack.fp8_tensors()) scales.insert(q.scale_name);
  for (const auto& t : pack.tensors()) {
    if (t.view.ndim == 2 && t.name.find("conv1d") == std::string::npos && !scales.count(t.name)) {
      names.insert(std::string(dtype_name(t.view.dtype)));
    }
  }
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : "+") + n;
  return s;
}

// "; N matrices dequantized from block FP8 ..." for a pack convert
// dequantized, else "".
// note: said, since such a pack's numbers are not the FP8 checkpoint's (a
// bf16 pack diverges from the checkpoint's goldens where f32 does not).
std::string dequantized_text(const Pack& pack) {
  const size_t n = dequantized_fp8_matrices(pack);
  if (n == 0) return "";
  return fmt::format(
      "; {} of the pack's matrices were dequantized from block-FP8 e4m3 at convert (fp8 x "
      "scale, rounded once to nearest even)",
      n);
}

int64_t pack_max_new_tokens(const Pack& pack) {
  const auto& m = pack.manifest();
  if (auto g = m.find("generation"); g != m.end() && g->is_object()) {
    if (auto t = g->find("max_new_tokens");
        t != g->end() && t->is_number_integer() && t->get<int64_t>() > 0) {
      return t->get<int64_t>();
    }
  }
  return 256;
}

// The device and precision a run uses, resolved from the flags (before any
// file is opened, so that a bad combination fails up front).
struct DeviceChoice {
  std::string device;     // cpu | cuda
  std::string precision;  // f32 | bf16
};

DeviceChoice resolve_device(const GenerateOptions& o) {
  if (!o.precision.empty() && o.precision != "f32" && o.precision != "bf16") {
    fail("--precision: expected f32 or bf16, found '{}'", o.precision);
  }
  if (o.device == "cpu") {
    if (o.precision == "bf16") {
      fail(
          "--precision bf16: the cpu device computes in float32 only (expected f32 or no "
          "--precision; bf16 runs with --device cuda)");
    }
    return {"cpu", "f32"};
  }
  if (o.device == "cuda") {
    const std::string p = o.precision.empty() ? "bf16" : o.precision;
    check_device("cuda");  // a build without the CUDA backend, or no device: fails here
    return {"cuda", p};
  }
  fail("--device: expected cpu or cuda, found '{}'", o.device);
}

// What an FP8 pack's matrices compute, for the run header ("" for others);
// `ranks`: the tensor-parallel rank count (1: unsplit).
std::string fp8_text(const Pack& pack, const DeviceChoice& d, int ranks) {
  if (pack.fp8_tensors().empty()) return "";
  std::set<int64_t> rows;
  for (const auto& q : pack.fp8_tensors()) rows.insert(q.block_rows);
  std::string r;
  for (int64_t x : rows) r += fmt::format("{}{}", r.empty() ? "" : " or ", x);
  // note: a rank's FP8 slices are copies of whole scale blocks of the pack
  // (runtime/parallel/tensor_parallel.h), so "in place" holds unsplit only.
  const std::string where =
      ranks > 1 ? "split over the ranks on scale-block boundaries, each rank's slice read as it is"
                : "read in place";
  const int64_t cols = pack.fp8_tensors().front().block_cols;
  const std::string warp_product =
      "each weight computed as the float32 product fp8 x scale inside a fixed-order warp "
      "product (float32 accumulation; the FP8 matrices go through no cuBLASLt GEMM)";
  // note: which CUDA product runs is launch_warp_matmul's choice
  // (kernels/cuda/warp_matmul.cuh): with bf16 activations the tensor-core
  // form wherever K % 16 == 0 and the blocks hold whole 64-column chunks.
  if (d.device == "cuda" && d.precision == "bf16" && tuning().mma_matmul)
    return fmt::format(
        "; F8_E4M3 (e4m3fn) weights {} with float32 block scales (blocks of {} rows x {} "
        "columns): the e4m3 values enter bf16 tensor-core products exactly (mma.sync, float32 "
        "accumulation, one fixed order per shape) and each block's partial sum is multiplied by "
        "its float32 scale (a matrix with K not a multiple of 16 or blocks not of whole 64 "
        "columns: {})",
        where, r, cols, warp_product);
  return fmt::format(
      "; F8_E4M3 (e4m3fn) weights {} with float32 block scales (blocks of {} rows x {} columns), "
      "{}",
      where, r, cols,
      d.device == "cuda" ? warp_product
                         : "each weight computed as the float32 product fp8 x scale");
}

// The run header's description of the arithmetic.
std::string precision_text(const DeviceChoice& d, const Pack& pack, int ranks) {
  const auto& plan = pack.config().layer_plan;
  const bool gdn = std::find(plan.begin(), plan.end(), LayerKind::kLinear) != plan.end();
  if (d.device == "cpu") {
    return fmt::format(
        "float32 activations, float32 KV cache{}, {} weights, float32 accumulation{}{}",
        gdn ? " and GDN state" : "", weight_dtypes(pack), fp8_text(pack, d, ranks),
        dequantized_text(pack));
  }
  if (d.precision == "f32") {
    return fmt::format(
        "CUDA: float32 weights (from {} at upload), activations, KV cache{}, float32 "
        "accumulation{}{}",
        weight_dtypes(pack), gdn ? " and GDN state" : "", fp8_text(pack, d, ranks),
        dequantized_text(pack));
  }
  return fmt::format(
      "CUDA: bfloat16 weights (from {} at upload), activations and KV cache; float32 "
      "accumulation{}{}{}",
      weight_dtypes(pack), gdn ? ", norms and GDN state" : " and norms", fp8_text(pack, d, ranks),
      dequantized_text(pack));
}

// note: sizes below come from user input (max_tokens up to INT64_MAX, any
// number of lines), so their sums and products saturate instead of wrapping.
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}
int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// ---- chat template (issue 25) ----
// The template "messages" lines are rendered with: --chat-template FILE,
// else the pack's chat_template.jinja entry, else tokenizer_config.json's
// "chat_template".
struct ChatTemplateSetup {
  std::optional<jinja::Template> tmpl;
  std::string source;   // where it came from
  std::string digest;   // XXH64 of its text (the run header records it)
  std::string missing;  // when !tmpl: why, for the lines that need one
  std::vector<std::pair<std::string, nlohmann::ordered_json>> special_tokens;

  nlohmann::json describe() const {
    if (!tmpl) return nullptr;
    return {{"source", source}, {"xxh64", digest}};
  }
};

ChatTemplateSetup load_chat_template(const GenerateOptions& o, const Pack& pack) {
  ChatTemplateSetup s;
  std::optional<nlohmann::json> config;
  if (auto tc = pack.entry("tokenizer_config.json")) {
    config = nlohmann::json::parse(*tc, nullptr, false);
    if (config->is_discarded()) config.reset();
  }
  s.special_tokens = chat::special_tokens_from_config(config ? &*config : nullptr);
  std::optional<std::string> text;
  if (!o.chat_template.empty()) {
    // note: a regular file only: a --devices run reads it in each worker,
    // which a pipe cannot give twice.
    text = read_input_text(o.chat_template, "the chat template", InputFile::kRegularOnly);
    s.source = o.chat_template;
  } else {
    std::optional<std::string> jinja_file;
    if (auto e = pack.entry("chat_template.jinja")) jinja_file = std::string(*e);
    s.source = jinja_file ? o.model + ":chat_template.jinja"
                          : o.model + ":tokenizer_config.json:chat_template";
    try {
      text = chat::template_from_config(config ? &*config : nullptr,
                                        o.model + ":tokenizer_config.json", jinja_file);
    } catch (const Error& e) {
      s.missing = e.what();
      return s;
    }
  }
  if (!text) {
    s.missing =
        "this pack has no chat template (no chat_template.jinja entry, no 'chat_template' in "
        "tokenizer_config.json); give one with --chat-template FILE";
    return s;
  }
  try {
    s.tmpl = jinja::Template::parse(*text, s.source);
  } catch (const jinja::TemplateError& e) {
    // note: a bad --chat-template is a bad flag (the run stops); a pack's
    // broken template only fails the lines that need it.
    if (!o.chat_template.empty()) fail("--chat-template {}", e.what());
    s.missing = fmt::format("the chat template does not parse: {}", e.what());
    return s;
  }
  s.digest = fmt::format("{:016x}", xxh64(text->data(), text->size()));
  return s;
}
// ---- end chat template ----

// note: an empty prompts file is a mistake (a wrong path, a failed
// upstream step), not an empty golden file; so is one of blank lines only.
// (A blank line among prompts stays a failed line of its own.)
void refuse_empty_batch(const std::string& path, const std::vector<std::string_view>& lines) {
  if (lines.empty()) fail("{}: expected at least one prompt line, found an empty file", path);
  const auto is_blank = [](std::string_view l) {
    return l.find_first_not_of(" \t\r") == std::string_view::npos;
  };
  const bool blank = is_blank(without_byte_order_mark(lines.front())) &&
                     std::all_of(lines.begin() + 1, lines.end(), is_blank);
  if (blank)
    fail("{}: expected at least one prompt line, found {} blank line{}", path, lines.size(),
         lines.size() == 1 ? "" : "s");
}

void check_flags(const GenerateOptions& o) {
  if (o.block_size < 1) fail("--block-size: expected a positive integer, found {}", o.block_size);
  if (o.max_num_seqs < 1)
    fail("--max-num-seqs: expected a positive integer, found {}", o.max_num_seqs);
  if (o.max_batched_tokens < 1) {
    fail("--max-batched-tokens: expected a positive integer, found {}", o.max_batched_tokens);
  }
  if (o.kv_cache_blocks < 0)
    fail("--kv-cache-blocks: expected a positive integer, found {}", o.kv_cache_blocks);
  if (o.max_tokens < 0) fail("--max-tokens: expected a positive integer, found {}", o.max_tokens);
  if (o.threads < 0) fail("--threads: expected a positive integer, found {}", o.threads);
  if (o.logprobs < 0 || o.logprobs > kMaxLogprobs)
    fail("--logprobs: expected 0 (off) to {}, found {}", kMaxLogprobs, o.logprobs);
  if (o.logprobs > 0 && o.device == "cuda") {
    fail(
        "--logprobs: the cuda device picks tokens on the GPU and does not return the logits; "
        "expected --device cpu for --logprobs");
  }
  if (o.tune_only && o.device != "cuda")
    fail("--tune-only: tunes the CUDA GEMM plans; expected --device cuda, found --device {}",
         o.device);
  if (o.tune_only && tuning().plan_cache == "off") {
    fail(
        "--tune-only: the tuned plans go to the plan cache; expected a file or the default "
        "location, found --plan-cache off");
  }
  if (o.force && o.resume)
    fail("--force and --resume: expected at most one (--force starts over, --resume continues)");
  if (o.progress && o.no_progress) fail("--progress and --no-progress: expected at most one");
}

// `--out -` writes the results to stdout: nothing to resume, and --show
// would mix its text into them.
void check_stdout_flags(const GenerateOptions& o);

// The files generate reads, by flag, which no output may be.
std::vector<std::pair<std::string, std::string>> generate_inputs(const GenerateOptions& o) {
  std::vector<std::pair<std::string, std::string>> inputs = {{"--model", o.model},
                                                             {"--batch", o.batch}};
  if (!o.chat_template.empty()) inputs.emplace_back("--chat-template", o.chat_template);
  return inputs;
}

// Every output path is safe to write before anything is opened: none is an
// input, none is a directory, device or FIFO, and an existing --meta file
// is replaced only with --force or --resume (--shard implies --resume).
void check_outputs(const GenerateOptions& o) {
  const bool may_replace = o.force || o.resume || !o.shard.empty();
  if (o.meta == "-")
    fail(
        "--meta -: expected a file for the run header (it is never written to stdout; without "
        "--meta it goes beside --out, or nowhere with --out -)");
  if (o.out == "-") {
    check_stdout_flags(o);
    if (!o.meta.empty())
      check_meta_path(o.meta, generate_inputs(o), may_replace, /*resumable=*/false);
    return;
  }
  refuse_outputs_that_are_inputs(ResultsPaths::of(o.out, o.meta), generate_inputs(o), may_replace);
}

void check_stdout_flags(const GenerateOptions& o) {
  if (o.resume)
    fail("--resume: expected --out FILE; results written to stdout (--out -) cannot be resumed");
  if (o.show)
    fail(
        "--show: prints to stdout, which --out - already writes the results to; expected one of "
        "them");
}

// The pack, its tokenizer and the model on the chosen device.
// note: members are destroyed in reverse order: the backend (the model and
// what it uses) before the pack it reads.
struct LoadedModel {
  std::unique_ptr<Pack> pack;
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<BackendSession> backend;  // runtime/backend/backend.h
  Model* model = nullptr;                   // backend->model()
  std::string device_name = "cpu";
  int threads = 0;
  Clock::time_point load_start;
  double load_seconds = 0.0;        // verify_seconds included
  double verify_seconds = 0.0;      // the checksums (0 with --no-verify)
  double first_token_seconds = -1;  // since load_start; -1: no token generated
};

void load(const GenerateOptions& o, const DeviceChoice& dev, LoadedModel& m) {
  const auto load_start = Clock::now();
  m.load_start = load_start;
  m.pack = Pack::open(o.model);
  // note: checked before any tensor is used: a flipped byte would otherwise
  // give wrong tokens silently, and the pack digest (from the manifest)
  // would not tell the run apart from a clean one.
  if (o.verify) {
    const auto t = Clock::now();
    // note: a CUDA run reads each weight once more, to upload it, and then
    // hands its pages back; a CPU run computes from the mapping and keeps them.
    m.pack->verify(/*release_pages=*/dev.device == "cuda");
    m.verify_seconds = std::chrono::duration<double>(Clock::now() - t).count();
  }
  if (auto tj = m.pack->entry("tokenizer.json")) {
    m.tokenizer = Tokenizer::from_json_text(*tj, o.model + ":tokenizer.json");
  }
  // note: more workers than CPUs this process may run on only wait for one
  // another (the pool's workers spin between phases): --threads 1024 on 2
  // CPUs took 170 s for what 2 threads do in 0.12 s. The tokens do not
  // depend on the thread count, so a larger request is capped, with a note
  // (the header records the count used).
  const int cpus = default_thread_count();
  m.threads = o.threads > 0 ? std::min(o.threads, cpus) : cpus;
  if (o.threads > cpus)
    fmt::print(stderr,
               "generate: note: --threads {}: this process may run on {} CPU{}; using {} "
               "thread{}\n",
               o.threads, cpus, cpus == 1 ? "" : "s", m.threads, m.threads == 1 ? "" : "s");
  m.backend = open_backend(*m.pack, BackendChoice{.device = dev.device,
                                                  .precision = dev.precision,
                                                  .plan_cache = tuning().plan_cache,
                                                  .threads = m.threads,
                                                  .tensor_parallel = o.tensor_parallel});
  m.model = &m.backend->model();
  m.device_name = m.backend->device_name();
  m.load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
}

std::vector<PromptLine> parse_lines(const std::vector<std::string_view>& raw,
                                    const PromptDefaults& defaults) {
  std::vector<PromptLine> lines;
  lines.reserve(raw.size());
  std::map<std::string, size_t> first_line;  // id (as JSON) -> the line that used it first
  for (size_t i = 0; i < raw.size(); ++i) {
    lines.push_back(parse_prompt_line(raw[i], static_cast<int64_t>(i) + 1, defaults));
    PromptLine& l = lines.back();
    const auto [it, fresh] = first_line.emplace(l.id.dump(), i);
    if (!fresh && l.error.empty()) {
      const PromptLine& first = lines[it->second];
      l.error = fmt::format(
          "line {}: id {} already used on line {}{} (ids must be unique within a batch)", l.line_no,
          l.id.dump(), first.line_no,
          first.id_given ? "" : " (it has no \"id\", so its line number is its id)");
    }
  }
  return lines;
}

// The most tokens a request can hold: its prompt plus its budget, capped by the context.
int64_t request_tokens(const SequenceRequest& r, int64_t max_context) {
  const int64_t p = static_cast<int64_t>(r.prompt.size());
  return p + std::min(r.max_tokens, std::max<int64_t>(0, max_context - p));
}

// Whether line `l`'s prompt plus max_tokens runs past the model's context.
bool context_capped(const PromptLine& l, int64_t max_context) {
  return l.error.empty() &&
         l.request.max_tokens > max_context - static_cast<int64_t>(l.request.prompt.size());
}

// Lines whose prompt plus max_tokens runs past the model's context: they stop
// at the context end (finish_reason "length"). Says so once on stderr, naming
// the first (the meta file's stats count them: context_capped_lines).
// note: capped rather than refused, so that one --max-tokens serves a batch of
// mixed prompt lengths; a golden file's reader learns it from the note and
// from context_capped_lines, not from the tokens alone.
void note_context_capped(const std::vector<PromptLine>& lines, int64_t max_context) {
  int64_t capped = 0;
  const PromptLine* first = nullptr;
  for (const auto& l : lines) {
    if (context_capped(l, max_context) && capped++ == 0) first = &l;
  }
  if (capped > 0) {
    const int64_t p = static_cast<int64_t>(first->request.prompt.size());
    const char* s = capped == 1 ? "s" : "";  // the verbs' ending
    fmt::print(stderr,
               "generate: note: {} ask{} for more tokens than the model's context of {} positions "
               "holds and stop{} at its end (finish_reason \"length\"); the first: line {} (id "
               "{}), a {}-token prompt with max_tokens {} gets at most {}\n",
               count_of(capped, "line"), s, max_context, s, first->line_no, first->id.dump(), p,
               first->request.max_tokens, max_context - p);
  }
}

// Scheduler settings, with the cache sized for max_num_seqs of the longest
// request, within the byte budget.
SchedulerOptions size_cache(const GenerateOptions& o, const ModelConfig& cfg, const CacheSpec& spec,
                            const std::vector<PromptLine>& lines) {
  int64_t longest = 1, all_blocks = 0, requests = 0, all_tokens = 0;
  for (const auto& l : lines) {
    if (!l.error.empty()) continue;
    const int64_t n = request_tokens(l.request, cfg.max_position_embeddings);
    longest = std::max(longest, n);
    all_blocks = sat_add(all_blocks, (n + o.block_size - 1) / o.block_size);
    all_tokens = sat_add(all_tokens, n);
    ++requests;
  }
  SchedulerOptions so;
  // note: the step buffers (and the GPU's graphs) are sized by these two
  // limits, so they are capped where this batch can never reach them: no
  // step holds more sequences than there are requests, nor more tokens than
  // all requests together (prompt plus output, replays after a preemption
  // included). A limit that never binds changes no schedule, hence no result;
  // the header keeps the flags' values (uncapped, 65,536 sequences and 2^20
  // tokens take ~7.6 GB for two short prompts on a tiny model). The token
  // floor keeps any prefill alignment (Model::prefill_alignment) below the
  // budget.
  constexpr int64_t kTokenCapFloor = 4096;
  so.max_num_seqs = std::min(o.max_num_seqs, std::max<int64_t>(requests, 1));
  so.max_batched_tokens = std::min(o.max_batched_tokens, std::max(all_tokens, kTokenCapFloor));
  so.block_size = o.block_size;
  so.max_context = cfg.max_position_embeddings;
  so.logprobs = o.logprobs;
  const int64_t blocks_per_seq = (longest + o.block_size - 1) / o.block_size;
  if (o.kv_cache_blocks > 0) {
    so.num_blocks = o.kv_cache_blocks;
  } else {
    const int64_t bb = std::max<int64_t>(1, KvCache::block_bytes(spec, o.block_size));
    // note: never more than every request at once needs (fewer prompts than
    // --max-num-seqs, or shorter ones than the longest): the cache is zeroed
    // at allocation, and a worst-case size cost seconds of page faults.
    const int64_t needed = std::min(all_blocks, sat_mul(blocks_per_seq, so.max_num_seqs));
    so.num_blocks = std::max(blocks_per_seq, std::min(o.kv_cache_bytes / bb, needed));
  }
  // note: the per-sequence block table never needs more than the longest request.
  so.max_context = std::min<int64_t>(so.max_context, std::max<int64_t>(longest, 2));
  return so;
}

// The KV cache on the CPU is allocated and zeroed up front: a size past the
// memory there is would swap, or be killed by the kernel with no word said.
// An explicit --kv-cache-blocks must fit in the memory available. The
// default is lowered to half of it where it would take more (the cache's
// size only decides when sequences are preempted, never a result), but
// never below what the longest request needs; a request that alone needs
// more than there is stops the run, named.
void fit_cpu_cache(const GenerateOptions& o, const CacheSpec& spec, const ModelConfig& cfg,
                   const std::vector<PromptLine>& lines, SchedulerOptions& so) {
  const int64_t bb = std::max<int64_t>(1, KvCache::block_bytes(spec, o.block_size));
  const int64_t bytes = sat_mul(so.num_blocks, bb);
  const int64_t available = available_memory_bytes();
  if (available <= 0) return;
  // (a QTK_MEM_AVAILABLE left in the environment is named where it decides)
  const std::string memory = fmt::format("the {} of memory available{}", size_of(available),
                                         tuning().mem_available > 0 ? " (QTK_MEM_AVAILABLE)" : "");
  if (o.kv_cache_blocks > 0) {
    if (bytes > available)
      fail(
          "--kv-cache-blocks {}: {} blocks of {} tokens need {} of KV cache, more than {}; lower "
          "--kv-cache-blocks or --block-size",
          o.kv_cache_blocks, so.num_blocks, o.block_size, size_of(bytes), memory);
    return;
  }
  if (bytes <= available / 2) return;
  const PromptLine* longest = nullptr;
  int64_t longest_tokens = 0;
  for (const auto& l : lines) {
    if (!l.error.empty()) continue;
    const int64_t n = request_tokens(l.request, cfg.max_position_embeddings);
    if (n > longest_tokens) longest_tokens = n, longest = &l;
  }
  const int64_t need = (longest_tokens + o.block_size - 1) / o.block_size;
  if (longest != nullptr && sat_mul(need, bb) > available)
    fail(
        "line {} (id {}): a {}-token prompt with max_tokens {} needs {} KV-cache blocks of {} "
        "tokens ({} positions), {}, more than {}; shorten the prompt or lower its max_tokens (or "
        "--max-tokens)",
        longest->line_no, longest->id.dump(), longest->request.prompt.size(),
        longest->request.max_tokens, need, o.block_size, longest_tokens, size_of(sat_mul(need, bb)),
        memory);
  const int64_t was = so.num_blocks;
  so.num_blocks = std::max(need, available / 2 / bb);
  fmt::print(stderr,
             "generate: note: the KV cache takes {} blocks ({}; {}), instead of {} ({}); "
             "sequences may be preempted and recomputed more often (the results do not change)\n",
             so.num_blocks, size_of(sat_mul(so.num_blocks, bb)),
             so.num_blocks == need ? "what the longest request needs" : "half " + memory, was,
             size_of(bytes));
}

std::vector<std::string> ignored_fields(const std::vector<PromptLine>& lines) {
  std::set<std::string> names;
  for (const auto& l : lines) names.insert(l.ignored_fields.begin(), l.ignored_fields.end());
  return {names.begin(), names.end()};
}

// The run header (OUT.meta.json), without status and stats. `chat_template`:
// the template's source and XXH64 when the batch has "messages" lines, else
// null (a setting only of runs that use it, so other runs resume as before).
nlohmann::json run_header(const GenerateOptions& o, const DeviceChoice& dev, const LoadedModel& m,
                          const PromptDefaults& defaults, const SchedulerOptions& so,
                          const std::vector<std::string_view>& raw,
                          const std::vector<PromptLine>& lines,
                          const nlohmann::json& chat_template) {
  const ModelConfig& cfg = m.pack->config();
  nlohmann::json settings = {{"max_tokens_default", defaults.max_tokens},
                             {"ignore_eos", o.ignore_eos},
                             {"margins", o.margins},
                             {"logprobs", o.logprobs},
                             {"max_num_seqs", o.max_num_seqs},
                             {"max_batched_tokens", o.max_batched_tokens},
                             {"block_size", o.block_size},
                             {"kv_cache_blocks", so.num_blocks},
                             {"kv_cache_blocks_flag", o.kv_cache_blocks},
                             {"threads", m.threads},
                             {"device", dev.device},
                             {"precision", dev.precision},
                             {"verify_checksums", o.verify},
                             {"allow_unknown_fields", o.allow_unknown_fields},
                             {"chat_template", chat_template}};
  nlohmann::json meta = {
      {"tool", "qtk generate"},
      {"tool_version", QTK_VERSION},
      {"pack",
       {{"path", o.model}, {"digest", m.pack->digest()}, {"architecture", cfg.hf_architecture}}},
      {"batch", o.batch},
      {"device", m.device_name},
      {"precision", precision_text(dev, *m.pack, o.tensor_parallel)},
      {"settings", settings},
      {"tuning", tuning_header(tuning())},
      {"input_lines", raw.size()},
      {"input_line_xxh64", input_line_digests(raw)}};
  if (o.allow_unknown_fields) meta["unknown_fields_ignored"] = ignored_fields(lines);
  meta["settings"]["tensor_parallel"] = o.tensor_parallel;
  // note: written only for a split model, so that the headers of unsplit
  // runs (and of runs made before tensor parallelism) stay comparable.
  if (o.tensor_parallel > 1) {
    meta["tensor_parallel"] = {
        {"ranks", o.tensor_parallel},
        {"compare",
         fmt::format("a tensor-parallel run (TP {}) adds each output projection's {} partial "
                     "sums in rank order: bit-identical from run to run and batch-invariant, "
                     "but compared with a TP-1 result by the near-tie rule, not byte for byte",
                     o.tensor_parallel, o.tensor_parallel)}};
  }
  return meta;
}

// Model text as --show prints it: newlines and tabs kept, every other
// control byte (a NUL, an ESC that would drive the terminal) escaped.
std::string shown_text(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (is_control_byte(u) && c != '\n' && c != '\t')
      append_control_escape(out, u);
    else
      out += c;
  }
  return out;
}

// One result line; prints it with --show.
std::string format_result(const GenerateOptions& o, const PromptLine& l, const SequenceResult& r,
                          const std::optional<Tokenizer>& tokenizer) {
  std::string text;
  if (tokenizer) {
    // note: output_text is the decode of all of output_token_ids, a final
    // stop token included (as vLLM's include_stop_str_in_output=True), so
    // the two fields always describe the same tokens.
    text = tokenizer->decode(std::span<const int32_t>(r.output.data(), r.output.size()));
  }
  if (o.show) {
    const std::string prompt_text = tokenizer ? tokenizer->decode(l.request.prompt)
                                              : fmt::format("{}", fmt::join(l.request.prompt, " "));
    // (ids without a tokenizer: " | " between the prompt's and the output's)
    const std::string cont = tokenizer ? text : fmt::format(" | {}", fmt::join(r.output, " "));
    // The continuation in bold on a terminal.
    const bool tty = ::isatty(1);
    const std::string shown =
        fmt::format("=== {}\n{}{}{}{}\n", l.id.dump(), shown_text(prompt_text),
                    tty ? "\033[1m" : "", shown_text(cont), tty ? "\033[0m" : "");
    // note: a failed write is remembered and reported at the end of the run
    // (generate_main: finish_stdout); the results file does not depend on it.
    write_stdout(shown);
    flush_stdout();
  }
  std::string line =
      result_line(l.id, l.request.prompt, r.output, r.stopped, tokenizer ? &text : nullptr,
                  o.margins ? &r.margins : nullptr, l.is_chat ? &l.chat_prompt : nullptr);
  if (o.logprobs > 0) append_logprobs(line, r.top_ids, r.top_logprobs, o.logprobs);
  return line;
}

// What run_lines wrote: the lines that got an error line from the run
// itself (a row of non-finite logits: SequenceResult::error), and the
// prompt and output tokens of the result lines it wrote.
struct LinesWritten {
  int64_t lines = 0;  // every line appended, error lines included
  int64_t failed = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

// Runs every line from `skip` on through the scheduler and appends its
// result line, in input order, as soon as it and all lines before it are
// done; `written` counts what it appended (also when it throws).
void run_lines(const GenerateOptions& o, const std::vector<PromptLine>& lines, size_t skip,
               Scheduler& sched, const std::optional<Tokenizer>& tokenizer, ResultsWriter& out,
               int64_t max_context, Clock::time_point since, double* first_token_seconds,
               LinesWritten& written) {
  std::vector<int64_t> line_of;  // handle -> input line index
  int64_t work_tokens = 0;
  for (size_t i = skip; i < lines.size(); ++i) {
    if (!lines[i].error.empty()) continue;
    const int64_t h = sched.add(lines[i].request);
    if (h != static_cast<int64_t>(line_of.size()))
      fail("generate: internal error: unexpected handle {}", h);
    line_of.push_back(static_cast<int64_t>(i));
    work_tokens = sat_add(work_tokens, request_tokens(lines[i].request, max_context));
  }
  std::vector<std::optional<SequenceResult>> results(lines.size());
  size_t next = skip;
  // note: lines count the whole file (a resumed run starts at the lines
  // already done); tokens and rates count this run's work only.
  Progress progress((o.progress || ::isatty(2)) && !o.no_progress,
                    static_cast<int64_t>(lines.size()), work_tokens);
  int64_t done = static_cast<int64_t>(skip);
  auto flush = [&]() {
    for (; next < lines.size(); ++next, ++done, ++written.lines) {
      const PromptLine& l = lines[next];
      if (!l.error.empty()) {
        out.append(error_line(l.id, l.error));
      } else if (results[next] && !results[next]->error.empty()) {
        out.append(error_line(l.id, fmt::format("line {}: {}", l.line_no, results[next]->error)));
        results[next].reset();
        ++written.failed;
      } else if (results[next]) {
        out.append(format_result(o, l, *results[next], tokenizer));
        written.prompt_tokens += static_cast<int64_t>(l.request.prompt.size());
        written.generated_tokens += static_cast<int64_t>(results[next]->output.size());
        results[next].reset();
      } else {
        break;
      }
    }
  };
  flush();
  std::vector<int64_t> finished;
  while (sched.has_work()) {
    if (const int sig = interrupt_signal()) {
      fail("{}: interrupted by {} after {} of {} lines{}", o.out, signal_name(sig), next,
           lines.size(),
           o.out == "-"
               ? std::string()
               : fmt::format(" ({}.partial keeps them; --resume finishes the run)", o.out));
    }
    finished.clear();
    sched.step(finished);
    if (*first_token_seconds < 0 && sched.stats().generated_tokens > 0)
      *first_token_seconds = std::chrono::duration<double>(Clock::now() - since).count();
    for (int64_t h : finished) {
      const PromptLine& l = lines[line_of[h]];
      results[line_of[h]] = sched.take_result(h);
      progress.finished_early(request_tokens(l.request, max_context) -
                              static_cast<int64_t>(l.request.prompt.size()) -
                              static_cast<int64_t>(results[line_of[h]]->output.size()));
    }
    flush();
    progress.update(done, sched.stats(), false);
  }
  flush();
  progress.update(done, sched.stats(), true);
}

nlohmann::json run_stats(const SchedulerStats& st, size_t lines, size_t skip, double sec,
                         const LoadedModel& m) {
  return {{"lines", lines},
          {"resumed_after_lines", skip},
          {"steps", st.steps},
          {"preemptions", st.preemptions},
          {"recomputed_tokens", st.recomputed_tokens},
          {"seconds", sec},
          {"prompt_tokens_computed", st.prompt_tokens_computed},
          {"decode_tokens", st.decode_tokens},
          {"prefill_seconds", st.prefill_seconds},
          {"decode_seconds", st.decode_seconds},
          {"load_seconds", m.load_seconds},
          // (null when no token was generated: every line an error line)
          {"first_token_seconds",
           m.first_token_seconds < 0 ? nlohmann::json() : nlohmann::json(m.first_token_seconds)},
          {"verify_seconds", m.verify_seconds},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"cpu_path", std::string(cpu_path_name(active_cpu_path()))}};
}

}  // namespace

std::string summary_line(const GenerateSummary& s) {
  const double sec = std::max(s.seconds, 1e-9);
  return fmt::format(
      "generate: {}: {} ok, {} failed{}; {} prompt + {} generated tokens in {:.2f} s "
      "({:.1f} tok/s generated); wall time {:.2f} s",
      count_of(s.lines, "line"), s.lines - s.failed_lines, s.failed_lines,
      s.resumed_after > 0 ? fmt::format(" ({} done before --resume)", s.resumed_after) : "",
      s.prompt_tokens, s.generated_tokens, s.seconds, static_cast<double>(s.generated_tokens) / sec,
      s.wall_seconds);
}

// Where the results go, settled before anything is opened for writing: no
// output is an input, the output is this run's alone (OUT.lock), and the
// run starts fresh or resumes (stdout: always fresh).
ResumeSource claim_outputs(const GenerateOptions& o, const ResultsPaths& paths, bool sharded,
                           std::optional<OutputLock>& lock) {
  check_outputs(o);
  // note: results on stdout have no file of their own: no lock, nothing to
  // resume or replace (a file named "-" is someone else's).
  if (o.out == "-") {
    // (what a killed `--out - --meta M` run left of M's temporaries)
    if (!o.meta.empty())
      for (const std::string& line : remove_stale_meta_temporaries(o.meta))
        std::fprintf(stderr, "generate: %s\n", line.c_str());
    return ResumeSource{};
  }
  lock.emplace(paths.lock, o.out);
  // note: with the lock held no other run writes these names: what a
  // killed run left of its temporary files can go.
  for (const std::string& line : remove_stale_temporaries(paths))
    std::fprintf(stderr, "generate: %s\n", line.c_str());
  // note: --shard implies --resume: a retried task runs the same command.
  return choose_start(paths, o.force               ? StartMode::kForce
                             : o.resume || sharded ? StartMode::kResume
                                                   : StartMode::kFresh);
}

// What a prompt line may ask for and gets by default, from the flags, the
// pack and the chat template.
PromptDefaults prompt_defaults(const GenerateOptions& o, const LoadedModel& m,
                               const ChatTemplateSetup& chat) {
  const ModelConfig& cfg = m.pack->config();
  PromptDefaults d;
  d.max_tokens = o.max_tokens > 0 ? o.max_tokens : pack_max_new_tokens(*m.pack);
  d.ignore_eos = o.ignore_eos;
  for (int64_t e : cfg.eos_token_ids) d.eos_ids.push_back(static_cast<int32_t>(e));
  d.vocab_size = cfg.vocab_size;
  d.max_context = cfg.max_position_embeddings;
  d.allow_mrope = !cfg.rope.mrope_section.empty();
  d.allow_unknown_fields = o.allow_unknown_fields;
  d.tokenizer = m.tokenizer ? &*m.tokenizer : nullptr;
  d.chat_template = chat.tmpl ? &*chat.tmpl : nullptr;
  d.chat_template_missing = chat.missing;
  d.chat_special_tokens = chat.special_tokens;
  return d;
}

// A shard keeps its own lines, after every line was parsed: default ids
// (line numbers) and duplicate-id errors are those of the whole batch.
void keep_shard_lines(std::vector<PromptLine>& lines, const ShardSpec& shard) {
  std::vector<PromptLine> own;
  for (size_t i = 0; i < lines.size(); ++i)
    if (shard.owns(static_cast<int64_t>(i))) own.push_back(std::move(lines[i]));
  lines = std::move(own);
}

// A shard resumes only its own file.
// note: checked before the line-by-line resume checks, so that the message
// names the real mismatch (another shard's file).
void check_same_shard(const ResumeSource& source, const nlohmann::json& meta) {
  const nlohmann::json old =
      nlohmann::json::parse(read_file_text(source.meta, "the run header"), nullptr, false);
  // note: a header without the entries every run writes is no run's (an
  // empty object read as "a whole run, not a shard").
  if (!old.is_object() || !old.contains("pack") || !old.contains("settings"))
    fail(
        "{}: cannot resume: not a run header generate wrote (expected a JSON object with 'pack' "
        "and 'settings'); start over with --force",
        source.meta);
  const nlohmann::json was = old.value("shard", nlohmann::json());
  const nlohmann::json now = meta.value("shard", nlohmann::json());
  if (was == now) return;
  auto name = [](const nlohmann::json& s) {
    return fmt::format("shard {}/{}", s.value("index", nlohmann::json()).dump(),
                       s.value("count", nlohmann::json()).dump());
  };
  if (!was.is_object())
    fail(
        "{}: cannot resume: it holds a whole run, not a shard; resume it without --shard (or "
        "start {} over with --force)",
        source.meta, name(now));
  if (!now.is_object())
    fail("{}: cannot resume: it holds {}; resume it with --shard {}/{}", source.meta, name(was),
         was.value("index", nlohmann::json()).dump(), was.value("count", nlohmann::json()).dump());
  if (name(was) != name(now))
    fail("{}: cannot resume: it holds {}, this run is {}", source.meta, name(was), name(now));
  fail(
      "{}: cannot resume: its {} is of another prompts file (batch digest {}, {} lines; now {}, "
      "{} lines); start it over with --force",
      source.meta, name(was), was.value("batch_digest", nlohmann::json()).dump(),
      was.value("lines_total", nlohmann::json()).dump(),
      now.value("batch_digest", nlohmann::json()).dump(),
      now.value("lines_total", nlohmann::json()).dump());
}

// The lines, failed lines and resumed lines of a run's summary; run_failed:
// the lines whose error line came from the run (kept ones included).
GenerateSummary summary_of(const std::vector<PromptLine>& lines, int64_t resumed_after,
                           int64_t run_failed) {
  GenerateSummary s;
  s.lines = static_cast<int64_t>(lines.size());
  s.failed_lines = run_failed;
  for (const auto& l : lines) s.failed_lines += l.error.empty() ? 0 : 1;
  s.resumed_after = resumed_after;
  return s;
}

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void check_generate_inputs(const GenerateOptions& o) {
  const DeviceChoice dev = resolve_device(o);
  check_flags(o);
  // (a QTK_CPU_PATH this CPU cannot run, before --devices starts workers
  // that would each meet it)
  if (dev.device == "cpu") (void)active_cpu_path();
  if (!o.shard.empty()) parse_shard("--shard", o.shard, ::getenv);
  if (!o.tune_only) check_outputs(o);
  Pack::open(o.model);
  if (!o.chat_template.empty())
    read_input_text(o.chat_template, "the chat template", InputFile::kRegularOnly);
  // note: stdin, a pipe or a FIFO is read once, by the run
  if (o.tune_only || reads_once(o.batch)) return;
  const std::string batch_text = read_input_text(o.batch, "the batch file");
  refuse_empty_batch(o.batch, split_lines(batch_text));
}

GenerateSummary run_generate(const GenerateOptions& o) {
  const auto start = Clock::now();
  const DeviceChoice dev = resolve_device(o);
  check_flags(o);
  if (o.tune_only) {
    // --tune-only: the model and its GEMM plans, no prompts and no output.
    LoadedModel m;
    load(o, dev, m);
    m.backend->tune_only();
    return {};
  }
  const bool sharded = !o.shard.empty();
  const ShardSpec shard = sharded ? parse_shard("--shard", o.shard, ::getenv) : ShardSpec{};
  if (sharded && o.out == "-")
    fail("--shard: expected --out FILE (a shard's results must be resumable and merged)");
  // Nothing is opened for writing before the output is known to be safe to
  // write and ours alone.
  const bool to_stdout = o.out == "-";
  if (!to_stdout) refuse_parts_of_another_count(o.out, 1);
  const ResultsPaths paths = ResultsPaths::of(o.out, o.meta);
  // note: SIGINT/SIGTERM/SIGHUP are recorded and acted on between steps:
  // the lines done stay in OUT.partial, its header says "interrupted", the
  // lock goes, and main re-raises the signal. Installed before the lock, so
  // the lock leaves the signals to it.
  InterruptScope interrupts(InterruptScope::Syscalls::kRestarted);
  std::optional<OutputLock> lock;
  const ResumeSource source = claim_outputs(o, paths, sharded, lock);
  // What the run may replace when it completes: what is there now (or,
  // with --force, anything).
  const OutputsAtStart at_start = OutputsAtStart::of(paths, o.force);

  LoadedModel m;
  load(o, dev, m);
  check_interrupted(fmt::format("{}: loading {}", o.out, o.model));
  const ModelConfig& cfg = m.pack->config();
  const ChatTemplateSetup chat = load_chat_template(o, *m.pack);

  // Parse every input line first: ids are needed for --resume, and sizes for the cache.
  // note: a signal stops the wait for a pipe's or a FIFO's prompts (read_input_text).
  const std::string batch_text = read_input_text(o.batch, "the batch file");
  const auto raw_lines = split_lines(batch_text);
  refuse_empty_batch(o.batch, raw_lines);
  const PromptDefaults defaults = prompt_defaults(o, m, chat);
  std::vector<PromptLine> lines = parse_lines(raw_lines, defaults);
  // note: over the whole batch, before sharding, so that every shard of
  // one job records the same template.
  const bool any_chat =
      std::any_of(lines.begin(), lines.end(), [](const PromptLine& l) { return l.is_chat; });
  const int64_t lines_total = static_cast<int64_t>(lines.size());
  if (sharded) keep_shard_lines(lines, shard);

  SchedulerOptions so = size_cache(o, cfg, m.model->cache_spec(), lines);
  if (dev.device == "cpu") fit_cpu_cache(o, m.model->cache_spec(), cfg, lines, so);
  Scheduler sched(*m.model, so);
  // Refuse up front what can never fit (context or cache); it gets an error line.
  for (auto& l : lines) {
    if (!l.error.empty()) continue;
    if (auto why = sched.check_fits(l.request); !why.empty()) {
      l.error = fmt::format("line {}: {}", l.line_no, why);
    }
  }
  note_context_capped(lines, cfg.max_position_embeddings);

  nlohmann::json meta = run_header(o, dev, m, defaults, so, raw_lines, lines,
                                   any_chat ? chat.describe() : nlohmann::json());
  if (sharded) {
    meta["shard"] = shard_json(
        shard, lines_total, "xxh64:" + checksum_hex(xxh64(batch_text.data(), batch_text.size())));
  }
  if (source.resume) check_same_shard(source, meta);
  ResumePoint rp;
  if (source.resume) {
    rp = check_resume(source, meta, lines, o.batch, cfg.vocab_size);
    meta["resumed_from"] = rp.earlier;
  }
  // note: resuming a complete OUT (a retried shard task, a repeated
  // command) does nothing: its results and header stay as that run left
  // them, statistics included.
  if (source.resume && source.path == paths.out && rp.lines_done == lines.size()) {
    if (sharded) {
      std::fprintf(stderr, "generate: shard %lld/%lld of %s is already complete in %s\n",
                   static_cast<long long>(shard.index), static_cast<long long>(shard.count),
                   o.batch.c_str(), o.out.c_str());
    } else {
      std::fprintf(stderr, "generate: %s is already complete (every line of %s); left as it is\n",
                   o.out.c_str(), o.batch.c_str());
    }
    GenerateSummary s = summary_of(lines, static_cast<int64_t>(lines.size()), rp.run_error_lines);
    s.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return s;
  }
  std::optional<ResultsWriter> out;
  if (to_stdout) {
    out.emplace(STDOUT_FILENO, o.meta, meta, o.force);
  } else if (source.resume) {
    out.emplace(paths, source, at_start, meta, rp.keep_bytes);
  } else {
    out.emplace(paths, at_start, meta);
  }
  const auto t0 = Clock::now();
  LinesWritten written;
  // note: the line and token counts cover the whole file as it stands (the
  // kept lines' tokens from their records after --resume, the result lines
  // of this invocation as written; an error line's tokens are not in the
  // file and not counted), so they can be checked against it and a merge
  // adds them up; steps, seconds and the other counts are this invocation's
  // work (the earlier ones' in resumed_from).
  auto stats_now = [&](int64_t lines_in_file) {
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    nlohmann::json stats = run_stats(sched.stats(), lines_in_file, rp.lines_done, sec, m);
    stats["context_capped_lines"] = std::count_if(
        lines.begin(), lines.begin() + lines_in_file,
        [&](const PromptLine& l) { return context_capped(l, cfg.max_position_embeddings); });
    stats["prompt_tokens"] = rp.kept_prompt_tokens + written.prompt_tokens;
    stats["generated_tokens"] = rp.kept_generated_tokens + written.generated_tokens;
    return stats;
  };
  try {
    run_lines(o, lines, rp.lines_done, sched, m.tokenizer, *out, cfg.max_position_embeddings,
              m.load_start, &m.first_token_seconds, written);
    // The device's header entries (cuda: the plan cache written, "gemm_plan"
    // and "startup"; none on the CPU).
    nlohmann::json entries = nlohmann::json::object();
    m.backend->finish(entries);
    for (const auto& [key, value] : entries.items()) out->set_header(key, value);
    out->complete(stats_now(static_cast<int64_t>(lines.size())));
  } catch (const std::exception& e) {
    // (the lines the partial file holds now, for the header resumed_from keeps)
    out->set_failure(e.what(), stats_now(static_cast<int64_t>(rp.lines_done) + written.lines));
    throw;
  }
  const int64_t run_failed = rp.run_error_lines + written.failed;
  GenerateSummary s = summary_of(lines, static_cast<int64_t>(rp.lines_done), run_failed);
  s.prompt_tokens = sched.stats().prompt_tokens;
  s.generated_tokens = sched.stats().generated_tokens;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return s;
}

}  // namespace qtk
