// Archive inputs (.tar.gz, .tar.zst, .zip, with and without a top-level
// folder) and every rejection rule of the extractor and the CLI: the
// program exits 1, prints one line on stderr, and leaves neither the pack
// nor any temporary file or directory.
#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>

#include "convert/convert.h"
#include "convert_test_util.h"

namespace qtk {
namespace {

using testing::quote;
using testing::run_shell;
using testing::TempDir;

const std::string kTiny = "tests/data/models/qwen3-tiny";

std::string convert_bin() { return QTK_CONVERT_BIN; }

// Converts `input` with the CLI and expects failure with one stderr line
// containing `needle`, no OUT and nothing else new in the output directory.
void expect_rejected(const std::string& input, const std::string& needle,
                     const std::string& flags = "") {
  TempDir out_dir;
  const std::string out = out_dir.file("m.pack");
  const auto r = run_shell(convert_bin() + " " + quote(input) + " " + quote(out) + " " + flags);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(testing::count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("convert: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err << "expected: " << needle;
  EXPECT_TRUE(out_dir.listing().empty()) << "left behind: " << *out_dir.listing().begin();
}

struct TarEntry {
  TarEntry(std::string n, mode_t t, std::string d, std::string l = "", bool h = false)
      : name(std::move(n)), type(t), data(std::move(d)), link(std::move(l)), hardlink(h) {}
  std::string name;
  mode_t type;
  std::string data;
  std::string link;  // symlink target or hardlink source
  bool hardlink;
};

// Writes a pax tar with libarchive.
void write_tar(const std::string& path, const std::vector<TarEntry>& entries) {
  archive* a = archive_write_new();
  archive_write_set_format_pax(a);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (const auto& e : entries) {
    archive_entry* en = archive_entry_new();
    archive_entry_set_pathname(en, e.name.c_str());
    archive_entry_set_filetype(en, e.type);
    archive_entry_set_perm(en, 0644);
    if (e.hardlink)
      archive_entry_set_hardlink(en, e.link.c_str());
    else if (e.type == AE_IFLNK)
      archive_entry_set_symlink(en, e.link.c_str());
    archive_entry_set_size(
        en, e.type == AE_IFREG && !e.hardlink ? static_cast<la_int64_t>(e.data.size()) : 0);
    ASSERT_EQ(archive_write_header(a, en), ARCHIVE_OK) << archive_error_string(a);
    if (!e.data.empty() && !e.hardlink) archive_write_data(a, e.data.data(), e.data.size());
    archive_entry_free(en);
  }
  archive_write_close(a);
  archive_write_free(a);
}

std::string tiny_config() {
  return testing::read_file(testing::source_path(kTiny + "/config.json"));
}

class ArchiveInput : public ::testing::TestWithParam<std::string> {};

// The pack from an archive is byte-identical to the pack from the directory.
TEST_P(ArchiveInput, GivesTheSamePackAsTheDirectory) {
  const std::string kind = GetParam();
  TempDir tmp;
  const std::string model_parent = testing::source_path("tests/data/models");
  std::string archive, cmd;
  if (kind == "tar.gz-folder") {
    archive = tmp.file("m.tar.gz");
    cmd = "tar -czf " + quote(archive) + " -C " + quote(model_parent) + " qwen3-tiny";
  } else if (kind == "tar.gz-flat") {
    archive = tmp.file("m.tar.gz");
    cmd = "tar -czf " + quote(archive) + " -C " + quote(testing::source_path(kTiny)) + " .";
  } else if (kind == "tar.zst") {
    archive = tmp.file("m.tar.zst");
    cmd = "tar --zstd -cf " + quote(archive) + " -C " + quote(model_parent) + " qwen3-tiny";
  } else if (kind == "tar-folder-and-readme") {
    // one checkpoint folder, a file beside it at the top level
    archive = tmp.file("m.tar");
    testing::write_file(tmp.file("README.md"), "a model\n");
    cmd = "tar -cf " + quote(archive) + " -C " + quote(model_parent) + " qwen3-tiny -C " +
          quote(tmp.str()) + " README.md";
  } else if (kind == "zip-folder") {
    archive = tmp.file("m.zip");
    cmd = "cd " + quote(model_parent) + " && zip -qr " + quote(archive) + " qwen3-tiny";
  } else {
    archive = tmp.file("m.zip");
    cmd = "cd " + quote(testing::source_path(kTiny)) + " && zip -qr " + quote(archive) + " .";
  }
  const auto made = run_shell(cmd);
  ASSERT_EQ(made.status, 0) << cmd << ": " << made.err;

  ConvertOptions from_dir, from_archive;
  from_dir.input = testing::source_path(kTiny);
  from_dir.output = tmp.file("dir.pack");
  from_archive.input = archive;
  from_archive.output = tmp.file("archive.pack");
  convert_checkpoint(from_dir);
  convert_checkpoint(from_archive);
  EXPECT_TRUE(testing::read_file(from_dir.output) == testing::read_file(from_archive.output));
  for (const auto& name : tmp.listing())
    EXPECT_EQ(name.find(".qtk-extract"), std::string::npos) << name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ArchiveInput,
                         ::testing::Values("tar.gz-folder", "tar.gz-flat", "tar.zst",
                                           "tar-folder-and-readme", "zip-folder", "zip-flat"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(ArchiveReject, DotDotComponent) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"),
            {{"m/config.json", AE_IFREG, tiny_config()}, {"m/../../evil", AE_IFREG, "x"}});
  expect_rejected(tmp.file("a.tar"), "\"..\" component");
}

TEST(ArchiveReject, AbsolutePath) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"/tmp/qtk-evil-config.json", AE_IFREG, tiny_config()}});
  expect_rejected(tmp.file("a.tar"), "absolute path");
}

