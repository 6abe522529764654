// Damaged packs handed to the real `inspect` (and `inspect --verify`,
// `generate`): wrong version, compressed, misaligned or overlapping entries,
// a forged central directory, truncation, a bad checksum.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pack/pack_checksum.h"
#include "tests/badinput/checkpoint_fixture.h"
#include "tests/zip_crc32.h"

namespace qtk::testing {
namespace {

uint32_t get32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint16_t get16(const std::string& s, size_t at) {
  uint16_t v;
  std::memcpy(&v, s.data() + at, 2);
  return v;
}
void set32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }

void set16(std::string& s, size_t at, uint16_t v) { std::memcpy(s.data() + at, &v, 2); }

struct ZipEntry {
  std::string name;
  size_t central = 0;  // offset of its central directory header
  size_t local = 0;    // offset of its local header
  size_t data = 0;     // offset of its data
  uint32_t size = 0;
};

struct ZipLayout {
  size_t eocd = 0;
  std::vector<ZipEntry> entries;
  const ZipEntry& find(const std::string& name) const {
    for (const auto& e : entries)
      if (e.name == name) return e;
    throw std::runtime_error("no entry " + name);
  }
};

// Reads the (small, non-zip64) pack the test converted.
ZipLayout parse_zip(const std::string& z) {
  ZipLayout L;
  L.eocd = z.rfind(std::string("PK\x05\x06", 4));
  if (L.eocd == std::string::npos) throw std::runtime_error("no EOCD");
  const uint16_t n = get16(z, L.eocd + 10);
  size_t pos = get32(z, L.eocd + 16);
  for (uint16_t i = 0; i < n; ++i) {
    ZipEntry e;
    e.central = pos;
    const uint16_t name_len = get16(z, pos + 28), extra = get16(z, pos + 30),
                   comment = get16(z, pos + 32);
    e.name = z.substr(pos + 46, name_len);
    e.local = get32(z, pos + 42);
    e.size = get32(z, pos + 24);
    e.data = e.local + 30 + get16(z, e.local + 26) + get16(z, e.local + 28);
    L.entries.push_back(e);
    pos += 46 + name_len + extra + comment;
  }
  return L;
}

// Replaces the data of the entry stored last (the manifest, as convert
// writes it) with `bytes` of any length, fixing sizes, CRC-32 and offsets
// so that the zip structure stays valid.
std::string replace_last_entry(const std::string& z, const std::string& name,
                               const std::string& bytes) {
  const ZipLayout L = parse_zip(z);
  const ZipEntry& e = L.find(name);
  for (const auto& o : L.entries)
    if (o.local > e.local) throw std::runtime_error(name + " is not the last entry");
  const size_t cd = get32(z, L.eocd + 16);
  std::string out = z.substr(0, e.data) + bytes;
  const size_t new_cd = out.size();
  std::string dir = z.substr(cd, L.eocd - cd);
  const std::string end = z.substr(L.eocd);
  const uint32_t n = static_cast<uint32_t>(bytes.size()), crc = zip_crc32(bytes);
  set32(out, e.local + 14, crc), set32(out, e.local + 18, n), set32(out, e.local + 22, n);
  set32(dir, e.central - cd + 16, crc), set32(dir, e.central - cd + 20, n),
      set32(dir, e.central - cd + 24, n);
  out += dir;
  const size_t eocd = out.size();
  out += end;
  set32(out, eocd + 16, static_cast<uint32_t>(new_cd));
  return out;
}

// Writes `bytes` at byte `offset` of tensor `tensor`'s data and puts its
// checksums right again (its XXH64 in the manifest, the entry's CRC-32): a
// pack edited after convert, which only the checks of the values can refuse.
std::string with_tensor_bytes(const std::string& z, const std::string& tensor, size_t offset,
                              const std::string& bytes) {
  const ZipLayout L = parse_zip(z);
  const ZipEntry& e = L.find("tensors/" + tensor);
  std::string out = z;
  out.replace(e.data + offset, bytes.size(), bytes);
  const std::string data = out.substr(e.data, e.size);
  const uint32_t crc = zip_crc32(data);
  set32(out, e.local + 14, crc);
  set32(out, e.central + 16, crc);
  const ZipEntry& m = L.find("manifest.json");
  auto j = nlohmann::ordered_json::parse(out.substr(m.data, m.size));
  for (auto& t : j["tensors"])
    if (t["name"] == tensor) t["checksum"] = checksum_hex(xxh64(data.data(), data.size()));
  return replace_last_entry(out, "manifest.json", j.dump());
}

class BadPack : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const RunResult r =
        run_program({program("convert"), model_fixture("qwen3-tiny"), *dir_ / "good.pack"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    good_ = new std::string(read_file(*dir_ / "good.pack"));
  }
  static void TearDownTestSuite() {
    delete good_;
    delete dir_;
  }

  // Writes `bytes` as a pack and expects `inspect` (and generate) to refuse it.
  void expect_rejected(const std::string& bytes, const std::vector<std::string>& needles,
                       bool verify = false) {
    TempDir t;
    write_file(t / "bad.pack", bytes);
    std::vector<std::string> argv = {program("inspect"), t / "bad.pack"};
    if (verify) argv.push_back("--verify");
    std::vector<std::string> all = {"bad.pack"};
    all.insert(all.end(), needles.begin(), needles.end());
    expect_clean_failure(run_program(argv), "inspect", all);
    write_file(t / "p.jsonl", "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 2}\n");
    const RunResult g = run_program({program("generate"), "--model", t / "bad.pack", "--batch",
                                     t / "p.jsonl", "--out", t / "out.jsonl", "--threads", "1"});
    expect_clean_failure(g, "generate", all);
    EXPECT_FALSE(file_exists(t / "out.jsonl")) << "generate left a results file for a bad pack";
    EXPECT_FALSE(file_exists(t / "out.jsonl.meta.json"))
        << "generate left a meta file for a bad pack";
  }

  static TempDir* dir_;
  static std::string* good_;
};
TempDir* BadPack::dir_ = nullptr;
std::string* BadPack::good_ = nullptr;

TEST_F(BadPack, GoodPackIsAcceptedAndVerifies) {
  const RunResult r = run_program({program("inspect"), *dir_ / "good.pack", "--verify"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r.out;
}

TEST_F(BadPack, ManifestEdits) {
  const ZipEntry m = parse_zip(*good_).find("manifest.json");
  auto j = nlohmann::ordered_json::parse(good_->substr(m.data, m.size));
  {  // control: re-inserting the same manifest keeps a valid pack
    TempDir t;
    write_file(t / "same.pack", replace_last_entry(*good_, "manifest.json", j.dump(1)));
    EXPECT_EQ(run_program({program("inspect"), t / "same.pack", "--verify"}).exit_code, 0);
  }
  auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto k = j;
    f(k);
    return replace_last_entry(*good_, "manifest.json", k.dump());
  };
  expect_rejected(edited([](auto& k) { k["version"] = "2.0"; }), {"version", "2.0"});
  expect_rejected(edited([](auto& k) { k["format"] = "zip"; }), {"format"});
  expect_rejected(edited([](auto& k) { k.erase("tensors"); }), {"tensors"});
  expect_rejected(edited([](auto& k) { k["tensors"][0]["shape"] = {-1}; }), {"shape"});
  expect_rejected(edited([](auto& k) { k["tensors"][0]["bytes"] = 7; }), {"bytes"});
  expect_rejected(edited([](auto& k) { k["tensors"][0]["entry"] = "tensors/nope"; }),
                  {"tensors/nope"});
  expect_rejected(edited([](auto& k) { k["tensors"].push_back(k["tensors"][0]); }), {"twice"});
  // note: validate_model_config names the field by its HF name
  // (num_key_value_heads) also for the manifest's num_kv_heads.
  expect_rejected(edited([](auto& k) { k["config"]["num_kv_heads"] = 3; }),
                  {"config", "heads", "found 3"});
  expect_rejected(replace_last_entry(*good_, "manifest.json", "{\"format\": "), {"manifest.json"});
}

// The tensors' checksums live in the manifest, so a damaged manifest (one
// changed digit of rms_norm_eps loads and computes other numbers) is found
// by its zip CRC-32, at every load; so is a CRC-32 field that differs
// between the local header and the central directory.
TEST_F(BadPack, DamagedManifestIsFoundByItsCrc) {
  const ZipEntry m = parse_zip(*good_).find("manifest.json");
  const size_t eps = good_->find("\"rms_norm_eps\"", m.data);
  ASSERT_NE(eps, std::string::npos);
  const size_t digit = good_->find_first_of("123456789", eps + 15);
  ASSERT_LT(digit, m.data + m.size);
  std::string flipped = *good_;
  flipped[digit] = flipped[digit] == '1' ? '2' : '1';
  expect_rejected(flipped, {"manifest.json", "damaged", "CRC-32"});
  expect_rejected(flipped, {"manifest.json", "damaged", "CRC-32"}, /*verify=*/true);
  const ZipEntry t = parse_zip(*good_).entries.front();
  std::string local_crc = *good_;
  local_crc[t.local + 14] ^= 1;
  expect_rejected(local_crc, {t.name, "local header CRC-32", "central directory"});
}

// Issue 20 item 12: `inspect --verify` runs every check generate runs at
// load; these packs have a valid zip structure, manifest and checksums, so
// the old --verify (checksums only) passed them while generate refused them.
TEST_F(BadPack, VerifyRefusesWhatGenerateRefuses) {
  const ZipEntry m = parse_zip(*good_).find("manifest.json");
  const auto j = nlohmann::ordered_json::parse(good_->substr(m.data, m.size));
  auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto k = j;
    f(k);
    return replace_last_entry(*good_, "manifest.json", k.dump());
  };
  auto tensor = [](nlohmann::ordered_json& k, const std::string& name) -> nlohmann::ordered_json& {
    for (auto& t : k["tensors"])
      if (t["name"] == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  // A tensor missing from the table (its entry stays in the zip).
  const std::string missing = edited([&](auto& k) {
    auto& ts = k["tensors"];
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i]["name"] == "layers.0.mlp.down_proj") ts.erase(i);
  });
  expect_rejected(missing, {"layers.0.mlp.down_proj"}, /*verify=*/true);
  // A transposed shape (same bytes, same checksum).
  const std::string transposed = edited([&](auto& k) {
    auto& t = tensor(k, "layers.0.self_attn.o_proj");
    t["shape"] = {t["shape"][1], t["shape"][0]};
  });
  expect_rejected(transposed, {"layers.0.self_attn.o_proj"}, /*verify=*/true);
}

TEST_F(BadPack, DeeplyNestedManifest) {
  const ZipEntry m = parse_zip(*good_).find("manifest.json");
  const auto j = nlohmann::ordered_json::parse(good_->substr(m.data, m.size));
  // note: a million nested arrays where a string is expected; showing the
  // value in the message must not overflow the stack.
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  std::string text = j.dump();
  const std::string key = "\"format\":\"qtk-pack\"";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"format\":" + deep);
  // The strict parser refuses the nesting before any field is read.
  expect_rejected(replace_last_entry(*good_, "manifest.json", text), {"manifest.json", "nested"});
}

