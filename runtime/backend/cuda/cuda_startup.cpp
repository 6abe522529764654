#include "runtime/backend/cuda/cuda_startup.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "pack/pack.h"
#include "runtime/backend/cuda/cuda_model.h"
#include "runtime/backend/cuda/process_memory.h"
#include "runtime/scheduler.h"

#ifndef QTK_GEMM_SOURCES_DIGEST
#error "QTK_GEMM_SOURCES_DIGEST is set by runtime/backend/cuda/CMakeLists.txt"
#endif

namespace qtk {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The model's GEMM dimensions (and precision): what decides its shape
// classes. Two packs with the same text share a cache file.
std::string model_shapes(const ModelConfig& c, const std::string& precision) {
  return fmt::format(
      "{} {}: vocab {} hidden {} intermediate {} heads {}/{} head_dim {} output_gate {} "
      "linear heads {}/{} dims {}/{}",
      c.model_type, precision, c.vocab_size, c.hidden_size, c.intermediate_size,
      c.num_attention_heads, c.num_kv_heads, c.head_dim, c.attn_output_gate ? 1 : 0,
      c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
      c.linear_value_head_dim);
}

PlanCacheKey current_key(const cuda::Gemm& gemm, const ModelConfig& c,
                         const std::string& precision) {
  PlanCacheKey k;
  int dev = 0;
  cudaDeviceProp prop{};
  QTK_CUDA_CHECK(cudaGetDevice(&dev));
  QTK_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  k.gpu = prop.name;
  k.compute_capability = fmt::format("{}.{}", prop.major, prop.minor);
  int driver = 0, runtime = 0;
  QTK_CUDA_CHECK(cudaDriverGetVersion(&driver));
  QTK_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  k.driver = driver;
  k.cuda_runtime = runtime;
  k.cublaslt = static_cast<int64_t>(cublasLtGetVersion());
  // note: the digest covers the sources of the GEMM wrapper and of the own
  // skinny kernel (runtime/backend/cuda/CMakeLists.txt): an edit there may change
  // which kernels are bit-equal or how a range is decided. The toolkit the
  // kernel was compiled with is part of it too, and so is the number of K
  // slices (QTK_GEMM_SLICES: another plan algorithm and own-kernel form).
  k.kernels = fmt::format("{} cuda {}{}", QTK_GEMM_SOURCES_DIGEST, CUDART_VERSION,
                          gemm.slices() > 1 ? fmt::format(" slices {}", gemm.slices()) : "");
  k.ref_m = gemm.ref_m();
  k.model = model_shapes(c, precision);
  return k;
}

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
ShapeKey shape_of(const cuda::GemmPlanRecord& r) {
  return {r.n, r.k, r.ldx, r.ldw, r.ldy, static_cast<int>(r.in), static_cast<int>(r.out)};
}

}  // namespace

