// Loading tokenizer.json into a TokenizerModel, refusing what we do not support.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/split_scanner.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode_classes.h"

namespace qtk {
namespace {

using nlohmann::json;

std::string shorten(std::string_view s, size_t max = 80) {
  if (s.size() <= max) return std::string(s);
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "...";
}

std::string json_kind(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_string()) return fmt::format("\"{}\"", shorten(v.get<std::string>()));
  if (v.is_number()) return v.dump();
  if (v.is_array()) return "an array";
  return "an object";
}

// The "type" of a component object, or a clear error.
std::string component_type(const json& v, const std::string& source, std::string_view field,
                           std::string_view expected) {
  if (!v.is_object()) {
    fail("{}: {} must be an object (expected {}), found {}", source, field, expected, json_kind(v));
  }
  const auto it = v.find("type");
  if (it == v.end() || !it->is_string()) {
    fail("{}: {} has no \"type\" string (expected {})", source, field, expected);
  }
  return it->get<std::string>();
}

// A boolean field that must hold `required` (absent means `absent_value`).
void require_bool(const json& obj, std::string_view name, bool required, bool absent_value,
                  const std::string& source, std::string_view field) {
  const auto it = obj.find(std::string(name));
  const bool value =
      it == obj.end() || it->is_null() ? absent_value : it->is_boolean() && it->get<bool>();
  if (it != obj.end() && !it->is_null() && !it->is_boolean()) {
    fail("{}: {}.{} must be a boolean, found {}", source, field, name, json_kind(*it));
  }
  if (value != required) {
    fail("{}: {}.{} = {} is not supported (expected {})", source, field, name, value, required);
  }
}

void check_normalizer(const json& v, const std::string& source, bool& nfc) {
  nfc = false;
  if (v.is_null()) return;
  const std::string type = component_type(v, source, "normalizer", "NFC or null");
  if (type != "NFC") {
    fail("{}: normalizer type '{}' is not supported (expected NFC or null)", source, type);
  }
  nfc = true;
}

void check_pre_tokenizer(const json& v, const std::string& source) {
  constexpr std::string_view kExpected = "Sequence[Split, ByteLevel]";
  if (v.is_null()) fail("{}: pre_tokenizer is missing (expected {})", source, kExpected);
  const std::string type = component_type(v, source, "pre_tokenizer", kExpected);
  if (type != "Sequence") {
    fail("{}: pre_tokenizer type '{}' is not supported (expected {})", source, type, kExpected);
  }
  const auto list = v.find("pretokenizers");
  if (list == v.end() || !list->is_array() || list->size() != 2) {
    fail("{}: pre_tokenizer.pretokenizers must be an array of 2 (expected {}), found {}", source,
         kExpected,
         list == v.end()    ? "nothing"
         : list->is_array() ? fmt::format("{} items", list->size())
                            : json_kind(*list));
  }
  const json& split = (*list)[0];
  const std::string split_type =
      component_type(split, source, "pre_tokenizer.pretokenizers[0]", "Split");
  if (split_type != "Split") {
    fail("{}: pre_tokenizer.pretokenizers[0] type '{}' is not supported (expected Split)", source,
         split_type);
  }
  const auto pattern = split.find("pattern");
  if (pattern == split.end() || !pattern->is_object() || !pattern->contains("Regex") ||
      !(*pattern)["Regex"].is_string()) {
    fail(
        "{}: pre_tokenizer.pretokenizers[0].pattern must be {{\"Regex\": ...}} with Qwen's split "
        "pattern, found {}",
        source, pattern == split.end() ? "nothing" : pattern->dump());
  }
  const std::string regex = (*pattern)["Regex"].get<std::string>();
  if (regex != kQwenSplitPattern) {
    fail(
        "{}: pre_tokenizer.pretokenizers[0].pattern.Regex is not supported (expected Qwen's "
        "pattern {}, found {})",
        source, kQwenSplitPattern, shorten(regex, 200));
  }
  const auto behavior = split.find("behavior");
  if (behavior == split.end() || *behavior != "Isolated") {
    fail("{}: pre_tokenizer.pretokenizers[0].behavior {} is not supported (expected \"Isolated\")",
         source, behavior == split.end() ? "(missing)" : json_kind(*behavior));
  }
  require_bool(split, "invert", false, false, source, "pre_tokenizer.pretokenizers[0]");

  const json& byte_level = (*list)[1];
  const std::string bl_type =
      component_type(byte_level, source, "pre_tokenizer.pretokenizers[1]", "ByteLevel");
  if (bl_type != "ByteLevel") {
    fail("{}: pre_tokenizer.pretokenizers[1] type '{}' is not supported (expected ByteLevel)",
         source, bl_type);
  }
  require_bool(byte_level, "add_prefix_space", false, true, source,
               "pre_tokenizer.pretokenizers[1]");
  require_bool(byte_level, "use_regex", false, true, source, "pre_tokenizer.pretokenizers[1]");
}

void check_post_processor(const json& v, const std::string& source) {
  if (v.is_null()) return;
  // note: ByteLevel post-processing only trims offsets; ids are unchanged.
  const std::string type = component_type(v, source, "post_processor", "ByteLevel or null");
  if (type != "ByteLevel") {
    fail("{}: post_processor type '{}' is not supported (expected ByteLevel or null)", source,
         type);
  }
}

void check_decoder(const json& v, const std::string& source) {
  if (v.is_null()) fail("{}: decoder is missing (expected ByteLevel)", source);
  // note: the ByteLevel decoder ignores its add_prefix_space/trim_offsets/use_regex flags.
  const std::string type = component_type(v, source, "decoder", "ByteLevel");
  if (type != "ByteLevel") {
    fail("{}: decoder type '{}' is not supported (expected ByteLevel)", source, type);
  }
}

struct Span {
  uint32_t offset;
  uint32_t size;
};

// String -> id over strings stored in one arena; open addressing.
// note: loading Qwen3 does ~600k lookups in a table of a few MB, so most of
// the time is cache misses; callers hash first and prefetch() a few keys
// ahead, and slots keep a hash tag so that mismatches skip the arena.
class VocabIndex {
 public:
  VocabIndex(const std::string& arena, size_t expected) : arena_(arena) {
    size_t capacity = 16;
    while (capacity < expected + expected / 2) capacity *= 2;
    slots_.assign(capacity, Slot{0, 0, 0, -1});
    mask_ = capacity - 1;
  }
  static uint64_t hash(std::string_view key) {
    return bpe::WordCache::hash_bytes(reinterpret_cast<const unsigned char*>(key.data()),
                                      key.size());
  }
  void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }
  // Returns the id already stored under the same string, or -1 after inserting.
  int32_t insert(Span key, uint64_t h, int32_t id) {
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      Slot& s = slots_[slot];
      if (s.id < 0) {
        s = Slot{key.offset, key.size, tag, id};
        return -1;
      }
      if (s.tag == tag && s.size == key.size &&
          std::memcmp(arena_.data() + s.offset, arena_.data() + key.offset, key.size) == 0) {
        return s.id;
      }
    }
  }
  std::optional<int32_t> find(std::string_view key, uint64_t h) const {
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      const Slot& s = slots_[slot];
      if (s.id < 0) return std::nullopt;
      if (s.tag == tag && s.size == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        return s.id;
      }
    }
  }
  std::optional<int32_t> find(std::string_view key) const { return find(key, hash(key)); }

 private:
  struct Slot {
    uint32_t offset;
    uint32_t size;
    uint32_t tag;  // high half of the hash
    int32_t id;    // -1 when free
  };
  const std::string& arena_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