TEST_F(BadPack, WrongVersion) {
  const ZipEntry m = parse_zip(*good_).find("manifest.json");
  std::string manifest = good_->substr(m.data, m.size);
  const size_t v = manifest.find("\"version\": \"1.");
  ASSERT_NE(v, std::string::npos);
  manifest[v + std::strlen("\"version\": \"")] = '7';
  expect_rejected(replace_last_entry(*good_, "manifest.json", manifest), {"version", "7."});
}

TEST_F(BadPack, CompressedEntry) {
  std::string z = *good_;
  const ZipLayout L = parse_zip(z);
  const ZipEntry& e = L.entries.front();
  set16(z, e.central + 10, 8);  // deflate, in the central directory...
  expect_rejected(z, {e.name, "compressed"});
  set16(z, e.central + 10, 0);
  set16(z, e.local + 8, 8);  // ...or only in the local header
  expect_rejected(z, {e.name, "compressed"});
}

TEST_F(BadPack, MisalignedEntry) {
  std::string z = *good_;
  const ZipEntry e = parse_zip(z).entries.front();
  // One more byte of local extra field moves the data off its 64-byte boundary.
  set16(z, e.local + 28, static_cast<uint16_t>(get16(z, e.local + 28) + 1));
  expect_rejected(z, {e.name, "aligned"});
}

