// Pack reader rejection rules, on crafted files: a real pack with bytes
// changed in place, and small zips built by hand here (independently of
// libzip) with the defect under test.
#include <gtest/gtest.h>

#include <cstring>

#include "convert/convert.h"
#include "convert_test_util.h"
#include "pack/pack.h"
#include "tests/zip_crc32.h"

namespace qtk {
namespace {

using testing::error_of;
using testing::TempDir;
using testing::zip_crc32;

void put16(std::string& s, size_t p, uint16_t v) {
  s[p] = static_cast<char>(v & 0xFF);
  s[p + 1] = static_cast<char>(v >> 8);
}
void put32(std::string& s, size_t p, uint32_t v) {
  put16(s, p, v & 0xFFFF);
  put16(s, p + 2, static_cast<uint16_t>(v >> 16));
}
uint16_t get16(const std::string& s, size_t p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[p]) | (static_cast<uint8_t>(s[p + 1]) << 8));
}
uint32_t get32(const std::string& s, size_t p) {
  return get16(s, p) | (static_cast<uint32_t>(get16(s, p + 2)) << 16);
}

std::string u16(uint16_t v) {
  std::string s(2, '\0');
  put16(s, 0, v);
  return s;
}
std::string u32(uint32_t v) {
  std::string s(4, '\0');
  put32(s, 0, v);
  return s;
}

struct HandEntry {
  HandEntry(std::string n, std::string d, uint16_t m = 0, uint16_t f = 0)
      : name(std::move(n)), data(std::move(d)), method(m), flags(f) {}
  std::string name;
  std::string data;
  uint16_t method;
  uint16_t flags;
  uint32_t offset = 0;  // filled in by hand_zip
};

std::string local_header(const HandEntry& e, uint16_t extra_len) {
  return u32(0x04034b50) + u16(20) + u16(e.flags) + u16(e.method) + u16(0) + u16(0x21) +
         u32(zip_crc32(e.data)) + u32(static_cast<uint32_t>(e.data.size())) +
         u32(static_cast<uint32_t>(e.data.size())) + u16(static_cast<uint16_t>(e.name.size())) +
         u16(extra_len) + e.name + std::string(extra_len, '\0');
}

// Sets the CRC-32 of entry `name` of zip `z` (local header and central
// directory) to its data's, after the data was edited in place.
void fix_crc(std::string& z, const std::string& name) {
  const size_t eocd = z.rfind(std::string("PK\x05\x06", 4));
  size_t pos = get32(z, eocd + 16);
  for (uint16_t i = 0; i < get16(z, eocd + 10); ++i) {
    const uint16_t name_len = get16(z, pos + 28);
    if (z.compare(pos + 46, name_len, name) == 0) {
      const uint32_t local = get32(z, pos + 42), size = get32(z, pos + 24);
      const size_t data = local + 30 + get16(z, local + 26) + get16(z, local + 28);
      const uint32_t crc = zip_crc32(z.substr(data, size));
      put32(z, local + 14, crc);
      put32(z, pos + 16, crc);
      return;
    }
    pos += 46 + name_len + get16(z, pos + 30) + get16(z, pos + 32);
  }
  throw std::runtime_error("no entry " + name);
}

// Sequential zip; with `align`, pads each local header so data is 64-aligned.
std::string hand_zip(std::vector<HandEntry> es, bool align) {
  std::string z;
  for (auto& e : es) {
    e.offset = static_cast<uint32_t>(z.size());
    uint16_t extra = 0;
    if (align) {
      const size_t base = z.size() + 30 + e.name.size();
      extra = static_cast<uint16_t>((64 - base % 64) % 64);
      if (extra != 0 && extra < 4) extra += 64;
    }
    std::string h = local_header(e, extra);
    if (extra) {
      put16(h, 30 + e.name.size(), 0x7174);
      put16(h, 32 + e.name.size(), static_cast<uint16_t>(extra - 4));
    }
    z += h + e.data;
  }
  const size_t cd = z.size();
  for (const auto& e : es)
    z += u32(0x02014b50) + u16(20) + u16(20) + u16(e.flags) + u16(e.method) + u16(0) + u16(0x21) +
         u32(zip_crc32(e.data)) + u32(static_cast<uint32_t>(e.data.size())) +
         u32(static_cast<uint32_t>(e.data.size())) + u16(static_cast<uint16_t>(e.name.size())) +
         u16(0) + u16(0) + u16(0) + u16(0) + u32(0) + u32(e.offset) + e.name;
  z += u32(0x06054b50) + u16(0) + u16(0) + u16(static_cast<uint16_t>(es.size())) +
       u16(static_cast<uint16_t>(es.size())) + u32(static_cast<uint32_t>(z.size() - cd)) +
       u32(static_cast<uint32_t>(cd)) + u16(0);
  return z;
}

