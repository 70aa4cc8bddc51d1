/* tp_rmtree: rm -rf that never follows a symlink and never leaves the
 * filesystem (mount) it started on.
 *
 * A box's upper dir is written by untrusted code, so the tree may be deeper
 * than any recursion or fd budget, hold 0000-mode dirs, and symlinks
 * anywhere.  The walk holds one directory fd at a time: it reads a directory
 * whole (unlinking non-directories, remembering subdirectories), descends
 * with openat2(RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS), and climbs back with
 * "..", checking the parent's identity (dev, ino) against the one recorded on
 * the way down.  Memory grows with depth and width, fds do not. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rmtree.h"
#include "utils.h"

#define TP__RESCANS_MAX 8 /* a dir still not empty after this many passes: give up */

typedef struct level_s {
  dev_t dev;
  ino_t ino;
  char *pending; /* NUL-separated names of subdirs still to remove; the last
                    one is the subdir being walked while we are below it */
  size_t len;    /* bytes used in pending */
  size_t cap;
  size_t visiting; /* offset in pending of the subdir being walked */
  int rescans;
} level_t;

typedef struct walk_s {
  level_t *lv;
  size_t depth; /* index of the current level */
  size_t cap;
  const char *top;
} walk_t;

static void walk_free(walk_t *w) {
  if (w->lv == NULL)
    return;
  for (size_t i = 0; i <= w->depth; i++)
    free(w->lv[i].pending);
  free(w->lv);
  w->lv = NULL;
}

static int open_beneath(int dfd, const char *name) {
  struct open_how how;
  int fd;
  memset(&how, 0, sizeof(how));
  how.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  do
    fd = (int) syscall(SYS_openat2, dfd, name, &how, sizeof(how));
  while (fd < 0 && errno == EAGAIN); /* openat2 may ask for a retry */
  return fd;
}

/* Opens subdir `name` of dfd, making it readable and searchable first if we
 * (say, without CAP_DAC_OVERRIDE) cannot. */
static int open_subdir(int dfd, const char *name) {
  int fd = open_beneath(dfd, name);
  if (fd < 0 && errno == EACCES) {
    if (fchmodat(dfd, name, 0700, AT_SYMLINK_NOFOLLOW) < 0)
      return -1;
    fd = open_beneath(dfd, name);
  }
  return fd;
}

/* unlinkat, making the dir writable when that is what stands in the way. */
static int unlink_in(int dfd, const char *name, int flags) {
  if (unlinkat(dfd, name, flags) == 0 || errno == ENOENT)
    return 0;
  if (errno != EACCES && errno != EPERM)
    return -1;
  if (fchmod(dfd, 0700) < 0)
    return -1;
  if (unlinkat(dfd, name, flags) == 0 || errno == ENOENT)
    return 0;
  return -1;
}

static int remember(level_t *l, const char *name) {
  size_t n = strlen(name) + 1;
  if (l->len + n > l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char *p;
    while (cap < l->len + n)
      cap *= 2;
    p = realloc(l->pending, cap);
    if (p == NULL)
      return -1;
    l->pending = p;
    l->cap = cap;
  }
  memcpy(l->pending + l->len, name, n);
  l->len += n;
  return 0;
}

/* Reads the directory at fd once: unlinks what is not a directory, queues
 * the subdirectories on l. */
static int scan(int fd, level_t *l, tp_error_t *err) {
  cleanup_close int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  DIR *d;
  struct dirent *e;
  int ret = 0;

  if (dup_fd < 0)
    return tp_error_errno(err, errno, "dup");
  d = fdopendir(dup_fd);
  if (d == NULL)
    return tp_error_errno(err, errno, "fdopendir");
  dup_fd = -1; /* owned by d */
  l->len = 0;
  for (;;) {
    errno = 0;
    e = readdir(d);
    if (e == NULL) {
      if (errno != 0)
        ret = tp_error_errno(err, errno, "readdir");
      break;
    }
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) {
      if (unlink_in(fd, e->d_name, 0) < 0) {
        ret = tp_error_errno(err, errno, "unlink '%s'", e->d_name);
        break;
      }
      continue;
    }
    if (e->d_type == DT_UNKNOWN) {
      if (unlink_in(fd, e->d_name, 0) == 0)
        continue;
      if (errno != EISDIR) {
        ret = tp_error_errno(err, errno, "unlink '%s'", e->d_name);
        break;
      }
    }
    if (remember(l, e->d_name) < 0) {
      ret = tp_error_errno(err, ENOMEM, "remember '%s'", e->d_name);
      break;
    }
  }
  closedir(d);
  return ret;
}

