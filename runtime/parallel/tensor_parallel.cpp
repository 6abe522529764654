#include "runtime/parallel/tensor_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "pack/pack.h"
#include "runtime/models/moe_weights.h"

namespace qtk {

namespace {

// Fails unless `value` (config field `field`) splits into `size` equal parts.
void check_divisible(const std::string& source, const char* field, int64_t value, int size) {
  if (value % size != 0)
    fail("{}: tensor parallel {}: config {} = {} is not divisible by {}", source, size, field,
         value, size);
}

// The part of a layer tensor's name after "layers.N." ("self_attn.o_proj"),
// or the whole name for a tensor outside the layers.
std::string_view layer_suffix(std::string_view name) {
  if (name.substr(0, 7) != "layers.") return name;
  const size_t dot = name.find('.', 7);
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

// The rank's [begin, end) of each segment along the split dimension, in
// rows (or columns) of the full tensor.
struct Range {
  int64_t begin = 0, end = 0;
};

std::vector<Range> rank_ranges(const TpSplit& s, TpRank r) {
  std::vector<Range> out;
  int64_t offset = 0;
  for (const TpSegment& g : s.segments) {
    int64_t h0 = 0, h1 = 0;
    if (g.heads % r.size == 0) {
      h0 = r.rank * (g.heads / r.size);
      h1 = h0 + g.heads / r.size;
    } else {  // replicated K/V or GDN key head (checked by tp_rank_config)
      h0 = static_cast<int64_t>(r.rank) * g.heads / r.size;
      h1 = h0 + 1;
    }
    out.push_back({offset + h0 * g.unit, offset + h1 * g.unit});
    offset += g.heads * g.unit;
  }
  return out;
}

int64_t extent(const TpSplit& s) {
  int64_t n = 0;
  for (const TpSegment& g : s.segments) n += g.heads * g.unit;
  return n;
}

// A rank's share of `heads` (config field `field`) that may be replicated:
// heads / size when size divides them, 1 (the rank's replicated head) when
// they divide size; fails otherwise.
int64_t heads_per_rank(const std::string& source, const char* field, int64_t heads, int size) {
  if (heads >= size) {
    check_divisible(source, field, heads, size);
    return heads / size;
  }
  if (heads <= 0 || size % heads != 0)
    fail("{}: tensor parallel {}: config {} = {} neither divides into nor divides {} ranks", source,
         size, field, heads, size);
  return 1;
}

}  // namespace

ModelConfig tp_rank_config(const ModelConfig& full, int size, const std::string& source) {
  if (size < 1) fail("{}: tensor parallel: expected a rank count >= 1, found {}", source, size);
  ModelConfig c = full;
  if (size == 1) return c;
  check_divisible(source, "num_attention_heads", full.num_attention_heads, size);
  c.num_attention_heads = full.num_attention_heads / size;
  // note: fewer K/V heads than ranks: each rank keeps the one K/V head its
  // query heads read, which needs whole ranks per K/V head.
  c.num_kv_heads = heads_per_rank(source, "num_key_value_heads", full.num_kv_heads, size);
  if (full.has_dense_mlp()) {
    check_divisible(source, "intermediate_size", full.intermediate_size, size);
    c.intermediate_size = full.intermediate_size / size;
  }
  if (full.linear_num_value_heads > 0) {
    check_divisible(source, "linear_num_value_heads", full.linear_num_value_heads, size);
    c.linear_num_value_heads = full.linear_num_value_heads / size;
    // note: fewer GDN key heads than ranks: value head h reads key head
    // h / (Hv / Hk), so with whole ranks per key head all of a rank's value
    // heads read one key head, which the rank keeps (its q and k conv
    // channels computed again on each rank that shares it).
    c.linear_num_key_heads =
        heads_per_rank(source, "linear_num_key_heads", full.linear_num_key_heads, size);
  }
  if (full.has_moe()) {
    check_divisible(source, "moe_intermediate_size", full.moe.expert_intermediate_size, size);
    c.moe.expert_intermediate_size = full.moe.expert_intermediate_size / size;
    if (full.moe.shared_expert_intermediate > 0) {
      check_divisible(source, "shared_expert_intermediate_size",
                      full.moe.shared_expert_intermediate, size);
      c.moe.shared_expert_intermediate = full.moe.shared_expert_intermediate / size;
    }
  }
  return c;
}

TpSplit tp_split(const ModelConfig& c, std::string_view name, int64_t rows) {
  using Dim = TpSplit::Dim;
  const std::string_view n = layer_suffix(name);
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  const int64_t I = c.intermediate_size;
  const TpSegment q{Hq, D}, kv{Hkv, D, true};
  // GDN: q, k, v are the conv channels; z follows v; b and a one per value head.
  const TpSegment gq{Hk, Dk, true}, gv{Hv, Dv}, per_v{Hv, 1};
  // The one table of split tensors (pack names after "layers.N.").
  if (n == "self_attn.qkv_proj") {
    // note: a gated layer's rows are q, then its output gate, then k, v
    // (convert's split_q_gate transform).
    if (c.attn_output_gate) return {Dim::kRows, {q, q, kv, kv}};
    return {Dim::kRows, {q, kv, kv}};
  }
  if (n == "self_attn.o_proj") return {Dim::kCols, {q}};
  if (n == "linear_attn.in_proj") {
    if (rows == c.linear_conv_dim() + c.linear_value_dim()) return {Dim::kRows, {gq, gq, gv, gv}};
    return {Dim::kRows, {gq, gq, gv, gv, per_v, per_v}};
  }
  if (n == "linear_attn.in_proj_ba") return {Dim::kRows, {per_v, per_v}};
  if (n == "linear_attn.conv1d") return {Dim::kRows, {gq, gq, gv}};
  if (n == "linear_attn.dt_bias" || n == "linear_attn.A") return {Dim::kRows, {per_v}};
  if (n == "linear_attn.out_proj") return {Dim::kCols, {gv}};
  if (n == "mlp.gate_up_proj") return {Dim::kRows, {{I, 1}, {I, 1}}};
  if (n == "mlp.down_proj") return {Dim::kCols, {{I, 1}}};
  const int64_t Ie = c.moe.expert_intermediate_size, S = c.moe.shared_expert_intermediate;
  if (n == "mlp.experts.gate_up_proj") return {Dim::kRows, {{Ie, 1}, {Ie, 1}}};
  if (n == "mlp.experts.down_proj") return {Dim::kCols, {{Ie, 1}}};
  if (n == "mlp.shared_expert.gate_up_proj") return {Dim::kRows, {{S, 1}, {S, 1}}};
  if (n == "mlp.shared_expert.down_proj") return {Dim::kCols, {{S, 1}}};
  return {};
}

namespace {

// A tensor as [outer, rows, cols]: a vector is [1, n, 1], a matrix or a
// table [1, rows, cols], stacked experts [E, rows, cols].
struct Dims {
  int64_t outer = 1, rows = 0, cols = 1;
};

Dims dims_of(const TensorView& t) {
  Dims d;
  d.outer = t.ndim == 3 ? t.shape[0] : 1;
  d.rows = t.ndim == 1 ? t.shape[0] : t.shape[t.ndim - 2];
  d.cols = t.ndim == 1 ? 1 : t.shape[t.ndim - 1];
  return d;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Fails unless `t` (pack tensor `name`) spans the segments of `s` along the
// split dimension.
void check_extent(const TensorView& t, const TpSplit& s, std::string_view name) {
  const Dims d = dims_of(t);
  const bool by_rows = s.dim == TpSplit::Dim::kRows;
  if ((by_rows ? d.rows : d.cols) != extent(s))
    fail("tensor parallel: tensor '{}' has shape {}; expected {} {} from the config", name,
         t.shape_string(), extent(s), by_rows ? "rows" : "columns");
}

}  // namespace

TpStorage::TpStorage() = default;
TpStorage::~TpStorage() = default;

PackFp8Scales& TpStorage::add_scales() {
  scales_.push_back(std::make_unique<PackFp8Scales>());
  return *scales_.back();
}

void TpStorage::clear() {
  blocks_.clear();
  pool_.clear();
  scales_.clear();
}

void TpStorage::recycle() {
  for (Block& b : blocks_) pool_.push_back(std::move(b));
  blocks_.clear();
  scales_.clear();
}

void* TpStorage::allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
  // The smallest recycled block that holds it, else a new one.
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->capacity >= rounded && (best == pool_.end() || it->capacity < best->capacity))
      best = it;
  if (best != pool_.end()) {
    blocks_.push_back(std::move(*best));
    pool_.erase(best);
    return blocks_.back().p.get();
  }
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) fail("tensor parallel: cannot allocate {} bytes for a weight slice", bytes);
  blocks_.push_back(Block{std::unique_ptr<void, Free>(p), rounded});
  return p;
}

