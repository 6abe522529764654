#include "pack/pack.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "core/tuning.h"
#include "pack/crc32.h"
#include "pack/manifest_copies.h"
#include "pack/pack_checksum.h"
#include "pack/pack_zip.h"

namespace qtk {

namespace {

using namespace zipfmt;

// Little-endian field reads from the mapping (bounds checked by the caller).
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const uint8_t* p) {
  return static_cast<uint64_t>(le32(p)) | (static_cast<uint64_t>(le32(p + 4)) << 32);
}

// Finds a zip64 extended-information field in an extra-field block and reads
// the values that the fixed header marked 0xFFFFFFFF, in the spec's order
// (uncompressed size, compressed size, local header offset).
void apply_zip64_extra(const std::string& where, const uint8_t* extra, size_t extra_len,
                       uint64_t* usize, uint64_t* csize, uint64_t* offset) {
  size_t pos = 0;
  while (pos + 4 <= extra_len) {
    const uint16_t id = le16(extra + pos);
    const uint16_t len = le16(extra + pos + 2);
    if (pos + 4 + len > extra_len) fail("{}: extra field 0x{:04x} runs past its block", where, id);
    if (id == kZip64ExtraId) {
      const uint8_t* q = extra + pos + 4;
      size_t left = len;
      for (uint64_t* v : {usize, csize, offset}) {
        if (v == nullptr || *v != 0xFFFFFFFFu) continue;
        if (left < 8) fail("{}: zip64 extra field is too short", where);
        *v = le64(q);
        q += 8;
        left -= 8;
      }
      return;
    }
    pos += 4 + len;
  }
  if (pos != extra_len) fail("{}: extra field block has {} trailing bytes", where, extra_len - pos);
  for (uint64_t* v : {usize, csize, offset})
    if (v != nullptr && *v == 0xFFFFFFFFu)
      fail("{}: size or offset is 0xFFFFFFFF but there is no zip64 extra field", where);
}

DType parse_pack_dtype(const std::string& where, const std::string& name) {
  if (auto d = parse_dtype(name)) {
    if (*d == DType::BF16 || *d == DType::F16 || *d == DType::F32 || *d == DType::F8_E4M3)
      return *d;
  }
  fail("{}: dtype \"{}\" is not one a pack holds (expected BF16, F16, F32 or F8_E4M3)", where,
       name);
}

const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) fail("{}: field \"{}\" is missing", where, key);
  return obj.at(key);
}

std::string string_field(const nlohmann::json& obj, const char* key, const std::string& where) {
  const auto& v = field(obj, key, where);
  if (!v.is_string())
    fail("{}: field \"{}\" must be a string, found a JSON {}", where, key, v.type_name());
  return v.get<std::string>();
}

}  // namespace

// "quantization": {"method": "fp8", "fmt": "e4m3", "tensors": [{"name",
// "scale", "block": [rows, cols]}, ...], ...}: every F8_E4M3 tensor listed
// once, with an f32 scale tensor of the shape its block size implies.
void Pack::read_fp8_section(const std::string& mwhere) {
  const std::string qwhere = mwhere + " quantization";
  std::set<std::string, std::less<>> listed;
  // note: by name once, not find_tensor per entry: a per-expert MoE pack
  // holds tens of thousands of tensors.
  std::unordered_map<std::string_view, const PackTensorInfo*> by_name;
  for (const auto& t : tensors_) by_name.emplace(t.name, &t);
  auto find = [&](const std::string& name) -> const PackTensorInfo* {
    const auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  if (manifest_.contains("quantization")) {
    const auto& q = manifest_["quantization"];
    if (!q.is_object()) fail("{}: expected an object", qwhere);
    const std::string method = string_field(q, "method", qwhere);
    if (method != "fp8") fail("{}: field \"method\" is \"{}\", expected \"fp8\"", qwhere, method);
    const std::string fmt_name = string_field(q, "fmt", qwhere);
    if (fmt_name != "e4m3")
      fail("{}: field \"fmt\" is \"{}\", expected \"e4m3\"", qwhere, fmt_name);
    const auto& list = field(q, "tensors", qwhere);
    if (!list.is_array()) fail("{}: field \"tensors\" must be an array", qwhere);
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& e = list[i];
      const std::string ewhere = fmt::format("{} tensors[{}]", qwhere, i);
      PackFp8Scales f;
      f.tensor = string_field(e, "name", ewhere);
      const std::string scale_name = string_field(e, "scale", ewhere);
      const auto& block = field(e, "block", ewhere);
      if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
          !block[1].is_number_integer() || block[0].get<int64_t>() <= 0 ||
          block[1].get<int64_t>() <= 0 || block[1].get<int64_t>() % 16 != 0 ||
          block[0].get<int64_t>() > (1 << 20) || block[1].get<int64_t>() > (1 << 20))
        fail(
            "{}: field \"block\" is {}, expected [rows, cols] of positive sizes, cols a multiple "
            "of 16",
            ewhere, block.dump());
      f.block_rows = block[0].get<int64_t>();
      f.block_cols = block[1].get<int64_t>();
      const PackTensorInfo* w = find(f.tensor);
      if (w == nullptr)
        fail("{}: names tensor \"{}\", which the pack does not hold", ewhere, f.tensor);
      if (w->view.dtype != DType::F8_E4M3 || w->view.ndim < 2)
        fail("{}: tensor \"{}\" is {} {}, expected an F8_E4M3 matrix", ewhere, f.tensor,
             dtype_name(w->view.dtype), w->view.shape_string());
      if (!listed.insert(f.tensor).second) fail("{}: tensor \"{}\" listed twice", ewhere, f.tensor);
      // note: convert names a tensor's scales after it; a scale entry named
      // otherwise (another tensor's scales) would load and scale the wrong
      // blocks.
      if (scale_name != f.tensor + ".scale")
        fail("{}: field \"scale\" is \"{}\", expected \"{}.scale\" (the scales of \"{}\")", ewhere,
             scale_name, f.tensor, f.tensor);
      const PackTensorInfo* s = find(scale_name);
      if (s == nullptr) fail("{}: scale tensor \"{}\" is not in the pack", ewhere, scale_name);
      const int64_t cols = w->view.shape[w->view.ndim - 1];
      const int64_t rows = cols > 0 ? w->view.numel() / cols : 0;
      const int64_t want0 = (rows + f.block_rows - 1) / f.block_rows;
      const int64_t want1 = (cols + f.block_cols - 1) / f.block_cols;
      if (s->view.dtype != DType::F32 || s->view.ndim != 2 || s->view.shape[0] != want0 ||
          s->view.shape[1] != want1)
        fail("{}: scale tensor \"{}\" is {} {}, expected F32 [{}, {}] for {} {} in {}x{} blocks",
             ewhere, scale_name, dtype_name(s->view.dtype), s->view.shape_string(), want0, want1,
             f.tensor, w->view.shape_string(), f.block_rows, f.block_cols);
      f.scale = s->view;
      f.scale_name = scale_name;
      f.weight = w->view;
      fp8_.push_back(std::move(f));
    }
  }
  for (const auto& t : tensors_)
    if (t.view.dtype == DType::F8_E4M3 && !listed.count(t.name))
      fail("{}: tensor \"{}\" is F8_E4M3 but has no entry in \"quantization\" (its scales)", mwhere,
           t.name);
}

