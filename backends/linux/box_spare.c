/* Spare box dirs: a removed box's empty dir, kept under <parent>/.spare/
 * and renamed to the next box's path instead of an rmdir now and a mkdir
 * then.  A rename makes no inode; a mkdir does, and on an ext4 without a
 * journal each new inode is searched for past every one deleted in the
 * last 60 s (docs/benchmarks.md, "Churn"), a cost that grows with the rate
 * of boxes.  Only where <parent>/.spare exists (the daemon makes it, and
 * removes what a previous daemon left there: daemon/recover.lua): a bare
 * tp_linux_box_start/destroy caller keeps mkdir and rmdir.  The list is the
 * process's, under a lock (starts and removals run in the thread pool). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "linux_int.h"
#include "utils.h"

static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static char *spare[TP__SPARE_DIRS_MAX]; /* "<parent>/.spare/<old id>", newest last */
static int n_spare;

/* "<parent of box_dir>/.spare/" + (name ? name : ""), or -1 if too long or
 * box_dir has no parent. */
static int spare_path(const char *box_dir, const char *name, char *out, size_t len) {
  const char *slash = strrchr(box_dir, '/');
  int n;
  if (slash == NULL || slash == box_dir || slash[1] == '\0')
    return -1;
  n = snprintf(out, len, "%.*s/" TP__SPARE_DIR "/%s", (int) (slash - box_dir), box_dir,
               name != NULL ? name : "");
  return n < 0 || (size_t) n >= len ? -1 : 0;
}

int tp__dir_only(int dfd, const char *const *names) {
  char buf[512];
  long n;
  while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0)
    for (long off = 0; off < n;) {
      struct dirent64 *d = (struct dirent64 *) (buf + off);
      int known = strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0;
      for (int i = 0; !known && names != NULL && names[i] != NULL; i++)
        known = strcmp(d->d_name, names[i]) == 0;
      if (!known)
        return 0;
      off += d->d_reclen;
    }
  return n < 0 ? -1 : 1;
}

int tp__spare_dir_take(const char *box_dir) {
  char prefix[TP__PATH_MAX_LEN + 96];
  char *got = NULL;
  size_t plen;
  int r, e;

  if (spare_path(box_dir, NULL, prefix, sizeof(prefix)) < 0)
    return -1;
  plen = strlen(prefix);
  pthread_mutex_lock(&spare_lock);
  for (int i = n_spare - 1; i >= 0 && got == NULL; i--)
    if (strncmp(spare[i], prefix, plen) == 0 && strchr(spare[i] + plen, '/') == NULL) {
      got = spare[i];
      memmove(&spare[i], &spare[i + 1], (size_t) (n_spare - i - 1) * sizeof(spare[0]));
      n_spare--;
    }
  pthread_mutex_unlock(&spare_lock);
  if (got == NULL)
    return -1;
  r = rename(got, box_dir);
  e = errno;
  if (r < 0)
    rmdir(got); /* whatever it was, it is no spare any more */
  free(got);
  errno = e;
  return r;
}

int tp__spare_dir_keep(const char *box_dir) {
  char to[TP__PATH_MAX_LEN + 96];
  const char *name = strrchr(box_dir, '/');
  cleanup_close int dfd = -1;
  char *copy;
  int full;

  if (name == NULL || spare_path(box_dir, name + 1, to, sizeof(to)) < 0)
    return -1;
  pthread_mutex_lock(&spare_lock);
  full = n_spare >= TP__SPARE_DIRS_MAX;
  pthread_mutex_unlock(&spare_lock);
  if (full)
    return -1;
  /* What a box with a disk cap leaves: the agent's socket and the pool's
   * name (box.c).  Anything else (a box without one: upper/, work/) is
   * the rmtree's. */
  dfd = open(box_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return -1;
  if ((unlinkat(dfd, TP__AGENT_SOCK, 0) < 0 && errno != ENOENT) ||
      (unlinkat(dfd, TP__POOL_LINK, 0) < 0 && errno != ENOENT))
    return -1;
  if (fremovexattr(dfd, TP__POOL_XATTR) < 0 && errno != ENODATA && errno != EOPNOTSUPP)
    return -1;
  if (tp__dir_only(dfd, NULL) != 1)
    return -1;
  copy = strdup(to);
  if (copy == NULL)
    return -1;
  /* ENOENT: no .spare dir, so no spares wanted here */
  if (rename(box_dir, to) < 0) {
    free(copy);
    return -1;
  }
  pthread_mutex_lock(&spare_lock);
  if (n_spare < TP__SPARE_DIRS_MAX) {
    spare[n_spare++] = copy;
    copy = NULL;
  }
  pthread_mutex_unlock(&spare_lock);
  if (copy != NULL) { /* filled meanwhile: removed after all */
    rmdir(copy);
    free(copy);
  }
  return 0;
}