constexpr size_t kPrefetchDistance = 16;

struct RawModel {
  std::string arena;  // vocabulary strings, then merge halves
  std::vector<std::pair<Span, int32_t>> vocab;
  std::vector<std::pair<Span, Span>> merges;
  bool ignore_merges = false;
  bool saw_vocab = false;
  bool saw_merges = false;
};

Span append(std::string& arena, std::string_view s) {
  Span span{static_cast<uint32_t>(arena.size()), static_cast<uint32_t>(s.size())};
  arena.append(s);
  return span;
}

std::string_view view(const std::string& arena, Span s) {
  return std::string_view(arena).substr(s.offset, s.size);
}

void read_model(JsonReader& r, RawModel& m) {
  const std::string& source = r.source();
  r.begin_object("model");
  std::string key, value;
  while (r.next_member(key)) {
    if (key == "type") {
      value.clear();
      r.read_string(value, "model.type");
      if (value != "BPE")
        fail("{}: model type '{}' is not supported (expected BPE)", source, value);
    } else if (key == "vocab") {
      m.saw_vocab = true;
      r.begin_object("model.vocab");
      std::string token;
      while (r.next_member(token)) {
        const int64_t id = r.read_integer("the id of a model.vocab token");
        if (id < 0 || id > INT32_MAX) {
          fail("{}: model.vocab token \"{}\" has id {} (expected 0..{})", source, shorten(token),
               id, INT32_MAX);
        }
        m.vocab.emplace_back(append(m.arena, token), static_cast<int32_t>(id));
      }
    } else if (key == "merges") {
      m.saw_merges = true;
      r.begin_array("model.merges");
      std::string a, b;
      while (r.next_element()) {
        const size_t index = m.merges.size();
        a.clear();
        b.clear();
        if (r.peek() == '[') {
          r.begin_array("a merge");
          if (!r.next_element())
            fail("{}: model.merges[{}] must hold 2 strings, found 0", source, index);
          r.read_string(a, "the left half of a merge");
          if (!r.next_element())
            fail("{}: model.merges[{}] must hold 2 strings, found 1", source, index);
          r.read_string(b, "the right half of a merge");
          if (r.next_element())
            fail("{}: model.merges[{}] must hold 2 strings, found more", source, index);
        } else if (r.peek() == '"') {
          // note: the older "a b" form; HF splits on ' ' and needs exactly 2 parts.
          std::string line;
          r.read_string(line, "a merge");
          const size_t space = line.find(' ');
          if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
            fail("{}: model.merges[{}] \"{}\" must be two tokens separated by one space", source,
                 index, shorten(line));
          }
          a = line.substr(0, space);
          b = line.substr(space + 1);
        } else {
          r.fail_here(fmt::format("model.merges[{}] as [\"a\", \"b\"] or \"a b\"", index));
        }
        const Span sa = append(m.arena, a);
        const Span sb = append(m.arena, b);
        m.merges.emplace_back(sa, sb);
      }
    } else if (key == "dropout") {
      const json v = r.read_value("/model/" + key);
      if (!v.is_null())
        fail("{}: model.dropout = {} is not supported (expected null)", source, json_kind(v));
    } else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix") {
      const json v = r.read_value("/model/" + key);
      if (!v.is_null() && v != "") {
        fail("{}: model.{} = {} is not supported (expected null or \"\")", source, key,
             json_kind(v));
      }
    } else if (key == "ignore_merges") {
      const json v = r.read_value("/model/" + key);
      if (!v.is_boolean())
        fail("{}: model.ignore_merges must be a boolean, found {}", source, json_kind(v));
      m.ignore_merges = v.get<bool>();
    } else {
      // unk_token, fuse_unk, byte_fallback: never used, since every byte has
      // a token (checked below). Unknown fields are ignored, as HF does.
      r.read_value("/model/" + key);
    }
  }
  if (!m.saw_vocab) fail("{}: model.vocab is missing (expected an object of token -> id)", source);
  if (!m.saw_merges) fail("{}: model.merges is missing (expected an array of merges)", source);
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool normalized;
};