namespace {

// The refusal for an archive given where a pack is expected: convert reads
// archives of checkpoints, so the fix is to convert it first.
[[noreturn]] void fail_archive_not_pack(const std::string& path, const std::string& what) {
  fail(
      "{}: this is {}, not a .pack file; convert reads an archive of a Hugging Face checkpoint: "
      "convert it first (convert {} OUT.pack)",
      path, what, path);
}

// Names what a path that is not a pack is, when that is recognisable: a
// checkpoint directory, a GGUF or safetensors file, or a compressed or tar
// archive (the common mix-ups; a zip archive is recognised while its entries
// are read, see read_zip_entries).
void refuse_what_is_not_a_pack(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // MappedFile reports it
  if (S_ISDIR(st.st_mode)) {
    struct stat cfg {};
    if (::stat((path + "/config.json").c_str(), &cfg) == 0) {
      fail(
          "{}: this is a checkpoint directory, not a .pack file; run convert first (convert {} "
          "OUT.pack)",
          path, path);
    }
    fail("{}: is a directory; expected a .pack file (made by convert)", path);
  }
  // note: a pack is mapped into memory, which only a regular file can be;
  // opening a FIFO would also wait for a writer, out of reach of signals.
  if (!S_ISREG(st.st_mode))
    fail("{}: expected a .pack file (a regular file, made by convert), found {}", path,
         describe_file_type(st.st_mode));
  // note: 512 bytes reach a tar header's "ustar" magic at offset 257.
  char head[512] = {};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return;
  const size_t n = std::fread(head, 1, sizeof(head), f);
  std::fclose(f);
  auto starts_with = [&](std::string_view magic) {
    return n >= magic.size() && std::memcmp(head, magic.data(), magic.size()) == 0;
  };
  if (starts_with("\x1f\x8b")) fail_archive_not_pack(path, "a gzip-compressed file (.tar.gz?)");
  if (starts_with("\x28\xb5\x2f\xfd"))
    fail_archive_not_pack(path, "a zstd-compressed file (.tar.zst?)");
  constexpr char kXzMagic[] = {'\xfd', '7', 'z', 'X', 'Z', '\0'};
  if (starts_with(std::string_view(kXzMagic, sizeof(kXzMagic))))
    fail_archive_not_pack(path, "an xz-compressed file (.tar.xz?)");
  if (starts_with("BZh")) fail_archive_not_pack(path, "a bzip2-compressed file (.tar.bz2?)");
  if (n >= 262 && std::memcmp(head + 257, "ustar", 5) == 0)
    fail_archive_not_pack(path, "a tar archive");
  if (n >= 4 && std::memcmp(head, "GGUF", 4) == 0) {
    fail(
        "{}: this looks like a GGUF file (llama.cpp's format), not a .pack; convert the Hugging "
        "Face checkpoint (safetensors) with convert instead",
        path);
  }
  // note: safetensors starts with a little-endian u64 header length, then '{'.
  if (n >= 9 && head[8] == '{' && head[6] == 0 && head[7] == 0) {
    fail(
        "{}: this looks like a safetensors file, not a .pack; run convert on its checkpoint "
        "directory first",
        path);
  }
}

}  // namespace

