// Qwen3 (dense) on the GPU: the forward pass of runtime/qwen3.cpp with the
// CUDA kernels, weights uploaded once, K/V cache in device memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm.h"
#include "core/error.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/cuda_models.h"
#include "runtime/cuda/decode_graphs.h"
#include "runtime/cuda/device_memory.h"
#include "runtime/cuda/device_upload.h"
#include "runtime/cuda/fused_steps.h"
#include "runtime/cuda/process_memory.h"
#include "runtime/cuda/step_io.h"
#include "runtime/kv_cache.h"
#include "pack/pack.h"

namespace qtk {
namespace {

using cuda::bf16;
using cuda::DeviceMemory;
using cuda::dtype_of;
using cuda::ensure;
using cuda::upload_matrix;
using cuda::upload_vector;

// One decoder layer in device memory; Act = the precision's activation and
// matrix type (f32 or bf16).
struct Qwen3DeviceLayer {
  DeviceMemory input_layernorm;           // f32 [hidden]
  DeviceMemory qkv_proj;                  // Act [(Hq + 2*Hkv)*head_dim, hidden]: rows q, k, v
  DeviceMemory q_norm, k_norm;            // f32 [head_dim]
  DeviceMemory o_proj;                    // Act [hidden, Hq*head_dim]
  DeviceMemory post_attention_layernorm;  // f32 [hidden]
  DeviceMemory gate_up_proj;              // Act [2*intermediate, hidden]: rows gate, up
  DeviceMemory down_proj;                 // Act [hidden, intermediate]
};

template <class Act>
class CudaQwen3 final : public CudaModel {
 public:
  explicit CudaQwen3(const Pack& pack) : cfg_(pack.config()) {
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    QTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    embed_ = upload_matrix<Act>(pack, "embed_tokens", c.vocab_size, H);
    tied_ = pack.find_tensor("lm_head") == nullptr;
    if (!tied_) lm_head_ = upload_matrix<Act>(pack, "lm_head", c.vocab_size, H);
    norm_ = upload_vector(pack, "norm", H);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      Qwen3DeviceLayer l;
      l.input_layernorm = upload_vector(pack, p + "input_layernorm", H);
      l.qkv_proj =
          upload_matrix<Act>(pack, p + "self_attn.qkv_proj", c.q_dim() + 2 * c.kv_dim(), H);
      l.q_norm = upload_vector(pack, p + "self_attn.q_norm", D);
      l.k_norm = upload_vector(pack, p + "self_attn.k_norm", D);
      l.o_proj = upload_matrix<Act>(pack, p + "self_attn.o_proj", H, c.q_dim());
      l.post_attention_layernorm = upload_vector(pack, p + "post_attention_layernorm", H);
      l.gate_up_proj = upload_matrix<Act>(pack, p + "mlp.gate_up_proj", 2 * I, H);
      l.down_proj = upload_matrix<Act>(pack, p + "mlp.down_proj", H, I);
      layers_.push_back(std::move(l));
    }
    rope_.rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : D;
    rope_.theta = c.rope.theta;
  }
  ~CudaQwen3() override { cudaStreamDestroy(stream_); }

  const ModelConfig& config() const override { return cfg_; }
  cuda::Gemm* gemm() override { return &gemm_; }
  int64_t graphs_captured() const override { return graphs_.captured(); }
  double graph_capture_seconds() const override { return graphs_.capture_seconds(); }

  CacheSpec cache_spec() const override {
    CacheSpec s;
    s.attention_layers = cfg_.num_layers;
    s.kv_heads = cfg_.num_kv_heads;
    s.head_dim = cfg_.head_dim;
    return s;
  }

