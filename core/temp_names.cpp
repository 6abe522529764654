#include "core/temp_names.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>

#include <fmt/format.h>

namespace qtk {

std::string temp_name_prefix(const std::string& dir, const std::string& name,
                             std::string_view marker) {
  const std::string tail = fmt::format("{}{}.", marker, ::getpid());
  const long limit = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name_max = limit > 0 ? static_cast<size_t>(limit) : NAME_MAX;
  const size_t fixed = 1 + tail.size() + 8;  // ".", the tail, the hex digits
  size_t keep = name.size();
  if (fixed + keep > name_max) {
    keep = name_max > fixed + 1 ? name_max - fixed : 1;
    while (keep > 1 && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  }
  return fmt::format("{}/.{}{}", dir, name.substr(0, keep), tail);
}

long parse_pid(std::string_view digits) {
  if (digits.empty() || digits.size() > 9) return 0;
  long v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v;
}

long temp_owner_pid(std::string_view name, std::string_view marker) {
  if (name.size() < 2 || name[0] != '.') return 0;
  const size_t last_dot = name.rfind('.');
  if (last_dot == std::string_view::npos || name.size() - last_dot - 1 != 8) return 0;
  for (char c : name.substr(last_dot + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return 0;
  const std::string_view head = name.substr(0, last_dot);
  const size_t at = head.rfind(marker);
  if (at == std::string_view::npos || at == 0) return 0;
  return parse_pid(head.substr(at + marker.size()));
}

bool process_running(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

}  // namespace qtk
