// synth: writes a random-weight Hugging Face checkpoint for any supported
// config.json, for benchmarks on real model shapes without real weights.
//
//   synth CONFIG.json OUT_DIR [--seed N] [--dtype bf16|f32] [--shard-mb N] [--fp8]
//
// --fp8 writes the layout of Qwen's block-FP8 releases: every decoder-layer
// projection ([out, in]; not the embedding, lm_head or the GDN in_proj_a/b)
// as F8_E4M3 with a float32 `_scale_inv` [ceil(out/128), ceil(in/128)]
// (scale = block amax / 448, values rounded to the nearest e4m3), and
// config.json gets the matching quantization_config.
//
// The tensor list and shapes come from the loaders' name table
// (expected_tensors), so a synthesised checkpoint is exactly what `convert`
// accepts. Multimodal configs get the published `model.language_model.*`
// layout. Values are seeded and reproducible.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loaders/model_config.h"
#include "loaders/name_table.h"

namespace qtk {
namespace {

// note: xoshiro256** — fast, seedable, good enough for weights.
struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& x : s) {  // splitmix64 seeding
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      x = z ^ (z >> 31);
    }
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
  // Uniform in [-1, 1).
  float uniform() {
    return static_cast<float>(static_cast<int64_t>(next() >> 11) * 0x1.0p-52 - 1.0);
  }
};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// How a tensor's values are drawn: value = center + scale * uniform(-1, 1).
// note: "realistic magnitudes": projections and embeddings like a trained
// model's initialisation (std ~0.02), norm weights near their identity
// (1 for Qwen3, 0 for Qwen3.5's (1 + w) form), A_log = log(uniform(1, 16)),
// dt_bias small.
struct Init {
  float center = 0, scale = 0.0346f;  // uniform(-a, a) has std a / sqrt(3) = 0.02
  bool log_uniform_1_16 = false;
};

Init init_for(const std::string& name, const ModelConfig& c) {
  auto ends = [&](const char* s) {
    return name.size() >= std::strlen(s) &&
           name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0;
  };
  if (ends("A_log")) return {0, 0, true};
  if (ends("dt_bias")) return {0.5f, 0.5f};
  if (ends("conv1d.weight")) return {0, 0.3f};
  if (ends("linear_attn.norm.weight")) return {1.0f, 0.1f};
  if (ends("norm.weight") || ends("layernorm.weight"))
    return c.norm_adds_one ? Init{0.0f, 0.1f} : Init{1.0f, 0.1f};
  return {};
}

struct Tensor {
  std::string hf_name;
  std::vector<int64_t> shape;
  Init init;
  bool fp8 = false;  // F8_E4M3 with a `_scale_inv` tensor written after it
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* b = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0) fail_errno(fmt::format("synth: {}: write failed", path));
    b += w;
    n -= static_cast<size_t>(w);
  }
}

constexpr int64_t kFp8Block = 128;

int64_t scale_count(const Tensor& t) {
  return ((t.shape[0] + kFp8Block - 1) / kFp8Block) * ((t.shape[1] + kFp8Block - 1) / kFp8Block);
}

// The e4m3fn byte nearest to v (|v| <= 448), ties to the even code.
uint8_t to_e4m3(float v) {
  static const std::vector<float> mags = [] {
    std::vector<float> m(127);
    for (int b = 0; b < 127; ++b) {
      const int e = b >> 3, mant = b & 7;
      m[b] = e == 0 ? std::ldexp(static_cast<float>(mant), -9)
                    : std::ldexp(static_cast<float>(8 + mant), e - 10);
    }
    return m;
  }();
  const float a = std::fabs(v);
  const auto it = std::lower_bound(mags.begin(), mags.end(), a);
  int b = static_cast<int>(it - mags.begin());
  if (b == 127) b = 126;
  if (b > 0) {
    const float lo = mags[b - 1], hi = mags[b];
    if (a - lo < hi - a || (a - lo == hi - a && ((b - 1) & 1) == 0)) b -= 1;
  }
  return static_cast<uint8_t>((v < 0 ? 0x80 : 0) | b);
}

