#include "convert/tensor_plan.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <set>

#include "convert/dtype_convert.h"
#include "core/error.h"

namespace qtk {

int64_t PlannedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string tensor_entry_name(const std::string& name) { return "tensors/" + name; }

std::string fp8_scale_name(const std::string& name) { return name + ".scale"; }

std::string fp8_source_scale_name(const std::string& name) { return name + "_scale_inv"; }

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

double load_as_double(const void* base, DType t, int64_t i) {
  float f;
  convert_elements(static_cast<const uint8_t*>(base) + i * dtype_size(t), t, &f, DType::F32, 1);
  return f;
}

class Planner {
 public:
  Planner(const ModelConfig& c, const TensorLookup& lookup, MatrixDType md,
          const std::string& source)
      : c_(c), lookup_(lookup), matrix_dtype_(md), source_(source) {}

  // The source tensor `name`, checked against `shape`.
  const TensorView& need(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* v = lookup_(name);
    if (v == nullptr)
      fail("{}: tensor \"{}\" is missing (expected shape {})", source_, name, shape_str(shape));
    if (v->dtype == DType::F8_E4M3) {
      need_fp8_scale(name, *v);
    } else if (!is_pack_float(v->dtype)) {
      fail("{}: tensor \"{}\" has dtype {}; convert reads BF16, F16, F32 and F8_E4M3", source_,
           name, dtype_name(v->dtype));
    }
    std::vector<int64_t> got(v->shape, v->shape + v->ndim);
    if (got != shape)
      fail("{}: tensor \"{}\": expected shape {} (from config.json), found {}", source_, name,
           shape_str(shape), shape_str(got));
    used_.insert(name);
    return *v;
  }

  // The block scales of an F8_E4M3 source (the loader validated them).
  void need_fp8_scale(const std::string& name, const TensorView& v) {
    const std::string scale_name = fp8_source_scale_name(name);
    const TensorView* s = lookup_(scale_name);
    if (!c_.fp8.enabled || v.ndim != 2 || s == nullptr || s->dtype != DType::F32 || s->ndim != 2 ||
        s->shape[0] !=
            (v.shape[0] + c_.fp8.block_rows - 1) / std::max<int64_t>(c_.fp8.block_rows, 1) ||
        s->shape[1] !=
            (v.shape[1] + c_.fp8.block_cols - 1) / std::max<int64_t>(c_.fp8.block_cols, 1))
      fail(
          "{}: tensor \"{}\" is F8_E4M3 but has no valid float32 block scales \"{}\" (and an fp8 "
          "quantization_config)",
          source_, name, scale_name);
    fp8_scales_[&v] = s;
    used_.insert(scale_name);
  }

  // Rows [r0, r0 + n) of a row-major matrix.
  static Piece rows(const TensorView& v, int64_t r0, int64_t n) {
    const int64_t cols = v.numel() / std::max<int64_t>(v.shape[0], 1);
    Piece p{static_cast<const uint8_t*>(v.data) + r0 * cols * dtype_size(v.dtype), v.dtype,
            n * cols};
    p.source = &v;
    p.origin = &v;
    p.row0 = r0;
    return p;
  }
  static Piece whole(const TensorView& v) {
    Piece p{v.data, v.dtype, v.numel()};
    p.source = &v;
    p.origin = &v;
    return p;
  }

