#include "loaders/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "loaders/name_table.h"

namespace qtk {

using nlohmann::json;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// note: a FIFO, a device or a directory under a checkpoint file's name would
// otherwise read as "missing" (or block a read); it is refused by name.
void refuse_non_regular(const std::string& path) {
  struct stat lst {
  }, st{};
  if (::lstat(path.c_str(), &lst) != 0) return;  // absent
  if (::stat(path.c_str(), &st) != 0) fail("{}: a symlink to nothing", path);
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  fail("{}: expected a regular file, found {}", path, kind);
}

std::string quote_name(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Reads the index: tensor name -> shard file name.
std::map<std::string, std::string> read_index(const std::string& path) {
  const json doc = load_json_file(path);
  if (!doc.is_object()) fail("{}: expected a JSON object, found {}", path, doc.type_name());
  if (!doc.contains("weight_map") || !doc["weight_map"].is_object())
    fail("{}: field 'weight_map': expected an object of tensor name -> shard file, found {}", path,
         doc.contains("weight_map") ? doc["weight_map"].dump().substr(0, 60) : "nothing");
  std::map<std::string, std::string> map;
  for (const auto& [tensor, shard] : doc["weight_map"].items()) {
    if (!shard.is_string())
      fail("{}: field 'weight_map': tensor {}: expected a shard file name, found {}", path,
           quote_name(tensor), shard.dump());
    const std::string s = shard.get<std::string>();
    if (!is_plain_file_name(s))
      fail(
          "{}: field 'weight_map': tensor {}: expected a plain file name inside the directory, "
          "found {}",
          path, quote_name(tensor), quote_name(s));
    map.emplace(tensor, s);
  }
  if (map.empty()) fail("{}: field 'weight_map': expected at least one tensor, found none", path);
  return map;
}

// Canonical name -> (shard file name, tensor), the tensors not yet claimed.
using TensorsByName = std::map<std::string, std::pair<std::string, const SafetensorsTensor*>>;

constexpr std::string_view kScaleSuffix = "_scale_inv";

// Finds, validates and claims the scale of the FP8 weight `t`.
// note: a weight is FP8 because of its dtype; the `_scale_inv` name only
// pairs the scale with its weight (the format's convention).
void attach_fp8_scale(const Checkpoint& ck, TensorsByName& rest, CheckpointTensor& t) {
  const std::string file = ck.file_path(t.file);
  const TensorView& v = t.view;
  if (v.dtype == DType::F8_E5M2)
    fail(
        "{}: tensor {}: dtype F8_E5M2 is not supported (expected F8_E4M3 block-FP8 weights with "
        "float32 scales, or BF16, F16, F32)",
        file, quote_name(t.hf_name));
  const Fp8Quantization& q = ck.config().fp8;
  if (!q.enabled)
    fail(
        "{}: tensor {}: dtype F8_E4M3, but {}/config.json has no quantization_config (expected "
        "quant_method \"fp8\" for FP8 weights)",
        file, quote_name(t.hf_name), ck.dir());
  if (v.ndim != 2)
    fail("{}: tensor {}: F8_E4M3 is supported for 2-D weights only, found shape {}", file,
         quote_name(t.hf_name), v.shape_string());
  const std::vector<int64_t> want = {(v.shape[0] + q.block_rows - 1) / q.block_rows,
                                     (v.shape[1] + q.block_cols - 1) / q.block_cols};
  const std::string scale_name = t.name + std::string(kScaleSuffix);
  const auto it = rest.find(scale_name);
  if (it == rest.end())
    fail(
        "{}: tensor {} is F8_E4M3 but its scale {}{} is missing (expected F32 {} for "
        "weight_block_size [{}, {}])",
        ck.dir(), quote_name(t.hf_name), t.hf_name, kScaleSuffix, shape_text(want), q.block_rows,
        q.block_cols);
  const auto& [shard, s] = it->second;
  const std::string sfile = ck.file_path(shard);
  if (s->view.dtype != DType::F32)
    fail("{}: tensor {}: expected dtype F32 (the block scales of an FP8 weight), found {}", sfile,
         quote_name(s->name), dtype_name(s->view.dtype));
  const std::vector<int64_t> got(s->view.shape, s->view.shape + s->view.ndim);
  if (got != want)
    fail("{}: tensor {}: expected shape {} (ceil of {} {} by the {}x{} blocks), found {}", sfile,
         quote_name(s->name), shape_text(want), quote_name(t.hf_name), v.shape_string(),
         q.block_rows, q.block_cols, shape_text(got));
  // note: the scales are small (one per 16K weights) and all read here;
  // what makes one unusable: core/dtype.h, Fp8ScaleFault.
  using Kind = Fp8ScaleFault::Kind;
  if (const auto e = first_fp8_scale_fault(s->view.data, static_cast<const uint8_t*>(v.data),
                                           v.shape[0], v.shape[1], q.block_rows, q.block_cols)) {
    const float f = e->scale;
    if (e->kind == Kind::kNotFinite)
      fail("{}: tensor {}: expected finite scales, found {} at block [{}, {}]", sfile,
           quote_name(s->name), f, e->block_row, e->block_col);
    if (e->kind == Kind::kNegative)
      fail("{}: tensor {}: expected non-negative scales, found {} at block [{}, {}]", sfile,
           quote_name(s->name), f, e->block_row, e->block_col);
    if (e->kind == Kind::kZeroOverData)
      fail(
          "{}: tensor {}: expected a positive scale at block [{}, {}] (its weights in {} are "
          "not all zero: element [{}, {}] is byte 0x{:02x}), found {}",
          sfile, quote_name(s->name), e->block_row, e->block_col, quote_name(t.hf_name), e->row,
          e->col, e->byte, f);
    const float x = fp8_e4m3_to_f32(e->byte);
    fail(
        "{}: tensor {}: the scale {} at block [{}, {}] overflows float32 for element [{}, "
        "{}] of {}: FP8 value {} x scale {} = {:g} (expected products within float32)",
        sfile, quote_name(s->name), f, e->block_row, e->block_col, e->row, e->col,
        quote_name(t.hf_name), x, f, static_cast<double>(x) * f);
  }
  t.scale = s->view;
  t.scale_hf_name = s->name;
  rest.erase(it);
}

// A `_scale_inv` tensor left over belongs to a weight that is not FP8.
void reject_stray_scales(const Checkpoint& ck, const TensorsByName& rest) {
  for (const auto& [name, where] : rest) {
    if (name.size() <= kScaleSuffix.size() ||
        name.compare(name.size() - kScaleSuffix.size(), kScaleSuffix.size(), kScaleSuffix) != 0)
      continue;
    const CheckpointTensor* base = ck.find(name.substr(0, name.size() - kScaleSuffix.size()));
    if (base)
      fail(
          "{}: tensor {}: a block scale for {}, whose dtype is {} (expected scales only beside "
          "F8_E4M3 weights)",
          ck.file_path(where.first), quote_name(where.second->name), quote_name(base->hf_name),
          dtype_name(base->view.dtype));
  }
}

}  // namespace

bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  if (name.find('/') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    return false;
  return !has_control_character(name);
}

bool Checkpoint::has_file(const std::string& name) const {
  return is_regular_file(file_path(name));
}

std::string Checkpoint::file_path(const std::string& name) const { return dir_ + "/" + name; }

const CheckpointTensor* Checkpoint::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// config.json, and generation_config.json when present (its token ids win).
void Checkpoint::read_configs() {
  const std::string& dir = dir_;
  for (const char* f : {"config.json", "generation_config.json", kSingleFile, kIndexFile})
    refuse_non_regular(file_path(f));
  const std::string config_path = file_path("config.json");
  if (!is_regular_file(config_path)) fail("{}: missing config.json", dir);
  config_ = load_hf_config(config_path);
  source_files_.push_back(config_path);

  if (has_file("generation_config.json")) {
    const std::string gpath = file_path("generation_config.json");
    generation_ = load_generation_config(gpath);
    has_generation_ = true;
    source_files_.push_back(gpath);
    if (generation_.has_eos) config_.eos_token_ids = generation_.eos_token_ids;
    if (config_.bos_token_id < 0) config_.bos_token_id = generation_.bos_token_id;
    if (config_.pad_token_id < 0) config_.pad_token_id = generation_.pad_token_id;
    validate_model_config(config_, gpath);
  }
}

// The shards named by the index, each checked to hold exactly the tensors
// the index gives it.
void Checkpoint::open_indexed_shards() {
  const std::string& dir = dir_;
  const std::string index_path = file_path(kIndexFile);
  source_files_.push_back(index_path);
  const auto index = read_index(index_path);
  for (const auto& [tensor, shard] : index) {
    if (shards_.count(shard)) continue;
    const std::string path = file_path(shard);
    refuse_non_regular(path);
    if (!is_regular_file(path))
      fail("{}: field 'weight_map': tensor {}: shard {} does not exist in {}", index_path,
           quote_name(tensor), quote_name(shard), dir);
    shards_.emplace(shard, SafetensorsFile::open(path));
  }
  for (const auto& [name, file] : shards_) source_files_.push_back(file->path());
  // Every indexed tensor is in its shard.
  for (const auto& [tensor, shard] : index) {
    if (!shards_.at(shard)->find(tensor))
      fail("{}: tensor {} is indexed to {} but that shard does not contain it", index_path,
           quote_name(tensor), shard);
  }
  // Every tensor of a shard is indexed to that shard (so none is in two shards).
  for (const auto& [shard, file] : shards_) {
    for (const auto& t : file->tensors()) {
      const auto it = index.find(t.name);
      if (it == index.end())
        fail("{}: tensor {} is not listed in {} (unindexed tensor)", file->path(),
             quote_name(t.name), kIndexFile);
      if (it->second != shard)
        fail("{}: tensor {} is in two shards: {} and {} (the index names {})", dir,
             quote_name(t.name), shard, it->second, it->second);
    }
  }
}

// The weights: one file or an index of shards, never both.
void Checkpoint::open_weights() {
  const std::string& dir = dir_;
  const bool single = has_file(kSingleFile);
  const bool sharded = has_file(kIndexFile);
  if (single && sharded)
    fail("{}: both {} and {} exist; expected one (remove the stale one)", dir, kSingleFile,
         kIndexFile);
  if (!single && !sharded) fail("{}: no weights: expected {} or {}", dir, kSingleFile, kIndexFile);

  if (single) {
    const std::string path = file_path(kSingleFile);
    source_files_.push_back(path);
    shards_.emplace(kSingleFile, SafetensorsFile::open(path));
  } else {
    open_indexed_shards();
  }
}

// Every tensor under its canonical name; the tensors the name table skips
// are counted by group into `skipped`.
Checkpoint::TensorsByName Checkpoint::canonical_tensors(
    std::map<std::string, SkippedGroup>& skipped) const {
  const std::string& dir = dir_;
  TensorsByName by_canonical;
  for (const auto& [shard, file] : shards_) {
    for (const auto& t : file->tensors()) {
      const HfName m = map_hf_name(t.name);
      if (m.kind == HfName::Kind::kUnknown)
        fail(
            "{}: tensor {}: unknown tensor name (expected model.*, model.language_model.*, "
            "lm_head.weight, model.visual.* or mtp.*)",
            file->path(), quote_name(t.name));
      if (m.kind == HfName::Kind::kSkipped) {
        SkippedGroup& g = skipped[m.group];
        g.prefix = m.group;
        g.count += 1;
        g.bytes += t.view.nbytes();
        continue;
      }
      auto [it, inserted] = by_canonical.emplace(m.canonical, std::pair{shard, &t});
      if (!inserted)
        fail("{}: tensors {} and {} both map to {} (mixed name layouts?)", dir,
             quote_name(it->second.second->name), quote_name(t.name), quote_name(m.canonical));
    }
  }
  return by_canonical;
}

// Claims the tensors the config expects, checking shape and dtype (and
// attaching FP8 scales), into tensors_ and index_.
void Checkpoint::claim_expected_tensors(TensorsByName& by_canonical) {
  const std::string& dir = dir_;
  const ModelConfig& c = config_;
  const std::string& arch = c.hf_architecture;
  // note: the routed experts are stored one tensor per expert or fused into
  // 3-D tensors; a fused gate_up_proj anywhere picks the fused layout, and
  // a layer in the other layout then fails below as missing/unexpected.
  ExpertLayout experts = ExpertLayout::kPerExpert;
  // note: a layer that holds both layouts is named here; left to the
  // missing/unexpected checks below it would be blamed on another layer.
  std::map<std::string, std::string> fused_in, per_expert_in;  // "layers.N." -> a source tensor
  for (const auto& [name, where] : by_canonical) {
    const std::string_view fused = ".mlp.experts.gate_up_proj";
    if (name.size() > fused.size() && name.ends_with(fused)) experts = ExpertLayout::kFused;
    const size_t at = name.find(".mlp.experts.");
    if (at == std::string::npos) continue;
    const std::string layer = name.substr(0, at + 1);
    // note: "experts.N.*" (N digits) is the per-expert layout and a name
    // with no further dot ("experts.gate_up_proj") the fused one; anything
    // else ("experts.-1.gate_proj.weight", "experts. 1.*") is neither and is
    // left to the unexpected-tensor check, which names it.
    const std::string_view rest =
        std::string_view(name).substr(at + std::string_view(".mlp.experts.").size());
    const size_t digits = rest.find_first_not_of("0123456789");
    if (digits > 0 && digits != std::string_view::npos && rest[digits] == '.')
      per_expert_in.emplace(layer, where.second->name);
    else if (rest.find('.') == std::string_view::npos)
      fused_in.emplace(layer, where.second->name);
  }
  for (const auto& [layer, fused_name] : fused_in)
    if (const auto it = per_expert_in.find(layer); it != per_expert_in.end())
      fail(
          "{}: layer {} holds both expert layouts: fused {} and per-expert {} (expected one: the "
          "fused mlp.experts.gate_up_proj/down_proj, or mlp.experts.N.*_proj per expert)",
          dir, layer.substr(0, layer.size() - 1), quote_name(fused_name), quote_name(it->second));
  // note: the per-expert layout expects 3 tensors per expert per MoE layer;
  // a num_experts the checkpoint cannot hold (a damaged or huge value) is
  // refused here, before the expected-tensor table is built in proportion
  // to it.
  if (experts == ExpertLayout::kPerExpert && c.moe.num_experts > 0 &&
      c.moe.num_experts > static_cast<int64_t>(by_canonical.size() / 3)) {
    std::string held = fmt::format("at most {} (the checkpoint holds {} tensors, 3 per expert)",
                                   by_canonical.size() / 3, by_canonical.size());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      if (!c.is_moe_layer(i)) continue;
      const auto r = by_canonical.find(fmt::format("layers.{}.mlp.gate.weight", i));
      if (r != by_canonical.end() && r->second.second->view.ndim >= 1) {
        held = fmt::format("{} (the first dimension of the router {} {})",
                           r->second.second->view.shape[0], quote_name(r->second.second->name),
                           r->second.second->view.shape_string());
        break;
      }
    }
    fail("{}: field '{}': expected {}, found {}", file_path("config.json"),
         c.moe.num_experts_field.empty() ? "num_experts" : c.moe.num_experts_field, held,
         c.moe.num_experts);
  }
  for (const ExpectedTensor& e : expected_tensors(c, experts)) {
    const auto it = by_canonical.find(e.name);
    if (it == by_canonical.end()) {
      if (e.name == "lm_head.weight")
        fail("{}: missing tensor lm_head.weight (tie_word_embeddings is false, so it is required)",
             dir);
      fail("{}: missing tensor {} (expected shape {} for {})", dir, quote_name(e.name),
           shape_text(e.shape), arch);
    }
    const auto& [shard, t] = it->second;
    const TensorView& v = t->view;
    std::vector<int64_t> got(v.shape, v.shape + v.ndim);
    if (got != e.shape)
      fail("{}: tensor {}: expected shape {} from the config, found {}", file_path(shard),
           quote_name(t->name), shape_text(e.shape), shape_text(got));
    CheckpointTensor ct{t->name, e.name, shard, v, {}, {}};
    if (v.dtype == DType::F8_E4M3 || v.dtype == DType::F8_E5M2) {
      attach_fp8_scale(*this, by_canonical, ct);
    } else if (v.dtype != DType::BF16 && v.dtype != DType::F16 && v.dtype != DType::F32) {
      fail("{}: tensor {}: dtype {} is not supported (expected BF16, F16, F32 or F8_E4M3)",
           file_path(shard), quote_name(t->name), dtype_name(v.dtype));
    }
    index_.emplace(e.name, tensors_.size());
    tensors_.push_back(std::move(ct));
    by_canonical.erase(e.name);
  }
}

