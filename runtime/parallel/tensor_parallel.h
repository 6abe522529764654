// Tensor parallelism: how a model's weights split over N ranks (one per GPU,
// or N emulated ranks on the CPU), and the checks that make a split valid.
//
// Every rank runs the unchanged model definition (runtime/models/*) with a
// rank config whose head counts and feed-forward widths are 1/N of the
// model's (tp_rank_config), over its slices of the weights (tp_split):
//   attention   query (and output-gate) heads split evenly; K/V heads split
//               evenly, or, with fewer K/V heads than ranks, each rank keeps
//               the one K/V head its query heads read (replicated);
//   GDN         key heads and value heads split evenly; conv channels,
//               dt_bias and A follow their heads;
//   MLP, experts, shared expert   the intermediate width split evenly;
//   o_proj, out_proj, down_proj   split by input column, so that each rank's
//               product is a partial sum of the full output;
//   the rest    (embeddings, norms, router, shared_expert_gate, lm_head)
//               replicated.
// After every attention, GDN, MLP and MoE block the ranks add their partial
// outputs: one all-reduce per block (runtime/parallel/rank_group.h), summed in
// rank order 0..N-1 in float32 on every rank, so every rank holds the same
// bits and a TP-N run is the same from run to run and batch-invariant.
//
// note: a TP-N result is not bit-identical to the TP-1 result: each output
// projection's dot products are split into N partial sums that are added in
// another order. A TP-N run is compared with a TP-1 run by the near-tie rule.
// note: experts are split by width, not by expert: every rank then does the
// same work whatever the routing (an expert-split rank idles when its experts
// are not chosen), and the router, top-k and weights stay replicated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor_view.h"
#include "loaders/model_config.h"

namespace qtk {

struct MoeWeights;

// Which rank of how many; size 1 is the unsplit model.
struct TpRank {
  int rank = 0;
  int size = 1;
  bool split() const { return size > 1; }
};

// The config a rank computes with: head counts and widths divided by `size`
// (K/V heads: max(1, Hkv / size)). Throws qtk::Error naming `source`, the
// config field, its value and `size` when the model cannot be split so.
ModelConfig tp_rank_config(const ModelConfig& full, int size, const std::string& source);

// One run of a split dimension: `heads` groups of `unit` rows (or columns).
// A rank takes heads [rank*heads/size, (rank+1)*heads/size); a replicable run
// with fewer heads than ranks gives rank r its one head r*heads/size.
struct TpSegment {
  int64_t heads = 0;
  int64_t unit = 1;
  bool replicable = false;  // K/V heads only
};

// How one pack tensor splits: along its rows (dim -2 of a matrix or stacked
// experts, dim 0 of a vector or table) or its columns (dim -1), as a list of
// runs; kNone: replicated.
struct TpSplit {
  enum class Dim { kNone, kRows, kCols };
  Dim dim = Dim::kNone;
  std::vector<TpSegment> segments;
};

// The split of the pack tensor `name` ("layers.3.self_attn.qkv_proj") of a
// model with config `full`; `rows` is the tensor's row count (the GDN in_proj
// has the b and a rows or not).
TpSplit tp_split(const ModelConfig& full, std::string_view name, int64_t rows);

// Rank-owned bytes the slices live in (64-byte aligned).
class TpStorage {
 public:
  void* allocate(size_t bytes);
  void clear() { blocks_.clear(); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::vector<std::unique_ptr<void, Free>> blocks_;
};

// Rank r's slice of `full` (1-D, 2-D or 3-D stacked experts) by `s`, copied
// into `storage`; `full` itself when s.dim is kNone. Throws qtk::Error naming
// `name` when the tensor's extent along the split dimension is not the
// segments' total.
TensorView tp_slice(const TensorView& full, const TpSplit& s, TpRank r, std::string_view name,
                    TpStorage& storage);

// Rank r's slice of a mixture-of-experts block (full: its unsplit weights,
// c: the unsplit config).
MoeWeights tp_slice_experts(const MoeWeights& full, const ModelConfig& c, TpRank r,
                            const std::string& prefix, TpStorage& storage);

}  // namespace qtk
