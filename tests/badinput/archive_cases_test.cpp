// Hostile checkpoint archives handed to the real `convert`. The archives are
// written byte by byte here (ustar headers; a STORED zip), so each carries
// exactly one problem next to a valid checkpoint.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "tests/badinput/checkpoint_fixture.h"

namespace qtk::testing {
namespace {

struct TarEntry {
  TarEntry(std::string n, char t = '0', std::string d = {}, std::string l = {},
           uint64_t decl = UINT64_MAX)
      : name(std::move(n)), type(t), data(std::move(d)), link(std::move(l)), declared(decl) {}
  std::string name;
  char type;               // '0' file, '1' hard link, '2' symlink, '3' char dev, '5' dir, '6' FIFO
  std::string data;
  std::string link;        // link target
  uint64_t declared;       // size in the header (UINT64_MAX: data.size())
};

void put_octal(char* field, size_t width, uint64_t v) {
  if (v >> (3 * (width - 1))) {
    // note: too large for width-1 octal digits: GNU base-256 (high bit of
    // the first byte set, then big-endian binary), which libarchive reads.
    field[0] = static_cast<char>(0x80);
    for (size_t i = width - 1; i > 0; --i, v >>= 8) field[i] = static_cast<char>(v & 0xFF);
    return;
  }
  // width-1 octal digits and a NUL.
  std::string s(width - 1, '0');
  for (size_t i = width - 1; i-- > 0 && v;) {
    s[i] = static_cast<char>('0' + (v & 7));
    v >>= 3;
  }
  std::memcpy(field, s.c_str(), width);
}

std::string tar_archive(const std::vector<TarEntry>& entries) {
  std::string out;
  for (const TarEntry& e : entries) {
    std::array<char, 512> h{};
    std::memcpy(h.data(), e.name.data(), std::min<size_t>(e.name.size(), 100));
    put_octal(&h[100], 8, e.type == '5' ? 0755 : 0644);
    put_octal(&h[108], 8, 0);
    put_octal(&h[116], 8, 0);
    const uint64_t size = e.declared != UINT64_MAX ? e.declared : e.data.size();
    put_octal(&h[124], 12, size);
    put_octal(&h[136], 12, 0);
    h[156] = e.type;
    std::memcpy(&h[157], e.link.data(), std::min<size_t>(e.link.size(), 100));
    std::memcpy(&h[257], "ustar", 6);
    std::memcpy(&h[263], "00", 2);
    std::memset(&h[148], ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    put_octal(&h[148], 7, sum);
    h[155] = ' ';
    out.append(h.data(), h.size());
    out += e.data;
    out.append((512 - e.data.size() % 512) % 512, '\0');
  }
  out.append(1024, '\0');
  return out;
}

// The qwen3-tiny checkpoint's files as tar entries.
std::vector<TarEntry> good_entries() {
  const std::string dir = model_fixture("qwen3-tiny");
  return {{"config.json", '0', read_file(dir + "/config.json")},
          {"generation_config.json", '0', read_file(dir + "/generation_config.json")},
          {"model.safetensors", '0', read_file(dir + "/model.safetensors")}};
}

void expect_archive_rejected(const std::string& archive_name, const std::string& bytes,
                             const std::vector<std::string>& needles,
                             const std::vector<std::string>& extra_args = {}) {
  TempDir t;
  const std::string in = t / archive_name;
  write_file(in, bytes);
  std::filesystem::create_directories(t / "out");
  std::vector<std::string> argv = {program("convert"), in, t / "out/x.pack"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  const RunResult r = run_program(argv);
  std::vector<std::string> all = {archive_name};
  all.insert(all.end(), needles.begin(), needles.end());
  expect_clean_failure(r, "convert", all);
  expect_no_output(t / "out", "x.pack", {});
  // Nothing extracted is left anywhere in the test directory either.
  for (const std::string& f : list_dir(t.path()))
    EXPECT_TRUE(f == archive_name || f == "out") << "left behind: " << f;
}

TEST(BadArchive, ValidTarIsAccepted) {
  // The control case: the same writer without a hostile entry converts.
  TempDir t;
  write_file(t / "ok.tar", tar_archive(good_entries()));
  const RunResult r = run_program({program("convert"), t / "ok.tar", t / "x.pack"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(file_exists(t / "x.pack"));
}

TEST(BadArchive, DotDotAndAbsolutePaths) {
  for (const std::string name : {"../evil.json", "a/../../evil.json", "/tmp/evil.json", "..", "./../x"}) {
    SCOPED_TRACE(name);
    auto e = good_entries();
    e.insert(e.begin(), TarEntry{name, '0', "{}"});
    expect_archive_rejected("ck.tar", tar_archive(e), {});
  }
}

TEST(BadArchive, LinksDevicesAndFifos) {
  struct Case {
    TarEntry entry;
    const char* needle;
  };
  const Case cases[] = {
      {{"link.json", '2', "", "/etc/passwd"}, "link"},
      {{"hard.json", '1', "", "config.json"}, "link"},
      {{"dev", '3', ""}, "device"},
      {{"fifo", '6', ""}, "FIFO"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry.name);
    auto e = good_entries();
    e.insert(e.begin(), c.entry);
    expect_archive_rejected("ck.tar", tar_archive(e), {c.entry.name, c.needle});
  }
}

TEST(BadArchive, DuplicateNames) {
  auto e = good_entries();
  e.push_back({"config.json", '0', "{}"});
  expect_archive_rejected("ck.tar", tar_archive(e), {"config.json", "twice"});
  // The same file under two spellings.
  e = good_entries();
  e.push_back({"./config.json", '0', "{}"});
  expect_archive_rejected("ck.tar", tar_archive(e), {"config.json", "twice"});
}

TEST(BadArchive, BombSizedEntries) {
  // A header claiming 1 TiB (over the default 256 GiB cap), with no data: it
  // must be refused from the header, before anything is written.
  auto e = good_entries();
  e.insert(e.begin(), TarEntry{"huge.bin", '0', "", "", uint64_t{1} << 40});
  expect_archive_rejected("ck.tar", tar_archive(e), {"huge.bin", "limit"});
  // 4 GiB claimed against --max-unpacked-bytes 1G.
  e = good_entries();
  e.insert(e.begin(), TarEntry{"big.bin", '0', "", "", uint64_t{4} << 30});
  expect_archive_rejected("ck.tar", tar_archive(e), {"big.bin", "limit"}, {"--max-unpacked-bytes", "1G"});
  // A real 32 MiB entry of zeros, gzip-compressed to ~32 KiB, against
  // --max-unpacked-bytes 4M.
  TempDir t;
  e = good_entries();
  e.push_back({"zeros.bin", '0', std::string(32u << 20, '\0')});
  write_file(t / "bomb.tar", tar_archive(e));
  const RunResult gz = run_program({"/bin/gzip", "-1", t / "bomb.tar"});
  ASSERT_EQ(gz.exit_code, 0) << gz.err;
  expect_archive_rejected("bomb.tar.gz", read_file(t / "bomb.tar.gz"), {"limit"},
                          {"--max-unpacked-bytes", "4M"});
}

TEST(BadArchive, TruncatedOrGarbage) {
  const std::string full = tar_archive(good_entries());
  // Cut inside the model's data (the tar layout puts it last).
  expect_archive_rejected("ck.tar", full.substr(0, full.size() - 4096), {});
  expect_archive_rejected("ck.tar", std::string(2000, 'x'), {});
  expect_archive_rejected("ck.tar", "", {});
}

// ---- zip ----------------------------------------------------------------------

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put16(std::string& s, uint16_t v) { s.push_back(char(v & 255)), s.push_back(char(v >> 8)); }
void put32(std::string& s, uint32_t v) { put16(s, uint16_t(v & 0xFFFF)), put16(s, uint16_t(v >> 16)); }

// A STORED zip of (name, data) pairs.
std::string zip_archive(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out, cd;
  for (const auto& [name, data] : files) {
    const uint32_t offset = static_cast<uint32_t>(out.size());
    const uint32_t crc = crc32(data);
    put32(out, 0x04034b50), put16(out, 20), put16(out, 0), put16(out, 0), put16(out, 0), put16(out, 0x21);
    put32(out, crc), put32(out, uint32_t(data.size())), put32(out, uint32_t(data.size()));
    put16(out, uint16_t(name.size())), put16(out, 0);
    out += name + data;
    put32(cd, 0x02014b50), put16(cd, 0x031e), put16(cd, 20), put16(cd, 0), put16(cd, 0), put16(cd, 0),
        put16(cd, 0x21);
    put32(cd, crc), put32(cd, uint32_t(data.size())), put32(cd, uint32_t(data.size()));
    put16(cd, uint16_t(name.size())), put16(cd, 0), put16(cd, 0), put16(cd, 0), put16(cd, 0);
    put32(cd, 0100644u << 16), put32(cd, offset);
    cd += name;
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  out += cd;
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0), put16(out, uint16_t(files.size())),
      put16(out, uint16_t(files.size())), put32(out, uint32_t(cd.size())), put32(out, cd_offset), put16(out, 0);
  return out;
}

std::vector<std::pair<std::string, std::string>> good_zip_files() {
  std::vector<std::pair<std::string, std::string>> v;
  for (const TarEntry& e : good_entries()) v.emplace_back(e.name, e.data);
  return v;
}

TEST(BadArchive, ZipWithEscapingOrDuplicateNames) {
  {
    TempDir t;  // control: the zip writer itself is fine
    write_file(t / "ok.zip", zip_archive(good_zip_files()));
    const RunResult r = run_program({program("convert"), t / "ok.zip", t / "x.pack"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  auto f = good_zip_files();
  f.insert(f.begin(), {"../evil.json", "{}"});
  expect_archive_rejected("ck.zip", zip_archive(f), {"evil.json"});
  f = good_zip_files();
  f.insert(f.begin(), {"/abs.json", "{}"});
  expect_archive_rejected("ck.zip", zip_archive(f), {"abs.json"});
  f = good_zip_files();
  f.push_back({"config.json", "{}"});
  expect_archive_rejected("ck.zip", zip_archive(f), {"config.json", "twice"});
}

}  // namespace
}  // namespace qtk::testing