// A real pack of qwen3-tiny, converted once for the suite.
class ReaderReject : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ConvertOptions opt;
    opt.input = testing::source_path("tests/data/models/qwen3-tiny");
    opt.output = dir_->file("good.pack");
    convert_checkpoint(opt);
    good_ = new std::string(testing::read_file(opt.output));
  }
  static void TearDownTestSuite() {
    delete good_;
    delete dir_;
  }
  // Writes `bytes` as a pack and returns Pack::open's error.
  std::string open_error(const std::string& bytes, const std::string& name = "bad.pack") {
    const std::string p = dir_->file(name);
    testing::write_file(p, bytes);
    return error_of([&] { Pack::open(p); });
  }
  // Offset of the central directory entry for `name` in the good pack.
  static size_t central_entry(const std::string& z, const std::string& name) {
    const size_t eocd = z.size() - 22;
    size_t p = get32(z, eocd + 16);
    for (uint16_t i = 0; i < get16(z, eocd + 10); ++i) {
      const size_t n = get16(z, p + 28), m = get16(z, p + 30), k = get16(z, p + 32);
      if (z.compare(p + 46, n, name) == 0) return p;
      p += 46 + n + m + k;
    }
    ADD_FAILURE() << "no entry " << name;
    return 0;
  }
  static TempDir* dir_;
  static std::string* good_;
};
TempDir* ReaderReject::dir_ = nullptr;
std::string* ReaderReject::good_ = nullptr;

TEST_F(ReaderReject, GoodPackOpensAndVerifies) {
  const std::string p = dir_->file("copy.pack");
  testing::write_file(p, *good_);
  auto pack = Pack::open(p);
  EXPECT_GT(pack->verify(), 20u);
  EXPECT_EQ(pack->digest().size(), 16u);
  EXPECT_EQ(pack->tensor("embed_tokens").dtype, DType::BF16);
  EXPECT_NE(error_of([&] { pack->tensor("no_such_tensor"); }).find("no_such_tensor"),
            std::string::npos);
}

// The digest (which --resume and merge compare) covers everything in the
// manifest that can change a token, labels and the tokenizer and generation
// files included, but not the tool version.
TEST_F(ReaderReject, DigestCoversTheManifestButTheToolVersion) {
  const auto digest_of = [&](std::string z, const std::string& from, const std::string& to,
                             const std::string& name) {
    if (!from.empty()) {
      const size_t at = z.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at == std::string::npos) return std::string();
      EXPECT_EQ(from.size(), to.size());
      z.replace(at, from.size(), to);
      fix_crc(z, "manifest.json");
    }
    const std::string p = dir_->file(name);
    testing::write_file(p, z);
    return Pack::open(p)->digest();
  };
  const std::string base = digest_of(*good_, "", "", "d0.pack");
  ASSERT_EQ(base.size(), 16u);
  EXPECT_EQ(digest_of(*good_, "", "", "d1.pack"), base);
  EXPECT_EQ(digest_of(*good_, "\"tool_version\": \"qtk 0.1.0\"", "\"tool_version\": \"qtk 9.9.9\"",
                      "d2.pack"),
            base);
  // a tensor's dtype label (same bytes)
  EXPECT_NE(digest_of(*good_, "\"dtype\": \"BF16\"", "\"dtype\":  \"F16\"", "d3.pack"), base);
  // the generation_config.json entry's checksum (listed under "files")
  const size_t gen = good_->find("\"entry\": \"generation_config.json\"");
  ASSERT_NE(gen, std::string::npos);
  const size_t sum = good_->rfind("\"checksum\": \"", gen);
  ASSERT_NE(sum, std::string::npos);
  const std::string was = good_->substr(sum, 30);
  std::string now = was;
  now[14] = now[14] == '0' ? '1' : '0';
  EXPECT_NE(digest_of(*good_, was, now, "d4.pack"), base);
}

