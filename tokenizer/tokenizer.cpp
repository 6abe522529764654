#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/read_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/split_scanner.h"
#include "tokenizer/tokenizer_model.h"
#include "tokenizer/unicode_classes.h"

namespace qtk {
namespace {

// note: one word cache per thread, so encode() needs no locks. It belongs to
// one model at a time and is cleared when a thread switches models.
struct ThreadCache {
  uint64_t instance = 0;
  bpe::WordCache words;
};

bpe::WordCache& word_cache_for(const TokenizerModel& model) {
  thread_local ThreadCache cache;
  if (cache.instance != model.instance) {
    cache.words.clear();
    cache.instance = model.instance;
  }
  return cache.words;
}

// BPE of one pre-token, appended to out.
void encode_word(const TokenizerModel& m, bpe::WordCache& cache, const unsigned char* w, size_t n,
                 std::vector<int32_t>& out) {
  if (n == 1) {
    out.push_back(m.byte_ids[w[0]]);
    return;
  }
  if (m.ignore_merges) {
    const auto it = m.bytes_to_id.find(std::string(reinterpret_cast<const char*>(w), n));
    if (it != m.bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (n == 2) {  // one possible merge: cheaper than the cache
    const int32_t a = m.byte_ids[w[0]], b = m.byte_ids[w[1]];
    if (const bpe::MergeTable::Entry* e = m.merges.find(a, b)) {
      out.push_back(e->merged);
    } else {
      out.push_back(a);
      out.push_back(b);
    }
    return;
  }
  if (n > bpe::WordCache::kMaxWordBytes) {
    bpe::merge_word(m.merges, m.byte_ids, w, n, out);
    return;
  }
  const uint64_t hash = bpe::WordCache::hash_bytes(w, n);
  if (cache.lookup(hash, w, n, out)) return;
  const size_t first = out.size();
  bpe::merge_word(m.merges, m.byte_ids, w, n, out);
  cache.insert(hash, w, n, out.data() + first, out.size() - first);
}

// Split + ByteLevel + BPE of normalized text without added tokens.
void encode_normalized(const TokenizerModel& m, bpe::WordCache& cache, std::string_view text,
                       std::vector<int32_t>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = split_piece_end(text, begin);
    encode_word(m, cache, s + begin, end - begin, out);
    begin = end;
  }
}

// Text between raw added tokens: normalize, then split on normalized added tokens.
void encode_segment(const TokenizerModel& m, bpe::WordCache& cache, std::string_view segment,
                    std::string& buffer, std::vector<int32_t>& out) {
  const std::string_view normalized = m.nfc ? unicode::nfc(segment, buffer) : segment;
  if (m.normalized_added.empty()) {
    encode_normalized(m, cache, normalized, out);
    return;
  }
  size_t pos = 0;
  AddedTokenMatcher::Match match;
  while (m.normalized_added.find(normalized, pos, match)) {
    encode_normalized(m, cache, normalized.substr(pos, match.begin - pos), out);
    out.push_back(match.id);
    pos = match.begin + match.size;
  }
  encode_normalized(m, cache, normalized.substr(pos), out);
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerModel> model) : model_(std::move(model)) {}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& source) {
  return Tokenizer(std::make_shared<const TokenizerModel>(load_tokenizer_json(json_text, source)));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json_text(read_file_text(path, "a tokenizer file"), path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const TokenizerModel& m = *model_;
  const size_t bad = unicode::find_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    fail("encode: text is not valid UTF-8 at byte {} (found byte 0x{:02X})", bad,
         static_cast<unsigned char>(text[bad]));
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  bpe::WordCache& cache = word_cache_for(m);
  std::string buffer;
  size_t pos = 0;
  AddedTokenMatcher::Match match;
  while (m.raw_added.find(text, pos, match)) {
    if (match.begin > pos)
      encode_segment(m, cache, text.substr(pos, match.begin - pos), buffer, out);
    out.push_back(match.id);
    pos = match.begin + match.size;
  }
  if (pos < text.size()) encode_segment(m, cache, text.substr(pos), buffer, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const TokenizerModel& m = *model_;
  std::string bytes;
  for (const int32_t id : ids) {
    if (!is_valid_id(id)) {
      fail("decode: token id {} is not in the vocabulary (valid ids are 0..{} with a token)", id,
           m.vocab_size - 1);
    }
    const auto i = static_cast<size_t>(id);
    bytes.append(m.decode_bytes, m.decode_offsets[i],
                 m.decode_offsets[i + 1] - m.decode_offsets[i]);
  }
  std::string text;
  byte_level::append_utf8_lossy(text, bytes);
  return text;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                          int threads) const {
  std::vector<std::vector<int32_t>> results(texts.size());
  size_t workers = threads > 0 ? static_cast<size_t>(threads)
                               : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, texts.size());
  if (workers <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) results[i] = encode(texts[i]);
    return results;
  }
  // note: texts are handed out in small chunks from a shared counter, so
  // uneven text lengths still keep every thread busy.
  constexpr size_t kChunk = 16;
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (;;) {
      const size_t begin = next.fetch_add(kChunk);
      if (begin >= texts.size()) return;
      const size_t end = std::min(begin + kChunk, texts.size());
      try {
        for (size_t i = begin; i < end; ++i) results[i] = encode(texts[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(texts.size());
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return results;
}

int64_t Tokenizer::vocab_size() const { return model_->vocab_size; }

bool Tokenizer::is_valid_id(int32_t id) const {
  return id >= 0 && id < model_->vocab_size && model_->id_known[static_cast<size_t>(id)] != 0;
}

}  // namespace qtk