TEST_F(BadPack, OverlappingEntries) {
  std::string z = *good_;
  const ZipLayout L = parse_zip(z);
  // The first entry grows (in both headers) into the second.
  const ZipEntry& e = L.entries[0];
  const uint32_t grown = e.size + 128;
  set32(z, e.central + 20, grown), set32(z, e.central + 24, grown);
  set32(z, e.local + 18, grown), set32(z, e.local + 22, grown);
  expect_rejected(z, {"overlap"});
}

TEST_F(BadPack, ForgedCentralDirectory) {
  const ZipLayout L = parse_zip(*good_);
  {  // the directory offset points into tensor data
    std::string z = *good_;
    set32(z, L.eocd + 16, get32(z, L.eocd + 16) - 64);
    expect_rejected(z, {"central directory"});
  }
  {  // one entry more than the directory holds
    std::string z = *good_;
    set16(z, L.eocd + 8, static_cast<uint16_t>(get16(z, L.eocd + 8) + 1));
    set16(z, L.eocd + 10, static_cast<uint16_t>(get16(z, L.eocd + 10) + 1));
    expect_rejected(z, {"central directory"});
  }
  {  // an entry's local header offset moved to another entry's header
    std::string z = *good_;
    set32(z, L.entries[1].central + 42, static_cast<uint32_t>(L.entries[0].local));
    expect_rejected(z, {L.entries[1].name});
  }
  {  // a local header offset past the entry area
    std::string z = *good_;
    set32(z, L.entries[0].central + 42, 0xFFFFFFF0u);
    expect_rejected(z, {L.entries[0].name});
  }
  {  // a duplicate name: the second entry renamed to the first's name length-permitting
    std::string z = *good_;
    const ZipEntry& a = L.entries[1];
    const ZipEntry& b = L.entries[2];
    if (a.name.size() == b.name.size()) {
      z.replace(b.central + 46, b.name.size(), a.name);
      z.replace(b.local + 30, b.name.size(), a.name);
      expect_rejected(z, {a.name, "twice"});
    }
  }
}