  // A matrix in the pack: stored in --dtype, or the sources' dtype for keep.
  void matrix(const std::string& name, std::vector<int64_t> shape, std::vector<Piece> pieces,
              std::initializer_list<const char*> transforms = {}) {
    PlannedTensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.pieces = std::move(pieces);
    for (Piece& p : t.pieces) {
      if (p.dtype != DType::F8_E4M3) continue;
      // note: FP8 pieces must come from whole() or rows() of a tensor that
      // need() returned, which know their source matrix and its scales.
      const auto it = fp8_scales_.find(p.source);
      if (it == fp8_scales_.end())
        fail(
            "{}: internal error: pack tensor \"{}\" has an F8_E4M3 piece without its source's "
            "scales",
            source_, name);
      p.scale = it->second;
      p.block_rows = c_.fp8.block_rows;
      p.block_cols = c_.fp8.block_cols;
    }
    if (matrix_dtype_) {
      t.dtype = *matrix_dtype_;
    } else {
      t.dtype = t.pieces.front().dtype;
      for (const Piece& p : t.pieces) {
        if (p.dtype == t.dtype) continue;
        if (p.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E4M3)
          fail(
              "{}: pack tensor \"{}\" fuses F8_E4M3 and {} sources; --dtype keep cannot store one "
              "matrix of both exactly (not supported yet); pass --dtype f32 or bf16 to dequantize",
              source_, name, dtype_name(p.dtype == DType::F8_E4M3 ? t.dtype : p.dtype));
        fail("{}: pack tensor \"{}\" fuses sources of dtypes {} and {}; pass --dtype to pick one",
             source_, name, dtype_name(t.dtype), dtype_name(p.dtype));
      }
    }
    for (const Piece& p : t.pieces)
      if (p.dtype != t.dtype)
        note_transform(p.dtype == DType::F8_E4M3 ? "dequantize_fp8" : "cast_matrices", name);
    for (const char* tr : transforms) note_transform(tr, name);
    const bool keep_fp8 = t.dtype == DType::F8_E4M3;
    out_.push_back(std::move(t));
    if (keep_fp8) fp8_scales(out_.back());
  }

