// Leftovers of a convert that was killed (SIGKILL, a crash, a power cut):
// its temporary pack (".NAME.tmp.<pid>.<8 hex>") and its archive extraction
// directory (".qtk-extract.<pid>.<6 chars>"). Both names carry the owner's
// pid, so a later convert writing into the same directory removes those
// whose owner is no longer running.
#pragma once

#include <string>
#include <vector>

namespace qtk {

// The extraction directory name for this process (a mkdtemp template).
std::string extract_dir_template(const std::string& parent_dir);

// Removes, in `dir`, every temporary pack and extraction directory whose
// owner pid is not running, that belongs to this user. Returns one line per
// removal ("removed stale temporary file X left by pid N, which is no
// longer running") for the caller to print. Errors are ignored (best effort:
// leftovers never stop a conversion).
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace qtk
