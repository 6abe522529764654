// inspect MODEL_DIR | X.pack [--verify]
//
// For a Hugging Face checkpoint directory: architecture, hyperparameters,
// the layer plan (one letter per layer: L = linear attention (Gated
// DeltaNet), F = full attention), tensor count, bytes per dtype and the
// skipped groups. A regular file is handed to inspect_pack
// (convert/inspect_pack.cpp).
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <cxxopts.hpp>

#include "convert/inspect_pack.h"
#include "core/error.h"
#include "core/mapped_file.h"  // describe_file_type
#include "core/stdout_check.h"
#include "loaders/checkpoint.h"
#include "loaders/cli_args.h"

namespace qtk {
namespace {

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{} bytes ({:.1f} {})", b, v, units[u]);
}

std::string ids_text(const std::vector<int64_t>& ids) {
  return ids.empty() ? "none" : fmt::format("{}", fmt::join(ids, ", "));
}

std::string id_text(int64_t id) { return id < 0 ? "none" : std::to_string(id); }

// The mixture-of-experts lines: experts, top-k, renormalisation, shared
// expert, the stored expert layout and which layers are dense.
template <typename Line>
void print_moe(const Checkpoint& ck, Line&& line) {
  const ModelConfig& c = ck.config();
  const MoeConfig& m = c.moe;
  line(fmt::format("mixture of experts: {} experts of width {}, top-{} per token, {}",
                   m.num_experts, m.expert_intermediate_size, m.top_k,
                   m.norm_topk_prob ? "top-k weights renormalised to sum 1"
                                    : "top-k weights not renormalised (norm_topk_prob false)"));
  line(m.shared_expert_intermediate > 0
           ? fmt::format("shared expert: width {}, sigmoid gate", m.shared_expert_intermediate)
           : std::string("shared expert: none"));
  bool fused = false;
  for (const CheckpointTensor& t : ck.tensors())
    fused |= t.name.ends_with(".mlp.experts.gate_up_proj");
  line(fmt::format("expert tensors: {}",
                   fused ? "fused 3-D (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I])"
                         : "one per expert (mlp.experts.N.{gate,up,down}_proj)"));
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!c.is_moe_layer(i)) dense.push_back(i);
  line(fmt::format("mlp plan: {}  (E = mixture of experts, D = dense MLP); dense layers: {}",
                   c.mlp_plan_string(),
                   dense.empty() ? "none" : fmt::format("{}", fmt::join(dense, ", "))));
}

