// Replays every kept crasher (tests/fuzz/crashers/<target>/) and every seed
// (tests/fuzz/corpus/<target>/) through the same entry function the fuzzer
// ran, in the normal build. A crasher that still crashes kills this test
// (the last "replay:" line on stderr names the file); a broken invariant
// aborts the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_entries.h"

namespace qtk::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Feeds each file of corpus/<target> and crashers/<target>; returns how many.
size_t replay(const std::string& target, int (*entry)(const uint8_t*, size_t)) {
  const fs::path root = fs::path(QTK_SOURCE_DIR) / "tests" / "fuzz";
  size_t n = 0;
  for (const char* kind : {"corpus", "crashers"}) {
    for (const fs::path& p : files_in(root / kind / target)) {
      std::fprintf(stderr, "replay: %s\n", p.c_str());
      const std::string bytes = read_all(p);
      EXPECT_EQ(entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0) << p;
      ++n;
    }
  }
  return n;
}

// Every target has seeds: an empty corpus directory would make the replay
// (and the fuzzer) start from nothing without anyone noticing.
#define QTK_REPLAY_TEST(target)                                                              \
  TEST(Replay, target) {                                                                     \
    EXPECT_GT(files_in(fs::path(QTK_SOURCE_DIR) / "tests/fuzz/corpus" / #target).size(), 0u) \
        << "no seeds in tests/fuzz/corpus/" #target;                                         \
    EXPECT_GT(replay(#target, &target), 0u);                                                 \
  }

QTK_REPLAY_TEST(safetensors_header)
QTK_REPLAY_TEST(shard_index)
QTK_REPLAY_TEST(hf_config)
QTK_REPLAY_TEST(pack_zip)
QTK_REPLAY_TEST(tokenizer_json)
QTK_REPLAY_TEST(tokenizer_codec)
QTK_REPLAY_TEST(chat_template)
#ifdef QTK_FUZZ_HAVE_PROMPT_JSONL
QTK_REPLAY_TEST(prompt_jsonl)
#endif

}  // namespace
}  // namespace qtk::fuzz