void TpStorage::Free::operator()(void* p) const { std::free(p); }

TensorView tp_slice(const TensorView& full, const TpSplit& s, TpRank r, std::string_view name,
                    TpStorage& storage) {
  if (s.dim == TpSplit::Dim::kNone || !r.split()) return full;
  if (full.ndim < 1 || full.ndim > 3)
    fail("tensor parallel: tensor '{}' has {} dims; expected 1 to 3", name, full.ndim);
  check_extent(full, s, name);
  const auto [outer, rows, cols] = dims_of(full);
  const bool by_rows = s.dim == TpSplit::Dim::kRows;
  const std::vector<Range> ranges = rank_ranges(s, r);
  int64_t kept = 0;
  for (const Range& g : ranges) kept += g.end - g.begin;
  const int64_t out_rows = by_rows ? kept : rows, out_cols = by_rows ? cols : kept;
  const size_t es = dtype_size(full.dtype);
  auto* dst = static_cast<uint8_t*>(storage.allocate(outer * out_rows * out_cols * es));
  const auto* src = static_cast<const uint8_t*>(full.data);
  uint8_t* o = dst;
  for (int64_t e = 0; e < outer; ++e) {
    const uint8_t* base = src + e * rows * cols * es;
    if (by_rows) {  // whole rows: one copy per range
      for (const Range& g : ranges) {
        const size_t n = (g.end - g.begin) * cols * es;
        std::memcpy(o, base + g.begin * cols * es, n);
        o += n;
      }
    } else {  // a run of columns of every row
      for (int64_t i = 0; i < rows; ++i) {
        for (const Range& g : ranges) {
          const size_t n = (g.end - g.begin) * es;
          std::memcpy(o, base + (i * cols + g.begin) * es, n);
          o += n;
        }
      }
    }
  }
  // The full shape with the split dimension narrowed (vectors split by rows only).
  std::vector<int64_t> shape(full.shape, full.shape + full.ndim);
  shape[by_rows ? std::max(0, full.ndim - 2) : full.ndim - 1] = kept;
  return TensorView(dst, full.dtype, shape);
}