TEST_F(ReaderReject, UnknownMajorVersion) {
  std::string z = *good_;
  const size_t at = z.find("\"version\": \"1.0\"");
  ASSERT_NE(at, std::string::npos);
  z.replace(at, 16, "\"version\": \"2.0\"");
  fix_crc(z, "manifest.json");
  const std::string p = dir_->file("v2.pack");
  EXPECT_EQ(open_error(z, "v2.pack"),
            p + ": pack format version 2.0 is not supported (this build reads 1.x)");
}

TEST_F(ReaderReject, UnknownChecksumAlgorithm) {
  std::string z = *good_;
  const size_t at = z.find("\"checksum_algorithm\": \"xxh64\"");
  ASSERT_NE(at, std::string::npos);
  z.replace(at + 23, 5, "xxh32");
  fix_crc(z, "manifest.json");
  EXPECT_NE(open_error(z).find("field \"checksum_algorithm\": expected \"xxh64\", found \"xxh32\""),
            std::string::npos)
      << open_error(z);
}

TEST_F(ReaderReject, NewerMinorVersionIsRead) {
  std::string z = *good_;
  const size_t at = z.find("\"version\": \"1.0\"");
  z.replace(at, 16, "\"version\": \"1.7\"");
  fix_crc(z, "manifest.json");
  const std::string p = dir_->file("v17.pack");
  testing::write_file(p, z);
  EXPECT_NO_THROW(Pack::open(p));
}

TEST_F(ReaderReject, CompressedEntry) {
  std::string z = *good_;
  put16(z, central_entry(z, "manifest.json") + 10, 8);
  EXPECT_NE(open_error(z).find("is compressed"), std::string::npos);
}

TEST_F(ReaderReject, ForgedCentralDirectoryName) {
  std::string z = *good_;
  const size_t c = central_entry(z, "tensors/norm");
  z[c + 46 + 8] = 'N';  // "tensors/Norm" in the central directory only
  EXPECT_NE(open_error(z).find("local header names it"), std::string::npos);
}

// A damaged local header name is shown short and printable: bytes outside
// ASCII as \xHH, at most 96 of them (a name length of 0xFFFF made the
// message 64 KB of raw bytes).
TEST_F(ReaderReject, DamagedLocalHeaderNameIsShownShort) {
  std::string z = *good_;
  const size_t c = central_entry(z, "tensors/layers.1.mlp.down_proj");
  const size_t local = get32(z, c + 42);
  z[local + 30] = static_cast<char>(0xff);
  std::string e = open_error(z);
  EXPECT_NE(e.find("local header names it \"\\xffensors/layers.1.mlp.down_proj\""),
            std::string::npos)
      << e;
  z = *good_;
  put16(z, local + 26, 0xFFFF);
  e = open_error(z);
  EXPECT_LT(e.size(), 600u) << e.substr(0, 600);
  for (const char ch : e) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << e.substr(0, 600);
}

TEST_F(ReaderReject, ForgedCentralDirectoryOffset) {
  std::string z = *good_;
  const size_t eocd = z.size() - 22;
  put32(z, eocd + 16, get32(z, eocd + 16) + 4);
  EXPECT_NE(open_error(z).find("central directory"), std::string::npos);
}

TEST_F(ReaderReject, ForgedLocalHeaderOffset) {
  std::string z = *good_;
  const size_t c = central_entry(z, "tensors/norm");
  put32(z, c + 42, get32(z, c + 42) + 64);
  EXPECT_NE(open_error(z).find("tensors/norm"), std::string::npos);
}

TEST_F(ReaderReject, TruncatedFile) {
  EXPECT_NE(open_error(good_->substr(0, good_->size() - 30)).find("end-of-central-directory"),
            std::string::npos);
  EXPECT_NE(open_error("not a zip").find("not a pack"), std::string::npos);
}