namespace {

// Where the central directory is, from the end records.
struct CentralDirectory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Finds the end-of-central-directory record (and the zip64 records when
// present) and returns where the central directory is.
CentralDirectory find_central_directory(const std::string& path, const uint8_t* base,
                                        uint64_t size) {
  if (size < kEocdSize) fail("{}: not a pack (a zip file); {} bytes is too short", path, size);
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = size > kEocdSize + kMaxComment ? size - kEocdSize - kMaxComment : 0;
  for (uint64_t pos = size - kEocdSize;; --pos) {
    // note: a comment could contain the signature; the real record is the
    // one whose comment length reaches exactly the end of the file.
    if (le32(base + pos) == kEocdSig && pos + kEocdSize + le16(base + pos + 20) == size) {
      eocd = pos;
      break;
    }
    if (pos == lowest) break;
  }
  if (eocd == UINT64_MAX) fail("{}: not a pack: no zip end-of-central-directory record", path);
  const uint8_t* e = base + eocd;
  if (le16(e + 4) != 0 || le16(e + 6) != 0)
    fail("{}: multi-disk zip archives are not supported", path);
  uint64_t n_entries = le16(e + 10);
  if (le16(e + 8) != n_entries) fail("{}: end-of-central-directory entry counts disagree", path);
  uint64_t cd_size = le32(e + 12);
  uint64_t cd_offset = le32(e + 16);
  uint64_t cd_limit = eocd;  // the central directory must end before this

  // --- zip64 records ----------------------------------------------------------
  if (eocd >= kZip64LocatorSize && le32(base + eocd - kZip64LocatorSize) == kZip64LocatorSig) {
    const uint8_t* loc = base + eocd - kZip64LocatorSize;
    const uint64_t rec = le64(loc + 8);
    if (le32(loc + 4) != 0 || le32(loc + 16) != 1)
      fail("{}: multi-disk zip64 archives are not supported", path);
    if (rec > eocd - kZip64LocatorSize || eocd - kZip64LocatorSize - rec < kZip64EocdSize)
      fail("{}: zip64 end-of-central-directory offset {} is out of bounds", path, rec);
    const uint8_t* z = base + rec;
    if (le32(z) != kZip64EocdSig)
      fail("{}: zip64 end-of-central-directory record has a bad signature", path);
    if (le32(z + 16) != 0 || le32(z + 20) != 0)
      fail("{}: multi-disk zip64 archives are not supported", path);
    const uint64_t z_entries = le64(z + 32);
    if (le64(z + 24) != z_entries) fail("{}: zip64 entry counts disagree", path);
    auto pick = [&](uint64_t narrow, uint64_t wide, uint64_t all_ones, const char* what) {
      if (narrow != all_ones && narrow != wide)
        fail("{}: zip64 and classic end records disagree on the {}", path, what);
      return wide;
    };
    n_entries = pick(n_entries, z_entries, 0xFFFF, "entry count");
    cd_size = pick(cd_size, le64(z + 40), 0xFFFFFFFF, "central directory size");
    cd_offset = pick(cd_offset, le64(z + 48), 0xFFFFFFFF, "central directory offset");
    cd_limit = rec;
  } else if (n_entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    fail("{}: end-of-central-directory record needs zip64 records, which are missing", path);
  }
  if (cd_offset > cd_limit || cd_size != cd_limit - cd_offset)
    fail(
        "{}: central directory (offset {}, {} bytes) does not end where the end records start ({})",
        path, cd_offset, cd_size, cd_limit);
  return CentralDirectory{n_entries, cd_offset, cd_size};
}

// A name read from the file as messages show it: at most 96 bytes, each
// byte outside printable ASCII as \xHH (a damaged header's name can be 64 KB
// of anything; the pack's own names are ASCII).
std::string shown_name(std::string_view name) {
  constexpr size_t kShown = 96;
  std::string out;
  for (size_t i = 0; i < std::min(name.size(), kShown); ++i) {
    const auto u = static_cast<unsigned char>(name[i]);
    if (u >= 0x20 && u < 0x7f)
      out += static_cast<char>(u);
    else
      out += fmt::format("\\x{:02x}", u);
  }
  if (name.size() > kShown) out += fmt::format("... ({} bytes)", name.size());
  return out;
}

// Checks the local header of an entry against its central directory record
// (name, sizes, no encryption or compression) and returns where its data
// starts: aligned, and with the data inside the entry area.
uint64_t check_local_header(const std::string& where, const uint8_t* base, uint64_t local,
                            uint64_t cd_offset, const std::string& name, uint64_t csize,
                            uint64_t usize, uint32_t crc) {
  if (local > cd_offset || cd_offset - local < kLocalHeaderSize)
    fail("{}: local header offset {} is outside the entry area", where, local);
  const uint8_t* l = base + local;
  if (le32(l) != kLocalSig) fail("{}: local header has a bad signature", where);
  const uint16_t l_flags = le16(l + 6);
  if (l_flags & (kFlagEncrypted | kFlagStrongEncryption))
    fail("{}: local header says encrypted", where);
  if (l_flags & kFlagDataDescriptor) fail("{}: local header uses a data descriptor", where);
  if (le16(l + 8) != 0) fail("{}: local header says compressed (method {})", where, le16(l + 8));
  const uint16_t l_name_len = le16(l + 26), l_extra_len = le16(l + 28);
  const uint64_t header_end = local + kLocalHeaderSize + l_name_len + l_extra_len;
  if (header_end > cd_offset) fail("{}: local header runs past the entry area", where);
  if (std::string_view(reinterpret_cast<const char*>(l + kLocalHeaderSize), l_name_len) != name)
    fail("{}: local header names it \"{}\"", where,
         shown_name(
             std::string_view(reinterpret_cast<const char*>(l + kLocalHeaderSize), l_name_len)));
  uint64_t l_csize = le32(l + 18), l_usize = le32(l + 22);
  if (l_csize == 0xFFFFFFFF || l_usize == 0xFFFFFFFF)
    apply_zip64_extra(where + " (local header)", l + kLocalHeaderSize + l_name_len, l_extra_len,
                      &l_usize, &l_csize, nullptr);
  if (l_csize != csize || l_usize != usize)
    fail("{}: local header sizes ({}, {}) differ from the central directory ({}, {})", where,
         l_csize, l_usize, csize, usize);
  if (le32(l + 14) != crc)
    fail("{}: local header CRC-32 {:08x} differs from the central directory's {:08x}", where,
         le32(l + 14), crc);
  if (header_end % kPackAlignment != 0)
    fail("{}: data starts at offset {}, which is not {}-byte aligned", where, header_end,
         kPackAlignment);
  if (usize > cd_offset - header_end)
    fail("{}: data ({} bytes at offset {}) runs past the entry area", where, usize, header_end);
  return header_end;
}

// Refuses a manifest whose "version" is not "major.minor" with this build's
// major version.
void check_pack_version(const nlohmann::json& m, const std::string& mwhere,
                        const std::string& path) {
  const std::string version = string_field(m, "version", mwhere);
  int major = -1, minor = -1;
  {
    const size_t dot = version.find('.');
    auto all_digits = [](std::string_view s) {
      return !s.empty() && s.size() < 6 &&
             std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    };
    if (dot == std::string::npos || !all_digits(std::string_view(version).substr(0, dot)) ||
        !all_digits(std::string_view(version).substr(dot + 1)))
      fail("{}: field \"version\" is \"{}\", expected \"major.minor\"", mwhere, version);
    major = std::stoi(version.substr(0, dot));
    minor = std::stoi(version.substr(dot + 1));
  }
  (void)minor;  // note: minor versions only add fields; any 1.x is readable.
  if (major != kPackFormatMajor)
    fail("{}: pack format version {} is not supported (this build reads {}.x)", path, version,
         kPackFormatMajor);
}

}  // namespace

namespace {

// The entry names of the central directory, or nothing when a record does
// not fit in it (the checks proper, with their messages, are
// read_zip_entries'). Used only to tell an archive from a damaged pack.
std::optional<std::vector<std::string_view>> zip_entry_names(const uint8_t* base,
                                                             const CentralDirectory& cd) {
  std::vector<std::string_view> names;
  uint64_t pos = cd.offset;
  const uint64_t end = cd.offset + cd.size;
  for (uint64_t i = 0; i < cd.entries; ++i) {
    if (end - pos < kCentralHeaderSize || le32(base + pos) != kCentralSig) return std::nullopt;
    const uint8_t* c = base + pos;
    const uint64_t name_len = le16(c + 28), rest = name_len + le16(c + 30) + le16(c + 32);
    if (end - pos - kCentralHeaderSize < rest) return std::nullopt;
    names.emplace_back(reinterpret_cast<const char*>(c + kCentralHeaderSize), name_len);
    pos += kCentralHeaderSize + rest;
  }
  return names;
}

}  // namespace

void Pack::read_zip_entries(const std::string& path) {
  const uint8_t* base = file_.data();
  const CentralDirectory cd = find_central_directory(path, base, file_.size());
  // A zip without the pack's manifest.json that holds a config.json or
  // safetensors is an archive of a checkpoint (convert's input), refused as
  // that before any complaint about its layout or compression. A directory
  // that does not read whole counts as a pack's (its damage is reported
  // below).
  bool has_manifest = true, has_checkpoint = false;
  if (const auto names = zip_entry_names(base, cd)) {
    has_manifest = std::find(names->begin(), names->end(), "manifest.json") != names->end();
    for (const std::string_view n : *names) {
      auto ends_with = [&](std::string_view tail) {
        return n.size() >= tail.size() && n.substr(n.size() - tail.size()) == tail;
      };
      has_checkpoint |=
          n == "config.json" || ends_with("/config.json") || ends_with(".safetensors");
    }
  }
  if (!has_manifest && has_checkpoint)
    fail_archive_not_pack(path, "a zip archive of a checkpoint (no manifest.json entry)");
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  std::set<std::string, std::less<>> names;
  const uint64_t cd_offset = cd.offset, cd_size = cd.size;
  uint64_t pos = cd_offset;
  for (uint64_t i = 0; i < cd.entries; ++i) {
    if (cd_offset + cd_size - pos < kCentralHeaderSize)
      fail("{}: central directory entry {} runs past the central directory", path, i);
    const uint8_t* c = base + pos;
    if (le32(c) != kCentralSig) fail("{}: central directory entry {} has a bad signature", path, i);
    const uint16_t flags = le16(c + 8);
    const uint16_t method = le16(c + 10);
    uint64_t csize = le32(c + 20), usize = le32(c + 24);
    const uint16_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    uint64_t local = le32(c + 42);
    if (cd_offset + cd_size - pos - kCentralHeaderSize <
        uint64_t{name_len} + extra_len + comment_len)
      fail("{}: central directory entry {} runs past the central directory", path, i);
    std::string name(reinterpret_cast<const char*>(c + kCentralHeaderSize), name_len);
    const std::string where = fmt::format("{}: entry \"{}\"", path, shown_name(name));
    if (name.empty()) fail("{}: central directory entry {} has an empty name", path, i);
    if (le16(c + 34) != 0) fail("{}: lives on another disk", where);
    apply_zip64_extra(where + " (central directory)", c + kCentralHeaderSize + name_len, extra_len,
                      &usize, &csize, &local);
    if (flags & (kFlagEncrypted | kFlagStrongEncryption)) fail("{}: is encrypted", where);
    if (flags & kFlagDataDescriptor)
      fail("{}: uses a data descriptor (a pack entry must not)", where);
    if (method != 0 && !has_manifest)
      fail_archive_not_pack(
          path, fmt::format("a zip archive (no manifest.json entry; entry \"{}\" is compressed)",
                            shown_name(name)));
    if (method != 0)
      fail("{}: is compressed (method {}); every pack entry must be STORED", where, method);
    if (csize != usize)
      fail("{}: compressed size {} != size {} for a STORED entry", where, csize, usize);
    if (!names.insert(name).second) fail("{}: appears twice in the central directory", where);

    const uint32_t crc = le32(c + 16);
    const uint64_t header_end =
        check_local_header(where, base, local, cd_offset, name, csize, usize, crc);
    spans.push_back({local, header_end + usize, name});
    entries_.push_back({name, header_end, usize, crc});
    pos += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  if (pos != cd_offset + cd_size)
    fail("{}: central directory holds {} bytes after its {} entries", path,
         cd_offset + cd_size - pos, cd.entries);
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      fail("{}: entries \"{}\" and \"{}\" overlap", path, spans[i - 1].name, spans[i].name);
}

void Pack::read_tensor_list(const std::string& mwhere) {
  const nlohmann::json& m = manifest_;
  const uint8_t* base = file_.data();
  const auto& tensors = field(m, "tensors", mwhere);
  if (!tensors.is_array()) fail("{}: field \"tensors\" must be an array", mwhere);
  std::unordered_map<std::string_view, const RawEntry*> by_name;
  for (const auto& r : entries_) by_name.emplace(r.name, &r);
  std::set<std::string, std::less<>> tensor_names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const std::string twhere = fmt::format("{} tensors[{}]", mwhere, i);
    PackTensorInfo info;
    info.name = string_field(t, "name", twhere);
    const std::string where = fmt::format("{} tensor \"{}\"", mwhere, info.name);
    if (!tensor_names.insert(info.name).second) fail("{}: listed twice", where);
    info.entry = string_field(t, "entry", where);
    const DType dtype = parse_pack_dtype(where, string_field(t, "dtype", where));
    const auto& shape = field(t, "shape", where);
    if (!shape.is_array() || shape.size() > static_cast<size_t>(kMaxDims))
      fail("{}: field \"shape\" must be an array of at most {} sizes", where, kMaxDims);
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail("{}: field \"shape\" holds {}, expected sizes >= 0", where, d.dump());
      const int64_t v = d.get<int64_t>();
      if (v != 0 && numel > INT64_MAX / 8 / v)
        fail("{}: shape {} is too large", where, shape.dump());
      numel *= v;
      dims.push_back(v);
    }
    const auto& bytes = field(t, "bytes", where);
    if (!bytes.is_number_unsigned() && !bytes.is_number_integer())
      fail("{}: field \"bytes\" must be an integer", where);
    const int64_t expect = numel * dtype_size(dtype);
    if (bytes.get<int64_t>() != expect)
      fail("{}: field \"bytes\" is {}, but shape {} of {} needs {}", where, bytes.dump(),
           shape.dump(), dtype_name(dtype), expect);
    const std::string sum = string_field(t, "checksum", where);
    if (!parse_checksum_hex(sum, &info.checksum))
      fail("{}: field \"checksum\" is \"{}\", expected 16 hex digits", where, sum);
    auto it = by_name.find(info.entry);
    if (it == by_name.end()) fail("{}: entry \"{}\" is not in the zip", where, info.entry);
    if (it->second->size != static_cast<uint64_t>(expect))
      fail("{}: entry \"{}\" holds {} bytes, expected {}", where, info.entry, it->second->size,
           expect);
    info.view = TensorView(base + it->second->offset, dtype, std::span<const int64_t>(dims));
    tensors_.push_back(std::move(info));
  }
}