std::vector<AddedToken> read_added_tokens(const json& v, const std::string& source) {
  std::vector<AddedToken> tokens;
  if (v.is_null()) return tokens;
  if (!v.is_array()) fail("{}: added_tokens must be an array, found {}", source, json_kind(v));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string field = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) fail("{}: {} must be an object, found {}", source, field, json_kind(t));
    const auto id = t.find("id");
    if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX) {
      fail("{}: {}.id must be an integer in 0..{}, found {}", source, field, INT32_MAX,
           id == t.end() ? "nothing" : json_kind(*id));
    }
    const auto content = t.find("content");
    if (content == t.end() || !content->is_string() || content->get<std::string>().empty()) {
      fail("{}: {}.content must be a non-empty string, found {}", source, field,
           content == t.end() ? "nothing" : json_kind(*content));
    }
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      require_bool(t, flag, false, false, source, field);
    }
    const auto normalized = t.find("normalized");
    if (normalized != t.end() && !normalized->is_boolean()) {
      fail("{}: {}.normalized must be a boolean, found {}", source, field, json_kind(*normalized));
    }
    tokens.push_back(AddedToken{content->get<std::string>(),
                                static_cast<int32_t>(id->get<int64_t>()),
                                normalized != t.end() && normalized->get<bool>()});
  }
  return tokens;
}