// note: transformers leaves a module in high precision when its name holds
// an entry of modules_to_not_convert; a checkpoint whose FP8 tensors fall
// under one contradicts itself. The dtype decides (an F8_E4M3 tensor has
// only its fp8 bytes and scales), and a config line says so.
void Checkpoint::note_fp8_in_modules_not_converted() {
  for (const std::string& key : config_.fp8.modules_to_not_convert) {
    const CheckpointTensor* first = nullptr;
    int64_t count = 0;
    for (const CheckpointTensor& t : tensors_)
      if (t.view.dtype == DType::F8_E4M3 && t.hf_name.find(key) != std::string::npos) {
        if (first == nullptr) first = &t;
        ++count;
      }
    if (first != nullptr)
      config_.resolution.push_back(fmt::format(
          "quantization_config.modules_to_not_convert names '{}', yet {} F8_E4M3 tensor{} under "
          "it (first: {}) {} block scales: read as FP8 (a weight's dtype decides)",
          key, count, count == 1 ? "" : "s", first->hf_name, count == 1 ? "has" : "have"));
  }
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir_in) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  ck->dir_ = dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail("{}: expected a checkpoint directory, found {}", dir,
         ::stat(dir.c_str(), &st) != 0 ? "nothing" : "a file");

  ck->read_configs();
  ck->open_weights();
  std::map<std::string, SkippedGroup> skipped;
  TensorsByName by_canonical = ck->canonical_tensors(skipped);
  ck->claim_expected_tensors(by_canonical);
  ck->note_fp8_in_modules_not_converted();
  const ModelConfig& c = ck->config_;
  const std::string& arch = c.hf_architecture;
  // note: a tied checkpoint may still carry lm_head.weight (a copy of the
  // embeddings); it is accepted and ignored, and reported as skipped.
  if (c.tie_word_embeddings) {
    if (const auto it = by_canonical.find("lm_head.weight"); it != by_canonical.end()) {
      skipped["lm_head (tied)"] = {"lm_head (tied)", 1, it->second.second->view.nbytes()};
      by_canonical.erase(it);
      if (const auto sc = by_canonical.find("lm_head.weight_scale_inv"); sc != by_canonical.end()) {
        skipped["lm_head (tied)"].count += 1;
        skipped["lm_head (tied)"].bytes += sc->second.second->view.nbytes();
        by_canonical.erase(sc);
      }
    }
  }
  reject_stray_scales(*ck, by_canonical);
  if (!by_canonical.empty()) {
    const auto& [name, where] = *by_canonical.begin();
    fail("{}: tensor {}: unexpected tensor (canonical {}) for {} with layer plan {}",
         ck->file_path(where.first), quote_name(where.second->name), quote_name(name), arch,
         c.plan_string());
  }
  for (const std::string& prefix : skipped_group_prefixes())
    if (skipped.count(prefix)) ck->skipped_.push_back(skipped.at(prefix));
  if (skipped.count("lm_head (tied)")) ck->skipped_.push_back(skipped.at("lm_head (tied)"));
  return ck;
}

}  // namespace qtk
