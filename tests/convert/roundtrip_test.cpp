// Round trip: every fixture model and sample, converted with each --dtype,
// read back with Pack::open and compared with the source tensors read
// straight from the safetensors files (by HF name, without the converter's
// name table): bytes equal for kept matrices (fused tensors as sub-ranges),
// the conversion rule element by element otherwise, transforms recomputed
// here in double. Plus the zip structure walked independently (every entry
// STORED, data 64-byte aligned) and `unzip -t`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/dtype_convert.h"
#include "convert_test_util.h"
#include "loaders/safetensors.h"
#include "pack/pack.h"

namespace qtk {
namespace {

using testing::TempDir;

// All tensors of all .safetensors files in a directory, by HF name.
class Source {
 public:
  explicit Source(const std::string& dir) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string p = e.path().string();
      if (p.size() > 12 && p.substr(p.size() - 12) == ".safetensors" &&
          e.path().filename() != "activations.safetensors") {
        files_.push_back(SafetensorsFile::open(p));
        for (const auto& t : files_.back()->tensors()) by_name_[t.name] = &t.view;
      }
    }
  }
  // HF tensor for a canonical name: tries the plain and the multimodal layout.
  const TensorView& get(const std::string& canonical) const {
    for (const std::string prefix : {"model.", "model.language_model.", ""}) {
      auto it = by_name_.find(prefix + canonical);
      if (it != by_name_.end()) return *it->second;
    }
    throw std::runtime_error("source has no tensor " + canonical);
  }
  bool has(const std::string& canonical) const {
    for (const std::string prefix : {"model.", "model.language_model.", ""})
      if (by_name_.count(prefix + canonical)) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
};

std::string bytes_of(const TensorView& v) {
  return std::string(static_cast<const char*>(v.data), static_cast<size_t>(v.nbytes()));
}
std::string rows_of(const TensorView& v, int64_t r0, int64_t n) {
  const int64_t row_bytes = v.nbytes() / v.shape[0];
  return std::string(static_cast<const char*>(v.data) + r0 * row_bytes,
                     static_cast<size_t>(n * row_bytes));
}
double element(const TensorView& v, int64_t i) {
  float f;
  convert_elements(static_cast<const uint8_t*>(v.data) + i * dtype_size(v.dtype), v.dtype, &f,
                   DType::F32, 1);
  return f;
}
std::string f32_bytes(const TensorView& v, double (*fn)(double)) {
  std::string out(static_cast<size_t>(v.numel()) * 4, '\0');
  for (int64_t i = 0; i < v.numel(); ++i) {
    const float f = static_cast<float>(fn(element(v, i)));
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

// What a pack tensor must hold: raw source bytes in the source dtype
// (matrices, before any dtype conversion) or final f32 bytes (small tensors).
struct Expect {
  std::string bytes;
  DType dtype;
  bool small = false;
};

Expect expected(const Source& src, const ModelConfig& c, const std::string& name) {
  auto ends = [&](const char* s) {
    return name.size() >= std::strlen(s) &&
           name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0;
  };
  const std::string layer =
      name.rfind("layers.", 0) == 0 ? name.substr(0, name.find('.', 7) + 1) : "";
  const bool plus_one = c.norm_adds_one;
  auto identity = [](double x) { return x; };
  auto add_one = [](double x) { return 1.0 + x; };
  auto norm = [&](const std::string& hf) {
    return Expect{f32_bytes(src.get(hf), plus_one ? +add_one : +identity), DType::F32, true};
  };
  if (name == "embed_tokens" || name == "lm_head") {
    const auto& v = src.get(name == "lm_head" ? "lm_head.weight" : "embed_tokens.weight");
    return {bytes_of(v), v.dtype};
  }
  if (name == "norm") return norm("norm.weight");
  if (ends("input_layernorm") || ends("post_attention_layernorm") || ends("q_norm") ||
      ends("k_norm"))
    return norm(name + ".weight");
  // Mixture of experts: the pack stacks experts [E, 2I, H] (gate rows, then
  // up rows, per expert) and [E, H, I], whether the source has one tensor per
  // expert or the fused 3-D tensors.
  if (ends("mlp.router")) {
    const auto& v = src.get(layer + "mlp.gate.weight");
    return {bytes_of(v), v.dtype};
  }
  if (ends("mlp.experts.gate_up_proj") || ends("mlp.experts.down_proj")) {
    if (src.has(name)) {
      const auto& v = src.get(name);
      return {bytes_of(v), v.dtype};
    }
    const bool gate_up = ends("mlp.experts.gate_up_proj");
    std::string b;
    DType dt = DType::F32;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const std::string x = layer + "mlp.experts." + std::to_string(e) + ".";
      const auto& first = src.get(x + (gate_up ? "gate_proj.weight" : "down_proj.weight"));
      dt = first.dtype;
      b += bytes_of(first);
      if (gate_up) b += bytes_of(src.get(x + "up_proj.weight"));
    }
    return {b, dt};
  }
  if (ends("mlp.shared_expert.gate_up_proj")) {
    const auto& g = src.get(layer + "mlp.shared_expert.gate_proj.weight");
    return {bytes_of(g) + bytes_of(src.get(layer + "mlp.shared_expert.up_proj.weight")), g.dtype};
  }
  if (ends("mlp.shared_expert_gate")) {
    const auto& v = src.get(name + ".weight");
    return {bytes_of(v), v.dtype};
  }
  if (ends("mlp.gate_up_proj")) {
    const auto& g = src.get(layer + "mlp.gate_proj.weight");
    return {bytes_of(g) + bytes_of(src.get(layer + "mlp.up_proj.weight")), g.dtype};
  }
  if (ends("down_proj") || ends("o_proj") || ends("out_proj")) {
    const auto& v = src.get(name + ".weight");
    return {bytes_of(v), v.dtype};
  }
  if (ends("self_attn.qkv_proj")) {
    const auto& q = src.get(layer + "self_attn.q_proj.weight");
    std::string b;
    if (c.attn_output_gate) {
      const int64_t D = c.head_dim;
      for (int64_t h = 0; h < c.num_attention_heads; ++h) b += rows_of(q, 2 * h * D, D);
      for (int64_t h = 0; h < c.num_attention_heads; ++h) b += rows_of(q, 2 * h * D + D, D);
    } else {
      b = bytes_of(q);
    }
    b += bytes_of(src.get(layer + "self_attn.k_proj.weight"));
    b += bytes_of(src.get(layer + "self_attn.v_proj.weight"));
    return {b, q.dtype};
  }
  if (ends("linear_attn.in_proj")) {
    const auto& qkv = src.get(layer + "linear_attn.in_proj_qkv.weight");
    return {bytes_of(qkv) + bytes_of(src.get(layer + "linear_attn.in_proj_z.weight")) +
                bytes_of(src.get(layer + "linear_attn.in_proj_b.weight")) +
                bytes_of(src.get(layer + "linear_attn.in_proj_a.weight")),
            qkv.dtype};
  }
  if (ends("linear_attn.conv1d"))
    return {f32_bytes(src.get(name + ".weight"), identity), DType::F32, true};
  if (ends("linear_attn.dt_bias")) return {f32_bytes(src.get(name), identity), DType::F32, true};
  if (ends("linear_attn.A"))
    return {f32_bytes(src.get(layer + "linear_attn.A_log"), [](double x) { return -std::exp(x); }),
            DType::F32, true};
  if (ends("linear_attn.norm"))
    return {f32_bytes(src.get(name + ".weight"), identity), DType::F32, true};
  throw std::runtime_error("unexpected pack tensor " + name);
}

uint16_t le16(const std::string& s, size_t p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[p]) | (static_cast<uint8_t>(s[p + 1]) << 8));
}
uint32_t le32(const std::string& s, size_t p) {
  return le16(s, p) | (static_cast<uint32_t>(le16(s, p + 2)) << 16);
}