TEST(ArchiveReject, Symlink) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"config.json", AE_IFREG, tiny_config()},
                                {"model.safetensors", AE_IFLNK, "", "/etc/passwd"}});
  expect_rejected(tmp.file("a.tar"), "symbolic link");
}

TEST(ArchiveReject, Hardlink) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"config.json", AE_IFREG, tiny_config()},
                                {"model.safetensors", AE_IFREG, "", "config.json", true}});
  expect_rejected(tmp.file("a.tar"), "hard link");
}

TEST(ArchiveReject, Fifo) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"config.json", AE_IFREG, tiny_config()}, {"pipe", AE_IFIFO, ""}});
  expect_rejected(tmp.file("a.tar"), "FIFO");
}

TEST(ArchiveReject, CharacterDevice) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"config.json", AE_IFREG, tiny_config()}, {"null", AE_IFCHR, ""}});
  expect_rejected(tmp.file("a.tar"), "character device");
}

TEST(ArchiveReject, DuplicateNames) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"),
            {{"config.json", AE_IFREG, tiny_config()}, {"./config.json", AE_IFREG, "{}"}});
  expect_rejected(tmp.file("a.tar"), "appears twice");
}

TEST(ArchiveReject, SparseEntry) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  testing::copy_dir(testing::source_path(kTiny), dir);
  const auto made = run_shell("truncate -s 4M " + quote(dir + "/holes.bin") + " && tar -cSf " +
                              quote(tmp.file("a.tar")) + " -C " + quote(dir) + " .");
  ASSERT_EQ(made.status, 0) << made.err;
  expect_rejected(tmp.file("a.tar"), "sparse");
}

TEST(ArchiveReject, UnpackedSizeCap) {
  TempDir tmp;
  ASSERT_EQ(run_shell("tar -czf " + quote(tmp.file("a.tar.gz")) + " -C " +
                      quote(testing::source_path(kTiny)) + " .")
                .status,
            0);
  // note: the model is ~400 KB; a 100 KB cap must stop it (a bomb is the
  // same rule with bigger numbers).
  expect_rejected(tmp.file("a.tar.gz"), "exceed", "--max-unpacked-bytes 100K");
}

TEST(ArchiveReject, EntryCountCap) {
  TempDir tmp;
  ASSERT_EQ(run_shell("tar -czf " + quote(tmp.file("a.tar.gz")) + " -C " +
                      quote(testing::source_path(kTiny)) + " .")
                .status,
            0);
  expect_rejected(tmp.file("a.tar.gz"), "more than 2 entries", "--max-entries 2");
}

