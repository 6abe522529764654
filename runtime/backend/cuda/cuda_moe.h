// The mixture-of-experts block on the GPU (the CUDA backend's norm_moe): the
// arithmetic of runtime/models/moe_weights.h with the kernels of
// kernels/cuda/moe.h. Act = float (f32 precision) or bf16.
//
//   logits   = h router^T                    (f32 out; moe_router_front does
//   ids, w   = top-k of softmax(logits)       these three steps, in one
//   groups   = the T*k routed rows by expert  launch up to 16 tokens)
//   act      = swiglu(h[row] gate_up_e^T)     (moe_expert_matmul, swiglu)
//   y        = act down_e^T                   (moe_expert_matmul, f32 out)
//   shared   = shared_down(swiglu(h shared_gate_up^T))   (Qwen3.5-MoE)
//   out      = sum_e (increasing e) w_e y_e + sigmoid(h . gate) shared   (moe_combine)
//
// Dense products go through project() (device_weight.h): cuBLASLt with its
// fixed algorithms, or the fixed-order warp product for FP8 weights.
// note: every step is row-independent (Gemm's fixed algorithms, one warp
// per routed row and column in the experts' products), so a token's output
// does not depend on the batch; nothing here synchronises with the host, so
// decode steps stay capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "loaders/model_config.h"
#include "pack/pack.h"
#include "runtime/backend/cuda/device_upload.h"
#include "runtime/backend/cuda/device_weight.h"
#include "runtime/models/moe_weights.h"

