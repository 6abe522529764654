// Finds added tokens (<|im_start|>, <think>, ...) in text: leftmost match,
// longest at that position, as HF's Aho-Corasick with LeftmostLongest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qtk {

class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t size;
    int32_t id;
  };

  void add(std::string content, int32_t id);  // content must not be empty
  bool empty() const { return count_ == 0; }
  // The leftmost-longest match at or after `from`; false when there is none.
  bool find(std::string_view text, size_t from, Match& match) const;

 private:
  struct Candidate {
    std::string content;
    int32_t id;
  };
  // note: added tokens are few (26 in Qwen3), so a first-byte bucket holding
  // candidates sorted longest first is as fast as a trie and much simpler.
  std::array<std::vector<Candidate>, 256> by_first_byte_{};
  size_t count_ = 0;
  int single_first_byte_ = -1;  // the only first byte when all tokens share it
  bool mixed_first_bytes_ = false;
};

}  // namespace qtk