void print_checkpoint(const Checkpoint& ck, bool tensors) {
  const ModelConfig& c = ck.config();
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(fmt::format("checkpoint: {}", ck.dir()));
  line(fmt::format("architecture: {} (model_type {})", c.hf_architecture,
                   c.model_type.empty() ? "?" : c.model_type));
  line(fmt::format("layers: {}", c.num_layers));
  line(fmt::format("layer plan: {}  (F = full attention, L = linear attention)", c.plan_string()));
  line(fmt::format("hidden_size: {}", c.hidden_size));
  if (c.has_moe() && !c.has_dense_mlp())
    line(fmt::format("intermediate_size: {} (unused: no dense MLP layer)", c.intermediate_size));
  else
    line(fmt::format("intermediate_size: {}", c.intermediate_size));
  if (c.has_moe()) print_moe(ck, line);
  line(fmt::format("vocab_size: {}", c.vocab_size));
  line(fmt::format("attention: {} heads, {} kv heads, head_dim {}{}", c.num_attention_heads,
                   c.num_kv_heads, c.head_dim, c.attn_output_gate ? ", output gate" : ""));
  if (c.arch == Arch::kQwen3_5)
    line(fmt::format("linear attention: {} key heads x {}, {} value heads x {}, conv kernel {}",
                     c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
                     c.linear_value_head_dim, c.linear_conv_kernel));
  std::string rope = fmt::format("rope: theta {}, rotary_dim {} (partial_rotary_factor {})",
                                 c.rope.theta, c.rope.rotary_dim, c.rope.partial_factor);
  if (!c.rope.mrope_section.empty())
    rope += fmt::format(", mrope_section [{}]{}", fmt::join(c.rope.mrope_section, ", "),
                        c.rope.mrope_interleaved ? " interleaved" : "");
  line(rope);
  for (const std::string& r : c.resolution) line(fmt::format("config: {}", r));
  line(fmt::format("rms_norm_eps: {}{}", c.rms_norm_eps,
                   c.norm_adds_one ? " (norm computes x * (1 + w))" : ""));
  line(fmt::format("tie_word_embeddings: {}", c.tie_word_embeddings));
  line(fmt::format("max_position_embeddings: {}", c.max_position_embeddings));
  line(fmt::format("eos_token_ids: {}; bos_token_id: {}; pad_token_id: {}",
                   ids_text(c.eos_token_ids), id_text(c.bos_token_id), id_text(c.pad_token_id)));
  if (const GenerationConfig* g = ck.generation();
      g && (g->max_new_tokens > 0 || g->max_length > 0))
    line(fmt::format("generation: max_new_tokens {}, max_length {}", id_text(g->max_new_tokens),
                     id_text(g->max_length)));
  line(fmt::format("weight files: {}", ck.shards().size()));

  std::map<std::string, std::pair<int64_t, int64_t>> per_dtype;  // count, bytes
  int64_t total = 0;
  for (const CheckpointTensor& t : ck.tensors()) {
    auto& [n, b] = per_dtype[std::string(dtype_name(t.view.dtype))];
    ++n;
    b += t.view.nbytes();
    total += t.view.nbytes();
  }
  line(fmt::format("tensors: {}, {}", ck.tensors().size(), human_bytes(total)));
  for (const auto& [name, nb] : per_dtype)
    line(fmt::format("  {}: {} tensors, {}", name, nb.first, human_bytes(nb.second)));
  if (ck.config().fp8.enabled) {
    int64_t scales = 0, scale_bytes = 0;
    for (const CheckpointTensor& t : ck.tensors())
      if (t.scale.data != nullptr) ++scales, scale_bytes += t.scale.nbytes();
    const Fp8Quantization& q = ck.config().fp8;
    line(fmt::format(
        "fp8: quant_method fp8, e4m3, weight_block_size [{}, {}], activation_scheme {}; {} "
        "F8_E4M3 weights with F32 _scale_inv ({}); modules_to_not_convert [{}]",
        q.block_rows, q.block_cols, q.activation_scheme, scales, human_bytes(scale_bytes),
        fmt::join(q.modules_to_not_convert, ", ")));
    // note: convert refuses an FP8 embedding table under --dtype keep (the
    // runtime has no FP8 embedding lookup); said here before a convert fails.
    if (const CheckpointTensor* e = ck.find("embed_tokens.weight");
        e != nullptr && e->view.dtype == DType::F8_E4M3)
      line(fmt::format(
          "fp8: tensor \"{}\" is F8_E4M3; an FP8 embedding table is not supported: convert "
          "refuses --dtype keep; pass --dtype bf16 (or f16, f32) to dequantize it",
          e->hf_name));
  }
  if (ck.skipped_groups().empty()) {
    line("skipped groups: none");
  } else {
    line("skipped groups:");
    for (const SkippedGroup& g : ck.skipped_groups())
      line(fmt::format("  {}: {} tensors, {}", g.prefix, g.count, human_bytes(g.bytes)));
  }
  line(fmt::format("tokenizer.json: {}", ck.has_file("tokenizer.json") ? "present" : "absent"));
  if (tensors) {
    line("tensor list: HF name, dtype, shape, bytes, file (FP8: its _scale_inv)");
    for (const CheckpointTensor& t : ck.tensors()) {
      std::string text = fmt::format("  {} {} {} {} {}", t.hf_name, dtype_name(t.view.dtype),
                                     t.view.shape_string(), t.view.nbytes(), t.file);
      if (t.scale.data != nullptr)
        text += fmt::format("  scales {} {}", t.scale_hf_name, t.scale.shape_string());
      line(text);
    }
  }
  write_stdout(out);
}

int run(int argc, char** argv) {
  cxxopts::Options opts(
      "inspect",
      "Summarise a Hugging Face checkpoint directory (architecture, "
      "hyperparameters, layer plan, tensors, skipped groups) or a .pack file.\nExit "
      "status: 0 shown (with --verify: and every check passed); 1 the input "
      "is unreadable or invalid, or the summary cannot be written to stdout (one line on "
      "stderr says why).");
  opts.positional_help("MODEL_DIR|X.pack");
  opts.add_options()("verify",
                     "for a .pack: recompute every checksum and run every check generate runs "
                     "at load (tokenizer, the model's tensor table), so a pack it passes loads")(
      "tensors",
      "also list every tensor: name, dtype, shape, bytes (and, for an FP8 weight, its block "
      "scales)")("h,help", "print this help")("path", "checkpoint directory or .pack file",
                                              cxxopts::value<std::string>());
  opts.parse_positional({"path"});
  const auto args = cli::parse_flags(opts, argc, argv);
  if (args.count("help")) {
    write_stdout(opts.help() + "\n");
    return 0;
  }
  if (!args.count("path")) fail("expected one argument MODEL_DIR or X.pack (see --help)");
  cli::no_extra_arguments(args);
  const std::string path = args["path"].as<std::string>();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_errno(path);
  const bool tensors = args.count("tensors") > 0;
  if (S_ISREG(st.st_mode)) return inspect_pack(path, args.count("verify") > 0, tensors);
  // note: a FIFO, socket or device is neither; name what it is rather than
  // let the checkpoint loader call it "a file".
  if (!S_ISDIR(st.st_mode))
    fail("{}: expected a checkpoint directory or .pack file, found {}", path,
         describe_file_type(st.st_mode));
  if (args.count("verify")) fail("{}: --verify applies to .pack files, not directories", path);
  print_checkpoint(*Checkpoint::open(path), tensors);
  return 0;
}

// One line: the messages never need more, and the CLI promise is one line.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

}  // namespace
}  // namespace qtk

int main(int argc, char** argv) {
  qtk::ignore_file_size_signal();
  try {
    const int status = qtk::run(argc, argv);
    // note: a report lost to a full disk or /dev/full is an error, not exit 0.
    qtk::finish_stdout();
    return status;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "inspect: %s\n", qtk::one_line(e.what()).c_str());
    return 1;
  }
}
