// convert_bench [--config tests/data/configs/qwen3-0.6b.json] [--work DIR]
//               [--model DIR] [--repeats 3] [--out result.json]
//               [--dtypes keep,f32] [--pack-dir DIR] [--baseline-bin OLD]
//               [--cold]
//
// Synthesises a random-weight bf16 checkpoint of the config's real shapes
// (one model.safetensors, written here by a tiny writer; or --model DIR, e.g.
// one from bench/synth for MoE shapes), then runs the `convert` program on it
// with each --dtypes entry, `repeats` times after one warm-up run (so the
// source is in the page cache), and prints JSON: median wall time, MB/s
// (source tensor bytes and pack bytes per second) and the child's peak RSS
// (getrusage ru_maxrss via wait4). The pack is deleted before each run, so
// no run pays for removing the previous one.
//
// --baseline-bin times a second convert program in the same rounds
// (alternating: baseline, convert, baseline, ...), for before/after numbers
// under the same load. --cold drops the source's pages from the page cache
// (posix_fadvise DONTNEED) before every run. The machine's reference
// bandwidths are measured in the same run: memcpy, reading the (cached)
// source with read(), and writing to the pack directory with 8 MiB pwrite()s
// and an fsync (what convert does, without the work in between).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

using nlohmann::json;

