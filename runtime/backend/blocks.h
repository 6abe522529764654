// The coarse blocks every architecture's forward pass is written in
// (runtime/models/*.cpp) and every backend implements (runtime/backend/cpu,
// runtime/backend/cuda). A model file binds its weights once through a
// WeightBinder (runtime/models/weight_binder.h), which hands each checked pack
// tensor to the backend and returns a handle; its forward pass is then a list
// of block calls on those handles. The backend owns all memory (weights in
// its layout, K/V cache, recurrent state, scratch), the step's arrays, and
// every fusion between blocks.
//
// The residual stream. A block never adds its output to the residual itself:
// it leaves it as the pending sublayer output d, and the next norm_* block (or
// logits) first does x += d. That is the order transformers computes
// (x = x + sublayer(norm(x))), and it lets a backend fuse the add, the norm
// and the next projection into one launch.
//
// note: blocks are coarse on purpose: each one is a unit a backend may fuse
// or capture (the CUDA backend runs a decode step's blocks inside one CUDA
// graph, and fuses add + norm + projection at small batch), so a block's
// arithmetic is specified exactly and never depends on how the step was
// batched.
#pragma once

#include <cstdint>
#include <span>

namespace qtk {

// Handles of weights a backend holds (ids into its tables), with the shape
// the model file bound them with.
struct Matrix {
  int32_t id = -1;
  int64_t rows = 0, cols = 0;  // "mat" dtype [rows, cols] (HF layout: out features, in features)
};
struct Vector {
  int32_t id = -1;
  int64_t n = 0;  // f32 [n] (or f32 [rows, cols] with n = rows * cols)
};
struct Experts {
  int32_t id = -1;  // one mixture-of-experts block (runtime/models/moe_weights.h)
};

// Full (softmax) attention of one layer over the paged K/V cache. Its input
// is the projection of the last norm_project: per token the rows
//   plain: q [Hq*D], k [Hkv*D], v [Hkv*D]
//   gated: q [Hq*D], gate [Hq*D], k [Hkv*D], v [Hkv*D]
// (widths from the config). q and k are RMS-normed per head (q_norm,
// k_norm), rotated (the architecture's RopeSpec), k and v written to the
// cache at the step's slots, and each query attends causally to its
// sequence's cached keys. Gated: each head's output times sigmoid(its gate).
// d = output o_proj^T.
struct AttentionLayer {
  int64_t cache_layer = 0;  // index among the attention layers (KvCache layer)
  bool gated = false;
  Vector q_norm, k_norm;  // f32 [head_dim]
  Matrix o_proj;          // mat [hidden, Hq*D]
};

// Gated DeltaNet mixer of one layer (Qwen3.5's linear attention). Its input
// is the projection of the last norm_project: per token the rows q, k, v
// (conv_dim = 2*Hk*Dk + Hv*Dv), z [Hv*Dv], b [Hv], a [Hv]. Causal depthwise
// conv over q, k, v continuing the sequence's conv state, SiLU; q and k
// L2-normed per head (eps 1e-6, q times Dk^-1/2); g = A * softplus(a +
// dt_bias), beta = sigmoid(b); the gated delta rule continuing the
// sequence's recurrent state; gated RMSNorm with z; d = output out_proj^T.
struct DeltaNetLayer {
  int64_t state_layer = 0;  // index among the GDN layers (state slot layout)
  Vector conv1d;            // f32 [conv_dim, conv_kernel]
  Vector dt_bias, A;        // f32 [Hv]; A = -exp(A_log)
  Vector norm;              // f32 [Dv] (plain w)
  Matrix out_proj;          // mat [hidden, Hv*Dv]
};

// Dense SwiGLU feed-forward: d = down(silu(gate(h)) * up(h)).
struct MlpLayer {
  Matrix gate_up;  // mat [2*intermediate, hidden]: gate rows, then up rows
  Matrix down;     // mat [hidden, intermediate]
};

class Blocks {
 public:
  virtual ~Blocks() = default;
  // x = table[token ids] (table: mat [vocab, hidden]); no pending output.
  virtual void embed(Matrix table) = 0;
  // x += d (if pending); h = rmsnorm(x) * norm; p = h [w0; w1; ...]^T, the
  // products' columns side by side: the input of the next mixer block.
  virtual void norm_project(Vector norm, std::span<const Matrix> w) = 0;
  virtual void attention(const AttentionLayer& l) = 0;
  virtual void delta_net(const DeltaNetLayer& l) = 0;
  // x += d; h = rmsnorm(x) * norm; d = the feed-forward block of h.
  virtual void norm_mlp(Vector norm, const MlpLayer& m) = 0;
  virtual void norm_moe(Vector norm, Experts e) = 0;
  // The end of decoder layer `layer` (the per-layer activation hook).
  virtual void layer_end(int64_t layer) = 0;
  // x += d; for the last token of every sequence that wants logits,
  // logits = (rmsnorm(x) * norm) lm_head^T.
  virtual void logits(Vector norm, Matrix lm_head) = 0;
};

}  // namespace qtk