void Pack::compute_digest() {
  // note: over the whole manifest except "source" (which checkpoint files it
  // came from) and "tool_version": every tensor's name, dtype, shape and
  // checksum, the config, the quantization section, the tokenizer and
  // generation files' checksums, the EOS and BOS ids, RoPE, the layer plan
  // and the transforms, i.e. everything that can change a token. --resume
  // and merge compare it, so a pack differing only in its tokenizer or a
  // tensor's dtype label is not taken for the one the results came from.
  // nlohmann::json keeps object keys sorted, so the text is canonical.
  nlohmann::json m = manifest_;
  m.erase("source");
  m.erase("tool_version");
  const std::string text = json_file_text(m, -1);
  digest_ = checksum_hex(xxh64(text.data(), text.size()));
}

std::unique_ptr<Pack> Pack::open(const std::string& path) {
  refuse_what_is_not_a_pack(path);
  std::unique_ptr<Pack> pack(new Pack());
  pack->file_ = MappedFile(path);
  pack->read_zip_entries(path);

  const std::string mwhere = path + ": manifest.json";
  const auto manifest_bytes = pack->entry("manifest.json");
  if (!manifest_bytes) fail("{}: has no manifest.json entry; not a pack", path);
  // note: the tensors' XXH64 checksums live in the manifest, so nothing
  // else would notice a damaged manifest (a changed rms_norm_eps loads and
  // silently computes other numbers); its zip CRC-32 costs microseconds.
  for (const auto& r : pack->entries_) {
    if (r.name != "manifest.json") continue;
    const uint32_t got = crc32_update(0, manifest_bytes->data(), manifest_bytes->size());
    if (got != r.crc)
      fail("{}: damaged: its CRC-32 is {:08x}, the zip directory says {:08x}", mwhere, got, r.crc);
  }
  // note: the strict parser validates UTF-8, rejects duplicate keys and caps
  // nesting depth, so no later message can recurse through a hostile value.
  pack->manifest_ = parse_json_strict(*manifest_bytes, mwhere);
  const nlohmann::json& m = pack->manifest_;
  if (!m.is_object()) fail("{}: expected a JSON object", mwhere);
  const std::string format = string_field(m, "format", mwhere);
  if (format != kPackFormatName)
    fail("{}: field \"format\" is \"{}\", expected \"{}\"", mwhere, format, kPackFormatName);
  check_pack_version(m, mwhere, path);
  // note: the tensor checksums are xxh64 whatever this field says; a pack
  // that names another algorithm was not written by convert.
  if (m.contains("checksum_algorithm") &&
      (!m["checksum_algorithm"].is_string() || m["checksum_algorithm"] != kChecksumAlgorithm))
    fail("{}: field \"checksum_algorithm\": expected \"{}\", found {}", mwhere, kChecksumAlgorithm,
         m["checksum_algorithm"].dump());

  pack->config_ = config_from_json(field(m, "config", mwhere), mwhere + " config");
  check_manifest_copies(m, pack->config_, pack->entry("generation_config.json"), path);

  pack->read_tensor_list(mwhere);
  pack->read_fp8_section(mwhere);

  pack->compute_digest();
  return pack;
}