TEST_F(BadPack, TruncatedAtEveryStructure) {
  const ZipLayout L = parse_zip(*good_);
  const size_t cd = get32(*good_, L.eocd + 16);
  for (size_t cut : {size_t{0}, size_t{10}, L.entries[1].local, cd, cd + 20, L.eocd, L.eocd + 21,
                     good_->size() / 2}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_rejected(good_->substr(0, cut), {});
  }
}

TEST_F(BadPack, NotAZip) {
  expect_rejected(std::string(4096, 'x'), {"not a pack"});
  expect_rejected(read_file(model_fixture("qwen3-tiny") + "/config.json"), {});
}

// An archive given where a pack is expected (inspect, generate --model) is
// named as an archive, with the convert command to run first; recognised by
// its magic bytes (gzip, zstd, xz, bzip2, tar) or, for a zip, by the pack's
// manifest.json entry missing.
TEST_F(BadPack, ArchiveIsNamedAndConvertIsSuggested) {
  const std::vector<std::string> convert_first = {"convert it first", "bad.pack OUT.pack)"};
  auto with = [&](std::vector<std::string> needles) {
    needles.insert(needles.end(), convert_first.begin(), convert_first.end());
    return needles;
  };
  TempDir t;
  const RunResult tar = run_program(
      {"/bin/tar", "-cf", t / "ck.tar", "-C", model_fixture("qwen3-tiny"), "config.json"});
  ASSERT_EQ(tar.exit_code, 0) << tar.err;
  expect_rejected(read_file(t / "ck.tar"), with({"this is a tar archive, not a .pack file"}));
  const RunResult gz = run_program({"/bin/gzip", "-k", t / "ck.tar"});
  ASSERT_EQ(gz.exit_code, 0) << gz.err;
  expect_rejected(read_file(t / "ck.tar.gz"), with({"this is a gzip-compressed file (.tar.gz?)"}));
  // The other compressors by their magic bytes alone.
  const std::string rest(600, '\x01');
  expect_rejected("\x28\xb5\x2f\xfd" + rest, with({"zstd-compressed file (.tar.zst?)"}));
  expect_rejected(std::string("\xfd"
                              "7zXZ\x00",
                              6) +
                      rest,
                  with({"xz-compressed file"}));
  expect_rejected("BZh9" + rest, with({"bzip2-compressed file"}));

  // A zip of a checkpoint: the pack's manifest.json renamed (same length)
  // to a checkpoint's config.json in a subdirectory, in both headers.
  const ZipLayout L = parse_zip(*good_);
  const ZipEntry& m = L.find("manifest.json");
  std::string ck = *good_;
  ck.replace(m.central + 46, 13, "a/config.json");
  ck.replace(m.local + 30, 13, "a/config.json");
  expect_rejected(ck, with({"this is a zip archive of a checkpoint (no manifest.json entry)"}));
  // A zip without a manifest.json whose entry is compressed: named as an
  // archive before any complaint about the compression.
  std::string zip = *good_;
  zip.replace(m.central + 46, 13, "manifest.txt!");
  zip.replace(m.local + 30, 13, "manifest.txt!");
  const ZipEntry& first = L.entries.front();
  set16(zip, first.central + 10, 8);
  set16(zip, first.local + 8, 8);
  expect_rejected(zip, with({"this is a zip archive (no manifest.json entry; entry \"" +
                             first.name + "\" is compressed)"}));
}

