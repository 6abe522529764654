#include "tokenizer/chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "tokenizer/chat/py_string.h"

namespace qtk::jinja {

namespace {

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& source) : source_(source) {
    // note: jinja2 turns \r\n and \r into \n everywhere (string literals
    // included) before lexing, then drops one trailing newline.
    src_.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\r') {
        src_ += '\n';
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      } else {
        src_ += text[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t open = find_tag_open(pos_);
      if (open == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      std::string text = src_.substr(pos_, open - pos_);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only whitespace between the line start and the tag
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            rstrip_ws(text.substr(l_pos)).empty()) {
          text.resize(l_pos);
        }
      }
      emit_text(text, pos_);
      pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        line_starting = lex_comment(open);
      } else if (kind == '%') {
        if (lex_raw(open)) {
          line_starting = !out_.empty() && ends_with_newline_;
          continue;
        }
        push(Token::Type::kBlockBegin, "", open);
        line_starting = lex_tag_body('%', open);
      } else {
        push(Token::Type::kVarBegin, "", open);
        line_starting = lex_tag_body('}', open);
      }
    }
    push(Token::Type::kEof, "", src_.size());
    return std::move(out_);
  }

 private:
  SourcePos pos_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    const size_t start = line_starts_[line - 1];
    // note: columns count code points; tokens come in source order, so the
    // count continues from the previous token on the same line.
    if (memo_line_ != line || memo_offset_ > offset) {
      memo_line_ = line;
      memo_offset_ = start;
      memo_column_ = 1;
    }
    memo_column_ += py_len(std::string_view(src_).substr(memo_offset_, offset - memo_offset_));
    memo_offset_ = offset;
    return {static_cast<int>(line), static_cast<int>(memo_column_)};
  }

  [[noreturn]] void fail(const std::string& message, size_t offset) const {
    const SourcePos p = pos_of(offset);
    throw TemplateError("TemplateSyntaxError", message, source_, p.line, p.column);
  }

  void push(Token::Type type, std::string value, size_t offset) {
    out_.push_back(Token{type, std::move(value), pos_of(offset)});
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) push(Token::Type::kText, text, offset);
  }

  size_t find_tag_open(size_t from) const {
    size_t p = from;
    while ((p = src_.find('{', p)) != std::string::npos) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
      ++p;
    }
    return std::string::npos;
  }

  static std::string rstrip_ws(const std::string& s) {
    return py_strip(s, std::nullopt, false, true);
  }

  // Skips whitespace after a "-" tag end (Python's \s, Unicode included);
  // returns whether the last character skipped was a newline.
  bool skip_ws_after() {
    bool nl = false;
    while (pos_ < src_.size()) {
      size_t len = 0;
      const char32_t c = decode_at(pos_, len);
      if (!py_isspace(c)) break;
      nl = c == '\n';
      pos_ += len;
    }
    return nl;
  }

  // The code point at `at` and its length in bytes.
  char32_t decode_at(size_t at, size_t& len) const {
    const unsigned char b = static_cast<unsigned char>(src_[at]);
    len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    len = std::min(len, src_.size() - at);
    const std::u32string cs = utf8_decode(std::string_view(src_).substr(at, len));
    return cs.empty() ? 0 : cs[0];
  }

  // After a block or comment end: trim_blocks drops one newline.
  bool after_block_end(char sign) {
    if (sign == '-') return skip_ws_after();
    if (sign == '+') return false;
    if (pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  bool lex_comment(size_t open) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("unclosed comment ({# without #})", open);
    const char sign =
        end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    pos_ = end + 2;
    return after_block_end(sign);
  }

  // {% raw %}...{% endraw %}: the text between, untouched.
  bool lex_raw(size_t open) {
    size_t p = pos_;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    char sign = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    after_block_end(sign);
    // find {%[-+]? endraw [-+]?%}
    size_t q = pos_;
    while (true) {
      q = src_.find("{%", q);
      if (q == std::string::npos) fail("unclosed {% raw %} block", open);
      size_t r = q + 2;
      char open_sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) open_sign = src_[r++];
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      if (src_.compare(r, 6, "endraw") != 0) {
        q += 2;
        continue;
      }
      r += 6;
      while (r < src_.size() && std::isspace(static_cast<unsigned char>(src_[r]))) ++r;
      char end_sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) {
        q += 2;
        continue;
      }
      std::string body = src_.substr(pos_, q - pos_);
      if (open_sign == '-') body = rstrip_ws(body);
      emit_text(body, pos_);
      pos_ = r + 2;
      ends_with_newline_ = after_block_end(end_sign);
      return true;
    }
  }

  // Tokens of a {% %} or {{ }} tag up to its end; returns whether the
  // end (with what it trimmed) finished a line.
  bool lex_tag_body(char closer, size_t open) {
    int depth = 0;  // open brackets: a tag end inside them is not an end
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) ++pos_;
      if (pos_ >= src_.size())
        fail(closer == '%' ? "unclosed block tag ({% without %})"
                           : "unclosed expression ({{ without }})",
             open);
      const size_t start = pos_;
      if (depth == 0) {
        char sign = '\0';
        size_t p = pos_;
        if (src_[p] == '-' || (src_[p] == '+' && closer == '%')) sign = src_[p++];
        if (p + 1 < src_.size() && src_[p] == closer && src_[p + 1] == '}') {
          pos_ = p + 2;
          if (closer == '%') {
            push(Token::Type::kBlockEnd, "", start);
            return after_block_end(sign);
          }
          push(Token::Type::kVarEnd, "", start);
          return sign == '-' ? skip_ws_after() : false;
        }
      }
      const char c = src_[pos_];
      if (c == '\'' || c == '"') {
        push(Token::Type::kString, read_string(), start);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        push(Token::Type::kName, src_.substr(pos_, e - pos_), start);
        pos_ = e;
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : kTwo)
          if (src_.compare(pos_, 2, t) == 0) op = t;
        if (op.empty()) {
          if (std::strchr("+-*/%~<>=()[]{},.:|;", c) == nullptr || c == '\0')
            fail(fmt::format("unexpected character '{}' in a tag", std::string(1, c)), pos_);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        push(Token::Type::kOp, op, start);
        pos_ += op.size();
      }
    }
  }

  void lex_number() {
    const size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
                                    (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                     std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    push(is_float ? Token::Type::kFloat : Token::Type::kInt, text, start);
  }

  // A Python string literal (escapes as "unicode-escape" decodes them).
  std::string read_string() {
    const size_t start = pos_;
    const char q = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail("unterminated string literal", start);
      const char c = src_[pos_++];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) fail("unterminated string literal", start);
      const char e = src_[pos_++];
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (pos_ >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[pos_])))
            fail(fmt::format("truncated \\{} escape in a string literal", std::string(1, e)), pos_);
          const char h = src_[pos_++];
          v = v * 16 +
              static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                        ? h - '0'
                                        : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
        }
        if ((v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF)
          fail("a string literal escape names a surrogate or an invalid code point", pos_);
        utf8_append(out, static_cast<char32_t>(v));
      };
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        case 'N':
          fail("\\N{...} escapes are not supported", pos_ - 2);
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++i)
              v = v * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            utf8_append(out, static_cast<char32_t>(v));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }

  const std::string& source_;
  std::string src_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  mutable size_t memo_line_ = 0, memo_offset_ = 0;
  mutable int64_t memo_column_ = 1;
  bool ends_with_newline_ = false;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex_template(std::string_view text, const std::string& source) {
  return Lexer(text, source).run();
}

}  // namespace qtk::jinja
