// JSON parsing that refuses what nlohmann's DOM parser would accept silently.
//
// note: nlohmann::json::parse keeps the last value of a duplicated key, so a
// crafted header could show one tensor to one reader and another to us. This
// parser builds the same DOM through the SAX interface and rejects a
// duplicated key in any object, naming the key and its path.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qtk {

// Returns the byte offset of the first invalid UTF-8 sequence in `bytes`
// (overlong forms, surrogates and code points above U+10FFFF are invalid),
// or std::string_view::npos when all of it is valid.
size_t find_invalid_utf8(std::string_view bytes);

// Parses `text` as one JSON document (UTF-8 validated first). `source` names
// the file in error messages. Throws qtk::Error on invalid UTF-8, a syntax
// error or a duplicated object key.
nlohmann::json parse_json_strict(std::string_view text, const std::string& source);

// Reads and parses a whole JSON file with parse_json_strict.
nlohmann::json load_json_file(const std::string& path);

}  // namespace qtk
