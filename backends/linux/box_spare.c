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

static tp__spares_t spares = TP__SPARES_INIT; /* "<parent>/.spare/<old id>" */

int tp__spares_full(tp__spares_t *s) {
  int full;
  pthread_mutex_lock(&s->lock);
  full = s->n >= TP__SPARES_MAX;
  pthread_mutex_unlock(&s->lock);
  return full;
}

int tp__spares_put(tp__spares_t *s, char *path) {
  int r = -1;
  pthread_mutex_lock(&s->lock);
  if (s->n < TP__SPARES_MAX) {
    s->path[s->n++] = path;
    r = 0;
  }
  pthread_mutex_unlock(&s->lock);
  return r;
}

char *tp__spares_take(tp__spares_t *s, const char *prefix) {
  size_t plen = strlen(prefix);
  char *got = NULL;
  pthread_mutex_lock(&s->lock);
  for (int i = s->n - 1; i >= 0 && got == NULL; i--)
    if (strncmp(s->path[i], prefix, plen) == 0 && strchr(s->path[i] + plen, '/') == NULL) {
      got = s->path[i];
      memmove(&s->path[i], &s->path[i + 1], (size_t) (s->n - i - 1) * sizeof(s->path[0]));
      s->n--;
    }
  pthread_mutex_unlock(&s->lock);
  return got;
}

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
  char *got;
  int r, e;

  if (spare_path(box_dir, NULL, prefix, sizeof(prefix)) < 0)
    return -1;
  got = tp__spares_take(&spares, prefix);
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

  if (name == NULL || spare_path(box_dir, name + 1, to, sizeof(to)) < 0)
    return -1;
  if (tp__spares_full(&spares))
    return -1;
  /* What a box with a disk cap leaves: the pool's name (box.c), an xattr
   * or a link, and, off the pool, the agent's socket.  Anything else (a
   * box without one: upper/, work/) is the rmtree's.  A box named by the
   * xattr is on the pool: its socket was in its subvolume and it has no
   * link, so nothing is unlinked (each was a failed call a destroy). */
  dfd = open(box_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return -1;
  if (fremovexattr(dfd, TP__POOL_XATTR) < 0) {
    if (errno != ENODATA && errno != EOPNOTSUPP)
      return -1;
    if ((unlinkat(dfd, TP__AGENT_SOCK, 0) < 0 && errno != ENOENT) ||
        (unlinkat(dfd, TP__POOL_LINK, 0) < 0 && errno != ENOENT))
      return -1;
  }
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
  if (tp__spares_put(&spares, copy) < 0) { /* filled meanwhile: removed after all */
    rmdir(copy);
    free(copy);
  }
  return 0;
}
