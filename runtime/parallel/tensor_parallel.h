// Tensor parallelism: how a model's weights split over N ranks (one per GPU,
// or N emulated ranks on the CPU), and the checks that make a split valid.
//
// Every rank runs the unchanged model definition (runtime/models/*) with a
// rank config whose head counts and feed-forward widths are 1/N of the
// model's (tp_rank_config), over its slices of the weights (tp_split):
//   attention   query (and output-gate) heads split evenly; K/V heads split
//               evenly, or, with fewer K/V heads than ranks, each rank keeps
//               the one K/V head its query heads read (replicated);
//   GDN         key heads and value heads split evenly; with fewer key
//               heads than ranks, each rank keeps the one key head its value
//               heads read (replicated, as K/V heads above); conv channels,
//               dt_bias and A follow their heads;
//   MLP, experts, shared expert   the intermediate width split evenly;
//   o_proj, out_proj, down_proj   split by input column, so that each rank's
//               product is a partial sum of the full output;
//   the rest    (embeddings, norms, router, shared_expert_gate, lm_head)
//               replicated.
// A block-FP8 (F8_E4M3) matrix splits as any other, its 1-byte values by the
// same rule, and its float32 block scales with it: a rank keeps the scale
// rows (or columns) of the blocks its rows (or columns) lie in
// (tp_slice_fp8). That needs every split boundary on a boundary of the
// tensor's scale blocks; a pack whose blocks straddle a boundary is refused
// (tp_check_fp8: convert it with --dtype f32, exact, or bf16 to split it).
// note: Qwen's FP8 releases use 128x128 blocks (convert may make a fused
// tensor's row blocks smaller), so a split works when each rank's heads x
// head_dim and widths are multiples of 128: a rank's K/V head of 64 rows, or
// an expert width of 64 per rank, is refused.
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
struct PackFp8Scales;

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
  bool replicable = false;  // attention K/V heads and GDN key heads only
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

// Rank-owned bytes the slices live in (64-byte aligned), and the rank's
// block-scale records of its FP8 slices.
class TpStorage {
 public:
  TpStorage();
  ~TpStorage();
  TpStorage(const TpStorage&) = delete;
  TpStorage& operator=(const TpStorage&) = delete;

  void* allocate(size_t bytes);
  // A new record, at an address that stays valid until clear() or recycle().
  PackFp8Scales& add_scales();
  // Frees every slice and record.
  void clear();
  // Ends every slice and record (their addresses go invalid) but keeps the
  // memory for the next allocate()s.
  // note: a backend that uploads each slice right away (CUDA) recycles
  // after every tensor: its layers' slices have the same sizes, so the
  // pages are faulted in once instead of once per tensor (fresh pages
  // cost more than the copy into them).
  void recycle();

 private:
  struct Free {
    void operator()(void* p) const;
  };
  struct Block {
    std::unique_ptr<void, Free> p;
    size_t capacity = 0;
  };
  std::vector<Block> blocks_;  // in use
  std::vector<Block> pool_;    // recycled, free
  std::vector<std::unique_ptr<PackFp8Scales>> scales_;
};

// Rank r's slice of `full` (1-D, 2-D or 3-D stacked experts) by `s`, copied
// into `storage`; `full` itself when s.dim is kNone. Throws qtk::Error naming
// `name` when the tensor's extent along the split dimension is not the
// segments' total.
TensorView tp_slice(const TensorView& full, const TpSplit& s, TpRank r, std::string_view name,
                    TpStorage& storage);

// Fails unless every split boundary of every rank of `size` of the F8_E4M3
// tensor q.weight (split by `s`) lies on a boundary of its scale blocks: a
// range's begin a multiple of the block size along the split dimension, its
// end a multiple or the tensor's end (a partial edge block). The message
// names `source` (the pack), `size`, the tensor, the first bad boundary and
// the block size. A tensor whose extent is not the segments' total is left
// to tp_slice's shape check.
void tp_check_fp8(const PackFp8Scales& q, const TpSplit& s, int size, std::string_view source);

// The block scales of rank r's slice `weight` (tp_slice of q.weight by `s`):
// the scale rows [begin/block_rows, ceil(end/block_rows)) of each of the
// rank's row ranges (per expert for stacked experts [E, rows, cols], whose
// scale tensor is [E*rows/block_rows, ceil(cols/block_cols)]), or the scale
// columns likewise for a column split, copied into `storage`. &q itself when
// s.dim is kNone or r is unsplit. Checks as tp_check_fp8.
const PackFp8Scales* tp_slice_fp8(const PackFp8Scales& q, const TensorView& weight,
                                  const TpSplit& s, TpRank r, std::string_view source,
                                  TpStorage& storage);

// Rank r's slice of a mixture-of-experts block (full: its unsplit weights,
// c: the unsplit config), FP8 block scales included; `source` (the pack)
// names the block in messages.
MoeWeights tp_slice_experts(const MoeWeights& full, const ModelConfig& c, TpRank r,
                            const std::string& prefix, std::string_view source, TpStorage& storage);

}  // namespace qtk