const PackFp8Scales* Pack::fp8_scales(std::string_view name) const {
  for (const auto& q : fp8_)
    if (q.tensor == name) return &q;
  return nullptr;
}

const PackTensorInfo* Pack::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorView& Pack::tensor(std::string_view name) const {
  const PackTensorInfo* t = find_tensor(name);
  if (t == nullptr) fail("{}: has no tensor \"{}\"", path(), name);
  return t->view;
}

std::optional<std::string_view> Pack::entry(std::string_view name) const {
  for (const auto& r : entries_)
    if (r.name == name)
      return std::string_view(reinterpret_cast<const char*>(file_.data()) + r.offset, r.size);
  return std::nullopt;
}

bool Pack::has_transform(std::string_view name) const {
  auto it = manifest_.find("transforms");
  if (it == manifest_.end() || !it->is_array()) return false;
  for (const auto& t : *it)
    if (t.is_object() && t.contains("name") && t["name"].is_string() &&
        t["name"].get<std::string>() == name)
      return true;
  return false;
}

size_t Pack::prefault() const {
  const uint8_t* base = file_.data();
  const size_t size = file_.size();
  if (base == nullptr || size == 0) return 0;
  const long page_size = sysconf(_SC_PAGESIZE);
  const size_t page = page_size > 0 ? static_cast<size_t>(page_size) : 4096;
  void* start = const_cast<uint8_t*>(base);  // mmap returns page-aligned addresses
  // note: WILLNEED starts asynchronous readahead of the whole file (the
  // pack's page cache may have been evicted since it was last used);
  // MADV_POPULATE_READ (Linux 5.14) then waits for it and fills the page
  // tables in one call. Older kernels refuse it with EINVAL, and one read
  // per page does the same job.
  ::madvise(start, size, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
  if (::madvise(start, size, MADV_POPULATE_READ) == 0) return size;
#endif
  volatile uint8_t sink = 0;
  for (size_t off = 0; off < size; off += page) sink = sink + base[off];
  return size;
}

size_t Pack::copy_to_hugepages() const {
  if (on_hugepages_) return 0;
  uint8_t* const base = const_cast<uint8_t*>(file_.data());
  const size_t size = file_.size();
  constexpr size_t kHuge = size_t{2} << 20;
  // note: packs below 2 MiB get no huge page but take the same path (the
  // tiny test models exercise the copy and the move that way).
  if (base == nullptr || size == 0) return prefault();
  // note: THP maps only 2 MiB-aligned virtual ranges with 2 MiB pages, and
  // mremap keeps a huge page whole only when it moves by a multiple of 2
  // MiB; so the copy is placed at the same offset modulo 2 MiB as the file
  // mapping. Every 2 MiB-aligned part of the pack then ends up on huge
  // pages (all but the first and last < 2 MiB).
  const size_t span = size + kHuge;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return prefault();
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t want = reinterpret_cast<uintptr_t>(base) % kHuge;
  const uintptr_t a = r + (want + kHuge - r % kHuge) % kHuge;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096);
  const size_t mapped = (size + page - 1) / page * page;  // whole pages of both mappings
  if (a > r) ::munmap(raw, a - r);
  if (r + span > a + mapped) ::munmap(reinterpret_cast<void*>(a + mapped), r + span - a - mapped);
  uint8_t* copy = reinterpret_cast<uint8_t*>(a);
  if (::madvise(copy, mapped, MADV_HUGEPAGE) != 0) {
    ::munmap(copy, mapped);
    return prefault();
  }
  ::madvise(base, size, MADV_WILLNEED);
  ::madvise(base, size, MADV_SEQUENTIAL);
  // note: copied in chunks, each chunk of the file mapping dropped right
  // after (MADV_DONTNEED on a private read-only file mapping only unmaps
  // page-cache pages), so the process never holds two copies: peak RSS
  // stays ~pack size + one chunk.
  constexpr size_t kChunk = size_t{32} << 20;
  for (size_t off = 0; off < size; off += kChunk) {
    const size_t n = std::min(kChunk, size - off);
    std::memcpy(copy + off, base + off, n);
    const size_t end = off + n == size ? mapped : off + n;  // chunks are page multiples
    ::madvise(base + off, end - off, MADV_DONTNEED);
  }
  if (::mprotect(copy, mapped, PROT_READ) != 0) {
    // Still a valid copy; the file mapping is intact (dropped pages fault
    // back in from the page cache), so keep using it.
    ::munmap(copy, mapped);
    return prefault();
  }
  void* moved = ::mremap(copy, mapped, mapped, MREMAP_MAYMOVE | MREMAP_FIXED, base);
  if (moved != base) {
    // note: a failed MREMAP_FIXED may already have unmapped the target range,
    // so the pack's pointers cannot be trusted any more.
    fail_errno(fmt::format("{}: cannot move the huge-page copy of {} bytes over the mapping",
                           path(), size));
  }
  on_hugepages_ = true;
  return size;
}

