// Helpers shared by the fuzz entry points (tests/fuzz/*_fuzz.cpp).
//
// Each entry point takes the fuzzer's bytes, calls one real parsing entry
// point of qtk, and treats qtk::Error as the expected answer to bad input.
// Anything else — another exception type, a broken invariant, a sanitizer
// report — is a finding: the entry lets it escape or calls fuzz_check_failed,
// which aborts so that libFuzzer (and the replay test) see a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtk::fuzz {

// A private directory for the files an API needs a path for, created on first
// use (under $TMPDIR or /tmp) and removed at exit.
const std::string& scratch_dir();

// Writes `size` bytes to scratch_dir()/name (replacing it) and returns the
// path. Aborts on a system error (that is the harness failing, not qtk).
std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size);

// Makes scratch_dir()/link point at `target` (a fixture), once.
void link_scratch_file(const std::string& link, const std::string& target);

// Prints "fuzz invariant broken: <what>" to stderr and aborts.
[[noreturn]] void fuzz_check_failed(std::string_view what);

// Checks an invariant; on failure reports `what`.
inline void fuzz_check(bool ok, std::string_view what) {
  if (!ok) fuzz_check_failed(what);
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace qtk::fuzz