TEST_F(BadPack, BadChecksumFoundByVerify) {
  std::string z = *good_;
  const ZipEntry e = parse_zip(z).entries.front();
  z[e.data + e.size / 2] ^= 0x40;
  // It opens (checksums are not recomputed on open)...
  TempDir t;
  write_file(t / "bad.pack", z);
  EXPECT_EQ(run_program({program("inspect"), t / "bad.pack"}).exit_code, 0);
  // ...and --verify names the entry.
  expect_rejected(z, {e.name, "checksum"}, /*verify=*/true);
}

// FP8 packs (issue 23): the manifest's "quantization" section ties each
// F8_E4M3 tensor to its scales; every broken link is refused by name.
class BadFp8Pack : public BadPack {
 protected:
  static void SetUpTestSuite() {
    BadPack::SetUpTestSuite();
    const RunResult r =
        run_program({program("convert"), model_fixture("qwen3-fp8-tiny"), *dir_ / "fp8.pack"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    fp8_ = new std::string(read_file(*dir_ / "fp8.pack"));
  }
  static void TearDownTestSuite() {
    delete fp8_;
    BadPack::TearDownTestSuite();
  }
  static std::string* fp8_;
};
std::string* BadFp8Pack::fp8_ = nullptr;

TEST_F(BadFp8Pack, QuantizationSectionEdits) {
  const ZipEntry m = parse_zip(*fp8_).find("manifest.json");
  const auto j = nlohmann::ordered_json::parse(fp8_->substr(m.data, m.size));
  ASSERT_TRUE(j.contains("quantization"));
  auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto k = j;
    f(k);
    return replace_last_entry(*fp8_, "manifest.json", k.dump());
  };
  {  // control
    TempDir t;
    write_file(t / "same.pack", edited([](auto&) {}));
    EXPECT_EQ(run_program({program("inspect"), t / "same.pack", "--verify"}).exit_code, 0);
  }
  expect_rejected(edited([](auto& k) { k.erase("quantization"); }),
                  {"layers.0.self_attn.qkv_proj", "F8_E4M3", "quantization"});
  expect_rejected(edited([](auto& k) { k["quantization"]["method"] = "awq"; }),
                  {"quantization", "method", "awq"});
  expect_rejected(edited([](auto& k) { k["quantization"]["fmt"] = "e5m2"; }),
                  {"quantization", "fmt", "e5m2"});
  expect_rejected(edited([](auto& k) {
                    k["quantization"]["tensors"][0]["block"] = {128, 24};
                  }),
                  {"quantization tensors[0]", "block", "multiple of 16"});
  expect_rejected(edited([](auto& k) {
                    k["quantization"]["tensors"][0]["block"] = {256, 128};
                  }),
                  {"quantization tensors[0]", "scale tensor", "expected F32 [2, 2]"});
  expect_rejected(
      edited([](auto& k) { k["quantization"]["tensors"][0]["scale"] = "nope"; }),
      {"quantization tensors[0]", "nope", "expected \"layers.0.self_attn.qkv_proj.scale\""});
  // Another tensor's scales (they exist, of the right shape).
  expect_rejected(edited([](auto& k) {
                    for (auto& t : k["quantization"]["tensors"])
                      if (t["name"] == "layers.0.self_attn.o_proj")
                        t["scale"] = "layers.1.self_attn.o_proj.scale";
                  }),
                  {"field \"scale\" is \"layers.1.self_attn.o_proj.scale\"",
                   "expected \"layers.0.self_attn.o_proj.scale\""});
  // The scales' entry gone from the table: named.
  expect_rejected(edited([](auto& k) {
                    auto& ts = k["tensors"];
                    for (size_t i = 0; i < ts.size(); ++i)
                      if (ts[i]["name"] == "layers.0.self_attn.qkv_proj.scale") ts.erase(i);
                  }),
                  {"layers.0.self_attn.qkv_proj.scale", "not in the pack"});
  expect_rejected(edited([](auto& k) { k["quantization"]["tensors"][0]["name"] = "lm_head"; }),
                  {"quantization tensors[0]", "lm_head", "BF16", "F8_E4M3"});
  expect_rejected(edited([](auto& k) {
                    k["quantization"]["tensors"].push_back(k["quantization"]["tensors"][0]);
                  }),
                  {"quantization", "listed twice"});
  // A scale tensor of another dtype than F32.
  expect_rejected(edited([](auto& k) {
                    for (auto& t : k["tensors"])
                      if (t["name"] == "layers.0.self_attn.o_proj.scale")
                        t["dtype"] = "BF16", t["shape"] = {2, 4};
                  }),
                  {"layers.0.self_attn.o_proj.scale", "BF16", "expected F32"});
}

// Values convert refuses in a checkpoint, in a pack edited after convert
// (checksums recomputed): an e4m3fn NaN byte in an FP8 matrix; a NaN,
// infinite or negative scale; a zero scale over non-zero bytes; a scale so
// large that fp8 x scale overflows float32. `inspect --verify` and generate
// (which verifies at load) refuse each, naming the tensor and the element.
TEST_F(BadFp8Pack, ValuesConvertRefusesAreRefusedAtLoad) {
  const std::string w = "layers.0.self_attn.qkv_proj", s = w + ".scale";
  auto f32 = [](float v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  {  // control: the same bytes written back
    TempDir t;
    write_file(t / "same.pack",
               with_tensor_bytes(*fp8_, w, 0,
                                 fp8_->substr(parse_zip(*fp8_).find("tensors/" + w).data, 1)));
    EXPECT_EQ(run_program({program("inspect"), t / "same.pack", "--verify"}).exit_code, 0);
  }
  // qkv_proj is F8_E4M3 [512, 256]; its scales F32 [4, 2] (128 x 128 blocks).
  expect_rejected(
      with_tensor_bytes(*fp8_, w, 100, "\x7f"),
      {"tensor \"" + w + "\"", "element [0, 100] is byte 0x7f", "a NaN in F8_E4M3 (e4m3fn)"},
      /*verify=*/true);
  expect_rejected(with_tensor_bytes(*fp8_, w, 256 * 300 + 7, "\xff"),
                  {"tensor \"" + w + "\"", "element [300, 7] is byte 0xff"}, /*verify=*/true);
  expect_rejected(
      with_tensor_bytes(*fp8_, s, 4, f32(std::nanf(""))),
      {"tensor \"" + s + "\"", "expected finite values of 0 or more, found nan at [0, 1]"},
      /*verify=*/true);
  expect_rejected(with_tensor_bytes(*fp8_, s, 4, f32(-0.01f)),
                  {"expected finite values of 0 or more, found -0.01 at [0, 1]"}, /*verify=*/true);
  // A zero scale is refused only over a block with a non-zero byte (here every block has one).
  expect_rejected(with_tensor_bytes(*fp8_, s, 4, f32(0.0f)),
                  {"tensor \"" + s + "\"", "expected a positive scale at [0, 1]", "found 0"},
                  /*verify=*/true);
  expect_rejected(
      with_tensor_bytes(*fp8_, s, 4, f32(3e38f)),
      {"the scale 3e+38 at [0, 1] overflows float32", "expected products within float32"},
      /*verify=*/true);
}

// The values a manifest holds twice (the top-level copies of "config", and
// "generation" with the carried generation_config.json): a pack whose copies
// disagree is refused, naming both fields and both values.
class BadPackCopies : public BadPack {
 protected:
  static void SetUpTestSuite() {
    BadPack::SetUpTestSuite();
    const RunResult r = run_program(
        {program("convert"), source_path("samples/qwen3.5-sample"), *dir_ / "copies.pack"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    sample_ = new std::string(read_file(*dir_ / "copies.pack"));
  }
  static void TearDownTestSuite() {
    delete sample_;
    BadPack::TearDownTestSuite();
  }
  // The sample's pack with its manifest edited by `f`.
  static std::string edited(const std::function<void(nlohmann::ordered_json&)>& f) {
    const ZipEntry m = parse_zip(*sample_).find("manifest.json");
    auto k = nlohmann::ordered_json::parse(sample_->substr(m.data, m.size));
    f(k);
    return replace_last_entry(*sample_, "manifest.json", k.dump());
  }
  static std::string* sample_;
};
std::string* BadPackCopies::sample_ = nullptr;

TEST_F(BadPackCopies, CopiesThatDisagreeAreRefused) {
  {  // control: the copies as convert wrote them
    TempDir t;
    write_file(t / "same.pack", edited([](auto&) {}));
    const RunResult r = run_program({program("inspect"), t / "same.pack", "--verify"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  struct Case {
    std::function<void(nlohmann::ordered_json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](auto& k) { k["layer_plan"] = "LLLLLLLF"; },
       {"'layer_plan' (\"LLLLLLLF\")", "'config.layer_plan' (\"LLLFLLLF\")", "disagree"}},
      {[](auto& k) { k["rope"]["theta"] = 5e6; },
       {"'rope.theta' (5000000.0)", "'config.rope.theta' (10000000.0)"}},
      {[](auto& k) { k["rope"]["rotary_dim"] = 32; },
       {"'rope.rotary_dim' (32)", "'config.rope.rotary_dim' (16)"}},
      {[](auto& k) { k["rope"]["partial_rotary_factor"] = 0.5; },
       {"'rope.partial_rotary_factor' (0.5)", "'config.rope.partial_factor' (0.25)"}},
      {[](auto& k) {
         k["rope"]["mrope_section"] = {2, 3, 3};
       },
       {"'rope.mrope_section' ([2,3,3])", "'config.rope.mrope_section' ([3,3,2])"}},
      {[](auto& k) { k["rope"]["mrope_interleaved"] = false; },
       {"'rope.mrope_interleaved' (false)", "'config.rope.mrope_interleaved' (true)"}},
      {[](auto& k) { k["rope"] = "default"; }, {"field 'rope': expected an object"}},
      {[](auto& k) { k["eos_token_ids"] = {1}; },
       {"'eos_token_ids' ([1])", "'config.eos_token_ids' ([0])"}},
      {[](auto& k) { k["bos_token_id"] = 5; },
       {"'bos_token_id' (5)", "'config.bos_token_id' (null)"}},
      {[](auto& k) { k["source"]["architecture"] = "Qwen3ForCausalLM"; },
       {"'source.architecture' (\"Qwen3ForCausalLM\")",
        "'config.hf_architecture' (\"Qwen3_5ForCausalLM\")"}},
      {[](auto& k) { k["source"]["model_type"] = "qwen3"; },
       {"'source.model_type' (\"qwen3\")", "'config.model_type' (\"qwen3_5_text\")"}},
      // The sample's generation_config.json has no max_new_tokens.
      {[](auto& k) { k["generation"]["max_new_tokens"] = 64; },
       {"'generation.max_new_tokens' (64)", "'generation_config.json max_new_tokens' (absent)"}},
      // Both eos copies of the manifest edited alike, against the carried file's.
      {[](auto& k) { k["eos_token_ids"] = k["config"]["eos_token_ids"] = {1}; },
       {"'config.eos_token_ids' ([1])", "'generation_config.json eos_token_id' ([0])"}},
      // A contiguous M-RoPE section the rotary dim (16: 8 frequencies) does
      // not hold, in both copies alike (the config's own check, reached
      // through a pack).
      {[](auto& k) {
         k["rope"]["mrope_section"] = k["config"]["rope"]["mrope_section"] = {3, 3, 3};
         k["rope"]["mrope_interleaved"] = k["config"]["rope"]["mrope_interleaved"] = false;
       },
       {"config", "field 'mrope_section'", "expected entries summing to rotary_dim / 2 = 8",
        "found [3,3,3] (sum 9)"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needles.front());
    std::vector<std::string> needles = {"manifest.json"};
    needles.insert(needles.end(), c.needles.begin(), c.needles.end());
    expect_rejected(edited(c.edit), needles);
  }
}

}  // namespace
}  // namespace qtk::testing