  void reserve(int64_t max_tokens, int64_t max_seqs, int64_t max_context) override {
    const ModelConfig& c = cfg_;
    const int64_t T = std::max<int64_t>(max_tokens, max_seqs);
    bool grew = false;
    grew |= ensure(x_, T * c.hidden_size * sizeof(T_));
    grew |= ensure(x2_, T * c.hidden_size * sizeof(T_));
    grew |= ensure(h_, T * c.hidden_size * sizeof(T_));
    grew |= ensure(qkv_, T * (c.q_dim() + 2 * c.kv_dim()) * sizeof(T_));
    grew |= ensure(attn_, T * c.q_dim() * sizeof(T_));
    grew |= ensure(gate_up_, T * 2 * c.intermediate_size * sizeof(T_));
    grew |= ensure(act_, T * c.intermediate_size * sizeof(T_));
    grew |= ensure(last_, max_seqs * c.hidden_size * sizeof(T_));
    grew |= ensure(logits_, max_seqs * c.vocab_size * sizeof(float));
    grew |= greedy_.reserve(max_seqs);
    if constexpr (std::is_same_v<T_, cuda::bf16>) {
      // Decode steps (padded to power-of-two buckets) may split each row's
      // key tiles over blocks: cuda::AttentionBatch::partials.
      grew |=
          cuda::ensure_attention_partials(partials_, partial_rows_, cuda::decode_bucket(max_seqs),
                                          c.num_attention_heads, c.head_dim);
    }
    grew |= cuda::ensure_rope_table(rope_table_, rope_, max_context, stream_);
    if (grew) graphs_.clear();
    max_context_ = std::max(max_context_, max_context);
  }

  void forward(const StepBatch& step, KvCache& kv, StatePool& /*states*/, float* logits) override {
    run_step(step, kv, logits, nullptr, nullptr);
  }

  bool forward_greedy(const StepBatch& step, KvCache& kv, StatePool& /*states*/, int32_t* ids,
                      float* margins) override {
    run_step(step, kv, nullptr, ids, margins);
    return true;
  }

  // One step; logits to the host, or the greedy ids and margins.
  void run_step(const StepBatch& step, KvCache& kv, float* logits, int32_t* ids, float* margins) {
    const int64_t S0 = step.num_seqs;
    const bool greedy = ids != nullptr;
    const int64_t max_len = *std::max_element(step.seq_len, step.seq_len + S0);
    const bool graph = cuda::decode_graphs_enabled() && cuda::is_decode_step(step) &&
                       cuda::context_bucket(max_len) <= cuda::paged_attention_max_context();
    StepBatch padded;
    if (graph) padded = cuda::pad_decode(step, cuda::decode_bucket(S0), 0, pad_);
    const StepBatch& b = graph ? padded : step;
    reserve(b.num_tokens, b.num_seqs, 0);
    ensure_kv(kv);
    // note: graphs size attention's shared memory by a context bucket, so
    // that one graph serves many steps; eager steps use the exact maximum.
    const int64_t ctx = graph ? cuda::context_bucket(max_len) : max_len;
    upload_step(b);
    if (graph) {
      const cuda::DecodeGraphs::Key key{b.num_seqs,     b.max_blocks, kv_blocks_,
                                        kv_block_size_, ctx,          greedy};
      graphs_.run(key, stream_, [&] { run_layers(b, ctx, greedy); });
    } else {
      run_layers(b, ctx, greedy);
    }
    // The real sequences' rows (padding rows come after them).
    const int64_t rows = static_cast<int64_t>(logit_rows_.size());
    const int64_t r = graph ? S0 : rows;
    if (r > 0 && logits != nullptr)
      QTK_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.as(), r * cfg_.vocab_size * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
    if (r > 0 && greedy) {
      greedy_.read(rows, r, ids, margins, stream_);
      return;
    }
    QTK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Everything between the step upload and the logits copy: what a decode
  // graph captures.
  void run_layers(const StepBatch& b, int64_t max_seq_len, bool greedy) {
    const ModelConfig& c = cfg_;
    const int64_t T = b.num_tokens, S = b.num_seqs, H = c.hidden_size, D = c.head_dim;
    const int64_t I = c.intermediate_size, Hq = c.num_attention_heads, Hkv = c.num_kv_heads;
    const int64_t qkv_ld = c.q_dim() + 2 * c.kv_dim();
    const float eps = static_cast<float>(c.rms_norm_eps);
    T_* h = h_.as<T_>();
    T_* q = qkv_.as<T_>();
    const DType dt = dtype_of<T_>();
    cuda::AttentionBatch ab;
    ab.num_seqs = S;
    ab.q_start = q_start_;
    ab.seq_len = seq_len_;
    ab.block_table = block_table_;
    ab.max_blocks = b.max_blocks;
    ab.block_size = kv_block_size_;
    ab.total_tokens = T;
    ab.max_seq_len = max_seq_len;
    ab.partials = partials_.as<float>();
    ab.partial_rows = partial_rows_;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));

