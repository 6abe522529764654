#include "runtime/backend/cpu/moe_block.h"

#include <algorithm>
#include <cstring>

#include "kernels/activation.h"
#include "kernels/matmul_fp8.h"
#include "kernels/moe.h"
#include "pack/pack.h"
#include "runtime/backend/cpu/tiled_weights.h"

namespace qtk {

namespace {

// y = x w_e^T for expert e's slice w_e [N, K] of a stacked tensor. An FP8
// slice goes to matmul_fp8 directly with the expert's scale rows: its rows
// start at e * N of the stacked tensor, i.e. at scale row e * N / block_rows
// (pack_stacked checked that this divides; a tensor-parallel rank's slice
// keeps whole blocks per expert: tp_slice_fp8). TiledWeights::matmul knows
// only the scales of whole matrices, not of one expert's rows.
void expert_matmul(const float* x, int64_t ldx, const TensorView& w, const PackFp8Scales* fp8,
                   int64_t e, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                   const TiledWeights& tiled, ThreadPool* pool) {
  if (fp8 == nullptr) {
    tiled.matmul(x, ldx, w, y, ldy, M, N, K, pool);
    return;
  }
  const int64_t scale_row = e * (N / fp8->block_rows);
  matmul_fp8(x, ldx, w.as<uint8_t>(), fp8->scale.as<float>() + scale_row * fp8->scale.shape[1],
             fp8->block_rows, fp8->block_cols, y, ldy, M, N, K, pool);
}

}  // namespace

MoeBlock::MoeBlock(const ModelConfig& c)
    : H_(c.hidden_size),
      E_(c.moe.num_experts),
      k_(c.moe.top_k),
      I_(c.moe.expert_intermediate_size),
      S_(c.moe.shared_expert_intermediate),
      renormalize_(c.moe.norm_topk_prob) {}

void MoeBlock::reserve(int64_t T) {
  const int64_t width = std::max(I_, S_);
  probs_.resize(T * E_);
  ids_.resize(T * k_);
  weights_.resize(T * k_);
  offsets_.resize(E_ + 1);
  cursor_.resize(E_);
  rows_.resize(T * k_);
  row_weight_.resize(T * k_);
  xg_.resize(T * H_);
  gate_up_.resize(T * 2 * width);
  act_.resize(T * width);
  y_.resize(T * H_);
  shared_gate_.resize(T);
}

void MoeBlock::forward(const MoeWeights& w, const float* h, int64_t T, float* out,
                       const TiledWeights& tiled, ThreadPool* pool) {
  const int64_t H = H_, E = E_, k = k_, I = I_;
  // Router: logits, then the float32 softmax and top-k.
  tiled.matmul(h, H, w.router, probs_.data(), E, T, E, H, pool);
  moe_route(probs_.data(), E, T, E, k, renormalize_, ids_.data(), weights_.data());

  // Group the (token, weight) pairs by expert (a counting sort: tokens stay
  // in increasing order within an expert).
  std::fill(offsets_.begin(), offsets_.end(), 0);
  for (int64_t i = 0; i < T * k; ++i) ++offsets_[ids_[i] + 1];
  for (int64_t e = 0; e < E; ++e) offsets_[e + 1] += offsets_[e];
  std::copy(offsets_.begin(), offsets_.end() - 1, cursor_.begin());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = cursor_[ids_[t * k + j]]++;
      rows_[slot] = static_cast<int32_t>(t);
      row_weight_[slot] = weights_[t * k + j];
    }
  }

  std::memset(out, 0, static_cast<size_t>(T * H) * sizeof(float));
  // note: experts in increasing index, so each token sums its experts'
  // outputs in that order (as transformers' loop over experts does).
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets_[e], n = offsets_[e + 1] - r0;
    if (n == 0) continue;
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(xg_.data() + r * H, h + rows_[r0 + r] * H,
                  static_cast<size_t>(H) * sizeof(float));
    expert_matmul(xg_.data(), H, w.expert_gate_up[e], w.gate_up_fp8, e, gate_up_.data(), 2 * I, n,
                  2 * I, H, tiled, pool);
    swiglu(gate_up_.data(), 2 * I, act_.data(), I, n, I);
    expert_matmul(act_.data(), I, w.expert_down[e], w.down_fp8, e, y_.data(), H, n, H, I, tiled,
                  pool);
    moe_scatter_add(out, H, y_.data(), H, rows_.data() + r0, row_weight_.data() + r0, n, H);
  }

  if (w.has_shared) {
    const int64_t S = S_;
    tiled.matmul(h, H, w.shared_gate_up_proj, gate_up_.data(), 2 * S, T, 2 * S, H, pool);
    swiglu(gate_up_.data(), 2 * S, act_.data(), S, T, S);
    tiled.matmul(act_.data(), S, w.shared_down_proj, y_.data(), H, T, H, S, pool);
    tiled.matmul(h, H, w.shared_expert_gate, shared_gate_.data(), 1, T, 1, H, pool);
    moe_add_gated(out, H, y_.data(), H, shared_gate_.data(), T, H);
  }
}

}  // namespace qtk