void Pack::prefault_range(const void* p, size_t n) const {
  const uintptr_t base = reinterpret_cast<uintptr_t>(file_.data());
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (n == 0 || a < base || a + n > base + file_.size()) return;
  const long ps = sysconf(_SC_PAGESIZE);
  const uintptr_t page = ps > 0 ? static_cast<uintptr_t>(ps) : 4096;
  const uintptr_t lo = a / page * page;
  void* start = reinterpret_cast<void*>(lo);
  const size_t len = a + n - lo;
  ::madvise(start, len, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
  if (::madvise(start, len, MADV_POPULATE_READ) == 0) return;
#endif
  volatile uint8_t sink = 0;
  for (uintptr_t off = lo; off < a + n; off += page)
    sink = sink + *reinterpret_cast<const uint8_t*>(off);
}

void Pack::release_range(const void* p, size_t n) const {
  if (on_hugepages_) return;
  const uintptr_t base = reinterpret_cast<uintptr_t>(file_.data());
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (n == 0 || a < base || a + n > base + file_.size()) return;
  const long ps = sysconf(_SC_PAGESIZE);
  const uintptr_t page = ps > 0 ? static_cast<uintptr_t>(ps) : 4096;
  const uintptr_t lo = (a + page - 1) / page * page;  // whole pages inside the range only:
  const uintptr_t hi = (a + n) / page * page;         // neighbours may share the edge pages
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

size_t Pack::load_for_cpu() const {
  if (!tuning().hugepages) return prefault();
  if (!anonymous_copy_fits()) return prefault();
  return copy_to_hugepages();
}

bool Pack::anonymous_copy_fits() const {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return true;
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr)
    found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  std::fclose(f);
  if (!found) return true;
  return static_cast<unsigned long long>(file_.size()) <= kib * 1024ULL / 4 * 3;
}

size_t Pack::verify(bool release_pages) const {
  // note: the tensors are hashed on up to 16 threads, each taking the next
  // tensor from a shared index: one thread (the hash plus the page faults of
  // the mapping) made the load of a 100 GB pack wait tens of seconds. The
  // error names the first mismatching tensor in manifest order, as one
  // thread would.
  const size_t n = tensors_.size();
  std::vector<uint64_t> got(n);
  // note: an FP8 tensor's bytes must also be finite (convert refuses the
  // e4m3fn NaN bytes 0x7f / 0xff; a pack edited after it, checksums
  // recomputed, would load and compute NaN). It is hashed and scanned in
  // pieces, each scanned while still in cache: no second pass over memory.
  std::vector<int64_t> nan_at(n, -1);  // the first NaN byte of an FP8 tensor
  constexpr size_t kPiece = 256 << 10;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      const auto& t = tensors_[i];
      const auto* data = static_cast<const uint8_t*>(t.view.data);
      const auto bytes = static_cast<size_t>(t.view.nbytes());
      if (t.view.dtype == DType::F8_E4M3) {
        Xxh64 h;
        for (size_t at = 0; at < bytes; at += kPiece) {
          const size_t len = std::min(kPiece, bytes - at);
          h.update(data + at, len);
          if (nan_at[i] >= 0) continue;
          if (const size_t bad = first_non_finite(data + at, DType::F8_E4M3, len); bad < len)
            nan_at[i] = static_cast<int64_t>(at + bad);
        }
        got[i] = h.digest();
      } else {
        got[i] = xxh64(data, bytes);
      }
      // note: whole pages inside the tensor only, so a page shared with a
      // neighbour another thread may be hashing stays mapped.
      if (release_pages) release_range(t.view.data, static_cast<size_t>(t.view.nbytes()));
    }
  };
  const size_t threads = std::min<size_t>(
      {size_t{16}, std::max(1u, std::thread::hardware_concurrency()), std::max<size_t>(n, 1)});
  std::vector<std::thread> pool;
  for (size_t k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  size_t checked = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& t = tensors_[i];
    if (got[i] != t.checksum)
      fail("{}: entry \"{}\" (tensor \"{}\"): checksum {} does not match the manifest's {}", path(),
           t.entry, t.name, checksum_hex(got[i]), checksum_hex(t.checksum));
    ++checked;
  }
  for (size_t i = 0; i < n; ++i) {
    if (nan_at[i] < 0) continue;
    const auto& t = tensors_[i];
    const int64_t cols = t.view.shape[t.view.ndim - 1];
    fail(
        "{}: tensor \"{}\": element [{}, {}]{} is byte 0x{:02x}, a NaN in F8_E4M3 (e4m3fn); "
        "expected finite FP8 weights",
        path(), t.name, nan_at[i] / cols, nan_at[i] % cols,
        t.view.ndim > 2 ? " (rows counted over the whole tensor)" : "",
        static_cast<const uint8_t*>(t.view.data)[nan_at[i]]);
  }
  // note: the checksums cover the FP8 scales' bytes; their values must also
  // be what the loader demanded of the checkpoint (core/dtype.h,
  // Fp8ScaleFault).
  using Kind = Fp8ScaleFault::Kind;
  for (const auto& q : fp8_) {
    const int64_t cols = q.weight.shape[q.weight.ndim - 1];
    const int64_t rows = cols > 0 ? q.weight.numel() / cols : 0;
    const auto e = first_fp8_scale_fault(q.scale.data, static_cast<const uint8_t*>(q.weight.data),
                                         rows, cols, q.block_rows, q.block_cols);
    if (!e) continue;
    if (e->kind == Kind::kNotFinite || e->kind == Kind::kNegative)
      fail(
          "{}: tensor \"{}\" (scales of \"{}\"): expected finite values of 0 or more, found {} "
          "at [{}, {}]",
          path(), q.scale_name, q.tensor, e->scale, e->block_row, e->block_col);
    if (e->kind == Kind::kZeroOverData)
      fail(
          "{}: tensor \"{}\" (scales of \"{}\"): expected a positive scale at [{}, {}], whose "
          "block holds element [{}, {}] = byte 0x{:02x}; found 0",
          path(), q.scale_name, q.tensor, e->block_row, e->block_col, e->row, e->col, e->byte);
    fail(
        "{}: tensor \"{}\" (scales of \"{}\"): the scale {} at [{}, {}] overflows float32 for "
        "element [{}, {}]: FP8 value {} x scale {} (expected products within float32)",
        path(), q.scale_name, q.tensor, e->scale, e->block_row, e->block_col, e->row, e->col,
        fp8_e4m3_to_f32(e->byte), e->scale);
  }
  // Non-tensor entries (tokenizer files, ...) listed under "files".
  auto it = manifest_.find("files");
  if (it != manifest_.end()) {
    const std::string mwhere = path() + ": manifest.json";
    if (!it->is_array()) fail("{}: field \"files\" must be an array", mwhere);
    for (const auto& f : *it) {
      const std::string name = string_field(f, "entry", mwhere + " files[]");
      const std::string where = fmt::format("{}: entry \"{}\"", path(), name);
      const auto bytes = entry(name);
      if (!bytes) fail("{}: listed in the manifest but missing from the zip", where);
      uint64_t want = 0;
      const std::string sum = string_field(f, "checksum", where);
      if (!parse_checksum_hex(sum, &want))
        fail("{}: checksum \"{}\" is not 16 hex digits", where, sum);
      const uint64_t got = xxh64(bytes->data(), bytes->size());
      if (got != want)
        fail("{}: checksum {} does not match the manifest's {}", where, checksum_hex(got), sum);
      ++checked;
    }
  }
  return checked;
}

}  // namespace qtk
