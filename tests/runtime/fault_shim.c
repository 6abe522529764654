/* An LD_PRELOAD library for the output-safety tests: it makes chosen system
 * calls of the real generate and merge fail, or stops the process at them,
 * as an immutable file, a file system without RENAME_NOREPLACE, a failing
 * disk, another process or a crash would. Each fault is set by an
 * environment variable; with none set every call goes straight through.
 *
 *   QTK_FAULT_RENAME_TO=SUFFIX        a rename onto a path ending in SUFFIX
 *                                     fails with EPERM (`chattr +i` on it)
 *   QTK_FAULT_KILL_AT_RENAME_TO=SUFFIX  ... the process is killed by
 *                                     SIGKILL instead (a crash before it)
 *   QTK_FAULT_CREATE_AT_RENAME_TO=SUFFIX  just before such a rename a file
 *                                     holding "appeared\n" is created there
 *                                     (another process writing it)
 *   QTK_FAULT_NO_RENAME_NOREPLACE=1   renameat2 with RENAME_NOREPLACE fails
 *                                     with EINVAL (as on such file systems)
 *   QTK_FAULT_DIR_FSYNC=1             fsync of a directory fails with EIO
 *   QTK_FAULT_SIGNAL_AT_FSYNC=SIG:N   after the N-th fsync of a regular
 *                                     file the process raises SIG
 *
 * note: the programs call rename(), renameat2() and fsync() through the
 * dynamic linker, so these definitions take their place; the real calls are
 * reached with dlsym(RTLD_NEXT). Written in C: glibc's C++ declarations of
 * these functions carry exception specifications a definition must match.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE 1
#endif

typedef int (*rename_fn)(const char*, const char*);
typedef int (*renameat2_fn)(int, const char*, int, const char*, unsigned int);
typedef int (*fsync_fn)(int);

static int ends_with(const char* path, const char* env) {
  const char* suffix = getenv(env);
  if (suffix == NULL || *suffix == '\0' || path == NULL) return 0;
  const size_t n = strlen(path), m = strlen(suffix);
  return n >= m && strcmp(path + n - m, suffix) == 0;
}

/* The faults of a rename onto `to`: nonzero when the call must fail. */
static int rename_fault(const char* to) {
  if (ends_with(to, "QTK_FAULT_KILL_AT_RENAME_TO")) kill(getpid(), SIGKILL);
  if (ends_with(to, "QTK_FAULT_CREATE_AT_RENAME_TO")) {
    const int fd = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (write(fd, "appeared\n", 9) != 9) {
      }
      close(fd);
    }
  }
  if (ends_with(to, "QTK_FAULT_RENAME_TO")) {
    errno = EPERM;
    return 1;
  }
  return 0;
}

int rename(const char* from, const char* to) {
  if (rename_fault(to)) return -1;
  return ((rename_fn)dlsym(RTLD_NEXT, "rename"))(from, to);
}

int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned int flags) {
  if (rename_fault(to)) return -1;
  if ((flags & RENAME_NOREPLACE) && getenv("QTK_FAULT_NO_RENAME_NOREPLACE")) {
    errno = EINVAL;
    return -1;
  }
  return ((renameat2_fn)dlsym(RTLD_NEXT, "renameat2"))(from_dir, from, to_dir, to, flags);
}

int fsync(int fd) {
  struct stat st;
  const int is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  if (is_dir && getenv("QTK_FAULT_DIR_FSYNC")) {
    errno = EIO;
    return -1;
  }
  const int rc = ((fsync_fn)dlsym(RTLD_NEXT, "fsync"))(fd);
  const char* at = getenv("QTK_FAULT_SIGNAL_AT_FSYNC");
  if (!is_dir && at != NULL) {
    static int count = 0;
    const int sig = atoi(at);
    const char* colon = strchr(at, ':');
    const int nth = colon ? atoi(colon + 1) : 1;
    if (++count == nth) raise(sig);
  }
  return rc;
}
