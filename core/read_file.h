// Whole small files read into memory with read(2), so that an I/O error is
// reported as one.
// note: std::ifstream's stream buffer ends a read at an error as at the
// end of the file (`ss << in.rdbuf()` sets no error flag), so a failing disk
// looked like a short file: generate's --resume cut its partial results back
// to the lines it had read, compare passed on the cases it had read, and a
// chat template read as empty.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace qtk {

// The contents of `path` ("-": standard input). Fails with one line naming
// the file and `what` ("the run header", "a chat template"): "PATH: cannot
// open WHAT for reading: <reason>", "PATH: cannot read WHAT: <reason>",
// "PATH: is a directory; expected WHAT", or, past max_bytes, "PATH: expected
// WHAT of at most N bytes, found M bytes". A FIFO or character device is read
// to its end.
std::string read_file_text(const std::string& path, std::string_view what,
                           uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

}  // namespace qtk
