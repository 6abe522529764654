// `inspect X.pack [--verify]`: prints the manifest summary of a pack.
#pragma once

#include <string>

namespace qtk {

// Prints the summary on stdout; with `verify`, recomputes every checksum,
// runs every check generate makes at load, and prints "verify: N entries OK". Throws qtk::Error on
// a bad pack or a checksum mismatch (the caller prints it and exits 1). Returns 0.
int inspect_pack(const std::string& path, bool verify);

}  // namespace qtk
