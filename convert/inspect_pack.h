// `inspect X.pack [--verify] [--tensors]`: prints the manifest summary of a pack.
#pragma once

#include <string>

namespace qtk {

// Prints the summary on stdout; with `tensors`, then one line per tensor
// (name, dtype, shape, bytes; an FP8 weight's block scales); with `verify`,
// recomputes every checksum, runs every check generate makes at load, and
// prints "verify: N entries OK". Throws qtk::Error on a bad pack or a
// checksum mismatch (the caller prints it and exits 1). Returns 0.
int inspect_pack(const std::string& path, bool verify, bool tensors);

}  // namespace qtk