void tune_remaining_gemm_ranges(CudaModel& model) {
  cuda::Gemm* gemm = model.gemm();
  if (gemm == nullptr) return;
  cudaStream_t stream = nullptr;
  QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    gemm->tune_remaining(stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  QTK_CUDA_CHECK(cudaStreamSynchronize(stream));
  QTK_CUDA_CHECK(cudaStreamDestroy(stream));
}

CudaStartup::CudaStartup(CudaModel& model, const Pack& pack, const std::string& precision,
                         const std::string& plan_cache)
    : model_(model), pack_digest_(pack.digest()) {
  cuda::Gemm* gemm = model.gemm();
  if (plan_cache == "off") {
    off_reason_ = "--plan-cache off";
    return;
  }
  if (gemm == nullptr) {
    off_reason_ = "this model's GEMMs are not tuned";
    return;
  }
  if (gemm->free_mode()) {
    off_reason_ = "QTK_GEMM_FREE=1 (cuBLASLt's pick per call: nothing is tuned)";
    std::fprintf(stderr,
                 "generate: warning: QTK_GEMM_FREE=1: the GEMMs take cuBLASLt's algorithm for "
                 "each call's batch; results then depend on the batch (a measurement mode)\n");
    return;
  }
  if (!gemm->alternates()) {
    off_reason_ = "QTK_GEMM_ALTS=0 (one algorithm per shape: nothing is tuned)";
    return;
  }
  key_ = current_key(*gemm, model.config(), precision);
  if (plan_cache.empty()) {
    const std::string dir = default_plan_cache_dir();
    if (dir.empty()) {
      off_reason_ = "no default location (neither XDG_CACHE_HOME nor HOME is set)";
      std::fprintf(stderr,
                   "generate: no GEMM plan cache: neither XDG_CACHE_HOME nor HOME is set "
                   "(--plan-cache PATH names a file); tuning from scratch\n");
      return;
    }
    path_ = dir + "/" + plan_cache_file_name(key_);
  } else {
    path_ = plan_cache;
  }
  const auto t0 = Clock::now();
  load_ = load_plan_cache(path_, key_);
  read_seconds_ = seconds_since(t0);
  if (!load_.used) {
    std::fprintf(stderr, "generate: %s\n", load_.note.c_str());
    return;
  }
  gemm->preload(load_.plans);
}

void CudaStartup::run_tuning_request(Model& model) {
  const ModelConfig& c = model.config();
  // note: 2 new tokens after the prompt: one prefill step and one decode
  // step (bf16 Qwen3.5 takes prompts of 64+ tokens through the chunked GDN
  // path). The GEMM shape classes do not depend on the step's rows, so these
  // meet them all; tune_remaining then decides every range of each.
  const int64_t new_tokens = 2;
  const int64_t prompt = std::clamp<int64_t>(c.max_position_embeddings - new_tokens, 1, 128);
  SequenceRequest r;
  for (int64_t i = 0; i < prompt; ++i)
    r.prompt.push_back(static_cast<int32_t>((i * 7919 + 17) % std::max<int64_t>(c.vocab_size, 1)));
  r.max_tokens = new_tokens;
  SchedulerOptions so;
  so.max_num_seqs = 1;
  so.max_batched_tokens = 512;
  so.block_size = 16;
  so.max_context = prompt + new_tokens;
  so.num_blocks = (so.max_context + so.block_size - 1) / so.block_size + 1;
  Scheduler sched(model, so);
  if (const std::string why = sched.check_fits(r); !why.empty())
    fail("--tune-only: the tuning request does not fit this model: {}", why);
  sched.add(std::move(r));
  std::vector<int64_t> finished;
  while (sched.has_work()) {
    finished.clear();
    sched.step(finished);
  }
}

bool CudaStartup::tunes() {
  const cuda::Gemm* gemm = model_.gemm();
  return gemm != nullptr && gemm->alternates();
}

void CudaStartup::tune_remaining() { tune_remaining_gemm_ranges(model_); }

void CudaStartup::tune_only() {
  if (tunes()) {
    run_tuning_request(model_);
    tune_remaining();
  }
  save_and_report();
}

void CudaStartup::save_and_report() {
  save();
  const nlohmann::json pm = plan_meta();
  const std::string where = written_        ? fmt::format("written to {}", path_)
                            : path_.empty() ? fmt::format("not written: {}", off_reason_)
                                            : fmt::format("{} already held every range", path_);
  std::fprintf(stderr,
               "generate: --tune-only: %lld M ranges tuned, %lld taken from the cache; %s\n",
               static_cast<long long>(pm["ranges_tuned"].get<int64_t>()),
               static_cast<long long>(pm["ranges_cached"].get<int64_t>()), where.c_str());
}

void CudaStartup::finish(nlohmann::json& meta) {
  const cuda::Gemm* gemm = model_.gemm();
  if (gemm != nullptr && load_.used && gemm->stats().records_stale > 0)
    std::fprintf(stderr,
                 "generate: %s: %lld records did not apply here (another plan algorithm, or an "
                 "alternate cuBLASLt refused); those were tuned, and the file is updated\n",
                 path_.c_str(), static_cast<long long>(gemm->stats().records_stale));
  save();
  meta["gemm_plan"] = plan_meta();
  meta["startup"] = startup_meta();
}

void CudaStartup::save() {
  cuda::Gemm* gemm = model_.gemm();
  if (path_.empty() || gemm == nullptr) return;
  const cuda::GemmTuneStats& st = gemm->stats();
  // Nothing new: the file already holds every decision this run used.
  if (st.ranges_tuned == 0 && st.records_stale == 0 && load_.used) return;
  PlanCacheContents c;
  c.key = key_;
  c.pack_digest = pack_digest_;
  c.tool_version = QTK_VERSION;
  c.plans = gemm->records();
  // note: another run may have written the file since this one read it;
  // its records for shape classes this run has none of are kept.
  const PlanCacheLoad now = load_plan_cache(path_, key_);
  if (now.used) {
    std::map<ShapeKey, bool> have;
    for (const auto& p : c.plans) have[shape_of(p)] = true;
    for (const auto& p : now.plans)
      if (!have.count(shape_of(p))) c.plans.push_back(p);
  }
  if (c.plans.empty()) return;
  try {
    write_plan_cache(path_, c);
    written_ = true;
  } catch (const Error& e) {
    write_error_ = e.what();
    std::fprintf(stderr, "generate: warning: the GEMM plan cache was not saved: %s\n",
                 write_error_.c_str());
  }
}

nlohmann::json CudaStartup::plan_meta() const {
  const cuda::Gemm* gemm = model_.gemm();
  const cuda::GemmTuneStats st = gemm != nullptr ? gemm->stats() : cuda::GemmTuneStats{};
  const char* source = st.ranges_cached == 0  ? "tuned"
                       : st.ranges_tuned == 0 ? "cached"
                                              : "cached+tuned";
  nlohmann::json j = {{"cache", path_.empty() ? "off" : path_},
                      {"source", source},
                      {"ranges_cached", st.ranges_cached},
                      {"ranges_tuned", st.ranges_tuned},
                      {"records_stale", st.records_stale}};
  if (!path_.empty()) {
    j["key"] = plan_cache_key_json(key_);
    j["file_used"] = load_.used;
    if (!load_.used) j["note"] = load_.note;
    j["written"] = written_;
    if (!write_error_.empty()) j["write_error"] = write_error_;
  } else {
    j["off_reason"] = off_reason_;
  }
  return j;
}

nlohmann::json CudaStartup::startup_meta() const {
  const cuda::Gemm* gemm = model_.gemm();
  const CudaLoadTimes& lt = model_.load_times;
  const ProcessMemory end = process_memory();
  // note: where the host memory goes: resident after the CUDA context, after
  // the upload (split into anonymous memory and mapped files), and at the
  // end (with the peak). Mapped files are the libraries' pages (cuBLASLt's
  // kernels are most of them) and pack pages not handed back yet.
  const nlohmann::json rss = {{"after_cuda_init_bytes", lt.rss_after_init_bytes},
                              {"after_upload_bytes", lt.rss_after_upload_bytes},
                              {"after_upload_anon_bytes", lt.anon_after_upload_bytes},
                              {"after_upload_file_bytes", lt.file_after_upload_bytes},
                              {"end_bytes", end.rss_bytes},
                              {"end_anon_bytes", end.anon_bytes},
                              {"end_file_bytes", end.file_bytes},
                              {"peak_bytes", end.hwm_bytes}};
  return {{"rss", rss},
          {"cuda_init_seconds", model_.load_times.init_seconds},
          {"upload_seconds", model_.load_times.upload_seconds},
          {"plan_cache_read_seconds", read_seconds_},
          {"gemm_tuning_seconds", gemm != nullptr ? gemm->stats().seconds : 0.0},
          {"graph_capture_seconds", model_.graph_capture_seconds()},
          {"graphs_captured", model_.graphs_captured()}};
}

}  // namespace qtk
