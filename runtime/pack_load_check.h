// The checks generate makes when it loads a pack, without running anything:
// for `inspect --verify`, so that it never passes a pack generate refuses.
#pragma once

#include <cstddef>

namespace qtk {

class Pack;

// Recomputes every checksum, parses the tokenizer as generate does, and
// builds the CPU model (every tensor's presence, dtype and shape as the
// model reads it). Throws qtk::Error naming the problem; returns the number
// of entries whose checksum was checked.
size_t check_pack_loads(const Pack& pack);

}  // namespace qtk