// An FP8 weight and its scales: values drawn as for bf16, then each 128x128
// block quantised with scale = amax / 448 (one 128-row band at a time).
void write_fp8(int fd, const std::string& path, const Tensor& t, Rng& rng) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t cb = (cols + kFp8Block - 1) / kFp8Block;
  std::vector<float> scales;
  std::vector<float> band;
  std::vector<uint8_t> q;
  for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block) {
    const int64_t nr = std::min(kFp8Block, rows - r0);
    band.resize(static_cast<size_t>(nr * cols));
    for (auto& v : band) v = t.init.center + t.init.scale * rng.uniform();
    q.resize(band.size());
    for (int64_t b = 0; b < cb; ++b) {
      const int64_t c0 = b * kFp8Block, nc = std::min(kFp8Block, cols - c0);
      float amax = 0;
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t c = 0; c < nc; ++c) amax = std::max(amax, std::fabs(band[r * cols + c0 + c]));
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      scales.push_back(scale);
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t c = 0; c < nc; ++c)
          q[r * cols + c0 + c] =
              to_e4m3(std::min(448.0f, std::max(-448.0f, band[r * cols + c0 + c] / scale)));
    }
    write_all(fd, q.data(), q.size(), path);
  }
  write_all(fd, scales.data(), scales.size() * 4, path);
}

void write_shard(const std::string& path, const std::vector<Tensor>& tensors, bool bf16, Rng& rng) {
  const int64_t esize = bf16 ? 2 : 4;
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"generator", "qtk bench/synth"}};
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t bytes = t.numel() * (t.fp8 ? 1 : esize);
    header[t.hf_name] = {{"dtype", t.fp8 ? "F8_E4M3" : (bf16 ? "BF16" : "F32")},
                         {"shape", t.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    if (t.fp8) {
      const int64_t sbytes = scale_count(t) * 4;
      header[t.hf_name + "_scale_inv"] = {
          {"dtype", "F32"},
          {"shape",
           {(t.shape[0] + kFp8Block - 1) / kFp8Block, (t.shape[1] + kFp8Block - 1) / kFp8Block}},
          {"data_offsets", {offset, offset + sbytes}}};
      offset += sbytes;
    }
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // note: 8-byte aligned data, as HF writers do
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("synth: cannot create {}", tmp));
  const uint64_t n = h.size();
  write_all(fd, &n, 8, path);
  write_all(fd, h.data(), h.size(), path);
  std::vector<uint16_t> b16;
  std::vector<float> f32;
  constexpr int64_t kChunk = 1 << 20;
  for (const auto& t : tensors) {
    if (t.fp8) {
      write_fp8(fd, path, t, rng);
      continue;
    }
    for (int64_t done = 0; done < t.numel(); done += kChunk) {
      const int64_t m = std::min(kChunk, t.numel() - done);
      f32.resize(m);
      for (int64_t i = 0; i < m; ++i) {
        f32[i] = t.init.log_uniform_1_16 ? std::log(1.0f + 7.5f * (rng.uniform() + 1.0f))
                                         : t.init.center + t.init.scale * rng.uniform();
      }
      if (bf16) {
        b16.resize(m);
        for (int64_t i = 0; i < m; ++i) b16[i] = to_bf16(f32[i]);
        write_all(fd, b16.data(), m * 2, path);
      } else {
        write_all(fd, f32.data(), m * 4, path);
      }
    }
  }
  if (::close(fd) != 0) fail_errno(fmt::format("synth: {}: close failed", tmp));
  std::filesystem::rename(tmp, path);
}