  // The pack's block scales of FP8 pack tensor t (pieces of whole rows of
  // F8_E4M3 sources, each with its own scales), pushed right after it.
  // note: the layout choice. Fusing rows (fuse_qkv, fuse_gate_up,
  // split_q_gate) puts a source's row r at pack row off + r; a source block
  // of 128 rows then starts at a pack row that is a multiple of 128 only when
  // every earlier part's row count is one (intermediate 320 is not), and a
  // pack row block of 128 could straddle two sources with different scales.
  // Re-quantizing would change the weights and dequantizing would lose the
  // halved size, so the pack's scales use row blocks of g rows instead: g is
  // the largest divisor of 128 that divides every part's first source row
  // and the row count of every part but the last. Then each pack block of g
  // rows lies inside one source block, and its scale is that block's scale,
  // copied unchanged (g = 128, the source layout itself, for an unfused
  // matrix and for real Qwen shapes). The kernels take g as a parameter.
  void fp8_scales(const PlannedTensor& t) {
    const int64_t cols = t.shape.back();
    const int64_t rows = t.numel() / std::max<int64_t>(cols, 1);
    const int64_t bc = c_.fp8.block_cols;
    int64_t g = c_.fp8.block_rows;
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      const Piece& p = t.pieces[i];
      if (p.source == nullptr || p.source->ndim != 2 || p.source->shape[1] != cols ||
          p.count % cols != 0)
        fail("{}: internal error: FP8 pack tensor \"{}\" has a piece that is not whole rows",
             source_, t.name);
      g = std::gcd(g, p.row0);
      if (i + 1 < t.pieces.size()) g = std::gcd(g, p.count / cols);
    }
    const int64_t groups = (rows + g - 1) / g, cblocks = (cols + bc - 1) / bc;
    auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(groups * cblocks));
    int64_t dst_row = 0;
    for (const Piece& p : t.pieces) {
      const int64_t n = p.count / cols;
      const auto* src = static_cast<const uint8_t*>(p.scale->data);
      for (int64_t r = 0; r < n; r += g) {
        const int64_t src_block = (p.row0 + r) / p.block_rows;
        std::memcpy(values->data() + ((dst_row + r) / g) * cblocks,
                    src + src_block * p.scale->shape[1] * 4, static_cast<size_t>(cblocks) * 4);
      }
      dst_row += n;
    }
    PlannedTensor s;
    s.name = fp8_scale_name(t.name);
    s.dtype = DType::F32;
    s.shape = {groups, cblocks};
    s.pieces.push_back({values->data(), DType::F32, groups * cblocks, false});
    s.computed = std::move(values);
    quantized_.push_back({t.name, s.name, g, bc});
    note_transform("fp8_block_scales", t.name);
    out_.push_back(std::move(s));
  }

  // A small vector stored as f32, optionally through a per-element function
  // evaluated in double.
  void small(const std::string& name, std::vector<int64_t> shape, const TensorView& v,
             double (*fn)(double), std::initializer_list<const char*> transforms = {}) {
    if (v.dtype == DType::F8_E4M3)
      fail("{}: pack tensor \"{}\": an F8_E4M3 source is supported for matrices only", source_,
           name);
    PlannedTensor t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = std::move(shape);
    if (fn == nullptr) {
      t.pieces.push_back(whole(v));
    } else {
      auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(v.numel()));
      for (int64_t i = 0; i < v.numel(); ++i)
        (*values)[static_cast<size_t>(i)] =
            static_cast<float>(fn(load_as_double(v.data, v.dtype, i)));
      t.pieces.push_back({values->data(), DType::F32, v.numel(), false});
      t.pieces.back().origin = &v;
      t.computed = std::move(values);
    }
    if (v.dtype != DType::F32) note_transform("small_tensors_f32", name);
    for (const char* tr : transforms) note_transform(tr, name);
    out_.push_back(std::move(t));
  }

  void note_transform(const std::string& tr, const std::string& tensor) {
    auto& list = transforms_[tr];
    if (list.empty() || list.back() != tensor) list.push_back(tensor);
  }

  // A norm weight: f32, with Qwen3.5's (1 + w) folded in.
  void norm(const std::string& pack_name, const std::string& hf_name, int64_t n) {
    const TensorView& v = need(hf_name, {n});
    if (c_.norm_adds_one)
      small(pack_name, {n}, v, [](double w) { return 1.0 + w; }, {"norm_plus_one_folded"});
    else
      small(pack_name, {n}, v, nullptr);
  }

  void plan() {
    const int64_t H = c_.hidden_size, I = c_.intermediate_size, V = c_.vocab_size;
    matrix("embed_tokens", {V, H}, {whole(need("embed_tokens.weight", {V, H}))});
    for (int64_t i = 0; i < c_.num_layers; ++i) {
      const std::string hf = fmt::format("layers.{}.", i);
      const std::string pk = fmt::format("layers.{}.", i);
      norm(pk + "input_layernorm", hf + "input_layernorm.weight", H);
      const LayerKind kind = c_.layer_plan.at(static_cast<size_t>(i));
      if (kind == LayerKind::kFull)
        full_attention(hf, pk);
      else
        linear_attention(hf, pk);
      norm(pk + "post_attention_layernorm", hf + "post_attention_layernorm.weight", H);
      if (c_.is_moe_layer(i)) {
        experts(hf, pk);
        continue;
      }
      const TensorView& gate = need(hf + "mlp.gate_proj.weight", {I, H});
      const TensorView& up = need(hf + "mlp.up_proj.weight", {I, H});
      matrix(pk + "mlp.gate_up_proj", {2 * I, H}, {whole(gate), whole(up)}, {"fuse_gate_up"});
      matrix(pk + "mlp.down_proj", {H, I}, {whole(need(hf + "mlp.down_proj.weight", {H, I}))});
    }
    norm("norm", "norm.weight", H);
    if (!c_.tie_word_embeddings) {
      matrix("lm_head", {V, H}, {whole(need("lm_head.weight", {V, H}))});
    } else if (lookup_("lm_head.weight") != nullptr) {
      // note: transformers ties the head to the embedding and ignores a
      // stored lm_head.weight; so do we.
      used_.insert("lm_head.weight");
    }
  }

  void full_attention(const std::string& hf, const std::string& pk) {
    const int64_t H = c_.hidden_size, D = c_.head_dim, Hq = c_.num_attention_heads,
                  Hkv = c_.num_kv_heads;
    const bool gated = c_.attn_output_gate;
    const TensorView& q = need(hf + "self_attn.q_proj.weight", {Hq * D * (gated ? 2 : 1), H});
    const TensorView& k = need(hf + "self_attn.k_proj.weight", {Hkv * D, H});
    const TensorView& v = need(hf + "self_attn.v_proj.weight", {Hkv * D, H});
    std::vector<Piece> pieces;
    if (gated) {
      // note: HF's q_proj yields, per head, D query rows then D gate rows;
      // the runtime wants all queries, then all gates (one GEMM, two slabs).
      for (int64_t h = 0; h < Hq; ++h) pieces.push_back(rows(q, h * 2 * D, D));
      for (int64_t h = 0; h < Hq; ++h) pieces.push_back(rows(q, h * 2 * D + D, D));
    } else {
      pieces.push_back(whole(q));
    }
    pieces.push_back(whole(k));
    pieces.push_back(whole(v));
    const int64_t rows_total = Hq * D * (gated ? 2 : 1) + 2 * Hkv * D;
    if (gated)
      matrix(pk + "self_attn.qkv_proj", {rows_total, H}, std::move(pieces),
             {"fuse_qkv", "split_q_gate"});
    else
      matrix(pk + "self_attn.qkv_proj", {rows_total, H}, std::move(pieces), {"fuse_qkv"});
    matrix(pk + "self_attn.o_proj", {H, Hq * D},
           {whole(need(hf + "self_attn.o_proj.weight", {H, Hq * D}))});
    norm(pk + "self_attn.q_norm", hf + "self_attn.q_norm.weight", D);
    norm(pk + "self_attn.k_norm", hf + "self_attn.k_norm.weight", D);
  }

  // A mixture-of-experts layer. Whatever the source layout, the pack holds
  // the routed experts stacked: mlp.experts.gate_up_proj [E, 2I, H] (expert
  // e's gate rows, then its up rows) and mlp.experts.down_proj [E, H, I].
  // note: that is the Hub's fused 3-D layout, so a fused source is copied as
  // it is; per-expert sources are streamed piece by piece into it
  // (stack_experts), never gathered in memory.
  void experts(const std::string& hf, const std::string& pk) {
    const int64_t H = c_.hidden_size, E = c_.moe.num_experts;
    const int64_t I = c_.moe.expert_intermediate_size;
    matrix(pk + "mlp.router", {E, H}, {whole(need(hf + "mlp.gate.weight", {E, H}))});
    if (lookup_(hf + "mlp.experts.gate_up_proj") != nullptr) {
      matrix(pk + "mlp.experts.gate_up_proj", {E, 2 * I, H},
             {whole(need(hf + "mlp.experts.gate_up_proj", {E, 2 * I, H}))});
      matrix(pk + "mlp.experts.down_proj", {E, H, I},
             {whole(need(hf + "mlp.experts.down_proj", {E, H, I}))});
    } else {
      std::vector<Piece> gate_up, down;
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}mlp.experts.{}.", hf, e);
        gate_up.push_back(whole(need(x + "gate_proj.weight", {I, H})));
        gate_up.push_back(whole(need(x + "up_proj.weight", {I, H})));
        down.push_back(whole(need(x + "down_proj.weight", {H, I})));
      }
      matrix(pk + "mlp.experts.gate_up_proj", {E, 2 * I, H}, std::move(gate_up), {"stack_experts"});
      matrix(pk + "mlp.experts.down_proj", {E, H, I}, std::move(down), {"stack_experts"});
    }
    if (const int64_t S = c_.moe.shared_expert_intermediate; S > 0) {
      const TensorView& gate = need(hf + "mlp.shared_expert.gate_proj.weight", {S, H});
      const TensorView& up = need(hf + "mlp.shared_expert.up_proj.weight", {S, H});
      matrix(pk + "mlp.shared_expert.gate_up_proj", {2 * S, H}, {whole(gate), whole(up)},
             {"fuse_gate_up"});
      matrix(pk + "mlp.shared_expert.down_proj", {H, S},
             {whole(need(hf + "mlp.shared_expert.down_proj.weight", {H, S}))});
      matrix(pk + "mlp.shared_expert_gate", {1, H},
             {whole(need(hf + "mlp.shared_expert_gate.weight", {1, H}))});
    }
  }

  void linear_attention(const std::string& hf, const std::string& pk) {
    const int64_t H = c_.hidden_size, Hv = c_.linear_num_value_heads, Dv = c_.linear_value_head_dim;
    const int64_t C = c_.linear_conv_dim(), K = c_.linear_conv_kernel, VD = c_.linear_value_dim();
    const TensorView& qkv = need(hf + "linear_attn.in_proj_qkv.weight", {C, H});
    const TensorView& z = need(hf + "linear_attn.in_proj_z.weight", {VD, H});
    const TensorView& b = need(hf + "linear_attn.in_proj_b.weight", {Hv, H});
    const TensorView& a = need(hf + "linear_attn.in_proj_a.weight", {Hv, H});
    if (!matrix_dtype_ && (qkv.dtype == DType::F8_E4M3 || z.dtype == DType::F8_E4M3) &&
        b.dtype != DType::F8_E4M3 && a.dtype != DType::F8_E4M3) {
      // note: Qwen's FP8 releases quantise in_proj_qkv and in_proj_z but keep
      // the [Hv, H] gates in_proj_b/a in bf16; one fused matrix cannot hold
      // both exactly, so --dtype keep stores the b and a rows as their own
      // matrix and the runtime writes its outputs into the same columns of
      // the projection (each output is its own dot product: same values).
      matrix(pk + "linear_attn.in_proj", {C + VD, H}, {whole(qkv), whole(z)},
             {"fuse_gdn_in_proj", "split_gdn_in_proj_ba"});
      matrix(pk + "linear_attn.in_proj_ba", {2 * Hv, H}, {whole(b), whole(a)},
             {"split_gdn_in_proj_ba"});
    } else {
      matrix(pk + "linear_attn.in_proj", {C + VD + 2 * Hv, H},
             {whole(qkv), whole(z), whole(b), whole(a)}, {"fuse_gdn_in_proj"});
    }
    // note: [C, 1, K] and [C, K] hold the same bytes in the same order; only
    // the recorded shape changes.
    small(pk + "linear_attn.conv1d", {C, K}, need(hf + "linear_attn.conv1d.weight", {C, 1, K}),
          nullptr, {"conv1d_squeeze"});
    small(pk + "linear_attn.dt_bias", {Hv}, need(hf + "linear_attn.dt_bias", {Hv}), nullptr);
    // note: exp in double, one rounding to f32 at the end.
    small(pk + "linear_attn.A", {Hv}, need(hf + "linear_attn.A_log", {Hv}),
          [](double x) { return -std::exp(x); }, {"A_neg_exp"});
    // note: the gated GDN norm computes w * x: not folded.
    small(pk + "linear_attn.norm", {Dv}, need(hf + "linear_attn.norm.weight", {Dv}), nullptr);
    matrix(pk + "linear_attn.out_proj", {H, VD},
           {whole(need(hf + "linear_attn.out_proj.weight", {H, VD}))});
  }

  TensorPlan finish(const std::vector<std::string>& all_names) {
    for (const auto& n : all_names)
      if (!used_.count(n))
        fail("{}: tensor \"{}\" is not used by any pack tensor (unsupported feature?)", source_, n);
    TensorPlan plan;
    plan.tensors = std::move(out_);
    static const std::pair<const char*, const char*> kDescriptions[] = {
        {"fuse_gate_up",
         "mlp.gate_up_proj = rows of mlp.gate_proj, then rows of mlp.up_proj (likewise "
         "mlp.shared_expert.gate_up_proj)"},
        {"stack_experts",
         "per-expert mlp.experts.{e}.{gate,up,down}_proj stacked: mlp.experts.gate_up_proj "
         "[E, 2I, H] = per expert e, rows of gate_proj then up_proj; mlp.experts.down_proj "
         "[E, H, I] = down_proj of each expert in order (the layout of fused 3-D sources, which "
         "are copied as they are)"},
        {"fuse_qkv",
         "self_attn.qkv_proj = rows of q_proj (queries[, gates]), then k_proj, then v_proj"},
        {"split_q_gate",
         "q_proj rows per head [query D; gate D] de-interleaved into all queries (Hq*D rows), then "
         "all gates (Hq*D rows)"},
        {"fuse_gdn_in_proj",
         "linear_attn.in_proj = rows of in_proj_qkv, in_proj_z, in_proj_b, in_proj_a"},
        {"split_gdn_in_proj_ba",
         "FP8 packs whose in_proj_qkv or in_proj_z is F8_E4M3 while in_proj_b and in_proj_a are "
         "not: linear_attn.in_proj holds the in_proj_qkv and in_proj_z rows only, and "
         "linear_attn.in_proj_ba [2*Hv, H] the in_proj_b then in_proj_a rows in their own dtype"},
        {"conv1d_squeeze", "linear_attn.conv1d.weight [C, 1, K] stored as [C, K]"},
        {"A_neg_exp", "linear_attn.A = -exp(A_log), computed in float64, rounded once to float32"},
        {"norm_plus_one_folded",
         "RMSNorm weights (input/post_attention_layernorm, norm, q_norm, k_norm) stored as 1 + w, "
         "computed in float64, rounded to float32; linear_attn.norm is not folded"},
        {"small_tensors_f32",
         "norm weights, conv1d, dt_bias and A stored as float32 (exact widening)"},
        {"cast_matrices",
         "matrices converted to the requested dtype (round to nearest even when narrowing)"},
        {"fp8_block_scales",
         "F8_E4M3 (e4m3fn) matrices kept as they are, each with float32 scales <name>.scale "
         "[ceil(rows/g), ceil(cols/128)]: real weight = fp8 value x the scale of its g x 128 "
         "block (g in the quantization section: 128, or a divisor of 128 where fused parts start "
         "at rows that are not multiples of 128); scale values copied unchanged"},
        {"dequantize_fp8",
         "F8_E4M3 matrices dequantized: fp8 value x its 128x128 block's scale, exact in float64, "
         "rounded once to the requested dtype (nearest even; for f32 the float32 product the "
         "FP8 kernels compute)"},
    };
    for (const auto& [name, desc] : kDescriptions) {
      auto it = transforms_.find(name);
      if (it == transforms_.end()) continue;
      plan.transforms.push_back({name, desc, it->second});
    }
    plan.quantized = std::move(quantized_);
    if (!fp8_scales_.empty()) {
      plan.source_block_rows = c_.fp8.block_rows;
      plan.source_block_cols = c_.fp8.block_cols;
    }
    return plan;
  }

 private:
  const ModelConfig& c_;
  const TensorLookup& lookup_;
  MatrixDType matrix_dtype_;
  std::string source_;
  std::set<std::string> used_;
  std::vector<PlannedTensor> out_;
  std::map<std::string, std::vector<std::string>> transforms_;
  std::map<const TensorView*, const TensorView*> fp8_scales_;  // F8 source -> its scales
  std::vector<QuantizedRecord> quantized_;
};