/* The last queued subdir name of l, marked as the one being walked. */
static const char *last(level_t *l) {
  size_t start = l->len - 1; /* at the trailing NUL */
  while (start > 0 && l->pending[start - 1] != '\0')
    start--;
  l->visiting = start;
  return l->pending + start;
}

static int push(walk_t *w, int fd, const char *name, tp_error_t *err) {
  struct stat st;
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "fstat '%s'", name ? name : w->top);
  if (w->lv == NULL || w->depth + 1 == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 16;
    level_t *lv = realloc(w->lv, cap * sizeof(*lv));
    if (lv == NULL)
      return tp_error_errno(err, ENOMEM, "walk '%s'", w->top);
    w->lv = lv;
    w->cap = cap;
  }
  if (name != NULL)
    w->depth++;
  memset(&w->lv[w->depth], 0, sizeof(level_t));
  w->lv[w->depth].dev = st.st_dev;
  w->lv[w->depth].ino = st.st_ino;
  return 0;
}

/* Climbs from the current dir (fd) to its parent, which must be the dir we
 * came from, and removes the current one.  Returns the parent's fd, or -2
 * when the current dir must be scanned again (entries appeared). */
static int climb(walk_t *w, int fd, tp_error_t *err) {
  level_t *cur = &w->lv[w->depth], *up = &w->lv[w->depth - 1];
  const char *name = up->pending + up->visiting;
  cleanup_close int pfd = -1;
  struct stat st;
  int ret;

  pfd = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0)
    return tp_error_errno(err, errno, "open '%s/..'", name);
  if (fstat(pfd, &st) < 0)
    return tp_error_errno(err, errno, "fstat '%s/..'", name);
  if (st.st_dev != up->dev || st.st_ino != up->ino)
    return tp_error_set(err, EBUSY, "'%s' was moved during removal", name);
  if (unlink_in(pfd, name, AT_REMOVEDIR) < 0) {
    if (errno != ENOTEMPTY || ++cur->rescans > TP__RESCANS_MAX)
      return tp_error_errno(err, errno, "rmdir '%s'", name);
    return -2;
  }
  free(cur->pending);
  w->depth--;
  up->len = up->visiting; /* done with that name */
  ret = pfd;
  pfd = -1;
  return ret;
}

static int walk(walk_t *w, int top_fd, tp_error_t *err) {
  cleanup_close int fd = top_fd;
  int scanned = 0;

  if (push(w, fd, NULL, err) < 0)
    return -1;
  for (;;) {
    level_t *l = &w->lv[w->depth];
    const char *name;
    int next;

    if (!scanned) {
      if (scan(fd, l, err) < 0)
        return -1;
      scanned = 1;
    }
    if (l->len > 0) {
      name = last(l);
      next = open_subdir(fd, name);
      if (next < 0 && errno == ENOENT) {
        l->len = l->visiting;
        continue;
      }
      if (next < 0)
        return tp_error_errno(err, errno, "open '%s'", name);
      if (push(w, next, name, err) < 0) {
        close(next);
        return -1;
      }
      close(fd);
      fd = next;
      scanned = 0;
      continue;
    }
    if (w->depth == 0)
      return 0; /* the caller removes the top */
    next = climb(w, fd, err);
    if (next == -2) {
      scanned = 0;
      continue;
    }
    if (next < 0)
      return -1;
    close(fd);
    fd = next;
  }
}

int tp_rmtree(const char *path, tp_error_t *err) {
  walk_t w = {NULL, 0, 0, path};
  struct stat st;
  int fd, r, tries = 0;

  if (lstat(path, &st) < 0) {
    if (errno == ENOENT)
      return 0;
    return tp_error_errno(err, errno, "lstat '%s'", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path) < 0 && errno != ENOENT)
      return tp_error_errno(err, errno, "unlink '%s'", path);
    return 0;
  }
  for (;;) {
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == EACCES && chmod(path, 0700) == 0)
      fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT)
        return 0;
      return tp_error_errno(err, errno, "open '%s'", path);
    }
    r = walk(&w, fd, err);
    walk_free(&w);
    w.depth = w.cap = 0;
    if (r < 0)
      return tp_error_prefix(err, "remove '%s'", path);
    if (rmdir(path) == 0 || errno == ENOENT)
      return 0;
    if (errno != ENOTEMPTY || ++tries > TP__RESCANS_MAX)
      return tp_error_errno(err, errno, "rmdir '%s'", path);
  }
}