// The top level of tokenizer.json: the BPE model streamed into raw tables,
// the small component objects kept as DOM values for their checks.
struct TopLevel {
  RawModel raw;
  json normalizer, pre_tokenizer, post_processor, decoder, added_tokens;
};

void read_top_level(std::string_view json_text, const std::string& source, TopLevel& top) {
  JsonReader r(json_text, source);
  top.raw.arena.reserve(json_text.size() / 2);
  bool saw_model = false;
  r.begin_object("the top level");
  std::string key;
  while (r.next_member(key)) {
    if (key == "model") {
      read_model(r, top.raw);
      saw_model = true;
    } else if (key == "normalizer") {
      top.normalizer = r.read_value("/normalizer");
    } else if (key == "pre_tokenizer") {
      top.pre_tokenizer = r.read_value("/pre_tokenizer");
    } else if (key == "post_processor") {
      top.post_processor = r.read_value("/post_processor");
    } else if (key == "decoder") {
      top.decoder = r.read_value("/decoder");
    } else if (key == "added_tokens") {
      top.added_tokens = r.read_value("/added_tokens");
    } else if (key == "truncation" || key == "padding") {
      const json v = r.read_value("/" + key);
      if (!v.is_null())
        fail("{}: {} is not supported (expected null), found {}", source, key, json_kind(v));
    } else {
      r.read_value("/" + key);  // "version" and fields HF ignores
    }
  }
  r.expect_end();
  if (!saw_model) fail("{}: model is missing (expected a BPE model object)", source);
}

// Indexes model.vocab, refusing a repeated string or id, and sets
// model.vocab_size to cover the added tokens too. Returns each id's
// vocabulary string (size UINT32_MAX for an id without one).
std::vector<Span> index_vocab(const RawModel& raw, const std::vector<AddedToken>& added,
                              const std::string& source, VocabIndex& index, TokenizerModel& model) {
  // note: the id tables below are sized by the largest id; every id names a
  // distinct entry, so an id far past the entries' count is damage (one id
  // of 2^31 - 1 allocated ~16 GB before any check), refused here. The slack
  // allows a vocabulary with gaps in its ids.
  const int64_t entries = static_cast<int64_t>(raw.vocab.size() + added.size());
  const int64_t id_limit = entries + 65536;
  int64_t max_id = -1;
  for (const auto& [span, id] : raw.vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& t : added) max_id = std::max<int64_t>(max_id, t.id);
  if (max_id >= id_limit)
    fail(
        "{}: {} holds id {}, far past its {} entries (model.vocab and added_tokens; expected ids "
        "below {})",
        source,
        std::any_of(added.begin(), added.end(), [&](const AddedToken& t) { return t.id == max_id; })
            ? "added_tokens"
            : "model.vocab",
        max_id, entries, id_limit);
  model.vocab_size = max_id + 1;
  std::vector<Span> token_of_id(static_cast<size_t>(model.vocab_size), Span{0, UINT32_MAX});
  std::vector<uint64_t> hashes(raw.vocab.size());
  for (size_t i = 0; i < raw.vocab.size(); ++i)
    hashes[i] = VocabIndex::hash(view(raw.arena, raw.vocab[i].first));
  for (size_t i = 0; i < raw.vocab.size(); ++i) {
    if (i + kPrefetchDistance < raw.vocab.size()) index.prefetch(hashes[i + kPrefetchDistance]);
    const auto& [span, id] = raw.vocab[i];
    if (index.insert(span, hashes[i], id) >= 0) {
      fail("{}: model.vocab lists token \"{}\" twice", source, shorten(view(raw.arena, span)));
    }
    Span& owner = token_of_id[static_cast<size_t>(id)];
    if (owner.size != UINT32_MAX) {
      fail("{}: model.vocab gives id {} to both \"{}\" and \"{}\" (expected unique ids)", source,
           id, shorten(view(raw.arena, owner)), shorten(view(raw.arena, span)));
    }
    owner = span;
  }

  return token_of_id;
}

