#include "loaders/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"

namespace qtk {

using nlohmann::json;

bool has_control_character(std::string_view name) {
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7F) return true;
    // note: C1 controls U+0080..U+009F are encoded as C2 80..C2 9F.
    if (c == 0xC2 && i + 1 < name.size()) {
      const auto d = static_cast<unsigned char>(name[i + 1]);
      if (d >= 0x80 && d <= 0x9F) return true;
    }
  }
  return false;
}

namespace {

std::string quote_name(std::string_view name) { return shown_json(json(std::string(name))); }

// A non-negative JSON integer that fits in int64, or -1.
int64_t as_count(const json& j) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return -1;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    const auto v = j.get<int64_t>();
    return v >= 0 ? v : -1;
  }
  return -1;
}

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t start, end;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& info) {
  const std::string where = fmt::format("{}: tensor {}", path, quote_name(name));
  if (name.empty()) fail("{}: expected a non-empty tensor name, found \"\"", path);
  if (has_control_character(name))
    fail("{}: expected a tensor name without control characters", where);
  if (!info.is_object())
    fail("{}: expected an object with dtype, shape and data_offsets, found {}", where,
         shown_json(info));
  for (const auto& [key, value] : info.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail("{}: unexpected field {} (expected only dtype, shape, data_offsets)", where,
           quote_name(key));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!info.contains(field)) fail("{}: missing field '{}'", where, field);

  Entry e{name, DType::F32, {}, 0, 0};
  const json& dt = info["dtype"];
  if (!dt.is_string())
    fail("{}: field 'dtype': expected a string, found {}", where, shown_json(dt));
  const auto parsed = parse_dtype(dt.get<std::string>());
  if (!parsed)
    fail(
        "{}: field 'dtype': expected one of BF16 F16 F32 F64 I8 I16 I32 I64 U8 U16 U32 U64 BOOL "
        "F8_E4M3 F8_E5M2, found {}",
        where, shown_json(dt));
  e.dtype = *parsed;

  const json& shape = info["shape"];
  if (!shape.is_array())
    fail("{}: field 'shape': expected an array of integers, found {}", where, shown_json(shape));
  if (shape.size() > static_cast<size_t>(kMaxDims))
    fail("{}: field 'shape': expected at most {} dimensions, found {}", where, kMaxDims,
         shape.size());
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = as_count(shape[i]);
    if (d < 0)
      fail("{}: field 'shape': expected integers >= 0 that fit in int64, found {} at index {}",
           where, shown_json(shape[i]), i);
    if (__builtin_mul_overflow(numel, d, &numel))
      fail("{}: field 'shape': element count of {} overflows int64", where, shown_json(shape));
    e.shape.push_back(d);
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes))
    fail("{}: field 'shape': byte size of {} x {} overflows int64", where, shown_json(shape),
         dtype_name(e.dtype));

  const json& off = info["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail("{}: field 'data_offsets': expected [start, end], found {}", where, shown_json(off));
  e.start = as_count(off[0]);
  e.end = as_count(off[1]);
  if (e.start < 0 || e.end < 0)
    fail("{}: field 'data_offsets': expected integers >= 0, found {}", where, shown_json(off));
  if (e.end < e.start)
    fail("{}: field 'data_offsets': expected start <= end, found {}", where, shown_json(off));
  if (e.end - e.start != nbytes)
    fail("{}: field 'data_offsets': {} spans {} bytes, but shape {} of {} needs {} bytes", where,
         shown_json(off), e.end - e.start, shown_json(shape), dtype_name(e.dtype), nbytes);
  return e;
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->file_ = MappedFile(path);
  const uint8_t* base = f->file_.data();
  const uint64_t size = f->file_.size();
  if (size < 8)
    fail("{}: expected at least 8 bytes (the header length), found a {}-byte file", path, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian u64
  if (n > kMaxSafetensorsHeaderBytes)
    fail("{}: header length {} exceeds the limit of {} bytes", path, n, kMaxSafetensorsHeaderBytes);
  if (n > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes after the length field)",
         path, n, size - 8);
  f->header_size_ = n;
  const std::string_view text(reinterpret_cast<const char*>(base + 8), n);
  const json header = parse_json_strict(text, path + " (header)");
  if (!header.is_object())
    fail("{}: header: expected a JSON object, found {}", path, header.type_name());

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail("{}: field '__metadata__': expected an object of strings, found {}", path,
             shown_json(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail("{}: field '__metadata__': key {}: expected a string value, found {}", path,
               quote_name(mk), shown_json(mv));
        f->metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value));
  }

  // note: sorting by (start, end) puts zero-byte tensors before a tensor
  // that starts at the same offset, so an exact tiling is a chain where each
  // start equals the previous end.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  const uint64_t buffer = size - 8 - n;
  // note: the causes first, the consequences after: a tensor past the data
  // buffer or over another also leaves a gap where it should have been, and
  // the gap, met first in offset order, would name an innocent tensor.
  for (const Entry& e : entries)
    if (static_cast<uint64_t>(e.end) > buffer)
      fail(
          "{}: tensor {}: field 'data_offsets': [{}, {}] ends past the {}-byte data buffer "
          "(file truncated?)",
          path, quote_name(e.name), e.start, e.end, buffer);
  const Entry* furthest = nullptr;  // the entry reaching furthest so far
  for (const Entry& e : entries) {
    if (furthest != nullptr && e.start < furthest->end && e.end > e.start)
      fail("{}: tensor {}: field 'data_offsets': [{}, {}] overlaps tensor {} [{}, {}]", path,
           quote_name(e.name), e.start, e.end, quote_name(furthest->name), furthest->start,
           furthest->end);
    if (furthest == nullptr || e.end > furthest->end) furthest = &e;
  }
  int64_t expected_start = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.start != expected_start) {
      if (!prev)
        fail(
            "{}: tensor {}: field 'data_offsets': expected the first tensor to start at 0, "
            "found {}",
            path, quote_name(e.name), e.start);
      if (e.start < expected_start)
        fail("{}: tensor {}: field 'data_offsets': [{}, {}] overlaps tensor {} ending at {}", path,
             quote_name(e.name), e.start, e.end, quote_name(prev->name), expected_start);
      fail(
          "{}: tensor {}: field 'data_offsets': expected start {} (end of tensor {}), found {} "
          "(a gap of {} bytes)",
          path, quote_name(e.name), expected_start, quote_name(prev->name), e.start,
          e.start - expected_start);
    }
    expected_start = e.end;
    prev = &e;
  }
  // (every tensor ends within the buffer, checked above: only bytes past the
  // last one can be left)
  if (static_cast<uint64_t>(expected_start) != buffer)
    fail(
        "{}: data buffer has {} bytes but the tensors cover {} (expected them to end exactly "
        "at the end of the file)",
        path, buffer, expected_start);

  const uint8_t* data = base + 8 + n;
  f->tensors_.reserve(entries.size());
  for (const Entry& e : entries) {
    SafetensorsTensor t;
    t.name = e.name;
    t.view = TensorView(data + e.start, e.dtype, std::span<const int64_t>(e.shape));
    t.file_offset = 8 + n + static_cast<uint64_t>(e.start);
    f->index_.emplace(t.name, f->tensors_.size());
    f->tensors_.push_back(std::move(t));
  }
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace qtk
