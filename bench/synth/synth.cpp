// synth: writes a random-weight Hugging Face checkpoint for any supported
// config.json, for benchmarks on real model shapes without real weights.
//
//   synth CONFIG.json OUT_DIR [--seed N] [--dtype bf16|f32] [--shard-mb N] [--fp8]
//         [--experts hub|per-expert|fused] [--threads N] [--force] [--dry-run]
//
// OUT_DIR is written whole or not at all (bench/synth/staged_dir.h): the
// files go to a temporary directory beside it, renamed into place when
// complete; a failure (a full disk, `ulimit -f`) or SIGINT/SIGTERM/SIGHUP
// removes it. A non-empty OUT_DIR is refused unless --force (then the new
// directory replaces it whole: no file of the old checkpoint stays beside
// the new ones).
//
// --fp8 writes the layout of Qwen's block-FP8 releases: every decoder-layer
// projection ([out, in]; not the embedding, lm_head or the GDN in_proj_a/b)
// as F8_E4M3 with a float32 `_scale_inv` [ceil(out/128), ceil(in/128)]
// (scale = block amax / 448, values rounded to the nearest e4m3), and
// config.json gets the matching quantization_config. Only 2-D projections
// are quantised: Qwen3.5-MoE's experts are FP8 only with --experts
// per-expert (the FP8 releases' layout; the default `hub` layout of
// Qwen3.5-MoE is the bf16 checkpoints' fused 3-D tensors, which stay bf16).
//
// --threads N draws each piece (an FP8 tensor's 128-row band, 2^20 values of
// another) from its own seeded stream on N threads: the same files for any
// N, but not those of the default single stream. For full-depth models
// (tens of GB) in seconds rather than minutes. --dry-run prints the size.
//
// The tensor list and shapes come from the loaders' name table
// (expected_tensors), so a synthesised checkpoint is exactly what `convert`
// accepts. Multimodal configs get the published `model.language_model.*`
// layout. Values are seeded and reproducible.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "bench/synth/staged_dir.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/output_files.h"  // fsync_directory
#include "core/stdout_check.h"
#include "loaders/cli_args.h"
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

// A file of the checkpoint: where it is written (in the temporary
// directory) and the name messages give it (in OUT_DIR).
struct OutFile {
  std::string path, shown;
};

void write_all(int fd, const void* p, size_t n, const OutFile& f) {
  const char* b = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0) {
      // note: without SA_RESTART (InterruptScope) a signal may cut a write
      // short with EINTR: stop when it was ours to stop on, else retry.
      if (errno == EINTR) {
        check_interrupted(f.shown);
        continue;
      }
      fail_errno(fmt::format("{}: write failed", f.shown));
    }
    b += w;
    n -= static_cast<size_t>(w);
  }
}

// fsync()s and closes `fd`, the file `f`.
// note: synced before the staging directory is renamed into place, so a
// power loss cannot leave OUT_DIR with empty or short files.
void sync_and_close(int fd, const OutFile& f) {
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    fail_errno(fmt::format("{}: cannot sync it to disk", f.shown));
  }
  if (::close(fd) != 0) fail_errno(fmt::format("{}: write failed (at close)", f.shown));
}

// Creates `f` (it must not exist: the temporary directory is new) with
// `mode` and writes `text` to it.
void write_file(const OutFile& f, const std::string& text, mode_t mode) {
  const int fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create it", f.shown));
  try {
    write_all(fd, text.data(), text.size(), f);
  } catch (...) {
    ::close(fd);
    throw;
  }
  sync_and_close(fd, f);
}

// fsync()s the directory `path` (its entries: the names of the files in it,
// or a rename into it); `shown` names it in the message.
void sync_directory(const std::string& path, const std::string& shown) {
  if (!fsync_directory(path))
    fail_errno(fmt::format("{}: cannot sync the directory to disk", shown));
}

constexpr int64_t kFp8Block = 128;

int64_t scale_count(const Tensor& t) {
  return ((t.shape[0] + kFp8Block - 1) / kFp8Block) * ((t.shape[1] + kFp8Block - 1) / kFp8Block);
}

