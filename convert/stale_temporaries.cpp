#include "convert/stale_temporaries.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "core/output_files.h"

namespace qtk {

namespace {

constexpr std::string_view kExtractPrefix = ".qtk-extract.";
constexpr std::string_view kTempMarker = ".tmp.";

// The owner pid of a temporary name, or 0 when `name` is not one of ours.
// Pack: ".NAME.tmp.<pid>.<8 hex>"; extraction: ".qtk-extract.<pid>.<6 chars>".
long owner_pid(std::string_view name, bool is_dir) {
  if (name.size() < 2 || name[0] != '.') return 0;
  if (is_dir) {
    if (name.substr(0, kExtractPrefix.size()) != kExtractPrefix) return 0;
    const std::string_view rest = name.substr(kExtractPrefix.size());
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos || rest.size() - dot - 1 != 6) return 0;
    return parse_pid(rest.substr(0, dot));
  }
  return temp_owner_pid(name, kTempMarker);
}

}  // namespace

std::string extract_dir_template(const std::string& parent_dir) {
  return fmt::format("{}/{}{}.XXXXXX", parent_dir, kExtractPrefix, ::getpid());
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] != '.' || name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
    const bool is_dir = S_ISDIR(st.st_mode);
    if (!is_dir && !S_ISREG(st.st_mode)) continue;
    const long pid = owner_pid(name, is_dir);
    if (pid <= 0 || pid == ::getpid() || process_running(pid)) continue;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (!ec) {
      removed.push_back(
          fmt::format("removed stale temporary {} {} left by pid {}, which is no longer running",
                      is_dir ? "directory" : "file", path, pid));
    }
  }
  ::closedir(d);
  return removed;
}

}  // namespace qtk