int run(int argc, char** argv) {
  cxxopts::Options opts("synth",
                        "Write a random-weight HF checkpoint (safetensors) for a config.json");
  opts.add_options()("config", "config.json of the model shape", cxxopts::value<std::string>())(
      "out", "output directory (created)", cxxopts::value<std::string>())(
      "seed", "random seed", cxxopts::value<uint64_t>()->default_value("1"))(
      "dtype", "bf16 or f32", cxxopts::value<std::string>()->default_value("bf16"))(
      "shard-mb", "start a new shard after this many MB (0: one file)",
      cxxopts::value<int64_t>()->default_value("0"))(
      "fp8", "block-FP8 layer projections (F8_E4M3 + float32 128x128 scales)")("h,help",
                                                                               "show this help");
  opts.parse_positional({"config", "out"});
  opts.positional_help("CONFIG.json OUT_DIR");
  auto args = opts.parse(argc, argv);
  if (args.count("help") || !args.count("config") || !args.count("out")) {
    std::fputs(opts.help().c_str(), args.count("help") ? stdout : stderr);
    return args.count("help") ? 0 : 1;
  }
  const std::string config_path = args["config"].as<std::string>();
  const std::string out = args["out"].as<std::string>();
  const std::string dtype = args["dtype"].as<std::string>();
  if (dtype != "bf16" && dtype != "f32")
    fail("synth: --dtype: expected bf16 or f32, found \"{}\"", dtype);
  const ModelConfig c = load_hf_config(config_path);
  // note: Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration.
  const bool multimodal = c.hf_architecture.ends_with("ForConditionalGeneration");

  std::vector<Tensor> all;
  for (const auto& e : expected_tensors(c)) {
    Tensor t;
    t.hf_name = e.name == "lm_head.weight"
                    ? e.name
                    : (multimodal ? "model.language_model." : "model.") + e.name;
    t.shape = e.shape;
    t.init = init_for(e.name, c);
    // note: as Qwen's FP8 releases: layer projections are quantised (GDN
    // in_proj_qkv and in_proj_z, experts and shared expert included); the
    // embedding, lm_head, the [Hv, H] gates in_proj_a/b, the MoE router and
    // the shared expert's [1, H] gate stay bf16.
    t.fp8 = args.count("fp8") && e.shape.size() == 2 && e.name.rfind("layers.", 0) == 0 &&
            e.name.find("in_proj_a") == std::string::npos &&
            e.name.find("in_proj_b") == std::string::npos &&
            e.name.find("mlp.router") == std::string::npos &&
            e.name.find("mlp.gate.") == std::string::npos &&
            e.name.find("shared_expert_gate") == std::string::npos;
    all.push_back(std::move(t));
  }
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(config_path, out + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::permissions(out + "/config.json", std::filesystem::perms::owner_read |
                                                         std::filesystem::perms::owner_write |
                                                         std::filesystem::perms::group_read |
                                                         std::filesystem::perms::others_read);
  if (args.count("fp8")) {
    nlohmann::ordered_json cj = nlohmann::ordered_json::parse(std::ifstream(config_path));
    nlohmann::ordered_json& target = multimodal ? cj["text_config"] : cj;
    target["quantization_config"] = {{"quant_method", "fp8"},
                                     {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {kFp8Block, kFp8Block}},
                                     {"modules_to_not_convert", {"lm_head"}}};
    std::ofstream(out + "/config.json") << cj.dump(2) << "\n";
  }

  Rng rng(args["seed"].as<uint64_t>());
  const bool bf16 = dtype == "bf16";
  const int64_t shard_bytes = args["shard-mb"].as<int64_t>() << 20;
  std::vector<std::vector<Tensor>> shards(1);
  int64_t in_shard = 0;
  for (auto& t : all) {
    const int64_t b = t.fp8 ? t.numel() + scale_count(t) * 4 : t.numel() * (bf16 ? 2 : 4);
    if (shard_bytes > 0 && in_shard > 0 && in_shard + b > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += b;
  }
  if (shards.size() == 1) {
    write_shard(out + "/model.safetensors", shards[0], bf16, rng);
  } else {
    nlohmann::ordered_json index;
    int64_t total = 0;
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      write_shard(out + "/" + name, shards[s], bf16, rng);
      for (const auto& t : shards[s]) {
        index["weight_map"][t.hf_name] = name;
        if (t.fp8) index["weight_map"][t.hf_name + "_scale_inv"] = name;
        total += t.fp8 ? t.numel() + scale_count(t) * 4 : t.numel() * (bf16 ? 2 : 4);
      }
    }
    index["metadata"] = {{"total_size", total}};
    std::ofstream(out + "/model.safetensors.index.json") << index.dump(2) << "\n";
  }
  int64_t params = 0;
  for (const auto& t : all) params += t.numel();
  std::fprintf(stderr, "synth: wrote %s (%zu tensors, %.3f B parameters, %s, %zu file(s))\n",
               out.c_str(), all.size(), params / 1e9, dtype.c_str(), shards.size());
  return 0;
}

}  // namespace
}  // namespace qtk

int main(int argc, char** argv) {
  try {
    return qtk::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synth: %s\n", e.what());
    return 1;
  }
}
