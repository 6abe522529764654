// Pack::copy_to_hugepages: the pack's bytes move to anonymous memory at the
// same addresses, unchanged (pack/pack.h).
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pack/pack.h"
#include "test_util.h"

namespace qtk {
namespace {

// The /proc/self/maps line of the mapping that holds `p` ("" when none).
std::string maps_line_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) return line;
  }
  return "";
}

TEST(PackHugepages, SameAddressesSameBytesAnonymous) {
  const std::string pack_path = rt_test::pack_of("tests/data/models/qwen3-tiny");
  auto pack = Pack::open(pack_path);
  ASSERT_FALSE(pack->tensors().empty());
  const PackTensorInfo& t = pack->tensors().front();
  const void* before_ptr = t.view.data;
  const auto* bytes = static_cast<const uint8_t*>(t.view.data);
  const std::vector<uint8_t> before(bytes, bytes + t.view.nbytes());
  const auto tok = pack->entry("tokenizer.json");
  const std::string tok_before = tok ? std::string(*tok) : std::string();
  ASSERT_NE(maps_line_of(before_ptr).find(pack_path), std::string::npos)
      << "expected a file mapping first: " << maps_line_of(before_ptr);

  EXPECT_GT(pack->copy_to_hugepages(), 0u);
  EXPECT_EQ(pack->tensors().front().view.data, before_ptr);
  EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + t.view.nbytes()), before);
  if (tok) {
    EXPECT_EQ(std::string(*pack->entry("tokenizer.json")), tok_before);
  }
  // Every tensor's checksum still matches the manifest.
  EXPECT_GT(pack->verify(), 0u);
  // The range is no longer backed by the file.
  const std::string line = maps_line_of(before_ptr);
  EXPECT_FALSE(line.empty());
  EXPECT_EQ(line.find(pack_path), std::string::npos) << line;
  // A second call does nothing.
  EXPECT_EQ(pack->copy_to_hugepages(), 0u);
}

// release_range drops pages the model has copied; the bytes must read back
// unchanged from the file, and after copy_to_hugepages (anonymous memory,
// where dropping would zero them) it must do nothing.
TEST(PackHugepages, ReleasedRangesReadBackUnchanged) {
  auto pack = Pack::open(rt_test::pack_of("tests/data/models/qwen3-tiny"));
  for (int round = 0; round < 2; ++round) {
    for (const PackTensorInfo& t : pack->tensors()) {
      const auto* b = static_cast<const uint8_t*>(t.view.data);
      const std::vector<uint8_t> before(b, b + t.view.nbytes());
      pack->release_range(t.view.data, static_cast<size_t>(t.view.nbytes()));
      ASSERT_EQ(std::vector<uint8_t>(b, b + t.view.nbytes()), before)
          << t.name << (round == 0 ? " (file mapping)" : " (huge-page copy)");
      pack->prefault_range(t.view.data, static_cast<size_t>(t.view.nbytes()));
    }
    EXPECT_GT(pack->verify(), 0u);
    if (round == 0) pack->copy_to_hugepages();
  }
}

// The process's resident file-backed pages (RssFile of /proc/self/status),
// in bytes; -1 when the kernel does not report it.
int64_t rss_file_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "RssFile: %lld kB", &kib) == 1) return kib * 1024;
  }
  return -1;
}

// verify(true) hands each tensor's pages back once hashed (what a CUDA run
// asks for: it uploads the weights and never computes from the mapping), so
// checking a pack does not leave it in the process's RSS; verify() keeps
// them. Both check every entry.
TEST(PackPages, VerifyHandsTheHashedPagesBackWhenAsked) {
  auto pack = Pack::open(rt_test::pack_of("samples/qwen3-sample"));
  int64_t tensor_bytes = 0;
  for (const PackTensorInfo& t : pack->tensors()) tensor_bytes += t.view.nbytes();
  ASSERT_GT(tensor_bytes, int64_t{8} << 20);
  const int64_t before = rss_file_bytes();
  if (before < 0) GTEST_SKIP() << "this kernel reports no RssFile in /proc/self/status";
  const size_t checked = pack->verify(/*release_pages=*/true);
  const int64_t released = rss_file_bytes();
  EXPECT_EQ(pack->verify(), checked);
  const int64_t kept = rss_file_bytes();
  EXPECT_LT(released - before, tensor_bytes / 4)
      << "released " << released - before << " of " << tensor_bytes;
  EXPECT_GT(kept - released, tensor_bytes / 2)
      << "kept " << kept - released << " of " << tensor_bytes;
}

}  // namespace
}  // namespace qtk