// model.byte_ids. Every byte needs a token: BPE starts from one symbol per
// byte.
void find_byte_ids(const VocabIndex& index, const std::string& source, TokenizerModel& model) {
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::append_utf8(ch, byte_level::byte_to_char(static_cast<uint8_t>(b)));
    const std::optional<int32_t> id = index.find(ch);
    if (!id) {
      fail(
          "{}: model.vocab has no token \"{}\" for byte 0x{:02X} (expected the full 256-character "
          "ByteLevel alphabet)",
          source, ch, b);
    }
    model.byte_ids[b] = *id;
  }
}

// model.merges: rank = position in the list. Hash everything first
// (sequential reads), then look up with prefetching.
void resolve_merges(const RawModel& raw, const VocabIndex& index, const std::string& source,
                    TokenizerModel& model) {
  const size_t merge_count = raw.merges.size();
  std::string joined_arena;
  std::vector<Span> joined(merge_count);
  std::vector<uint64_t> merge_hashes(merge_count * 3);
  joined_arena.reserve(raw.arena.size());
  for (size_t k = 0; k < merge_count; ++k) {
    const auto [a, b] = raw.merges[k];
    joined[k] = Span{static_cast<uint32_t>(joined_arena.size()), a.size + b.size};
    joined_arena.append(view(raw.arena, a));
    joined_arena.append(view(raw.arena, b));
    merge_hashes[3 * k] = VocabIndex::hash(view(raw.arena, a));
    merge_hashes[3 * k + 1] = VocabIndex::hash(view(raw.arena, b));
    merge_hashes[3 * k + 2] = VocabIndex::hash(view(joined_arena, joined[k]));
  }
  struct ResolvedMerge {
    int32_t left, right, merged;
  };
  std::vector<ResolvedMerge> resolved(merge_count);
  for (size_t k = 0; k < merge_count; ++k) {
    if (k + kPrefetchDistance < merge_count) {
      for (size_t j = 0; j < 3; ++j) index.prefetch(merge_hashes[3 * (k + kPrefetchDistance) + j]);
    }
    const auto [a, b] = raw.merges[k];
    const std::optional<int32_t> left = index.find(view(raw.arena, a), merge_hashes[3 * k]);
    const std::optional<int32_t> right = index.find(view(raw.arena, b), merge_hashes[3 * k + 1]);
    if (!left || !right) {
      fail("{}: model.merges[{}] uses \"{}\", which is not in model.vocab", source, k,
           shorten(view(raw.arena, left ? b : a)));
    }
    const std::optional<int32_t> merged =
        index.find(view(joined_arena, joined[k]), merge_hashes[3 * k + 2]);
    if (!merged) {
      fail("{}: model.merges[{}] makes \"{}\", which is not in model.vocab", source, k,
           shorten(view(joined_arena, joined[k])));
    }
    resolved[k] = ResolvedMerge{*left, *right, *merged};
  }
  model.merges.reserve(merge_count);
  for (size_t k = 0; k < merge_count; ++k) {
    if (k + kPrefetchDistance < merge_count) {
      const ResolvedMerge& ahead = resolved[k + kPrefetchDistance];
      model.merges.prefetch(ahead.left, ahead.right);
    }
    model.merges.insert(resolved[k].left, resolved[k].right, static_cast<uint32_t>(k),
                        resolved[k].merged);
  }
}

// The added tokens by id, for the decoding table.
struct AddedById {
  std::vector<std::string> text;
  std::vector<uint8_t> is_added;
};