// note: pages of a read-only file mapping that were streamed into the pack
// are dropped from this process (MADV_DONTNEED; the page cache keeps them, a
// later access faults them back in unchanged). Without this, every mapped
// page read stays in our resident set and peak RSS grows to the model size.
void release_pages(const void* data, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// note: conversions go through a 64 KiB staging buffer; a kept dtype is
// copied straight from the mapping into libzip's buffer.
constexpr size_t kStageElements = 16384;
// note: large pieces (an embedding is hundreds of MB) are released in steps
// while streaming, so peak RSS stays near this step, not the largest tensor.
constexpr int64_t kReleaseStep = 32 << 20;

class TensorSource final : public EntrySource {
 public:
  explicit TensorSource(const PlannedTensor& t)
      : t_(t), esize_(static_cast<size_t>(dtype_size(t.dtype))) {}
  uint64_t size() const override { return t_.nbytes(); }
  void rewind() override {
    piece_ = 0;
    elem_ = 0;
    released_ = 0;
    stage_len_ = stage_pos_ = 0;
  }
  size_t read(uint8_t* dst, size_t len) override {
    size_t done = 0;
    while (done < len) {
      if (stage_pos_ < stage_len_) {
        const size_t n = std::min(len - done, stage_len_ - stage_pos_);
        std::memcpy(dst + done, stage_.data() + stage_pos_, n);
        stage_pos_ += n;
        done += n;
        continue;
      }
      if (piece_ == t_.pieces.size()) break;
      const Piece& p = t_.pieces[piece_];
      const int64_t left = p.count - elem_;
      if (left == 0) {
        if (p.mapped)
          release_pages(static_cast<const uint8_t*>(p.data) + released_ * dtype_size(p.dtype),
                        static_cast<size_t>((p.count - released_) * dtype_size(p.dtype)));
        ++piece_;
        elem_ = 0;
        released_ = 0;
        continue;
      }
      const uint8_t* src = static_cast<const uint8_t*>(p.data) + elem_ * dtype_size(p.dtype);
      if (p.mapped && (elem_ - released_) * dtype_size(p.dtype) >= kReleaseStep) {
        release_pages(static_cast<const uint8_t*>(p.data) + released_ * dtype_size(p.dtype),
                      static_cast<size_t>((elem_ - released_) * dtype_size(p.dtype)));
        released_ = elem_;
      }
      if (p.dtype == t_.dtype && (len - done) >= esize_) {
        const size_t n = std::min<size_t>((len - done) / esize_, static_cast<size_t>(left));
        std::memcpy(dst + done, src, n * esize_);
        check_source(p, dst + done, n);
        done += n * esize_;
        elem_ += static_cast<int64_t>(n);
        continue;
      }
      size_t n = std::min<size_t>(kStageElements, static_cast<size_t>(left));
      stage_.resize(kStageElements * esize_);
      if (p.dtype == DType::F8_E4M3) {
        // One row at a time: each element needs its block's scale.
        const int64_t cols = p.source->shape[1];
        const int64_t row = p.row0 + elem_ / cols, col = elem_ % cols;
        n = std::min<size_t>(n, static_cast<size_t>(cols - col));
        const auto* scale_row = static_cast<const uint8_t*>(p.scale->data) +
                                (row / p.block_rows) * p.scale->shape[1] * 4;
        check_source(p, src, n);
        dequantize_fp8_row(src, scale_row, col, p.block_cols, stage_.data(), t_.dtype, n);
        check_converted(p, src, n, scale_row, col);
      } else {
        check_source(p, src, n);
        convert_elements(src, p.dtype, stage_.data(), t_.dtype, n);
        check_converted(p, src, n, nullptr, 0);
      }
      stage_len_ = n * esize_;
      stage_pos_ = 0;
      elem_ += static_cast<int64_t>(n);
    }
    return done;
  }

 private:
  // Where element `elem_ + i` of the current piece sits in its origin
  // tensor, as "[r, c]" (or the pack tensor's flat index without one).
  std::string where(const Piece& p, size_t i) const {
    int64_t flat = elem_ + static_cast<int64_t>(i);
    if (p.origin == nullptr) return fmt::format("[{}]", flat);
    if (p.mapped)
      flat += (static_cast<const uint8_t*>(p.data) - static_cast<const uint8_t*>(p.origin->data)) /
              dtype_size(p.dtype);
    std::vector<int64_t> idx(static_cast<size_t>(p.origin->ndim));
    for (int d = p.origin->ndim - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = flat % std::max<int64_t>(p.origin->shape[d], 1);
      flat /= std::max<int64_t>(p.origin->shape[d], 1);
    }
    std::string out = "[";
    for (size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
    return out + "]";
  }
  std::string label(const Piece& p) const {
    return p.label.empty() ? fmt::format("pack tensor \"{}\"", t_.name) : p.label;
  }

  // note: the source values are refused when they are not finite (a NaN
  // byte 0x7f/0xff in F8_E4M3, the e4m3fn encoding, or a NaN/inf float):
  // the runtime would compute on them silently. The scan runs over the bytes
  // just copied or about to be converted, so it costs one cheap pass over
  // data already in cache.
  void check_source(const Piece& p, const uint8_t* data, size_t n) const {
    const size_t bad = first_non_finite(data, p.dtype, n);
    if (bad == n) return;
    if (p.dtype == DType::F8_E4M3)
      fail(
          "{}: element {} is byte 0x{:02x}, a NaN in F8_E4M3 (e4m3fn); expected finite FP8 "
          "weights",
          label(p), where(p, bad), data[bad]);
    float f;
    convert_elements(data + bad * dtype_size(p.dtype), p.dtype, &f, DType::F32, 1);
    if (!p.mapped && p.origin != nullptr) {
      const int64_t i = elem_ + static_cast<int64_t>(bad);
      fail("{}: element {}: expected a finite value, found {} (computed from the source value {})",
           label(p), where(p, bad), f, load_as_double(p.origin->data, p.origin->dtype, i));
    }
    fail("{}: element {}: expected finite weights, found {} ({})", label(p), where(p, bad), f,
         dtype_name(p.dtype));
  }

  // The converted values (in stage_) must stay finite: a value beyond the
  // target dtype's range (a bf16 weight above 65504 in f16, an FP8 weight
  // times a huge scale) would become inf.
  void check_converted(const Piece& p, const uint8_t* src, size_t n, const uint8_t* scale_row,
                       int64_t col0) const {
    const size_t bad = first_non_finite(stage_.data(), t_.dtype, n);
    if (bad == n) return;
    float out;
    convert_elements(stage_.data() + bad * esize_, t_.dtype, &out, DType::F32, 1);
    if (p.dtype == DType::F8_E4M3) {
      float scale;
      std::memcpy(&scale, scale_row + 4 * ((col0 + static_cast<int64_t>(bad)) / p.block_cols), 4);
      fail(
          "{}: element {}: dequantized to {} it overflows: FP8 value {} x scale {} = {:g} becomes "
          "{} (expected a finite value; the scale or the --dtype is wrong)",
          label(p), where(p, bad), dtype_name(t_.dtype), fp8_e4m3_to_f32(src[bad]), scale,
          static_cast<double>(fp8_e4m3_to_f32(src[bad])) * scale, out);
    }
    float in;
    convert_elements(src + bad * dtype_size(p.dtype), p.dtype, &in, DType::F32, 1);
    fail(
        "{}: element {}: converted to {} it overflows: the {} value {} becomes {} (expected a "
        "finite value; pick a --dtype that holds it, e.g. bf16 or f32)",
        label(p), where(p, bad), dtype_name(t_.dtype), dtype_name(p.dtype), in, out);
  }

  const PlannedTensor& t_;
  size_t esize_;
  size_t piece_ = 0;
  int64_t elem_ = 0;
  int64_t released_ = 0;  // elements of the current piece already released
  std::vector<uint8_t> stage_;
  size_t stage_len_ = 0, stage_pos_ = 0;
};

}  // namespace

TensorPlan plan_tensors(const ModelConfig& config, const TensorLookup& lookup,
                        const std::vector<std::string>& all_names, MatrixDType matrix_dtype,
                        const std::string& source) {
  Planner p(config, lookup, matrix_dtype, source);
  p.plan();
  return p.finish(all_names);
}

std::unique_ptr<EntrySource> make_tensor_source(const PlannedTensor& t) {
  return std::make_unique<TensorSource>(t);
}

}  // namespace qtk