// The e4m3fn byte nearest to v (|v| <= 448), ties to the even code.
// note: from the float's bits: below 2^-6 the subnormal codes are v * 2^9
// rounded half to even; above, the mantissa rounded to 3 bits half to even
// (a carry steps the exponent), rebased from bias 127 to 7. Checked equal to
// a nearest-of-all-127-magnitudes search for every float with |v| <= 448.
uint8_t to_e4m3(float v) {
  const float a = std::fabs(v);
  uint32_t code;
  if (a < 0x1p-6f) {
    code = static_cast<uint32_t>(std::nearbyint(a * 512.0f));
  } else {
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u += 0x7ffff + ((u >> 20) & 1);
    code = (u >> 20) - (120u << 3);
  }
  return static_cast<uint8_t>((v < 0 ? 0x80 : 0) | code);
}

// Quantises one band of nr rows of a [rows, cols] FP8 weight: each 128x128
// block with scale = amax / 448 (`scales` gets the band's ceil(cols/128)).
void quantize_band(const std::vector<float>& band, int64_t nr, int64_t cols,
                   std::vector<uint8_t>& q, std::vector<float>& scales) {
  const int64_t cb = (cols + kFp8Block - 1) / kFp8Block;
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
}

// Draws m values of a non-FP8 tensor.
void draw_values(const Tensor& t, Rng& rng, std::vector<float>& f32, int64_t m) {
  f32.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    f32[i] = t.init.log_uniform_1_16 ? std::log(1.0f + 7.5f * (rng.uniform() + 1.0f))
                                     : t.init.center + t.init.scale * rng.uniform();
  }
}

// An FP8 weight and its scales: values drawn as for bf16, then each 128x128
// block quantised with scale = amax / 448 (one 128-row band at a time).
void write_fp8(int fd, const OutFile& f, const Tensor& t, Rng& rng) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> scales;
  std::vector<float> band;
  std::vector<uint8_t> q;
  for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block) {
    check_interrupted(f.shown);
    const int64_t nr = std::min(kFp8Block, rows - r0);
    band.resize(static_cast<size_t>(nr * cols));
    for (auto& v : band) v = t.init.center + t.init.scale * rng.uniform();
    quantize_band(band, nr, cols, q, scales);
    write_all(fd, q.data(), q.size(), f);
  }
  write_all(fd, scales.data(), scales.size() * 4, f);
}

constexpr int64_t kChunk = 1 << 20;  // values per piece of a non-FP8 tensor

// The bytes a tensor takes in a shard (an FP8 one with its scales).
int64_t tensor_bytes(const Tensor& t, bool bf16) {
  return t.fp8 ? t.numel() + scale_count(t) * 4 : t.numel() * (bf16 ? 2 : 4);
}

// A shard's safetensors header, padded so that the data starts 8-byte aligned.
std::string shard_header(const std::vector<Tensor>& tensors, bool bf16) {
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
  return h;
}