TEST(ArchiveReject, TruncatedArchive) {
  TempDir tmp;
  ASSERT_EQ(run_shell("tar -cf " + quote(tmp.file("a.tar")) + " -C " +
                      quote(testing::source_path(kTiny)) + " .")
                .status,
            0);
  const std::string bytes = testing::read_file(tmp.file("a.tar"));
  testing::write_file(tmp.file("cut.tar"), bytes.substr(0, bytes.size() / 2 + 100));
  expect_rejected(tmp.file("cut.tar"), "truncated");
}

// Data that fails its checksum: a gzip member whose trailer CRC-32 no longer
// matches (the deflate stream itself intact, which libarchive alone reads
// without complaint) and a stored zip entry with a flipped byte.
TEST(ArchiveReject, ChecksumMismatch) {
  TempDir tmp;
  const std::string src = quote(testing::source_path(kTiny));
  ASSERT_EQ(run_shell("tar -czf " + quote(tmp.file("a.tar.gz")) + " -C " + src + " .").status, 0);
  std::string gz = testing::read_file(tmp.file("a.tar.gz"));
  gz[gz.size() - 8] = static_cast<char>(gz[gz.size() - 8] ^ 0x01);  // the trailer's CRC-32
  testing::write_file(tmp.file("crc.tar.gz"), gz);
  expect_rejected(tmp.file("crc.tar.gz"), "its gzip data is damaged: incorrect data check");
  // Sound members with trailing zero bytes after them, and two members
  // concatenated, are read as gzip reads them.
  testing::write_file(tmp.file("zeros.tar.gz"),
                      testing::read_file(tmp.file("a.tar.gz")) + std::string(1000, '\0'));
  ASSERT_EQ(run_shell("tar -cf " + quote(tmp.file("b.tar")) + " -C " + src + " . && head -c 1000 " +
                      quote(tmp.file("b.tar")) + " | gzip -c > " + quote(tmp.file("two.gz")) +
                      " && tail -c +1001 " + quote(tmp.file("b.tar")) + " | gzip -c >> " +
                      quote(tmp.file("two.gz")))
                .status,
            0);
  for (const char* ok : {"zeros.tar.gz", "two.gz"}) {
    const auto r = run_shell(convert_bin() + " " + quote(tmp.file(ok)) + " " +
                             quote(tmp.file(std::string(ok) + ".pack")));
    EXPECT_EQ(r.status, 0) << ok << ": " << r.err;
  }

  ASSERT_EQ(run_shell("cd " + src + " && zip -q -0 -r " + quote(tmp.file("a.zip")) + " .").status,
            0);
  std::string zip = testing::read_file(tmp.file("a.zip"));
  zip[zip.size() / 2] = static_cast<char>(zip[zip.size() / 2] ^ 0x01);  // inside model.safetensors
  testing::write_file(tmp.file("crc.zip"), zip);
  expect_rejected(tmp.file("crc.zip"), "its data is damaged");
  // A deflated entry whose recorded size is 4 bytes more than its data:
  // libarchive's message for it ends with a newline, which used to be
  // printed as a literal "\n" at the end of the line.
  ASSERT_EQ(
      run_shell("cd " + src + " && zip -q " + quote(tmp.file("size.zip")) + " config.json").status,
      0);
  std::string sized = testing::read_file(tmp.file("size.zip"));
  ASSERT_EQ(sized.substr(0, 4), std::string("PK\x03\x04", 4));
  const size_t central = sized.find(std::string("PK\x01\x02", 4));
  ASSERT_NE(central, std::string::npos);
  for (const size_t at : {size_t{22}, central + 24}) {  // the uncompressed size fields
    uint32_t v = 0;
    std::memcpy(&v, sized.data() + at, 4);
    v += 4;
    std::memcpy(sized.data() + at, &v, 4);
  }
  testing::write_file(tmp.file("size-bad.zip"), sized);
  expect_rejected(tmp.file("size-bad.zip"),
                  "its data is damaged: ZIP uncompressed data is wrong size");
  TempDir out_dir;
  const auto r = run_shell(convert_bin() + " " + quote(tmp.file("size-bad.zip")) + " " +
                           quote(out_dir.file("m.pack")));
  EXPECT_EQ(r.err.find("\\n"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.ends_with(")\n")) << r.err;
}

TEST(ArchiveReject, NotAnArchive) {
  TempDir tmp;
  testing::write_file(tmp.file("notes.txt"), "this is not an archive\n");
  expect_rejected(tmp.file("notes.txt"), "not a readable tar or zip archive");
}

// A file that is not an archive but recognisable is named as `inspect`
// names it, not with libarchive's "Unrecognized archive format".
TEST(ArchiveReject, RecognisableNonArchivesAreNamed) {
  TempDir tmp;
  const std::string st = testing::source_path(kTiny + "/model.safetensors");
  expect_rejected(st, "this looks like a safetensors file, not a checkpoint");
  testing::write_file(tmp.file("m.gguf"), std::string("GGUF\x03\0\0\0", 8) + std::string(64, 'x'));
  expect_rejected(tmp.file("m.gguf"), "this looks like a GGUF file (llama.cpp's format)");
  ASSERT_EQ(run_shell("cp " + quote(st) + " " + quote(tmp.file("m.safetensors")) + " && gzip " +
                      quote(tmp.file("m.safetensors")))
                .status,
            0);
  expect_rejected(tmp.file("m.safetensors.gz"),
                  "this is a gzip-compressed file that does not hold a tar archive");
  for (const char* name : {"m.gguf", "m.safetensors.gz"}) {
    TempDir out_dir;
    const auto r = run_shell(convert_bin() + " " + quote(tmp.file(name)) + " " +
                             quote(out_dir.file("m.pack")));
    EXPECT_EQ(r.err.find("Unrecognized"), std::string::npos) << r.err;
  }
}

TEST(ArchiveReject, NoCheckpointInside) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"a/notes.txt", AE_IFREG, "x"}, {"b/notes.txt", AE_IFREG, "y"}});
  expect_rejected(tmp.file("a.tar"), "holds no config.json");
}