    cuda::ResidualStream<T_> rs{x_.as<T_>(), x2_.as<T_>()};
    cuda::embedding_lookup<T_>(embed_.as(), dt, H, token_ids_, T, rs.x, H, stream_);
    for (int64_t li = 0; li < c.num_layers; ++li) {
      const Layer& l = layers_[li];
      // Self-attention block: the input norm of x, projected to q, k, v.
      if (li == 0) {
        cuda::rmsnorm<T_>(rs.x, H, l.input_layernorm.as<float>(), h, H, T, H, eps, stream_);
        gemm_.run(h, H, l.qkv_proj.as(), H, q, qkv_ld, T, qkv_ld, H, dt, dt, stream_);
      } else {  // x += the previous layer's MLP output (in h) first
        cuda::add_norm_gemm<T_>(gemm_, rs, h, l.input_layernorm.as<float>(), eps, h,
                                l.qkv_proj.as(), q, qkv_ld, T, qkv_ld, H, stream_);
      }
      // q/k norms, RoPE, the K/V cache write and the attention: one launch
      // at decode in bf16 (cuda::decode_attention), else two.
      if (!decode_attention(l, li, ab, scale)) {
        cuda::qkv_rope_cache<T_>(q, qkv_ld, T, Hq, Hkv, D, l.q_norm.as<float>(),
                                 l.k_norm.as<float>(), eps, positions_, rope_, slot_mapping_,
                                 kv_k(li), kv_v(li), stream_);
        cuda::paged_attention<T_>(q, qkv_ld, kv_k(li), kv_v(li), attn_.as<T_>(), c.q_dim(), ab, Hq,
                                  Hkv, D, scale, stream_);
      }
      gemm_.run(attn_.as(), c.q_dim(), l.o_proj.as(), c.q_dim(), h, H, T, H, c.q_dim(), dt, dt,
                stream_);
      // MLP block: x += attention output; the post-attention norm of x,
      // projected to gate and up.
      cuda::add_norm_mlp<T_>(gemm_, rs, h, l.post_attention_layernorm.as<float>(), eps, h,
                             l.gate_up_proj.as(), gate_up_.as<T_>(), act_.as<T_>(),
                             l.down_proj.as(), h, T, I, H, stream_);
    }
    // x += the last MLP output; h = the final norm of x.
    cuda::add_rmsnorm<T_>(rs.x, H, h, H, norm_.as<float>(), h, H, T, H, eps, stream_);
    // Logits only for the last row of each sequence that samples: gather the
    // final-normed rows (embedding_lookup over h as a table), then lm_head.
    const int64_t r = static_cast<int64_t>(logit_rows_.size());
    if (r > 0) {
      cuda::embedding_lookup<T_>(h, dt, H, rows_, r, last_.as<T_>(), H, stream_);
      const void* head = tied_ ? embed_.as() : lm_head_.as();
      gemm_.run(last_.as(), H, head, H, logits_.as(), c.vocab_size, r, c.vocab_size, H, dt,
                DType::F32, stream_);
      if (greedy) greedy_.argmax(logits_.as<float>(), c.vocab_size, r, stream_);
    }
  }

 private:
  using T_ = Act;
  using Layer = Qwen3DeviceLayer;

  // The K/V cache mirrors the scheduler's KvCache geometry (blocks, block
  // size) in device memory, in T.
  // note: f32 precision keeps f32 K/V as the CPU runtime does (exactness
  // against the float64 goldens); bf16 precision stores bf16 K/V.
  void ensure_kv(const KvCache& kv) {
    if (kv_blocks_ == kv.num_blocks() && kv_block_size_ == kv.block_size()) return;
    kv_blocks_ = kv.num_blocks();
    kv_block_size_ = kv.block_size();
    kv_layer_elems_ = kv_blocks_ * kv_block_size_ * cfg_.kv_dim();
    k_cache_ = DeviceMemory(cfg_.num_layers * kv_layer_elems_ * sizeof(T_));
    v_cache_ = DeviceMemory(cfg_.num_layers * kv_layer_elems_ * sizeof(T_));
    graphs_.clear();
  }
  T_* kv_k(int64_t layer) { return k_cache_.as<T_>() + layer * kv_layer_elems_; }
  T_* kv_v(int64_t layer) { return v_cache_.as<T_>() + layer * kv_layer_elems_; }