// Registers the added tokens with the model's matchers.
// note: HF ignores the "id" written in the file and assigns the model's id
// when the content is in the vocabulary, else the next id after the
// vocabulary; we refuse a file where the two disagree.
AddedById add_added_tokens(const std::vector<AddedToken>& added, const RawModel& raw,
                           const VocabIndex& index, const std::string& source,
                           TokenizerModel& model) {
  int64_t next_id = static_cast<int64_t>(raw.vocab.size());
  AddedById by_id;
  by_id.text.resize(static_cast<size_t>(model.vocab_size));
  by_id.is_added.assign(static_cast<size_t>(model.vocab_size), 0);
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    const std::optional<int32_t> in_vocab = index.find(t.content);
    const int64_t hf_id = in_vocab ? *in_vocab : next_id++;
    if (hf_id != t.id) {
      fail(
          "{}: added_tokens[{}] \"{}\" has id {}, but HF tokenizers would give it id {} (expected "
          "the model.vocab id of the same string, or the next id after the vocabulary)",
          source, i, shorten(t.content), t.id, hf_id);
    }
    if (by_id.is_added[static_cast<size_t>(t.id)]) {
      fail("{}: added_tokens[{}] \"{}\" repeats id {}", source, i, shorten(t.content), t.id);
    }
    by_id.is_added[static_cast<size_t>(t.id)] = 1;
    by_id.text[static_cast<size_t>(t.id)] = t.content;
    if (t.normalized && model.nfc) {
      model.normalized_added.add(unicode::nfc_reference(t.content), t.id);
    } else if (t.normalized) {
      model.normalized_added.add(t.content, t.id);
    } else {
      model.raw_added.add(t.content, t.id);
    }
  }
  return by_id;
}

// The decoding table: the ByteLevel decoder's bytes for every id.
void build_decode_table(const RawModel& raw, const std::vector<Span>& token_of_id,
                        const AddedById& added, TokenizerModel& model) {
  model.decode_offsets.assign(static_cast<size_t>(model.vocab_size) + 1, 0);
  model.id_known.assign(static_cast<size_t>(model.vocab_size), 0);
  model.decode_bytes.reserve(raw.arena.size() / 2);
  for (size_t id = 0; id < static_cast<size_t>(model.vocab_size); ++id) {
    model.decode_offsets[id] = static_cast<uint32_t>(model.decode_bytes.size());
    std::string_view text;
    if (added.is_added[id]) {
      text = added.text[id];
    } else if (token_of_id[id].size != UINT32_MAX) {
      text = view(raw.arena, token_of_id[id]);
    } else {
      continue;
    }
    model.id_known[id] = 1;
    byte_level::append_token_bytes(model.decode_bytes, text);
  }
  model.decode_offsets[static_cast<size_t>(model.vocab_size)] =
      static_cast<uint32_t>(model.decode_bytes.size());
}

// model.bytes_to_id, for ignore_merges: a pre-token that is a whole
// vocabulary token is that token.
void build_bytes_to_id(const RawModel& raw, TokenizerModel& model) {
  model.bytes_to_id.reserve(raw.vocab.size());
  for (const auto& [span, id] : raw.vocab) {
    // Only tokens spelled in the ByteLevel alphabet can equal a pre-token.
    std::string bytes = byte_level::token_bytes(view(raw.arena, span));
    if (byte_level::to_token_string(bytes) == view(raw.arena, span))
      model.bytes_to_id.emplace(std::move(bytes), id);
  }
}

std::atomic<uint64_t> g_next_instance{1};

}  // namespace

TokenizerModel load_tokenizer_json(std::string_view json_text, const std::string& source) {
  TopLevel top;
  read_top_level(json_text, source, top);
  const RawModel& raw = top.raw;

  TokenizerModel model;
  check_normalizer(top.normalizer, source, model.nfc);
  check_pre_tokenizer(top.pre_tokenizer, source);
  check_post_processor(top.post_processor, source);
  check_decoder(top.decoder, source);
  const std::vector<AddedToken> added = read_added_tokens(top.added_tokens, source);
  model.ignore_merges = raw.ignore_merges;

  VocabIndex index(raw.arena, raw.vocab.size());
  const std::vector<Span> token_of_id = index_vocab(raw, added, source, index, model);
  find_byte_ids(index, source, model);
  resolve_merges(raw, index, source, model);
  const AddedById added_by_id = add_added_tokens(added, raw, index, source, model);
  build_decode_table(raw, token_of_id, added_by_id, model);
  if (model.ignore_merges) build_bytes_to_id(raw, model);
  model.instance = g_next_instance.fetch_add(1);
  return model;
}

}  // namespace qtk