void tp_check_fp8(const PackFp8Scales& q, const TpSplit& s, int size, std::string_view source) {
  if (s.dim == TpSplit::Dim::kNone || size <= 1) return;
  const Dims d = dims_of(q.weight);
  const bool by_rows = s.dim == TpSplit::Dim::kRows;
  const int64_t len = by_rows ? d.rows : d.cols;
  const int64_t block = by_rows ? q.block_rows : q.block_cols;
  if (len != extent(s) || block <= 0) return;  // tp_slice reports the shape
  const char* unit = by_rows ? "row" : "column";
  for (int r = 0; r < size; ++r) {
    for (const Range& g : rank_ranges(s, TpRank{r, size})) {
      for (const int64_t at : {g.begin, g.end}) {
        if (at % block == 0 || at == len) continue;
        fail(
            "{}: tensor parallel {}: tensor '{}' splits {}at {} {}, inside its FP8 scale blocks "
            "of {} {}s (expected a multiple of {}); convert with --dtype f32 (exact) or bf16 to "
            "split it",
            source, size, q.tensor, q.weight.ndim == 3 ? "each expert " : "", unit, at, block, unit,
            block);
      }
    }
  }
}

const PackFp8Scales* tp_slice_fp8(const PackFp8Scales& q, const TensorView& weight,
                                  const TpSplit& s, TpRank r, std::string_view source,
                                  TpStorage& storage) {
  if (s.dim == TpSplit::Dim::kNone || !r.split()) return &q;
  tp_check_fp8(q, s, r.size, source);
  check_extent(q.weight, s, q.tensor);
  const Dims d = dims_of(q.weight);
  const bool by_rows = s.dim == TpSplit::Dim::kRows;
  const int64_t br = q.block_rows, bc = q.block_cols;
  // note: stacked experts' scale rows are counted per expert (each expert
  // starts on a scale row: load_moe_weights checked rows % block_rows).
  if (d.outer > 1 && d.rows % br != 0)
    fail("{}: tensor '{}': scale blocks of {} rows straddle experts of {} rows", source, q.tensor,
         br, d.rows);
  const int64_t srows = d.outer * ceil_div(d.rows, br), scols = ceil_div(d.cols, bc);
  if (q.scale.dtype != DType::F32 || q.scale.ndim != 2 || q.scale.shape[0] != srows ||
      q.scale.shape[1] != scols)
    fail("{}: tensor '{}' has scale shape {}; expected [{}, {}]", source, q.scale_name,
         q.scale.shape_string(), srows, scols);
  // The rank's ranges in scale blocks.
  std::vector<Range> blocks;
  for (const Range& g : rank_ranges(s, r))
    blocks.push_back({g.begin / (by_rows ? br : bc), ceil_div(g.end, by_rows ? br : bc)});
  int64_t kept = 0;
  for (const Range& g : blocks) kept += g.end - g.begin;
  const int64_t per_expert = srows / d.outer;  // scale rows of one expert
  const int64_t out_rows = by_rows ? d.outer * kept : srows, out_cols = by_rows ? scols : kept;
  auto* dst = static_cast<float*>(storage.allocate(out_rows * out_cols * sizeof(float)));
  const float* src = q.scale.as<float>();
  float* o = dst;
  if (by_rows) {
    for (int64_t e = 0; e < d.outer; ++e) {
      for (const Range& g : blocks) {
        const size_t n = (g.end - g.begin) * scols;
        std::memcpy(o, src + (e * per_expert + g.begin) * scols, n * sizeof(float));
        o += n;
      }
    }
  } else {
    for (int64_t i = 0; i < srows; ++i) {
      for (const Range& g : blocks) {
        const size_t n = g.end - g.begin;
        std::memcpy(o, src + i * scols + g.begin, n * sizeof(float));
        o += n;
      }
    }
  }
  PackFp8Scales& out = storage.add_scales();
  out.tensor = q.tensor;
  out.weight = weight;
  out.scale_name = q.scale_name;
  out.scale.data = dst;
  out.scale.dtype = DType::F32;
  out.scale.set_shape(std::vector<int64_t>{out_rows, out_cols});
  out.block_rows = br;
  out.block_cols = bc;
  return &out;
}