// Walks the local headers from offset 0 (not through the central
// directory): each must be STORED with its data on a 64-byte boundary.
// Returns the number of entries.
int walk_local_headers(const std::string& file) {
  size_t pos = 0;
  int n = 0;
  while (pos + 4 <= file.size() && le32(file, pos) == 0x04034b50) {
    EXPECT_EQ(le16(file, pos + 8), 0) << "entry " << n << " is not STORED";
    EXPECT_EQ(le16(file, pos + 6) & 0x9, 0)
        << "entry " << n << " is encrypted or has a data descriptor";
    const size_t data = pos + 30 + le16(file, pos + 26) + le16(file, pos + 28);
    EXPECT_EQ(data % 64, 0u) << "entry " << n << " data at " << data;
    uint64_t size = le32(file, pos + 18);
    EXPECT_NE(size, 0xFFFFFFFFu) << "fixtures are small; no zip64 expected";
    pos = data + size;
    ++n;
  }
  EXPECT_EQ(le32(file, pos), 0x02014b50u) << "central directory does not follow the last entry";
  return n;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(RoundTrip, PackMatchesSource) {
  const auto& [model, dtype_text] = GetParam();
  TempDir tmp;
  ConvertOptions opt;
  opt.input = testing::source_path(model);
  opt.output = tmp.file("m.pack");
  opt.matrix_dtype = parse_matrix_dtype(dtype_text);
  const ConvertResult r = convert_checkpoint(opt);
  EXPECT_EQ(tmp.listing(), std::set<std::string>{"m.pack"}) << "temporary files left behind";

  const auto pack = Pack::open(opt.output);
  const ModelConfig& c = pack->config();
  const Source src(opt.input);
  size_t matrices = 0, smalls = 0;
  for (const auto& t : pack->tensors()) {
    SCOPED_TRACE(t.name);
    const Expect e = expected(src, c, t.name);
    const std::string got(static_cast<const char*>(t.view.data),
                          static_cast<size_t>(t.view.nbytes()));
    if (e.small) {
      ++smalls;
      EXPECT_EQ(t.view.dtype, DType::F32);
      EXPECT_TRUE(got == e.bytes) << "small tensor differs from the recomputed transform";
      continue;
    }
    ++matrices;
    const DType want_dtype = opt.matrix_dtype.value_or(e.dtype);
    ASSERT_EQ(t.view.dtype, want_dtype);
    const int64_t n = static_cast<int64_t>(e.bytes.size()) / dtype_size(e.dtype);
    ASSERT_EQ(t.view.numel(), n);
    if (want_dtype == e.dtype) {
      EXPECT_TRUE(got == e.bytes) << "bytes differ from the source sub-ranges";
    } else {
      // The rule, element by element (dtype_convert_test checks the scalar
      // functions against independent references).
      std::string conv(static_cast<size_t>(n * dtype_size(want_dtype)), '\0');
      for (int64_t i = 0; i < n; ++i)
        convert_elements(e.bytes.data() + i * dtype_size(e.dtype), e.dtype,
                         conv.data() + i * dtype_size(want_dtype), want_dtype, 1);
      EXPECT_TRUE(got == conv) << "converted bytes differ";
    }
  }
  // Every source tensor appears: count what the config implies.
  const int64_t full = std::count(c.layer_plan.begin(), c.layer_plan.end(), LayerKind::kFull);
  const int64_t lin = c.num_layers - full;
  // note: per layer, a dense MLP is 2 matrices; an MoE block 3 (router,
  // stacked gate_up, stacked down) plus 3 for a shared expert (gate_up,
  // down, its gate).
  int64_t mlp = 0, moe_layers = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    moe_layers += c.is_moe_layer(i);
    mlp += !c.is_moe_layer(i) ? 2 : c.moe.shared_expert_intermediate > 0 ? 6 : 3;
  }
  EXPECT_EQ(static_cast<int64_t>(matrices),
            1 + (c.tie_word_embeddings ? 0 : 1) + mlp + 2 * full + 2 * lin);
  EXPECT_EQ(static_cast<int64_t>(smalls), 1 + 2 * c.num_layers + 2 * full + 4 * lin);
  if (!c.tie_word_embeddings) {
    EXPECT_TRUE(src.has("lm_head.weight"));
  }
  EXPECT_EQ(pack->find_tensor("lm_head") == nullptr, c.tie_word_embeddings);

  // Manifest essentials.
  const auto& m = pack->manifest();
  EXPECT_EQ(m["format"], "qtk-pack");
  EXPECT_EQ(m["version"], "1.0");
  EXPECT_EQ(m["layer_plan"], c.plan_string());
  EXPECT_EQ(static_cast<int64_t>(c.plan_string().size()), c.num_layers);
  EXPECT_EQ(m["rope"]["rotary_dim"], c.rope.rotary_dim);
  EXPECT_EQ(pack->has_transform("norm_plus_one_folded"), c.norm_adds_one);
  EXPECT_EQ(pack->has_transform("A_neg_exp"), lin > 0);
  EXPECT_EQ(pack->has_transform("split_q_gate"), c.attn_output_gate);
  EXPECT_EQ(pack->has_transform("fuse_gate_up"),
            c.has_dense_mlp() || c.moe.shared_expert_intermediate > 0);
  // stack_experts exactly when the source stores one tensor per expert.
  bool per_expert = false;
  for (int64_t i = 0; i < c.num_layers; ++i)
    per_expert |= c.is_moe_layer(i) &&
                  src.has("layers." + std::to_string(i) + ".mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(pack->has_transform("stack_experts"), per_expert);
  EXPECT_EQ(moe_layers > 0, c.has_moe());
  EXPECT_EQ(pack->entry("tokenizer.json").has_value(),
            std::filesystem::exists(opt.input + "/tokenizer.json"));
  if (pack->entry("tokenizer.json")) {
    EXPECT_TRUE(std::string(*pack->entry("tokenizer.json")) ==
                testing::read_file(opt.input + "/tokenizer.json"));
  }
  EXPECT_EQ(pack->verify(), r.entries - 1);  // every entry but the manifest

  // Zip structure, independently of the reader, and by unzip.
  const std::string file = testing::read_file(opt.output);
  EXPECT_EQ(walk_local_headers(file), static_cast<int>(r.entries));
  const auto u = testing::run_shell("unzip -tq " + testing::quote(opt.output));
  EXPECT_EQ(u.status, 0) << u.out << u.err;
}

INSTANTIATE_TEST_SUITE_P(AllModels, RoundTrip,
                         ::testing::Combine(::testing::ValuesIn(testing::all_models()),
                                            ::testing::Values("keep", "f32", "bf16", "f16")),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           n = n.substr(n.find_last_of('/') + 1);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(RoundTrip, SameInputGivesByteIdenticalPacks) {
  TempDir tmp;
  for (const char* out : {"a.pack", "b.pack"}) {
    ConvertOptions opt;
    opt.input = testing::source_path("tests/data/models/qwen3.5-tiny");
    opt.output = tmp.file(out);
    convert_checkpoint(opt);
  }
  EXPECT_TRUE(testing::read_file(tmp.file("a.pack")) == testing::read_file(tmp.file("b.pack")));
}

}  // namespace
}  // namespace qtk

