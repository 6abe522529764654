#include "runtime/generate.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"
#include "loaders/error.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "runtime/pack.h"
#include "runtime/prompt_jsonl.h"
#include "runtime/scheduler.h"
#include "tokenizer/tokenizer.h"

#ifdef QTK_HAVE_CUDA
#include "runtime/cuda/cuda_model.h"
#endif

namespace qtk {

namespace {

using Clock = std::chrono::steady_clock;

int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // note: Linux reports KiB
}

int default_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno(fmt::format("{}: cannot open {} for reading", path, what));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail_errno(fmt::format("{}: cannot read {}", path, what));
  return ss.str();
}

// Splits into lines; a final line without '\n' counts, a final empty one does not.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

// Writes `data` with one write(2) (retrying only the rest of a short write).
void write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt::format("{}: write failed", path));
    }
    done += static_cast<size_t>(n);
  }
}

// Replaces `path` atomically: a temp file in the same directory, fsync, rename.
void write_file_atomic(const std::string& path, const std::string& data) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create", tmp));
  try {
    write_all(fd, data, tmp);
    if (::fsync(fd) != 0) fail_errno(fmt::format("{}: fsync failed", tmp));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail_errno(fmt::format("{}: cannot rename the temp file into place", path));
  }
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
#ifdef QTK_HAVE_CUDA
    const std::string p = o.precision.empty() ? "bf16" : o.precision;
    if (!cuda_device_available()) {
      fail(
          "--device cuda: no CUDA device is available (no NVIDIA GPU, or no driver, on this "
          "machine)");
    }
    return {"cuda", p};
#else
    fail(
        "--device cuda: this build has no CUDA backend (expected a build configured with "
        "-DQTK_CUDA=ON where nvcc exists; this one runs --device cpu only)");
#endif
  }
  fail("--device: expected cpu or cuda, found '{}'", o.device);
}

// What an FP8 pack's matrices compute, for the run header ("" for others).
std::string fp8_text(const Pack& pack) {
  if (pack.fp8_tensors().empty()) return "";
  std::set<int64_t> rows;
  for (const auto& q : pack.fp8_tensors()) rows.insert(q.block_rows);
  std::string r;
  for (int64_t x : rows) r += fmt::format("{}{}", r.empty() ? "" : " or ", x);
  return fmt::format(
      "; F8_E4M3 (e4m3fn) weights read in place with float32 block scales (blocks of {} rows x "
      "{} columns), each weight computed as the float32 product fp8 x scale",
      r, pack.fp8_tensors().front().block_cols);
}

// The run header's description of the arithmetic.
std::string precision_text(const DeviceChoice& d, const Pack& pack) {
  if (d.device == "cpu") {
    return fmt::format(
        "float32 activations, float32 KV cache and state, {} weights, float32 accumulation{}",
        weight_dtypes(pack), fp8_text(pack));
  }
  if (d.precision == "f32") {
    return fmt::format(
        "CUDA: float32 weights (from {} at upload), activations, KV cache and state, "
        "float32 accumulation",
        weight_dtypes(pack));
  }
  return fmt::format(
      "CUDA: bfloat16 weights (from {} at upload), activations and KV cache; float32 "
      "accumulation, norms and GDN state",
      weight_dtypes(pack));
}

class Progress {
 public:
  Progress(bool on, int64_t total) : on_(on), total_(total), start_(Clock::now()), last_(start_) {}
  void update(int64_t done, const SchedulerStats& st, bool final) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!final && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double sec = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double eta =
        done > 0 ? sec * static_cast<double>(total_ - done) / static_cast<double>(done) : 0.0;
    const std::string eta_text = done > 0 ? fmt::format("{:.0f}s", eta) : std::string("?");
    std::fprintf(
        stderr, "\rgenerate: %lld/%lld done | prompt %.0f tok/s | gen %.0f tok/s | ETA %s   %s",
        static_cast<long long>(done), static_cast<long long>(total_),
        static_cast<double>(st.prompt_tokens) / sec, static_cast<double>(st.generated_tokens) / sec,
        eta_text.c_str(), final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool on_;
  int64_t total_;
  Clock::time_point start_, last_;
};

}  // namespace