MoeWeights tp_slice_experts(const MoeWeights& full, const ModelConfig& c, TpRank r,
                            const std::string& p, std::string_view source, TpStorage& storage) {
  MoeWeights w = full;
  // The rank's slice of `t` (and of its scales *fp8 when it is FP8).
  auto slice = [&](const TensorView& t, const PackFp8Scales** fp8, const char* suffix) {
    const std::string name = p + suffix;
    const TpSplit s = tp_split(c, name, 0);
    const TensorView v = tp_slice(t, s, r, name, storage);
    if (*fp8 != nullptr) *fp8 = tp_slice_fp8(**fp8, v, s, r, source, storage);
    return v;
  };
  w.gate_up_proj = slice(full.gate_up_proj, &w.gate_up_fp8, "mlp.experts.gate_up_proj");
  w.down_proj = slice(full.down_proj, &w.down_fp8, "mlp.experts.down_proj");
  index_experts(w);
  if (w.has_shared) {
    w.shared_gate_up_proj =
        slice(full.shared_gate_up_proj, &w.shared_gate_up_fp8, "mlp.shared_expert.gate_up_proj");
    w.shared_down_proj =
        slice(full.shared_down_proj, &w.shared_down_fp8, "mlp.shared_expert.down_proj");
  }
  return w;
}

}  // namespace qtk