  // The whole attention of a bf16 decode step in one launch, from the raw
  // q, k, v rows in qkv_; false (nothing launched) where it does not apply.
  // note: only up to kMaxFusedSeqs sequences. H100, Qwen3-0.6B, ms per
  // decode step fused vs separate: batch 1 1.10 vs 1.19, batch
  // 32 1.65 vs 1.75-1.81, batch 128 2.76-2.79 vs 2.70; at 128 the attention
  // kernel is bound by the K/V reads and each block's extra q-norm work
  // (once per key tile) costs more than the launch it saves. The values are
  // the same either way.
  static constexpr int64_t kMaxFusedSeqs = 64;
  bool decode_attention(const Layer& l, int64_t li, const cuda::AttentionBatch& ab, float scale) {
    if constexpr (!std::is_same_v<T_, bf16>) {
      return false;
    } else {
      if (ab.num_seqs > kMaxFusedSeqs) return false;
      const ModelConfig& c = cfg_;
      const int64_t ld = c.q_dim() + 2 * c.kv_dim();
      cuda::DecodeAttentionInput in;
      in.q = qkv_.as<bf16>();
      in.k = in.q + c.q_dim();
      in.v = in.k + c.kv_dim();
      in.ldq = in.ldk = in.ldv = ld;
      in.q_norm = l.q_norm.as<float>();
      in.k_norm = l.k_norm.as<float>();
      in.eps = static_cast<float>(c.rms_norm_eps);
      in.positions = positions_;
      in.rope = rope_;
      in.slot_mapping = slot_mapping_;
      return cuda::decode_attention(in, kv_k(li), kv_v(li), attn_.as<bf16>(), c.q_dim(), ab,
                                    c.num_attention_heads, c.num_kv_heads, c.head_dim, scale,
                                    stream_);
    }
  }

  // Copies the step's small arrays to the device in one transfer.
  void upload_step(const StepBatch& b) {
    const int64_t T = b.num_tokens, S = b.num_seqs;
    logit_rows_.clear();
    for (int64_t s = 0; s < S; ++s)
      if (b.want_logits[s]) logit_rows_.push_back(b.q_start[s + 1] - 1);
    // Layout (int32 units): slot_mapping (int64, first for alignment),
    // token_ids, positions [3][T], q_start, seq_len, block_table, rows.
    const int64_t n32 = 2 * T + T + 3 * T + (S + 1) + S + S * b.max_blocks +
                        static_cast<int64_t>(logit_rows_.size());
    host_step_.resize(n32);
    int32_t* p = host_step_.data();
    std::memcpy(p, b.slot_mapping, T * sizeof(int64_t));
    p += 2 * T;
    auto put = [&p](const int32_t* src, int64_t n) {
      std::memcpy(p, src, n * sizeof(int32_t));
      int32_t* at = p;
      p += n;
      return at;
    };
    int32_t* h_tok = put(b.token_ids, T);
    int32_t* h_pos = put(b.positions, 3 * T);
    int32_t* h_qs = put(b.q_start, S + 1);
    int32_t* h_sl = put(b.seq_len, S);
    int32_t* h_bt = put(b.block_table, S * b.max_blocks);
    int32_t* h_rows = put(logit_rows_.data(), static_cast<int64_t>(logit_rows_.size()));
    if (ensure(step_, n32 * sizeof(int32_t))) graphs_.clear();
    QTK_CUDA_CHECK(cudaMemcpyAsync(step_.as(), host_step_.data(), n32 * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
    int32_t* base = step_.as<int32_t>();
    auto dev = [&](int32_t* host_at) { return base + (host_at - host_step_.data()); };
    slot_mapping_ = reinterpret_cast<const int64_t*>(base);
    token_ids_ = dev(h_tok);
    positions_ = dev(h_pos);
    q_start_ = dev(h_qs);
    seq_len_ = dev(h_sl);
    block_table_ = dev(h_bt);
    rows_ = dev(h_rows);
  }

  ModelConfig cfg_;
  cudaStream_t stream_ = nullptr;
  cuda::DecodeGraphs graphs_;
  cuda::PaddedDecode pad_;
  int64_t max_context_ = 0;
  cuda::Gemm gemm_;
  cuda::RopeParams rope_;
  bool tied_ = false;
  DeviceMemory embed_;       // T [vocab, hidden]
  DeviceMemory lm_head_;     // T [vocab, hidden] (absent when tied)
  DeviceMemory norm_;        // f32 [hidden]
  DeviceMemory partials_;    // f32 attention split workspace (bf16 only), partial_rows_ rows
  DeviceMemory rope_table_;  // f32x2 [max_context, rotary_dim / 2] RoPE (cos, sin)
  int64_t partial_rows_ = 0;
  std::vector<Layer> layers_;

  int64_t kv_blocks_ = -1, kv_block_size_ = -1, kv_layer_elems_ = 0;
  DeviceMemory k_cache_, v_cache_;  // T [layers][num_blocks, block_size, Hkv, D]

  // Scratch (T = tokens of the largest step).
  DeviceMemory x_, x2_;          // T [T, hidden] residual stream (two: cuda::ResidualStream)
  DeviceMemory h_;               // T [T, hidden] normed input / sublayer output
  DeviceMemory qkv_;             // T [T, (Hq + 2*Hkv)*head_dim]
  DeviceMemory attn_;            // T [T, Hq*head_dim]
  DeviceMemory gate_up_;         // T [T, 2*intermediate]
  DeviceMemory act_;             // T [T, intermediate]
  DeviceMemory last_;            // T [seqs, hidden] rows that get logits
  DeviceMemory logits_;          // f32 [seqs, vocab]
  cuda::GreedyReadback greedy_;  // ids and margins of forward_greedy
  DeviceMemory step_;            // int32 step arrays (see upload_step)
  cuda::PinnedVector<int32_t> host_step_;  // the step arrays on their way up
  std::vector<int32_t> logit_rows_;
  const int64_t* slot_mapping_ = nullptr;
  const int32_t *token_ids_ = nullptr, *positions_ = nullptr, *q_start_ = nullptr,
                *seq_len_ = nullptr, *block_table_ = nullptr, *rows_ = nullptr;
};

}  // namespace

CudaPrecision parse_cuda_precision(const std::string& text) {
  if (text == "f32") return CudaPrecision::kF32;
  if (text == "bf16") return CudaPrecision::kBF16;
  fail("--precision: expected f32 or bf16, got '{}'", text);
}

bool cuda_device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_name() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return "unknown CUDA device";
  return fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
}

