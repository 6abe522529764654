#include "loaders/strict_json.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace qtk {

using nlohmann::json;

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return i;  // continuation byte or 0xF8..0xFF as a lead byte
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const unsigned cc = p[i + k];
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// note: nlohmann's parser is iterative, but dump() and the DOM's users
// recurse; a few MB of '[' would overflow the stack when a message shows the
// value. No file we read nests deeper than ~6 levels.
constexpr size_t kMaxJsonDepth = 128;

// Builds a json DOM from SAX events, refusing duplicated object keys and
// nesting deeper than kMaxJsonDepth.
class StrictDomBuilder {
 public:
  explicit StrictDomBuilder(json& root) : root_(root) {}

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) { return value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(v); }
  bool string(json::string_t& v) { return value(std::move(v)); }
  bool binary(json::binary_t& v) { return value(json::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    Frame& f = frames_.back();
    if (f.node->contains(k)) {
      duplicate_key_ = k;
      duplicate_path_ = path();
      return false;
    }
    f.key = k;
    pending_ = &(*f.node)[k];
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    syntax_error_ = ex.what();
    error_position_ = position;
    return false;
  }

  const std::string& duplicate_key() const { return duplicate_key_; }
  const std::string& duplicate_path() const { return duplicate_path_; }
  const std::string& syntax_error() const { return syntax_error_; }
  bool too_deep() const { return too_deep_; }

 private:
  struct Frame {
    json* node;
    std::string key;  // last key seen in an object frame
  };

  json* place(json&& v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *frames_.back().node;
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    *pending_ = std::move(v);
    return pending_;
  }
  bool value(json&& v) {
    place(std::move(v));
    return true;
  }
  // note: a pointer to a child is only held while that child is open; its
  // parent receives no new element until the child closes, so array growth
  // never invalidates a pointer on the stack.
  bool open(json&& container) {
    if (frames_.size() >= kMaxJsonDepth) {
      too_deep_ = true;
      return false;
    }
    json* node = place(std::move(container));
    frames_.push_back({node, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }
  std::string path() const {
    std::string p;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      p += '/';
      if (frames_[i].node->is_array())
        p += std::to_string(frames_[i].node->size() - 1);
      else
        p += frames_[i].key;
    }
    return p.empty() ? "/" : p;
  }

  json& root_;
  std::vector<Frame> frames_;
  json* pending_ = nullptr;
  std::string duplicate_key_, duplicate_path_, syntax_error_;
  size_t error_position_ = 0;
  bool too_deep_ = false;
};

}  // namespace

json parse_json_strict(std::string_view text, const std::string& source) {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    fail("{}: expected UTF-8 JSON, found an invalid UTF-8 byte sequence at byte {}", source, bad);
  json root;
  StrictDomBuilder builder(root);
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok) {
    if (!builder.duplicate_key().empty() || !builder.duplicate_path().empty())
      fail("{}: duplicate JSON key '{}' in object {} (each key may appear once)", source,
           builder.duplicate_key(), builder.duplicate_path());
    if (builder.too_deep())
      fail("{}: expected JSON nested at most {} levels deep, found deeper nesting", source,
           kMaxJsonDepth);
    fail("{}: invalid JSON: {}", source, builder.syntax_error());
  }
  return root;
}

json load_json_file(const std::string& path) {
  // note: JSON side files (config, index, generation config) are small; the
  // cap keeps a wrong path (a weights file) from being read into memory.
  constexpr std::streamoff kMaxJsonBytes = 64ll << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) fail("{}: cannot read", path);
  if (size > kMaxJsonBytes)
    fail("{}: expected a JSON file of at most {} bytes, found {} bytes", path, kMaxJsonBytes, size);
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  if (!in) fail("{}: cannot read {} bytes", path, size);
  return parse_json_strict(text, path);
}

}  // namespace qtk