void run_generate(const GenerateOptions& o) {
  const DeviceChoice dev = resolve_device(o);
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

  const auto load_start = Clock::now();
  auto pack = Pack::open(o.model);
  const ModelConfig& cfg = pack->config();
  if (dev.device != "cpu" && !pack->fp8_tensors().empty()) {
    fail(
        "{}: holds {} F8_E4M3 weight tensors; --device {} does not run FP8 packs yet (expected "
        "--device cpu, or a pack converted with --dtype bf16 or f32)",
        o.model, pack->fp8_tensors().size(), dev.device);
  }
  std::optional<Tokenizer> tokenizer;
  if (auto tj = pack->entry("tokenizer.json")) {
    tokenizer = Tokenizer::from_json_text(*tj, o.model + ":tokenizer.json");
  }
  const int threads = o.threads > 0 ? o.threads : default_threads();
  // note: the pool outlives the model that holds a pointer to it.
  std::optional<ThreadPool> pool;
  std::unique_ptr<Model> model;
  std::string device_name = "cpu";
#ifdef QTK_HAVE_CUDA
  if (dev.device == "cuda") {
    model = load_cuda_model(*pack, parse_cuda_precision(dev.precision));
    device_name = cuda_device_name();
  }
#endif
  if (!model) {
    pool.emplace(threads);
    model = load_model(*pack, &*pool);
  }
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();

  // Parse every input line first: ids are needed for --resume, and sizes for the cache.
  const std::string batch_text = read_file(o.batch, "the batch file");
  const auto raw_lines = split_lines(batch_text);
  PromptDefaults defaults;
  defaults.max_tokens = o.max_tokens > 0 ? o.max_tokens : pack_max_new_tokens(*pack);
  defaults.ignore_eos = o.ignore_eos;
  for (int64_t e : cfg.eos_token_ids) defaults.eos_ids.push_back(static_cast<int32_t>(e));
  defaults.vocab_size = cfg.vocab_size;
  defaults.max_context = cfg.max_position_embeddings;
  defaults.allow_mrope = !cfg.rope.mrope_section.empty();
  defaults.tokenizer = tokenizer ? &*tokenizer : nullptr;
  std::vector<PromptLine> lines;
  lines.reserve(raw_lines.size());
  std::set<std::string> ids_seen;
  for (size_t i = 0; i < raw_lines.size(); ++i) {
    lines.push_back(parse_prompt_line(raw_lines[i], static_cast<int64_t>(i) + 1, defaults));
    PromptLine& l = lines.back();
    if (!ids_seen.insert(l.id.dump()).second && l.error.empty()) {
      l.error = fmt::format("duplicate id {} (ids must be unique within a batch)", l.id.dump());
    }
  }

  // Size the cache: enough for max_num_seqs of the longest request, within the budget.
  const CacheSpec spec = model->cache_spec();
  int64_t longest = 1, all_blocks = 0;
  for (const auto& l : lines) {
    if (!l.error.empty()) continue;
    const int64_t n = std::min(static_cast<int64_t>(l.request.prompt.size()) + l.request.max_tokens,
                               cfg.max_position_embeddings);
    longest = std::max(longest, n);
    all_blocks += (n + o.block_size - 1) / o.block_size;
  }
  SchedulerOptions so;
  so.max_num_seqs = o.max_num_seqs;
  so.max_batched_tokens = o.max_batched_tokens;
  so.block_size = o.block_size;
  so.max_context = cfg.max_position_embeddings;
  const int64_t blocks_per_seq = (longest + o.block_size - 1) / o.block_size;
  if (o.kv_cache_blocks > 0) {
    so.num_blocks = o.kv_cache_blocks;
  } else {
    const int64_t bb = std::max<int64_t>(1, KvCache::block_bytes(spec, o.block_size));
    // note: never more than every request at once needs (fewer prompts than
    // --max-num-seqs, or shorter ones than the longest): the cache is zeroed
    // at allocation, and a worst-case size cost seconds of page faults.
    const int64_t needed = std::min(all_blocks, blocks_per_seq * o.max_num_seqs);
    so.num_blocks = std::max(blocks_per_seq, std::min(o.kv_cache_bytes / bb, needed));
  }
  // note: the per-sequence block table never needs more than the longest request.
  so.max_context = std::min<int64_t>(so.max_context, std::max<int64_t>(longest, 2));
  Scheduler sched(*model, so);
  // Refuse up front what can never fit (context or cache); it gets an error line.
  for (auto& l : lines) {
    if (!l.error.empty()) continue;
    if (auto why = sched.check_fits(l.request); !why.empty()) l.error = why;
  }

  // Output: fresh, or resumed after the complete lines already written.
  const std::string meta_path = o.out + ".meta.json";
  nlohmann::json settings = {{"max_tokens_default", defaults.max_tokens},
                             {"ignore_eos", o.ignore_eos},
                             {"margins", o.margins},
                             {"max_num_seqs", o.max_num_seqs},
                             {"max_batched_tokens", o.max_batched_tokens},
                             {"block_size", o.block_size},
                             {"kv_cache_blocks", so.num_blocks},
                             {"kv_cache_blocks_flag", o.kv_cache_blocks},
                             {"threads", threads},
                             {"device", dev.device},
                             {"precision", dev.precision}};
  nlohmann::json meta = {
      {"tool", "qtk generate"},
      {"tool_version", QTK_VERSION},
      {"pack",
       {{"path", o.model}, {"digest", pack->digest()}, {"architecture", cfg.hf_architecture}}},
      {"batch", o.batch},
      {"device", device_name},
      {"precision", precision_text(dev, *pack)},
      {"settings", settings}};

  size_t skip = 0;
  int fd = -1;
  if (o.resume && ::access(o.out.c_str(), F_OK) == 0) {
    nlohmann::json old =
        nlohmann::json::parse(read_file(meta_path, "the run header"), nullptr, false);
    if (old.is_discarded() || !old.is_object()) {
      fail("{}: cannot resume: the run header is missing or malformed", meta_path);
    }
    auto same = [&](const nlohmann::json& a, const nlohmann::json& b) { return a == b; };
    if (!same(old.value("/pack/digest"_json_pointer, nlohmann::json()), meta["pack"]["digest"])) {
      fail("{}: cannot resume: the results were made with pack digest {}, this pack has {}",
           meta_path, old.value("/pack/digest"_json_pointer, nlohmann::json()).dump(),
           pack->digest());
    }
    // note: device and precision change the arithmetic, hence the results.
    for (const char* key : {"max_tokens_default", "ignore_eos", "margins", "device", "precision"}) {
      const auto was = old.value(nlohmann::json::json_pointer(std::string("/settings/") + key),
                                 nlohmann::json());
      if (!same(was, settings[key])) {
        fail("{}: cannot resume: setting '{}' was {}, now {} (it changes the results)", meta_path,
             key, was.dump(), settings[key].dump());
      }
    }
    const std::string existing = read_file(o.out, "the results");
    const size_t keep = existing.rfind('\n') == std::string::npos ? 0 : existing.rfind('\n') + 1;
    const auto done_lines = split_lines(std::string_view(existing).substr(0, keep));
    if (done_lines.size() > lines.size()) {
      fail("{}: cannot resume: it has {} lines but {} has only {}", o.out, done_lines.size(),
           o.batch, lines.size());
    }
    for (size_t i = 0; i < done_lines.size(); ++i) {
      nlohmann::json j = nlohmann::json::parse(done_lines[i], nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || j["id"] != lines[i].id) {
        fail("{}: cannot resume: line {} is not the result of {} line {} (id {})", o.out, i + 1,
             o.batch, i + 1, lines[i].id.dump());
      }
    }
    skip = done_lines.size();
    meta["status"] = "running";
    write_file_atomic(meta_path, meta.dump(2) + "\n");
    fd = ::open(o.out.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail_errno(fmt::format("{}: cannot open for appending", o.out));
    // Drop a trailing partial line left by a kill.
    if (::ftruncate(fd, static_cast<off_t>(keep)) != 0 || ::lseek(fd, 0, SEEK_END) < 0) {
      ::close(fd);
      fail_errno(fmt::format("{}: cannot truncate the partial last line", o.out));
    }
  } else {
    // note: the run header is written before the results file exists, so a
    // killed run always leaves a header for --resume to check.
    meta["status"] = "running";
    write_file_atomic(meta_path, meta.dump(2) + "\n");
    fd = ::open(o.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail_errno(fmt::format("{}: cannot create", o.out));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  // Schedule everything not yet written.
  std::vector<int64_t> line_of;  // handle -> input line index
  for (size_t i = skip; i < lines.size(); ++i) {
    if (!lines[i].error.empty()) continue;
    const int64_t h = sched.add(lines[i].request);
    if (h != static_cast<int64_t>(line_of.size()))
      fail("generate: internal error: unexpected handle {}", h);
    line_of.push_back(static_cast<int64_t>(i));
  }
  std::vector<std::optional<SequenceResult>> results(lines.size());
  size_t next = skip;
  const auto t0 = Clock::now();
  Progress progress(o.progress || ::isatty(2), static_cast<int64_t>(lines.size() - skip));
  int64_t done = 0;

  auto flush = [&]() {
    while (next < lines.size()) {
      const PromptLine& l = lines[next];
      std::string line;
      if (!l.error.empty()) {
        line = error_line(l.id, l.error);
      } else if (results[next]) {
        const SequenceResult& r = *results[next];
        std::string text;
        if (tokenizer) {
          // note: output_text leaves out a final stop token (it is in output_token_ids).
          size_t n = r.output.size() - (r.stopped ? 1 : 0);
          text = tokenizer->decode(std::span<const int32_t>(r.output.data(), n));
        }
        line = result_line(l.id, l.request.prompt, r.output, r.stopped, tokenizer ? &text : nullptr,
                           o.margins ? &r.margins : nullptr);
        if (o.show) {
          const std::string prompt_text = tokenizer
                                              ? tokenizer->decode(l.request.prompt)
                                              : fmt::format("{}", fmt::join(l.request.prompt, " "));
          const std::string cont = tokenizer ? text : fmt::format("{}", fmt::join(r.output, " "));
          // The continuation in bold on a terminal.
          const bool tty = ::isatty(1);
          std::fprintf(stdout, "=== %s\n%s%s%s%s\n", l.id.dump().c_str(), prompt_text.c_str(),
                       tty ? "\033[1m" : "", cont.c_str(), tty ? "\033[0m" : "");
          std::fflush(stdout);
        }
        results[next].reset();
      } else {
        break;
      }
      line += '\n';
      write_all(fd, line, o.out);
      ++next;
      ++done;
    }
  };

  flush();
  std::vector<int64_t> finished;
  while (sched.has_work()) {
    finished.clear();
    sched.step(finished);
    for (int64_t h : finished) {
      results[line_of[h]] = sched.take_result(h);
    }
    flush();
    progress.update(done, sched.stats(), false);
  }
  flush();
  progress.update(done, sched.stats(), true);
  if (::fsync(fd) != 0) fail_errno(fmt::format("{}: fsync failed", o.out));

  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto& st = sched.stats();
  meta["status"] = "complete";
  meta["stats"] = {{"lines", lines.size()},
                   {"resumed_after_lines", skip},
                   {"steps", st.steps},
                   {"preemptions", st.preemptions},
                   {"prompt_tokens", st.prompt_tokens},
                   {"generated_tokens", st.generated_tokens},
                   {"recomputed_tokens", st.recomputed_tokens},
                   {"seconds", sec},
                   {"prompt_tokens_computed", st.prompt_tokens_computed},
                   {"decode_tokens", st.decode_tokens},
                   {"prefill_seconds", st.prefill_seconds},
                   {"decode_seconds", st.decode_seconds},
                   {"load_seconds", load_seconds},
                   {"peak_rss_bytes", peak_rss_bytes()},
                   {"cpu_path", std::string(cpu_path_name(active_cpu_path()))}};
  write_file_atomic(meta_path, meta.dump(2) + "\n");
}

}  // namespace qtk
