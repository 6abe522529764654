#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

namespace qtk {

void AddedTokenMatcher::add(std::string content, int32_t id) {
  const auto first = static_cast<unsigned char>(content[0]);
  auto& bucket = by_first_byte_[first];
  bucket.push_back(Candidate{std::move(content), id});
  std::stable_sort(bucket.begin(), bucket.end(), [](const Candidate& a, const Candidate& b) {
    return a.content.size() > b.content.size();
  });
  if (count_ == 0) {
    single_first_byte_ = first;
  } else if (single_first_byte_ != first) {
    mixed_first_bytes_ = true;
  }
  ++count_;
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, Match& match) const {
  if (count_ == 0) return false;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = from;
  while (i < n) {
    if (!mixed_first_bytes_) {
      const void* hit = std::memchr(s + i, single_first_byte_, n - i);
      if (!hit) return false;
      i = static_cast<size_t>(static_cast<const unsigned char*>(hit) - s);
    }
    for (const Candidate& c : by_first_byte_[s[i]]) {
      if (c.content.size() <= n - i &&
          std::memcmp(s + i, c.content.data(), c.content.size()) == 0) {
        match = Match{i, c.content.size(), c.id};
        return true;
      }
    }
    ++i;
  }
  return false;
}

}  // namespace qtk