TEST_F(ReaderReject, BadChecksumFoundByVerify) {
  std::string z = *good_;
  const size_t c = central_entry(z, "tensors/layers.1.mlp.down_proj");
  const size_t local = get32(z, c + 42);
  const size_t data = local + 30 + get16(z, local + 26) + get16(z, local + 28);
  z[data + 100] ^= 0x01;
  const std::string p = dir_->file("flipped.pack");
  testing::write_file(p, z);
  auto pack = Pack::open(p);  // structure is fine
  const std::string err = error_of([&] { pack->verify(); });
  EXPECT_NE(err.find("tensors/layers.1.mlp.down_proj"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
#ifdef QTK_INSPECT_BIN
  const auto r =
      testing::run_shell(std::string(QTK_INSPECT_BIN) + " " + testing::quote(p) + " --verify");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  const auto ok = testing::run_shell(std::string(QTK_INSPECT_BIN) + " " +
                                     testing::quote(dir_->file("good.pack")) + " --verify");
  EXPECT_NE(ok.out.find("entries OK"), std::string::npos) << ok.out << ok.err;
#endif
}

#ifdef QTK_INSPECT_BIN
// `inspect X.pack [--verify]` on a full device: exit 1 and one line saying
// so (the summary was lost with exit 0, and `inspect > r.txt` on a full disk
// left an empty r.txt).
TEST_F(ReaderReject, InspectReportsAFullStdout) {
  for (const char* flags : {"", " --verify"}) {
    SCOPED_TRACE(flags);
    const auto r =
        testing::run_shell(std::string(QTK_INSPECT_BIN) + " " +
                           testing::quote(dir_->file("good.pack")) + flags + " >/dev/full");
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.err, "inspect: cannot write to standard output: No space left on device\n");
  }
}
#endif

TEST_F(ReaderReject, MisalignedEntry) {
  const std::string z = hand_zip({{"manifest.json", "{}"}}, /*align=*/false);
  EXPECT_NE(open_error(z).find("not 64-byte aligned"), std::string::npos);
  // The same entry aligned passes the zip checks and fails on the manifest.
  EXPECT_NE(
      open_error(hand_zip({{"manifest.json", "{}"}}, true)).find("field \"format\" is missing"),
      std::string::npos);
}

TEST_F(ReaderReject, DataDescriptorAndEncryption) {
  EXPECT_NE(open_error(hand_zip({{"manifest.json", "{}", 0, 0x8}}, true)).find("data descriptor"),
            std::string::npos);
  EXPECT_NE(open_error(hand_zip({{"manifest.json", "{}", 0, 0x1}}, true)).find("encrypted"),
            std::string::npos);
}

TEST_F(ReaderReject, DuplicateNames) {
  EXPECT_NE(open_error(hand_zip({{"manifest.json", "{}"}, {"manifest.json", "{}"}}, true))
                .find("appears twice"),
            std::string::npos);
}

TEST_F(ReaderReject, OverlappingEntries) {
  // Entry "b" (header and data) lives inside the data of entry "a".
  HandEntry b{"b", std::string(32, 'B')};
  std::string inner = local_header(b, 33);            // 30 + 1 + 33 = 64 bytes of header
  inner += b.data;                                    // data at +64
  std::string a_data = std::string(64, 'A') + inner;  // b's header at a's data + 64
  std::string z = hand_zip({{"a", a_data}}, true);  // a's data at 64: b header at 128, data at 192
  // Append b to the central directory by rebuilding the tail by hand.
  const size_t eocd = z.size() - 22;
  const size_t cd = get32(z, eocd + 16);
  std::string central = z.substr(cd, eocd - cd);
  central += u32(0x02014b50) + u16(20) + u16(20) + u16(0) + u16(0) + u16(0) + u16(0x21) +
             u32(zip_crc32(b.data)) + u32(32) + u32(32) + u16(1) + u16(0) + u16(0) + u16(0) +
             u16(0) + u32(0) + u32(128) + "b";
  z = z.substr(0, cd) + central + u32(0x06054b50) + u16(0) + u16(0) + u16(2) + u16(2) +
      u32(static_cast<uint32_t>(central.size())) + u32(static_cast<uint32_t>(cd)) + u16(0);
  EXPECT_NE(open_error(z).find("overlap"), std::string::npos);
}

}  // namespace
}  // namespace qtk