namespace {

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<Spec> qwen3_tensors(const json& c) {
  const int64_t H = c["hidden_size"], I = c["intermediate_size"], V = c["vocab_size"],
                L = c["num_hidden_layers"], Hq = c["num_attention_heads"],
                Hkv = c["num_key_value_heads"];
  const int64_t D = c.value("head_dim", H / Hq);
  std::vector<Spec> s{{"model.embed_tokens.weight", {V, H}}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    s.push_back({p + "input_layernorm.weight", {H}});
    s.push_back({p + "self_attn.q_proj.weight", {Hq * D, H}});
    s.push_back({p + "self_attn.k_proj.weight", {Hkv * D, H}});
    s.push_back({p + "self_attn.v_proj.weight", {Hkv * D, H}});
    s.push_back({p + "self_attn.o_proj.weight", {H, Hq * D}});
    s.push_back({p + "self_attn.q_norm.weight", {D}});
    s.push_back({p + "self_attn.k_norm.weight", {D}});
    s.push_back({p + "post_attention_layernorm.weight", {H}});
    s.push_back({p + "mlp.gate_proj.weight", {I, H}});
    s.push_back({p + "mlp.up_proj.weight", {I, H}});
    s.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  s.push_back({"model.norm.weight", {H}});
  if (!c.value("tie_word_embeddings", false)) s.push_back({"lm_head.weight", {V, H}});
  return s;
}

// Writes a bf16 safetensors file with random values in about [-0.125, 0.125).
uint64_t write_random_safetensors(const std::string& path, const std::vector<Spec>& specs) {
  json header = json::object();
  uint64_t off = 0;
  for (const auto& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    header[s.name] = {{"dtype", "BF16"}, {"shape", s.shape}, {"data_offsets", {off, off + 2 * n}}};
    off += static_cast<uint64_t>(2 * n);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h += ' ';
  std::ofstream out(path, std::ios::binary);
  const uint64_t hl = h.size();
  out.write(reinterpret_cast<const char*>(&hl), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::vector<uint16_t> buf(1 << 20);
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (uint64_t done = 0; done < off;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), (off - done) / 2);
    for (uint64_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;  // xorshift64
      // sign, exponent 2^-4..2^-11 (0x3D80 >> 7 region), random mantissa
      buf[i] =
          static_cast<uint16_t>(((x >> 63) << 15) | ((0x7B + (x >> 40) % 8) << 7) | (x & 0x7F));
    }
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(2 * n));
    done += 2 * n;
  }
  if (!out) throw std::runtime_error("cannot write " + path);
  return off;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GB/s of memcpy between two 1 GiB buffers, the best of 3.
double memcpy_GBps() {
  const size_t n = size_t{1} << 30;
  std::vector<uint8_t> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return n / best / 1e9;
}

// MB/s of read() of `path` in 8 MiB blocks (from the page cache when warm).
double read_MBps(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  std::vector<uint8_t> buf(8u << 20);
  uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(n);
  const double s = seconds_since(t0);
  ::close(fd);
  return total / 1e6 / s;
}

// MB/s of writing `bytes` to a new file in `dir` with 8 MiB pwrite()s and
// one fsync (the file is removed afterwards).
double write_MBps(const std::string& dir, uint64_t bytes) {
  const std::string path = dir + "/convert_bench.write_probe";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 0;
  std::vector<uint8_t> buf(8u << 20, 0x5A);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - done),
                               static_cast<off_t>(done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::fsync(fd);
  const double s = seconds_since(t0);
  ::close(fd);
  ::unlink(path.c_str());
  return bytes / 1e6 / s;
}

void evict(const std::string& model) {
  for (const auto& e : std::filesystem::directory_iterator(model)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Run {
  double seconds = 0;
  long max_rss_kb = 0;
  double cpu_seconds = 0;  // user + system of the child
  int status = -1;
};

Run run_convert(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ::wait4(pid, &status, 0, &ru);
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.max_rss_kb = ru.ru_maxrss;
  r.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                  1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("convert_bench", "Times convert on a Qwen3-0.6B-size random checkpoint");
  options.add_options()("config", "config.json to synthesise from",
                        cxxopts::value<std::string>()->default_value(
                            std::string(QTK_SOURCE_DIR) + "/tests/data/configs/qwen3-0.6b.json"))(
      "work", "scratch directory (checkpoint and packs)",
      cxxopts::value<std::string>()->default_value("/tmp/qtk-convert-bench"))(
      "model", "use this checkpoint directory instead of synthesising",
      cxxopts::value<std::string>())("repeats", "timed runs per dtype",
                                     cxxopts::value<std::string>()->default_value("3"))(
      "pack-dir", "write the packs here instead of --work (e.g. a tmpfs, to take the disk out)",
      cxxopts::value<std::string>())("convert-bin", "the convert program to time",
                                     cxxopts::value<std::string>()->default_value(QTK_CONVERT_BIN))(
      "dtypes", "comma-separated --dtype values to time",
      cxxopts::value<std::string>()->default_value("keep,f32"))(
      "baseline-bin", "also time this convert program, alternating with --convert-bin",
      cxxopts::value<std::string>())("cold",
                                     "drop the source from the page cache before every run")(
      "out", "also write the JSON here", cxxopts::value<std::string>())("h,help", "show this help");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "convert_bench: %s (see --help)\n", e.what());
    return 1;
  }
  if (args.count("help")) {
    std::printf("%s\n", options.help().c_str());
    return 0;
  }
  const std::string work = args["work"].as<std::string>();
  std::filesystem::create_directories(work);
  std::string model;
  uint64_t tensor_bytes = 0;
  if (args.count("model")) {
    model = args["model"].as<std::string>();
  } else {
    model = work + "/model";
    std::filesystem::create_directories(model);
    std::ifstream in(args["config"].as<std::string>());
    const json config = json::parse(in);
    const auto specs = qwen3_tensors(config);
    const std::string st = model + "/model.safetensors";
    std::filesystem::copy_file(args["config"].as<std::string>(), model + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    tensor_bytes = write_random_safetensors(st, specs);
    std::fprintf(stderr, "convert_bench: wrote %s (%.1f MB of bf16 tensors)\n", st.c_str(),
                 tensor_bytes / 1e6);
  }
  uint64_t source_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(model))
    if (e.is_regular_file()) source_bytes += e.file_size();

  std::string largest_source;
  for (const auto& e : std::filesystem::directory_iterator(model))
    if (e.is_regular_file() &&
        (largest_source.empty() || e.file_size() > std::filesystem::file_size(largest_source)))
      largest_source = e.path().string();
  const std::string pack_dir = args.count("pack-dir") ? args["pack-dir"].as<std::string>() : work;
  const std::string pack = pack_dir + "/bench.pack";
  const bool cold = args.count("cold") > 0;

  std::vector<std::pair<std::string, std::string>> programs;  // label, path
  if (args.count("baseline-bin"))
    programs.emplace_back("baseline", args["baseline-bin"].as<std::string>());
  programs.emplace_back("convert", args["convert-bin"].as<std::string>());

  // Reference bandwidths of this machine, now, under the same load.
  read_MBps(largest_source);  // warm the page cache
  json reference = {
      {"memcpy_GBps", memcpy_GBps()},
      {"cached_source_read_MBps", read_MBps(largest_source)},
      {"pack_dir_write_fsync_MBps",
       write_MBps(pack_dir, std::min<uint64_t>(source_bytes, 4ull << 30))},
  };
  std::fprintf(stderr, "convert_bench: reference %s\n", reference.dump().c_str());

  json result = {{"benchmark", "convert"},       {"model", model},
                 {"pack_dir", pack_dir},         {"cold", cold},
                 {"source_bytes", source_bytes}, {"nproc", ::sysconf(_SC_NPROCESSORS_ONLN)},
                 {"reference", reference},       {"runs", json::array()}};
  std::string dtypes = args["dtypes"].as<std::string>();
  for (size_t at = 0; at <= dtypes.size();) {
    const size_t comma = std::min(dtypes.find(',', at), dtypes.size());
    const std::string dtype = dtypes.substr(at, comma - at);
    at = comma + 1;
    if (dtype.empty()) continue;
    std::vector<std::vector<Run>> runs(programs.size());
    uint64_t pack_bytes = 0;
    for (int i = -1; i < std::stoi(args["repeats"].as<std::string>()); ++i) {
      for (size_t p = 0; p < programs.size(); ++p) {
        const std::vector<std::string> cmd = {programs[p].second, model, pack,
                                              "--dtype",          dtype, "--force"};
        std::filesystem::remove(pack);
        if (cold) evict(model);
        const Run r = run_convert(cmd);
        if (r.status != 0) {
          std::fprintf(stderr, "convert_bench: %s failed (status %d)\n", programs[p].second.c_str(),
                       r.status);
          return 1;
        }
        pack_bytes = std::filesystem::file_size(pack);
        if (i >= 0) runs[p].push_back(r);  // i == -1: warm-up
      }
    }
    for (size_t p = 0; p < programs.size(); ++p) {
      auto& rs = runs[p];
      std::sort(rs.begin(), rs.end(),
                [](const Run& a, const Run& b) { return a.seconds < b.seconds; });
      const Run& med = rs[rs.size() / 2];
      long rss = 0;
      for (const auto& r : rs) rss = std::max(rss, r.max_rss_kb);
      json all = json::array();
      for (auto& r : rs) all.push_back(r.seconds);
      result["runs"].push_back(
          {{"program", programs[p].first},
           {"bin", programs[p].second},
           {"dtype", dtype},
           {"median_seconds", med.seconds},
           {"source_MBps", source_bytes / 1e6 / med.seconds},
           {"pack_MBps", pack_bytes / 1e6 / med.seconds},
           {"pack_bytes", pack_bytes},
           {"peak_rss_MB", rss / 1024.0},
           // note: on a shared machine wall time includes waiting for a
           // core; CPU seconds show what the conversion itself costs.
           {"median_cpu_seconds", med.cpu_seconds},
           {"source_MB_per_cpu_second", source_bytes / 1e6 / med.cpu_seconds},
           {"peak_rss_fraction_of_source", rss * 1024.0 / static_cast<double>(source_bytes)},
           {"all_seconds", all}});
    }
    std::filesystem::remove(pack);
  }
  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (args.count("out")) std::ofstream(args["out"].as<std::string>()) << text << "\n";
  return 0;
}