namespace qtk {
namespace {

// One safetensors file from (name, dtype, shape, bytes) records.
struct StTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
std::string safetensors_file(const std::vector<StTensor>& ts) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype == DType::BF16  ? "BF16"
                           : t.dtype == DType::F16 ? "F16"
                                                   : "F32"},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string header = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

// The Qwen3.5-MoE fixture rewritten as the text-only class
// Qwen3_5MoeForCausalLM (model.layers.*, text_config at the top) with one
// tensor per expert (the FP8 releases' layout, here in bf16): the pack must
// hold the same tensors, byte for byte, as the one converted from the
// multimodal layout with fused 3-D experts.
TEST(RoundTrip, Qwen35MoeTextOnlyPerExpertEqualsFusedMultimodal) {
  TempDir tmp;
  const std::string vlm = testing::source_path("tests/data/models/qwen3.5-moe-tiny-vlm");
  const std::string text_dir = tmp.file("text-only");
  std::filesystem::create_directories(text_dir);
  auto cfg = nlohmann::json::parse(testing::read_file(vlm + "/config.json"));
  nlohmann::json text = cfg["text_config"];
  text["architectures"] = {"Qwen3_5MoeForCausalLM"};
  testing::write_file(text_dir + "/config.json", text.dump(2));
  std::vector<StTensor> out;
  int64_t stacked = 0;
  for (const auto& e : std::filesystem::directory_iterator(vlm)) {
    const std::string p = e.path().string();
    if (!p.ends_with(".safetensors") || e.path().filename() == "activations.safetensors") continue;
    const auto f = SafetensorsFile::open(p);
    for (const auto& t : f->tensors()) {
      const std::string prefix = "model.language_model.";
      if (!t.name.starts_with(prefix) && t.name != "lm_head.weight") continue;  // vision, MTP
      const std::string name =
          t.name == "lm_head.weight" ? t.name : "model." + t.name.substr(prefix.size());
      const TensorView& v = t.view;
      const std::string bytes = bytes_of(v);
      std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
      const bool gate_up = name.ends_with("mlp.experts.gate_up_proj");
      if (!gate_up && !name.ends_with("mlp.experts.down_proj")) {
        out.push_back({name, v.dtype, shape, bytes});
        continue;
      }
      ++stacked;
      const std::string base =
          name.substr(0, name.size() - std::string(gate_up ? "gate_up_proj" : "down_proj").size());
      const int64_t E = shape[0], rows = shape[1], cols = shape[2];
      const size_t per = static_cast<size_t>(rows * cols * dtype_size(v.dtype));
      for (int64_t x = 0; x < E; ++x) {
        const std::string one = bytes.substr(x * per, per);
        const std::string pre = base + std::to_string(x) + ".";
        if (gate_up) {  // gate rows first, then up rows
          out.push_back(
              {pre + "gate_proj.weight", v.dtype, {rows / 2, cols}, one.substr(0, per / 2)});
          out.push_back({pre + "up_proj.weight", v.dtype, {rows / 2, cols}, one.substr(per / 2)});
        } else {
          out.push_back({pre + "down_proj.weight", v.dtype, {rows, cols}, one});
        }
      }
    }
  }
  ASSERT_EQ(stacked, 8);  // 4 layers x (gate_up, down)
  testing::write_file(text_dir + "/model.safetensors", safetensors_file(out));

  ConvertOptions a, b;
  a.input = vlm;
  a.output = tmp.file("vlm.pack");
  b.input = text_dir;
  b.output = tmp.file("text.pack");
  convert_checkpoint(a);
  convert_checkpoint(b);
  const auto pa = Pack::open(a.output);
  const auto pb = Pack::open(b.output);
  EXPECT_EQ(pb->config().hf_architecture, "Qwen3_5MoeForCausalLM");
  ASSERT_EQ(pa->tensors().size(), pb->tensors().size());
  for (size_t i = 0; i < pa->tensors().size(); ++i) {
    const auto& x = pa->tensors()[i];
    const auto& y = pb->tensors()[i];
    ASSERT_EQ(x.name, y.name);
    EXPECT_EQ(x.view.nbytes(), y.view.nbytes()) << x.name;
    EXPECT_EQ(std::memcmp(x.view.data, y.view.data, static_cast<size_t>(x.view.nbytes())), 0)
        << x.name;
  }
  auto ca = config_to_json(pa->config()), cb = config_to_json(pb->config());
  for (auto* c : {&ca, &cb}) c->erase("hf_architecture"), c->erase("model_type");
  EXPECT_EQ(ca, cb);
  EXPECT_FALSE(pa->has_transform("stack_experts"));
  EXPECT_TRUE(pb->has_transform("stack_experts"));
}

}  // namespace
}  // namespace qtk

