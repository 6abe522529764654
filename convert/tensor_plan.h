// The one table that knows both worlds: which Hugging Face tensors (by the
// loader's canonical names, "layers.3.self_attn.q_proj.weight") become which
// pack tensors ("layers.3.self_attn.qkv_proj"), in which layout and dtype,
// through which recorded transforms. Nothing is copied here: a planned
// tensor is a list of pieces pointing into the mapped checkpoint (plus small
// computed vectors), streamed into the pack by TensorSource.
//
// Pack tensors (H hidden, I intermediate, V vocab, D head_dim, Hq/Hkv heads,
// Hk/Hv GDN key/value heads, Dk/Dv their dims, C conv channels, K kernel):
//   embed_tokens [V, H] (matrix dtype), norm f32 [H], lm_head [V, H] (absent when tied)
//   layers.i.input_layernorm f32 [H], layers.i.post_attention_layernorm f32 [H]
//   layers.i.mlp.gate_up_proj [2I, H] (gate rows, then up rows), layers.i.mlp.down_proj [H, I]
//   full attention: self_attn.qkv_proj [(Hq*D [+ Hq*D gate]) + 2*Hkv*D, H],
//     self_attn.o_proj [H, Hq*D], self_attn.q_norm f32 [D], self_attn.k_norm f32 [D]
//   GDN: linear_attn.in_proj [2*Hk*Dk + Hv*Dv (qkv) + Hv*Dv (z) + Hv (b) + Hv (a), H],
//     linear_attn.conv1d f32 [C, K], linear_attn.dt_bias f32 [Hv],
//     linear_attn.A f32 [Hv] (= -exp(A_log)), linear_attn.norm f32 [Dv],
//     linear_attn.out_proj [H, Hv*Dv]
//   mixture-of-experts layers (E experts of width Ie, shared expert of width S), instead of
//     the dense mlp.*: mlp.router [E, H], mlp.experts.gate_up_proj [E, 2*Ie, H] (per expert:
//     gate rows, then up rows), mlp.experts.down_proj [E, H, Ie]; with a shared expert also
//     mlp.shared_expert.gate_up_proj [2S, H], mlp.shared_expert.down_proj [H, S],
//     mlp.shared_expert_gate [1, H]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor_view.h"
#include "loaders/model_config.h"
#include "pack/pack_writer.h"

namespace qtk {

// A run of consecutive elements of one source tensor (or of computed values).
struct Piece {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t count = 0;
  // True when data points into a read-only file mapping, whose pages may be
  // dropped from this process once streamed (see TensorSource).
  bool mapped = true;
  // F8_E4M3 pieces: the 2-D source matrix and the piece's first row in it
  // (pieces are whole rows), its block scales f32 [ceil(rows/block_rows),
  // ceil(cols/block_cols)] and block size. Used to dequantize (--dtype
  // bf16|f16|f32) and to build the pack's scales (--dtype keep).
  const TensorView* source = nullptr;
  int64_t row0 = 0;
  const TensorView* scale = nullptr;
  int64_t block_rows = 0, block_cols = 0;
  // The source tensor this piece's values come from (for computed pieces,
  // the tensor they were computed from), and how messages name it
  // ("FILE: tensor \"HF name\""; set by the caller of plan_tensors, or the
  // pack tensor's name when empty). Used to refuse non-finite weights by
  // their source element.
  const TensorView* origin = nullptr;
  std::string label = {};
};

struct PlannedTensor {
  std::string name;          // pack canonical name
  DType dtype = DType::F32;  // stored dtype
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;                     // concatenated in order; sum of counts == numel
  std::shared_ptr<std::vector<float>> computed;  // owns computed pieces' data
  int64_t numel() const;
  uint64_t nbytes() const { return static_cast<uint64_t>(numel() * dtype_size(dtype)); }
};

struct TransformRecord {
  std::string name;
  std::string description;
  std::vector<std::string> tensors;  // pack tensors it applies to
};

// An F8_E4M3 pack tensor and its scales (--dtype keep). The pack's scale
// tensor is f32 [ceil(rows/block_rows), ceil(cols/block_cols)] over the pack
// tensor's rows (all dims but the last) and columns (the last dim).
struct QuantizedRecord {
  std::string tensor;  // "layers.0.mlp.gate_up_proj"
  std::string scale;   // "layers.0.mlp.gate_up_proj.scale"
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

struct TensorPlan {
  std::vector<PlannedTensor> tensors;
  std::vector<TransformRecord> transforms;
  std::vector<QuantizedRecord> quantized;                // empty unless FP8 weights are kept
  int64_t source_block_rows = 0, source_block_cols = 0;  // weight_block_size when FP8
};

// Name of the pack tensor holding the block scales of FP8 pack tensor `name`.
std::string fp8_scale_name(const std::string& name);

// The loader's canonical name of the scales of FP8 source tensor `name`
// ("layers.0.mlp.up_proj.weight" -> "layers.0.mlp.up_proj.weight_scale_inv");
// TensorLookup must resolve it for every F8_E4M3 source.
std::string fp8_source_scale_name(const std::string& name);

// What the matrices are stored as; nullopt keeps the source dtype.
using MatrixDType = std::optional<DType>;

// Source tensors by the loader's canonical name; nullptr when absent.
using TensorLookup = std::function<const TensorView*(const std::string& name)>;

// Builds the plan. `source` names the checkpoint in messages; `all_names`
// are every source tensor, so that one the table does not use is reported
// instead of silently dropped. Throws qtk::Error naming the tensor, the
// expected and the found shape or dtype.
TensorPlan plan_tensors(const ModelConfig& config, const TensorLookup& lookup,
                        const std::vector<std::string>& all_names, MatrixDType matrix_dtype,
                        const std::string& source);

// Streams a planned tensor's bytes (converting dtype on the way).
std::unique_ptr<EntrySource> make_tensor_source(const PlannedTensor& t);

// Entry name of a pack tensor: "tensors/<name>".
std::string tensor_entry_name(const std::string& name);

}  // namespace qtk