std::unique_ptr<CudaModel> make_cuda_qwen3(const Pack& pack, CudaPrecision precision) {
  if (precision == CudaPrecision::kF32) return std::make_unique<CudaQwen3<float>>(pack);
  return std::make_unique<CudaQwen3<bf16>>(pack);
}

namespace {
std::unique_ptr<CudaModel> make_cuda_model(const Pack& pack, CudaPrecision precision) {
  const ModelConfig& c = pack.config();
  // note: the CUDA backend has no mixture-of-experts block yet (issue 22).
  if (c.has_moe())
    fail(
        "{}: {} is a mixture-of-experts model; mixture-of-experts models run on the CPU only for "
        "now (use --device cpu)",
        pack.path(), c.hf_architecture);
  switch (c.arch) {
    case Arch::kQwen3:
      return make_cuda_qwen3(pack, precision);
    case Arch::kQwen3_5:
      if (c.norm_adds_one && !pack.has_transform("norm_plus_one_folded"))
        fail(
            "{}: Qwen3.5 pack without the 'norm_plus_one_folded' transform; the CUDA backend "
            "computes x * rsqrt(..) * w and needs the norms stored as 1 + w (re-run convert)",
            pack.path());
      return make_cuda_qwen3_5(pack, precision);
  }
  fail("{}: unsupported architecture '{}'", pack.path(), c.hf_architecture);
}
}  // namespace

std::unique_ptr<CudaModel> load_cuda_model(const Pack& pack, CudaPrecision precision) {
  if (!cuda_device_available()) fail("--device cuda: no CUDA device is available");
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // note: cudaFree(nullptr) creates the context now, so that its cost is
  // reported apart from the upload's.
  const auto t0 = Clock::now();
  QTK_CUDA_CHECK(cudaFree(nullptr));
  const double init = since(t0);
  const ProcessMemory after_init = process_memory();
  const auto t1 = Clock::now();
  auto model = make_cuda_model(pack, precision);
  CudaLoadTimes& lt = model->load_times;
  lt.init_seconds = init;
  lt.upload_seconds = since(t1);
  const ProcessMemory after_upload = process_memory();
  lt.rss_after_init_bytes = after_init.rss_bytes;
  lt.rss_after_upload_bytes = after_upload.rss_bytes;
  lt.anon_after_upload_bytes = after_upload.anon_bytes;
  lt.file_after_upload_bytes = after_upload.file_bytes;
  return model;
}

}  // namespace qtk
