#include "runtime/models/moe_weights.h"

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/weight_binder.h"

namespace qtk {

namespace {

// A stacked expert tensor [E, rows, cols] in a matrix dtype. An F8_E4M3 one
// also gives its block scales (*fp8), whose row blocks must not straddle two
// experts (each expert's slice then starts on a scale row: see
// expert_matmul).
TensorView pack_stacked(const Pack& pack, const std::string& name, int64_t E, int64_t rows,
                        int64_t cols, const PackFp8Scales** fp8) {
  const TensorView& v = pack_matrix_tensor(pack, name);
  if (v.ndim != 3 || v.shape[0] != E || v.shape[1] != rows || v.shape[2] != cols)
    fail("{}: tensor '{}' has shape {}; expected [{}, {}, {}] from the config", pack.path(), name,
         v.shape_string(), E, rows, cols);
  *fp8 = pack_fp8_scales(pack, name, v);
  if (const PackFp8Scales* q = *fp8) {
    if (rows % q->block_rows != 0)
      fail(
          "{}: tensor '{}': scale blocks of {} rows straddle experts of {} rows (expected a "
          "block height dividing {})",
          pack.path(), name, q->block_rows, rows, rows);
  }
  return v;
}

// Expert e's [rows, cols] slice of a stacked tensor.
TensorView expert_slice(const TensorView& stacked, int64_t e) {
  const int64_t rows = stacked.shape[1], cols = stacked.shape[2];
  const auto* base = static_cast<const uint8_t*>(stacked.data);
  return TensorView(base + e * rows * cols * dtype_size(stacked.dtype), stacked.dtype,
                    {rows, cols});
}

}  // namespace

MoeWeights load_moe_weights(const Pack& pack, const ModelConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size, E = c.moe.num_experts, I = c.moe.expert_intermediate_size;
  MoeWeights w;
  w.router = pack_matrix(pack, p + "mlp.router", E, H);
  w.router_fp8 = pack_fp8_scales(pack, p + "mlp.router", w.router);
  w.gate_up_proj = pack_stacked(pack, p + "mlp.experts.gate_up_proj", E, 2 * I, H, &w.gate_up_fp8);
  w.down_proj = pack_stacked(pack, p + "mlp.experts.down_proj", E, H, I, &w.down_fp8);
  index_experts(w);
  if (const int64_t S = c.moe.shared_expert_intermediate; S > 0) {
    w.has_shared = true;
    w.shared_gate_up_proj = pack_matrix(pack, p + "mlp.shared_expert.gate_up_proj", 2 * S, H);
    w.shared_down_proj = pack_matrix(pack, p + "mlp.shared_expert.down_proj", H, S);
    w.shared_expert_gate = pack_matrix(pack, p + "mlp.shared_expert_gate", 1, H);
    w.shared_gate_up_fp8 =
        pack_fp8_scales(pack, p + "mlp.shared_expert.gate_up_proj", w.shared_gate_up_proj);
    w.shared_down_fp8 =
        pack_fp8_scales(pack, p + "mlp.shared_expert.down_proj", w.shared_down_proj);
    w.shared_expert_gate_fp8 =
        pack_fp8_scales(pack, p + "mlp.shared_expert_gate", w.shared_expert_gate);
  }
  return w;
}

void index_experts(MoeWeights& w) {
  w.expert_gate_up.clear();
  w.expert_down.clear();
  for (int64_t e = 0; e < w.gate_up_proj.shape[0]; ++e) {
    w.expert_gate_up.push_back(expert_slice(w.gate_up_proj, e));
    w.expert_down.push_back(expert_slice(w.down_proj, e));
  }
}

void append_moe_matrices(const MoeWeights& w, std::vector<TensorView>& mats) {
  mats.push_back(w.router);
  mats.insert(mats.end(), w.expert_gate_up.begin(), w.expert_gate_up.end());
  mats.insert(mats.end(), w.expert_down.begin(), w.expert_down.end());
  if (w.has_shared)
    mats.insert(mats.end(), {w.shared_gate_up_proj, w.shared_down_proj, w.shared_expert_gate});
}

void append_moe_fp8_scales(const MoeWeights& w, std::vector<const PackFp8Scales*>& scales) {
  for (const PackFp8Scales* q :
       {w.router_fp8, w.shared_gate_up_fp8, w.shared_down_fp8, w.shared_expert_gate_fp8})
    if (q != nullptr) scales.push_back(q);
}

}  // namespace qtk