#ifdef QTK_INSPECT_BIN
namespace qtk {
namespace {

// `inspect X.pack` on MoE packs: experts, top-k, renormalisation, shared
// expert, the mlp plan, the context and the stack_experts transform where it
// applied.
TEST(RoundTrip, InspectShowsExperts) {
  testing::TempDir tmp;
  for (const char* model : {"qwen3-moe-tiny", "qwen3.5-moe-tiny-vlm"}) {
    SCOPED_TRACE(model);
    ConvertOptions opt;
    opt.input = testing::source_path(std::string("tests/data/models/") + model);
    opt.output = tmp.file(std::string(model) + ".pack");
    convert_checkpoint(opt);
    const auto r =
        testing::run_shell(std::string(QTK_INSPECT_BIN) + " " + testing::quote(opt.output));
    ASSERT_EQ(r.status, 0) << r.err;
    const bool q35 = std::string(model) == "qwen3.5-moe-tiny-vlm";
    const std::string want_experts =
        q35 ? "experts:       8 x width 32, top-2, renormalised, shared expert width 48 (sigmoid "
              "gate)\n"
            : "experts:       8 x width 32, top-2, renormalised, shared expert none\n";
    EXPECT_NE(r.out.find(want_experts), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(q35 ? "mlp plan:      EEEE  dense layers: none\n"
                             : "mlp plan:      EEE  dense layers: none\n"),
              std::string::npos)
        << r.out;
    // The context (a prompt plus its output stops there) is shown too.
    EXPECT_NE(r.out.find("context:       4096 positions (max_position_embeddings"),
              std::string::npos)
        << r.out;
    // Per-expert sources are stacked (stack_experts); fused 3-D ones are copied.
    EXPECT_EQ(r.out.find("stack_experts") != std::string::npos, !q35) << r.out;
  }
}

// `inspect --tensors` lists every tensor with its dtype, shape and bytes, an
// FP8 weight with its block scales, for a pack (--dtype keep) and for the
// checkpoint it came from.
TEST(RoundTrip, InspectListsTensors) {
  testing::TempDir tmp;
  ConvertOptions opt;
  opt.input = testing::source_path("tests/data/models/qwen3-fp8-tiny");
  opt.output = tmp.file("fp8.pack");  // (FP8 kept: the default)
  convert_checkpoint(opt);
  const auto p =
      testing::run_shell(std::string(QTK_INSPECT_BIN) + " --tensors " + testing::quote(opt.output));
  ASSERT_EQ(p.status, 0) << p.err;
  EXPECT_NE(p.out.find("\n  layers.1.mlp.down_proj F8_E4M3 [256, 320] 81920  scales "
                       "layers.1.mlp.down_proj.scale [2, 3] of 128 x 128 blocks\n"),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("\n  lm_head BF16 [512, 256] 262144\n"), std::string::npos) << p.out;
  // The summary, a heading, then one line per tensor.
  const auto plain =
      testing::run_shell(std::string(QTK_INSPECT_BIN) + " " + testing::quote(opt.output));
  const auto lines = [](const std::string& t) {
    return static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
  };
  EXPECT_EQ(lines(p.out), lines(plain.out) + 1 + Pack::open(opt.output)->tensors().size());
  const auto c =
      testing::run_shell(std::string(QTK_INSPECT_BIN) + " --tensors " + testing::quote(opt.input));
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.out.find("\n  model.layers.1.mlp.down_proj.weight F8_E4M3 [256, 320] 81920 "
                       "model.safetensors  scales model.layers.1.mlp.down_proj.weight_scale_inv "
                       "[2, 3]\n"),
            std::string::npos)
      << c.out;
}

}  // namespace
}  // namespace qtk
#endif
