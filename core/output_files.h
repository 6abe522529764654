// Files written beside an output: the parts of its path, the names of
// short-lived files and directories next to it (".NAME<marker><pid>.<8
// hex>": convert's temporary pack, synth's staging directory), how a later
// run tells whether the process that made one is still running (so that
// what a SIGKILL left can be removed), and the directory sync after a
// rename into place.
#pragma once

#include <string>
#include <string_view>

namespace qtk {

// Directory part of a path ("." when there is none, "/" for the root).
std::string directory_of(const std::string& path);
// Last component of a path.
std::string basename_of(const std::string& path);

// Renames `from` to `to` unless a file is at `to` (RENAME_NOREPLACE; on a
// file system without it, link() + unlink(), which refuse an existing name
// too; without hard links either, a check, then the rename). false, errno
// set, when it did not: EEXIST when a file is at `to`.
bool rename_noreplace(const std::string& from, const std::string& to);

// fsync()s the directory `dir` (a rename into it, its new entries); false,
// errno set, when it cannot be opened or synced.
bool fsync_directory(const std::string& dir);

// "DIR/.NAME<marker><pid>." for this process (8 random hex digits follow),
// NAME cut short at a UTF-8 character boundary when the whole name would
// pass DIR's name length limit.
// note: the tail adds ~20 bytes, so an output name close to NAME_MAX had no
// temporary name; temp_owner_pid reads only the tail, so a shortened name
// is recognised all the same.
std::string temp_name_prefix(const std::string& dir, const std::string& name,
                             std::string_view marker);

// The owner pid of ".NAME<marker><pid>.<8 hex>", else 0 (not such a name).
long temp_owner_pid(std::string_view name, std::string_view marker);

// Decimal digits as a pid (at most 9 digits); 0 when they are not one.
long parse_pid(std::string_view digits);

// The widest pid this system can give a process: pid_max - 1 from
// /proc/sys/kernel/pid_max (read once), at least this process's pid; the
// kernel's ceiling, 4194303, when /proc cannot say.
// note: names derived with a pid are length-checked at this width, so a
// later process with a longer pid (a --devices worker, a resumed run) still
// finds its names within the file system's limit.
long widest_pid();

// Whether process `pid` may still be running.
// note: kill(pid, 0) fails with ESRCH only when no such process exists; a
// live process of another user (EPERM) or a reused pid counts as running,
// so the worst case is a leftover kept, never a running process's file
// removed. Files written over NFS from several hosts would need the host in
// the name too; this does not cover that.
bool process_running(long pid);

}  // namespace qtk