// Two checkpoints in one archive: named as such, with their folders (it
// used to say "holds no config.json").
TEST(ArchiveReject, TwoCheckpointsInside) {
  TempDir tmp;
  write_tar(tmp.file("a.tar"), {{"b/config.json", AE_IFREG, tiny_config()},
                                {"a/config.json", AE_IFREG, tiny_config()},
                                {"c/notes.txt", AE_IFREG, "x"}});
  expect_rejected(tmp.file("a.tar"),
                  "holds 2 checkpoints (a config.json in each of the folders a/, b/)");
}

TEST(ConvertReject, TruncatedShard) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  testing::copy_dir(testing::source_path(kTiny), dir);
  const std::string shard = testing::read_file(dir + "/model.safetensors");
  testing::write_file(dir + "/model.safetensors", shard.substr(0, shard.size() - 1000));
  expect_rejected(dir, "model.safetensors");
}

TEST(ConvertReject, TruncatedShardInsideTarGz) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  testing::copy_dir(testing::source_path(kTiny), dir);
  const std::string shard = testing::read_file(dir + "/model.safetensors");
  testing::write_file(dir + "/model.safetensors", shard.substr(0, shard.size() / 3));
  ASSERT_EQ(
      run_shell("tar -czf " + quote(tmp.file("a.tar.gz")) + " -C " + quote(dir) + " .").status, 0);
  expect_rejected(tmp.file("a.tar.gz"), "model.safetensors");
}

// A bad file inside an archive is named as the archive's entry, never by the
// private extraction directory (removed by the time the message is read).
TEST(ConvertReject, FileInsideAnArchiveIsNamedAsItsEntry) {
  TempDir tmp;
  const std::string dir = tmp.file("m");
  testing::copy_dir(testing::source_path(kTiny), dir);
  testing::write_file(dir + "/config.json", "{ not json");
  const std::string tar = tmp.file("a.tar");
  ASSERT_EQ(run_shell("tar -cf " + quote(tar) + " -C " + quote(tmp.str()) + " m").status, 0);
  const auto r = run_shell(convert_bin() + " " + quote(tar) + " " + quote(tmp.file("o.pack")));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(tar + ": m/config.json: invalid JSON at byte 2"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find(".qtk-extract"), std::string::npos) << r.err;
}

TEST(ConvertReject, MissingInputAndBadFlags) {
  expect_rejected("/nonexistent/qtk-model", "/nonexistent/qtk-model");
  expect_rejected(testing::source_path(kTiny), "--dtype", "--dtype f8");
}

}  // namespace
}  // namespace qtk
