// Whole-file reads, line splitting and atomic replacement of small files
// (results, meta files), shared by generate and merge.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qtk {

// The file's bytes; `what` names it in the error ("the batch file").
std::string read_text_file(const std::string& path, const char* what);

// Splits into lines; a final line without '\n' counts, a final empty one does
// not; a '\r' before the '\n' is dropped.
std::vector<std::string_view> split_text_lines(std::string_view text);

// Replaces `path` atomically: a temp file in the same directory, fsync,
// rename, fsync of the directory. A failure leaves `path` as it was.
void replace_file_atomically(const std::string& path, const std::string& data);

}  // namespace qtk