namespace qtk::cuda {

// One MoE layer's weights in device memory (Act = the precision's type, or
// block-FP8 as the pack holds them: device_weight.h).
struct CudaMoeWeights {
  DeviceWeight router;   // [E, hidden]
  DeviceWeight gate_up;  // [E*2*Ie, hidden]: per expert gate rows, then up rows
  DeviceWeight down;     // [E*hidden, Ie]
  bool has_shared = false;
  DeviceWeight shared_gate_up;  // [2*S, hidden]
  DeviceWeight shared_down;     // [hidden, S]
  DeviceMemory shared_gate;     // Act [hidden] (shared_expert_gate [1, hidden])
};

// Uploads layer `prefix`'s block (`w`: the pack's weights, or a
// tensor-parallel rank's slices), FP8 matrices with the scales `w` gives.
template <class Act>
CudaMoeWeights upload_moe_weights(const Pack& pack, const std::string& prefix,
                                  const MoeWeights& w) {
  CudaMoeWeights d;
  d.router = upload_weight<Act>(pack, prefix + "mlp.router", w.router, w.router_fp8);
  d.gate_up =
      upload_weight<Act>(pack, prefix + "mlp.experts.gate_up_proj", w.gate_up_proj, w.gate_up_fp8);
  d.down = upload_weight<Act>(pack, prefix + "mlp.experts.down_proj", w.down_proj, w.down_fp8);
  d.has_shared = w.has_shared;
  if (w.has_shared) {
    d.shared_gate_up = upload_weight<Act>(pack, prefix + "mlp.shared_expert.gate_up_proj",
                                          w.shared_gate_up_proj, w.shared_gate_up_fp8);
    d.shared_down = upload_weight<Act>(pack, prefix + "mlp.shared_expert.down_proj",
                                       w.shared_down_proj, w.shared_down_fp8);
    if (w.shared_expert_gate.dtype == DType::F8_E4M3)
      fail("{}: tensor '{}mlp.shared_expert_gate' is F8_E4M3; expected BF16, F16 or F32",
           pack.path(), prefix);
    d.shared_gate = upload_view<Act>(pack, prefix + "mlp.shared_expert_gate", w.shared_expert_gate);
  }
  return d;
}

template <class Act>
class CudaMoe {
 public:
  explicit CudaMoe(const ModelConfig& c)
      : H_(c.hidden_size),
        E_(c.moe.num_experts),
        k_(c.moe.top_k),
        I_(c.moe.expert_intermediate_size),
        S_(c.moe.shared_expert_intermediate),
        renormalize_(c.moe.norm_topk_prob),
        ticket_(sizeof(unsigned)) {
    // moe_router_front's counter starts at zero (each launch leaves it so).
    QTK_CUDA_CHECK(cudaMemset(ticket_.as(), 0, sizeof(unsigned)));
    QTK_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Scratch for up to T tokens a step; true when a buffer was reallocated
  // (captured graphs hold the old pointers).
  bool reserve(int64_t T) {
    const int64_t R = T * k_;
    const size_t a = sizeof(Act);
    bool grew = false;
    grew |= ensure(logits_, T * E_ * sizeof(float));
    grew |= ensure(ids_, R * sizeof(int32_t));
    grew |= ensure(weights_, R * sizeof(float));
    grew |= ensure(offsets_, (E_ + 1) * sizeof(int32_t));
    grew |= ensure(active_, E_ * sizeof(int32_t));
    grew |= ensure(row_token_, R * sizeof(int32_t));
    grew |= ensure(row_expert_, R * sizeof(int32_t));
    grew |= ensure(pair_row_, R * sizeof(int32_t));
    grew |= ensure(gate_up_, R * 2 * I_ * a);
    grew |= ensure(act_, R * I_ * a);
    grew |= ensure(y_, R * H_ * sizeof(float));
    if (S_ > 0) {
      grew |= ensure(shared_gate_up_, T * 2 * S_ * a);
      grew |= ensure(shared_act_, T * S_ * a);
      grew |= ensure(shared_y_, T * H_ * sizeof(float));
    }
    return grew;
  }

  // out[t] = the block's output for h[t]; h, out: Act [T, hidden] (row
  // stride hidden), out not aliasing h.
  void forward(const CudaMoeWeights& w, const Act* h, int64_t T, Act* out, Gemm& gemm,
               cudaStream_t stream) {
    const int64_t H = H_, E = E_, k = k_, I = I_, R = T * k_;
    const MoeGroups g{offsets_.as<int32_t>(), active_.as<int32_t>(), row_token_.as<int32_t>(),
                      row_expert_.as<int32_t>(), pair_row_.as<int32_t>()};
    // note: the router's logits take the own fixed order (moe_router_logits)
    // wherever it applies, which depends on the weights and sizes, never on
    // T: up to 16 tokens the logits, routing and grouping are one launch.
    // An FP8 router (no release has one) goes through project().
    if (!w.router.fp8 && moe_router_front_supported(h, H, w.router.data.as(), E, H, sizeof(Act))) {
      moe_router_front<Act>(h, H, w.router.data.as<Act>(), T, E, H, k, renormalize_,
                            logits_.as<float>(), ids_.as<int32_t>(), weights_.as<float>(), g,
                            ticket_.as<unsigned>(), stream);
    } else {
      project<Act, float>(gemm, h, H, w.router, logits_.as<float>(), E, T, stream);
      moe_route(logits_.as<float>(), E, T, E, k, renormalize_, ids_.as<int32_t>(),
                weights_.as<float>(), stream);
      moe_group(ids_.as<int32_t>(), T, k, E, g, stream);
    }
    const int64_t max_active = std::min(E, R);
    // note: gate_up and SwiGLU in one launch where the tensor-core narrow
    // kernel computes the experts (kernels/cuda/moe.h), the same bits.
    if (!moe_expert_matmul_swiglu<Act>(h, H, true, w.gate_up.ref<Act>(), I, H, act_.as<Act>(), I, R,
                                       g, max_active, stream)) {
      moe_expert_matmul<Act, Act>(h, H, true, w.gate_up.ref<Act>(), 2 * I, H, gate_up_.as<Act>(),
                                  2 * I, R, g, max_active, false, stream);
      swiglu<Act>(gate_up_.as<Act>(), 2 * I, act_.as<Act>(), I, R, I, stream);
    }
    // note: the groups come from the front, two or more launches back.
    moe_expert_matmul<Act, float>(act_.as<Act>(), I, false, w.down.ref<Act>(), H, I, y_.as<float>(),
                                  H, R, g, max_active, true, stream);
    const float* shared = nullptr;
    if (w.has_shared) {
      const int64_t S = S_;
      project<Act, Act>(gemm, h, H, w.shared_gate_up, shared_gate_up_.as<Act>(), 2 * S, T, stream);
      swiglu<Act>(shared_gate_up_.as<Act>(), 2 * S, shared_act_.as<Act>(), S, T, S, stream);
      project<Act, float>(gemm, shared_act_.as<Act>(), S, w.shared_down, shared_y_.as<float>(), H,
                          T, stream);
      shared = shared_y_.as<float>();
    }
    moe_combine<Act>(y_.as<float>(), H, ids_.as<int32_t>(), weights_.as<float>(),
                     pair_row_.as<int32_t>(), T, k, H, shared, H, h, H,
                     w.has_shared ? w.shared_gate.as<Act>() : nullptr, out, H, stream);
  }

 private:
  int64_t H_, E_, k_, I_, S_;
  bool renormalize_;
  DeviceMemory ticket_;  // u32 moe_router_front's counter (zero between launches)
  // Scratch (T = tokens of the largest step, R = T * k routed rows).
  DeviceMemory logits_;                             // f32 [T, E] router logits
  DeviceMemory ids_;                                // i32 [T, k] chosen experts
  DeviceMemory weights_;                            // f32 [T, k] their weights
  DeviceMemory offsets_;                            // i32 [E + 1]
  DeviceMemory active_;                             // i32 [E]
  DeviceMemory row_token_, row_expert_, pair_row_;  // i32 [R]
  DeviceMemory gate_up_;                            // Act [R, 2*Ie]
  DeviceMemory act_;                                // Act [R, Ie]
  DeviceMemory y_;                                  // f32 [R, hidden]
  DeviceMemory shared_gate_up_;                     // Act [T, 2*S]
  DeviceMemory shared_act_;                         // Act [T, S]
  DeviceMemory shared_y_;                           // f32 [T, hidden]
};

}  // namespace qtk::cuda