// note: a shard is written under its own name: the whole temporary
// directory is what appears at once. It is registered so that a second
// signal (the process then ends at once) still unlinks the big file.
int create_shard(const OutFile& f, const std::string& h) {
  const int fd = ::open(f.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(fmt::format("{}: cannot create it", f.shown));
  register_emergency_unlink(f.path);
  try {
    const uint64_t n = h.size();
    write_all(fd, &n, 8, f);
    write_all(fd, h.data(), h.size(), f);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

void finish_shard(int fd, const OutFile& f) {
  unregister_emergency_unlink(f.path);
  sync_and_close(fd, f);
}

// One stream of values for the whole checkpoint, in file order (the default).
void write_shard(const OutFile& f, const std::vector<Tensor>& tensors, bool bf16, Rng& rng) {
  const int fd = create_shard(f, shard_header(tensors, bf16));
  try {
    std::vector<uint16_t> b16;
    std::vector<float> f32;
    for (const auto& t : tensors) {
      if (t.fp8) {
        write_fp8(fd, f, t, rng);
        continue;
      }
      for (int64_t done = 0; done < t.numel(); done += kChunk) {
        check_interrupted(f.shown);
        const int64_t m = std::min(kChunk, t.numel() - done);
        draw_values(t, rng, f32, m);
        if (bf16) {
          b16.resize(m);
          for (int64_t i = 0; i < m; ++i) b16[i] = to_bf16(f32[i]);
          write_all(fd, b16.data(), m * 2, f);
        } else {
          write_all(fd, f32.data(), m * 4, f);
        }
      }
    }
  } catch (...) {
    unregister_emergency_unlink(f.path);
    ::close(fd);
    throw;
  }
  finish_shard(fd, f);
}

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// --threads N: every piece (a 128-row band of an FP8 tensor, 2^20 values of
// another) draws from its own stream, seeded by (seed, tensor, piece), and
// is written at its place by whichever of the N threads takes it: the files
// are the same for every N (not the same as the one-stream default's).
void write_shards_parallel(const std::vector<OutFile>& files,
                           const std::vector<std::vector<Tensor>>& shards, bool bf16, uint64_t seed,
                           int threads) {
  struct Piece {
    size_t shard, tensor;  // tensor: index within its shard
    uint64_t stream;       // the tensor's index in the whole checkpoint
    int64_t index;         // band or chunk
    uint64_t data;         // file offset of the tensor's data
  };
  std::vector<Piece> pieces;
  std::vector<int> fds;
  struct Map {
    uint8_t* base;
    size_t size;
  };
  std::vector<Map> maps;
  // On failure: the files are closed (the caller removes the temporary
  // directory that holds them).
  auto discard = [&] {
    for (const auto& m : maps) ::munmap(m.base, m.size);
    for (size_t s = 0; s < fds.size(); ++s) {
      unregister_emergency_unlink(files[s].path);
      ::close(fds[s]);
    }
  };
  uint64_t stream = 0;
  try {
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string h = shard_header(shards[s], bf16);
      fds.push_back(create_shard(files[s], h));
      uint64_t data = 8 + h.size();
      for (size_t i = 0; i < shards[s].size(); ++i, ++stream) {
        const Tensor& t = shards[s][i];
        const int64_t n =
            t.fp8 ? (t.shape[0] + kFp8Block - 1) / kFp8Block : (t.numel() + kChunk - 1) / kChunk;
        for (int64_t k = 0; k < n; ++k) pieces.push_back({s, i, stream, k, data});
        data += static_cast<uint64_t>(tensor_bytes(t, bf16));
      }
      // note: the space is reserved up front (a full disk is an error here,
      // not a SIGBUS in the mapping), and the threads write through a shared
      // mapping: a tmpfs file's write() copies under the inode lock, one
      // thread at a time, while page faults on a mapping run in parallel.
      int rc;
      while ((rc = ::posix_fallocate(fds[s], 0, static_cast<off_t>(data))) == EINTR)
        check_interrupted(files[s].shown);
      if (rc == EOPNOTSUPP || rc == EINVAL) {
        if (::ftruncate(fds[s], static_cast<off_t>(data)) != 0)
          fail_errno(fmt::format("{}: cannot size the file to {} bytes", files[s].shown, data));
      } else if (rc != 0) {
        errno = rc;
        fail_errno(fmt::format("{}: cannot reserve {} bytes", files[s].shown, data));
      }
      void* m = ::mmap(nullptr, data, PROT_READ | PROT_WRITE, MAP_SHARED, fds[s], 0);
      if (m == MAP_FAILED) fail_errno(fmt::format("{}: mmap failed", files[s].shown));
      maps.push_back({static_cast<uint8_t*>(m), data});
    }
  } catch (...) {
    discard();
    throw;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    std::vector<float> f32, scales;
    std::vector<uint8_t> q;
    std::vector<uint16_t> b16;
    try {
      for (size_t p; !failed && (p = next++) < pieces.size();) {
        const Piece& pc = pieces[p];
        check_interrupted(files[pc.shard].shown);
        const Tensor& t = shards[pc.shard][pc.tensor];
        uint8_t* base = maps[pc.shard].base;
        Rng rng(mix64(mix64(mix64(seed) ^ pc.stream) ^ static_cast<uint64_t>(pc.index)));
        if (t.fp8) {
          const int64_t rows = t.shape[0], cols = t.shape[1], r0 = pc.index * kFp8Block;
          const int64_t nr = std::min(kFp8Block, rows - r0);
          const int64_t cb = (cols + kFp8Block - 1) / kFp8Block;
          f32.resize(static_cast<size_t>(nr * cols));
          for (auto& v : f32) v = t.init.center + t.init.scale * rng.uniform();
          scales.clear();
          quantize_band(f32, nr, cols, q, scales);
          std::memcpy(base + pc.data + r0 * cols, q.data(), q.size());
          std::memcpy(base + pc.data + rows * cols + pc.index * cb * 4, scales.data(),
                      scales.size() * 4);
        } else {
          const int64_t done = pc.index * kChunk, m = std::min(kChunk, t.numel() - done);
          draw_values(t, rng, f32, m);
          if (bf16) {
            b16.resize(m);
            for (int64_t i = 0; i < m; ++i) b16[i] = to_bf16(f32[i]);
            std::memcpy(base + pc.data + done * 2, b16.data(), m * 2);
          } else {
            std::memcpy(base + pc.data + done * 4, f32.data(), m * 4);
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) {
    discard();
    std::rethrow_exception(error);
  }
  for (const auto& m : maps) ::munmap(m.base, m.size);
  maps.clear();
  for (size_t s = 0; s < fds.size(); ++s) {
    try {
      finish_shard(fds[s], files[s]);
    } catch (...) {
      // (the others are closed too)
      for (size_t k = s + 1; k < fds.size(); ++k) {
        unregister_emergency_unlink(files[k].path);
        ::close(fds[k]);
      }
      throw;
    }
  }
}

int run(int argc, char** argv) {
  cxxopts::Options opts(
      "synth",
      "Write a random-weight HF checkpoint (safetensors) for a config.json.\nOUT_DIR is "
      "written whole or not at all: the files go to a temporary directory beside it "
      "(.NAME.synth-tmp.PID.HEX) that is renamed into place when complete.\nExit status: 0 "
      "written (with --dry-run: sized); 1 not (one line on stderr says why; OUT_DIR is left as "
      "it was and no temporary directory remains); on SIGINT, SIGTERM or SIGHUP it removes its "
      "temporary directory and ends by that signal.");
  opts.add_options()("config", "config.json of the model shape", cxxopts::value<std::string>())(
      "out", "output directory: created, or an empty one (a non-empty one needs --force)",
      cxxopts::value<std::string>())("seed", "random seed",
                                     cxxopts::value<std::string>()->default_value("1"))(
      "dtype", "bf16 or f32", cxxopts::value<std::string>()->default_value("bf16"))(
      "shard-mb", "start a new shard after this many MB (0: one file)",
      cxxopts::value<std::string>()->default_value("0"))(
      "fp8", "block-FP8 layer projections (F8_E4M3 + float32 128x128 scales)")(
      "experts",
      "MoE experts' layout: hub (the Hub's bf16 checkpoints': fused for Qwen3.5-MoE, "
      "per-expert for Qwen3-MoE), per-expert (Qwen's FP8 releases; with --fp8 the experts "
      "are FP8) or fused",
      cxxopts::value<std::string>()->default_value("hub"))(
      "threads",
      "0: one random stream in file order (default); N >= 1: N threads, each 128-row band "
      "or 2^20 values drawn from its own stream (the same files for every N, not the "
      "default's)",
      cxxopts::value<std::string>()->default_value("0"))(
      "dry-run",
      "write nothing; print {\"bytes\", \"parameters\", \"tensors\", \"files\"} "
      "of the checkpoint as JSON on stdout")(
      "force",
      "replace OUT_DIR when it is a directory that is not empty: the new checkpoint is swapped "
      "in when complete and the old one then removed (a crash in between leaves the old one "
      "under the temporary name; where the file system cannot swap, it is first moved to "
      ".NAME.synth-old.PID.HEX, and a crash before the new one is renamed in leaves both there "
      "and no OUT_DIR)")("h,help", "show this help");
  opts.parse_positional({"config", "out"});
  opts.positional_help("CONFIG.json OUT_DIR");
  // note: the toolkit's flag rules (an unknown flag named, a flag given
  // twice with two values refused, one line per error).
  const auto args = cli::parse_flags(opts, argc, argv);
  if (args.count("help")) {
    write_stdout(opts.help());
    return 0;
  }
  if (!args.count("config") || !args.count("out"))
    fail(
        "usage: synth CONFIG.json OUT_DIR [--dtype bf16|f32] [--fp8] [--experts "
        "hub|per-expert|fused] [--shard-mb N] [--seed N] [--threads N] [--force] [--dry-run] (see "
        "--help)");
  cli::no_extra_arguments(args);
  const std::string config_path = args["config"].as<std::string>();
  const std::string out = args["out"].as<std::string>();
  const std::string dtype =
      cli::parse_choice_flag("--dtype", args["dtype"].as<std::string>(), {"bf16", "f32"});
  const std::string experts = cli::parse_choice_flag("--experts", args["experts"].as<std::string>(),
                                                     {"hub", "per-expert", "fused"});
  const int threads = static_cast<int>(
      cli::parse_int_flag("--threads", args["threads"].as<std::string>(), 0, 1024, "0..1024"));
  const uint64_t seed = static_cast<uint64_t>(
      cli::parse_int_flag("--seed", args["seed"].as<std::string>(), 0,
                          std::numeric_limits<int64_t>::max(), "a non-negative integer"));
  const int64_t shard_mb = cli::parse_int_flag("--shard-mb", args["shard-mb"].as<std::string>(), 0,
                                               int64_t{1} << 30, "0 or a size in MB");
  const ModelConfig c = load_hf_config(config_path);
  // note: Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration.
  const bool multimodal = c.hf_architecture.ends_with("ForConditionalGeneration");

  std::vector<Tensor> all;
  const ExpertLayout layout = experts == "hub"          ? hub_expert_layout(c)
                              : experts == "per-expert" ? ExpertLayout::kPerExpert
                                                        : ExpertLayout::kFused;
  for (const auto& e : expected_tensors(c, layout)) {
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
  const bool bf16 = dtype == "bf16";
  const int64_t shard_bytes = shard_mb << 20;
  std::vector<std::vector<Tensor>> shards(1);
  int64_t in_shard = 0, total = 0, params = 0;
  for (auto& t : all) {
    const int64_t b = tensor_bytes(t, bf16);
    if (shard_bytes > 0 && in_shard > 0 && in_shard + b > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += b;
    total += b;
    params += t.numel();
  }
  if (args.count("dry-run")) {
    write_stdout(nlohmann::json{{"bytes", total},
                                {"parameters", params},
                                {"tensors", all.size()},
                                {"files", shards.size()}}
                     .dump() +
                 "\n");
    return 0;
  }
  // config.json as given, or with --fp8 its quantization_config added.
  std::string config_text;
  {
    std::ifstream in(config_path, std::ios::binary);
    if (!in) fail_errno(fmt::format("{}: cannot read it", config_path));
    config_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) fail_errno(fmt::format("{}: cannot read it", config_path));
  }
  if (args.count("fp8")) {
    nlohmann::ordered_json cj = nlohmann::ordered_json::parse(config_text);
    nlohmann::ordered_json& target = multimodal ? cj["text_config"] : cj;
    target["quantization_config"] = {{"quant_method", "fp8"},
                                     {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {kFp8Block, kFp8Block}},
                                     {"modules_to_not_convert", {"lm_head"}}};
    config_text = cj.dump(2) + "\n";
  }
  std::vector<std::string> names;
  for (size_t s = 0; s < shards.size(); ++s)
    names.push_back(shards.size() == 1
                        ? std::string("model.safetensors")
                        : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size()));
  std::string index_text;
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    for (size_t s = 0; s < shards.size(); ++s) {
      for (const auto& t : shards[s]) {
        index["weight_map"][t.hf_name] = names[s];
        if (t.fp8) index["weight_map"][t.hf_name + "_scale_inv"] = names[s];
      }
    }
    index["metadata"] = {{"total_size", total}};
    index_text = index.dump(2) + "\n";
  }

  const bool force = args.count("force") > 0;
  struct stat out_st {};
  const bool out_existed = ::lstat(out.c_str(), &out_st) == 0;
  int status = 0;
  std::vector<std::string> after;  // lines for stderr once OUT_DIR is in place
  {
    // note: SIGINT, SIGTERM, SIGHUP (and SIGPIPE: a stderr reader gone) are
    // turned into an exception at the next chunk, so the unwinding removes
    // the temporary directory; the signal is raised again below, so the
    // exit status says so. The scope also ignores SIGXFSZ: a write past
    // `ulimit -f` fails with EFBIG and is reported like a full disk.
    InterruptScope interrupts;
    std::optional<synth::StagedDirectory> staged;
    bool in_place = false;  // OUT_DIR was renamed into place
    try {
      staged.emplace(out, force);
      for (const std::string& note : staged->notes())
        std::fprintf(stderr, "synth: %s\n", note.c_str());
      const size_t notes_before = staged->notes().size();
      auto file = [&](const std::string& name) {
        return OutFile{staged->path() + "/" + name, (out.ends_with('/') ? out : out + "/") + name};
      };
      const OutFile config_file = file("config.json");
      write_file(config_file, config_text, 0644);
      // note: 0644 whatever the umask, so that config.json has one mode everywhere.
      if (::chmod(config_file.path.c_str(), 0644) != 0)
        fail_errno(fmt::format("{}: cannot set its mode", config_file.shown));
      if (threads == 0) {
        Rng rng(seed);
        for (size_t s = 0; s < shards.size(); ++s)
          write_shard(file(names[s]), shards[s], bf16, rng);
      } else {
        std::vector<OutFile> files;
        for (const auto& n : names) files.push_back(file(n));
        write_shards_parallel(files, shards, bf16, seed, threads);
      }
      if (!index_text.empty()) write_file(file("model.safetensors.index.json"), index_text, 0666);
      // note: the staging directory's entries are synced before the rename,
      // and the parent's after it (the rename itself), as convert does.
      sync_directory(staged->path(), staged->path());
      staged->commit();
      in_place = true;
      const std::filesystem::path out_path(out.ends_with('/') ? out.substr(0, out.size() - 1)
                                                              : out);
      const std::string parent =
          out_path.has_parent_path() ? out_path.parent_path().string() : std::string(".");
      sync_directory(parent, parent);
      for (size_t i = notes_before; i < staged->notes().size(); ++i)
        after.push_back(staged->notes()[i]);
    } catch (const std::exception& e) {
      // (the temporary directory is removed before the message is printed)
      const bool was_staged = staged.has_value();
      staged.reset();
      std::string message = e.what();
      if (in_place)
        message += fmt::format("; {} is in place, but may not survive a power loss", out);
      else if (was_staged)
        message += out_existed ? fmt::format("; {} is left as it was", out)
                               : fmt::format("; {} was not created", out);
      std::fprintf(stderr, "synth: %s\n", printable_message(message).c_str());
      status = 1;
    }
  }
  reraise_interrupt();
  if (status != 0) return status;
  // note: OUT_DIR is in place, so a stderr reader that is gone by now costs
  // these lines only (the write fails with EPIPE), not the exit status.
  std::signal(SIGPIPE, SIG_IGN);
  for (const std::string& line : after) std::fprintf(stderr, "synth: %s\n", line.c_str());
  // note: billions for real sizes, millions for the tiny test shapes (which
  // showed as "0.000 B").
  const bool billions = params >= 1e9;
  std::fprintf(stderr, "synth: wrote %s (%zu tensors, %.3f %s parameters, %s, %zu file(s))\n",
               out.c_str(), all.size(), params / (billions ? 1e9 : 1e6), billions ? "B" : "M",
               dtype.c_str(), shards.size());
  return 0;
}

}  // namespace
}  // namespace qtk

int main(int argc, char** argv) {
  qtk::ignore_file_size_signal();
  try {
    const int status = qtk::run(argc, argv);
    // note: --dry-run's JSON (or --help) lost to a full disk is an error.
    qtk::finish_stdout();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synth: %s\n", e.what());
    return 1;
  }
}
