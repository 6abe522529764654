// Helpers shared by the runtime tests: run the real programs, read and
// write files, convert fixtures into packs (once per test process).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "pack/pack.h"

namespace qtk::rt_test {

inline std::string src(const std::string& rel) { return std::string(QTK_SOURCE_DIR) + "/" + rel; }

// A scratch directory for this test process, in the build tree; removed at
// exit when every test passed, kept for inspection otherwise.
struct WorkDir {
  std::string path;
  WorkDir() : path(fmt::format("{}/rt-work-{}", QTK_TEST_WORK_DIR, ::getpid())) {
    // note: one kept from a failed run of an earlier process that had this
    // pid would hold outputs this run's tests expect not to exist.
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    std::filesystem::create_directories(path);
  }
  ~WorkDir() {
    if (::testing::UnitTest::GetInstance()->Passed()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
};

inline std::string work_dir() {
  static const WorkDir dir;
  return dir.path;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

struct RunResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// Runs a shell command line, capturing stdout and stderr.
inline RunResult run(const std::string& cmd) {
  static int n = 0;
  const std::string base = fmt::format("{}/cmd{}", work_dir(), n++);
  const std::string full = fmt::format("{} >{}.out 2>{}.err", cmd, base, base);
  int rc = std::system(full.c_str());
  RunResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  r.out = read_text(base + ".out");
  r.err = read_text(base + ".err");
  return r;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

// Converts a fixture model directory (relative to the source root) into a
// pack, once per process.
inline std::string pack_of(const std::string& model_rel) {
  static std::map<std::string, std::string> done;
  if (auto it = done.find(model_rel); it != done.end()) return it->second;
  std::string name = model_rel;
  for (char& c : name)
    if (c == '/') c = '_';
  const std::string pack = fmt::format("{}/{}.pack", work_dir(), name);
  RunResult r = run(fmt::format("{} {} {} --force", QTK_CONVERT_BIN, src(model_rel), pack));
  if (r.status != 0) {
    ADD_FAILURE() << "convert " << model_rel << " failed: " << r.err;
    return {};
  }
  done[model_rel] = pack;
  return pack;
}

inline nlohmann::json load_json(const std::string& path) {
  return nlohmann::json::parse(read_text(path));
}

// A copy of `pack` whose embedding row `id` is all NaN (as a damaged pack, or
// an overflow in the model's own arithmetic, would give); its checksums are
// not updated, so it runs with --no-verify.
inline std::string pack_with_nan_embedding(const std::string& pack, int32_t id) {
  const auto p = Pack::open(pack);
  const TensorView& e = p->tensor("embed_tokens");
  const size_t width = dtype_size(e.dtype), row_bytes = static_cast<size_t>(e.shape[1]) * width;
  const std::string_view row(static_cast<const char*>(e.data) + id * row_bytes, row_bytes);
  std::string bytes = read_text(pack);
  const size_t at = bytes.find(row);
  if (at == std::string::npos) {
    ADD_FAILURE() << pack << ": embedding row " << id << " not found in the file";
    return {};
  }
  EXPECT_EQ(bytes.find(row, at + 1), std::string::npos) << "the row is not unique in the file";
  const uint32_t nan32 = 0x7fc00000u;
  const uint16_t nan16 = 0x7fc0u;
  for (size_t i = 0; i < row_bytes; i += width)
    std::memcpy(&bytes[at + i], width == 4 ? static_cast<const void*>(&nan32) : &nan16, width);
  const std::string out = pack + ".nan.pack";
  write_text(out, bytes);
  return out;
}

// Which output token (1-based) of a line must fail on a pack whose embedding
// row `id` is NaN, given the line's prompt and its result on the undamaged
// pack (`good`); 0 when none. The prompt holding `id` makes the first output
// token's logits NaN; a generated `id` does the same to the token after it
// (it is fed back), unless it is the line's last token.
inline int64_t first_output_token_after_nan(const std::vector<int>& prompt,
                                            const nlohmann::json& good, int32_t id) {
  for (const int t : prompt)
    if (t == id) return 1;
  const auto& out = good.at("output_token_ids");
  for (size_t j = 0; j + 1 < out.size(); ++j)
    if (out[j].get<int32_t>() == id) return static_cast<int64_t>(j) + 2;
  return 0;
}

// Leaves what a run killed after `done` (its first complete lines) leaves:
// OUT.partial and its header, "running", made from `complete_meta` (a
// complete run's header) without what only completion writes.
inline void write_killed_run(const std::string& out, const std::string& done,
                             const std::string& complete_meta) {
  nlohmann::json header = load_json(complete_meta);
  header["status"] = "running";
  header.erase("results_xxh64");
  header.erase("stats");
  write_text(out + ".partial.meta.json", header.dump(2));
  write_text(out + ".partial", done);
}

// generate with extra flags; returns the run result.
inline RunResult generate(const std::string& pack, const std::string& batch, const std::string& out,
                          const std::string& flags) {
  return run(fmt::format("{} --model {} --batch {} --out {} {}", QTK_GENERATE_BIN, pack, batch, out,
                         flags));
}

// Prompt lines for every golden case (token ids, max_new_tokens, mrope).
inline std::string golden_prompts(const nlohmann::json& golden) {
  std::string s;
  for (const auto& c : golden["cases"]) {
    nlohmann::json j = {{"id", c["id"]},
                        {"prompt_token_ids", c["prompt_token_ids"]},
                        {"max_tokens", c["max_new_tokens"]}};
    if (c.contains("mrope_position_ids")) j["mrope_position_ids"] = c["mrope_position_ids"];
    s += j.dump() + "\n";
  }
  return s;
}

}  // namespace qtk::rt_test
