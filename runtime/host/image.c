/* tp_image_default_ensure: lays out the embedded busybox image.  Built in a
 * temp dir next to the target and renamed into place, so a reader sees no
 * image or a whole one; two daemons racing both build, one rename wins. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image.h"
#include "rmtree.h"
#include "utils.h"

#define TP__APPLET_MAX 255

typedef struct img_s {
  int dfd;   /* the temp root */
  uid_t uid; /* root in the box */
  gid_t gid;
} img_t;

static const struct {
  const char *path;
  mode_t mode;
  unsigned id_off; /* owner: base + id_off */
} img_dirs[] = {
    {"bin", 0755, 0},          {"sbin", 0755, 0}, {"usr", 0755, 0},  {"usr/bin", 0755, 0},
    {"usr/sbin", 0755, 0},     {"etc", 0755, 0},  {"root", 0700, 0}, {"home", 0755, 0},
    {"home/user", 0755, 1000}, {"tmp", 01777, 0}, {"proc", 0555, 0}, {"dev", 0755, 0},
    {"sys", 0555, 0},          {"mnt", 0755, 0},  {"run", 0755, 0},
};

static const struct {
  const char *path;
  const char *text;
} img_files[] = {
    {"etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                   "user:x:1000:1000:user:/home/user:/bin/sh\n"
                   "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
    {"etc/group", "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n"},
    {"etc/hostname", "tupper\n"},
    {"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n"},
    {"etc/resolv.conf", "# no network in the box by default\n"},
};

/* mkdir + exact mode (no umask) + owner.  EEXIST is fine when `exist_ok`. */
static int mkdir_owned(const img_t *im, const char *path, mode_t mode, unsigned id_off,
                       int exist_ok, tp_error_t *err) {
  if (mkdirat(im->dfd, path, mode) < 0) {
    if (errno == EEXIST && exist_ok)
      return 0;
    return tp_error_errno(err, errno, "mkdir '%s'", path);
  }
  if (fchmodat(im->dfd, path, mode, 0) < 0 ||
      fchownat(im->dfd, path, im->uid + id_off, im->gid + id_off, AT_SYMLINK_NOFOLLOW) < 0)
    return tp_error_errno(err, errno, "set owner and mode of '%s'", path);
  return 0;
}

/* Creates a file with exact mode and owner, durable before the rename. */
static int write_owned(const img_t *im, const char *path, const void *data, size_t len, mode_t mode,
                       tp_error_t *err) {
  cleanup_close int fd =
      openat(im->dfd, path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  const char *p = data;
  if (fd < 0)
    return tp_error_errno(err, errno, "create '%s'", path);
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "write '%s'", path);
    p += n;
    len -= (size_t) n;
  }
  if (fchmod(fd, mode) < 0 || fchown(fd, im->uid, im->gid) < 0)
    return tp_error_errno(err, errno, "set owner and mode of '%s'", path);
  if (fsync(fd) < 0)
    return tp_error_errno(err, errno, "fsync '%s'", path);
  return 0;
}

/* A `busybox --list-full` line: relative, no "." or ".." or empty component,
 * only characters applets use ("[", "[[" included). */
static int applet_valid(const char *s) {
  size_t n = strlen(s), comp = 0;
  if (n == 0 || n > TP__APPLET_MAX || s[0] == '/' || s[n - 1] == '/')
    return 0;
  for (size_t i = 0; i <= n; i++) {
    char c = s[i];
    if (c == '/' || c == '\0') {
      if (comp == 0 || (comp == 1 && s[i - 1] == '.') ||
          (comp == 2 && s[i - 1] == '.' && s[i - 2] == '.'))
        return 0;
      comp = 0;
      continue;
    }
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          strchr("._+-[]", c) != NULL))
      return 0;
    comp++;
  }
  return 1;
}

/* mkdir -p of the directories leading to `path` (not path itself). */
static int mkdir_parents(const img_t *im, const char *path, tp_error_t *err) {
  char buf[TP__APPLET_MAX + 1];
  size_t n = strlen(path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i < n; i++) {
    if (buf[i] != '/')
      continue;
    buf[i] = '\0';
    if (mkdir_owned(im, buf, 0755, 0, 1, err) < 0)
      return -1;
    buf[i] = '/';
  }
  return 0;
}

static int add_applets(const img_t *im, const char *text, size_t len, tp_error_t *err) {
  size_t off = 0;
  while (off < len) {
    const char *line = text + off;
    const char *nl = memchr(line, '\n', len - off);
    size_t n = nl ? (size_t) (nl - line) : len - off;
    char buf[TP__APPLET_MAX + 1];

    off += n + (nl ? 1 : 0);
    if (n == 0)
      continue;
    if (n > TP__APPLET_MAX || memchr(line, '\0', n) != NULL)
      return tp_error_set(err, EINVAL, "invalid applet path '%.*s'", (int) (n > 64 ? 64 : n), line);
    memcpy(buf, line, n);
    buf[n] = '\0';
    if (!applet_valid(buf))
      return tp_error_set(err, EINVAL, "invalid applet path '%s'", buf);
    if (strcmp(buf, "bin/busybox") == 0)
      continue;
    if (mkdir_parents(im, buf, err) < 0)
      return -1;
    if (symlinkat("/bin/busybox", im->dfd, buf) < 0) {
      if (errno == EEXIST)
        continue; /* listed twice */
      return tp_error_errno(err, errno, "symlink '%s'", buf);
    }
    if (fchownat(im->dfd, buf, im->uid, im->gid, AT_SYMLINK_NOFOLLOW) < 0)
      return tp_error_errno(err, errno, "chown '%s'", buf);
  }
  return 0;
}

static int build(const img_t *im, const void *busybox, size_t busybox_len, const char *applets,
                 size_t applets_len, tp_error_t *err) {
  if (fchmod(im->dfd, 0755) < 0 || fchown(im->dfd, im->uid, im->gid) < 0)
    return tp_error_errno(err, errno, "set owner and mode of the image root");
  for (size_t i = 0; i < TP_ARRAY_SIZE(img_dirs); i++)
    if (mkdir_owned(im, img_dirs[i].path, img_dirs[i].mode, img_dirs[i].id_off, 0, err) < 0)
      return -1;
  if (write_owned(im, "bin/busybox", busybox, busybox_len, 0755, err) < 0)
    return -1;
  for (size_t i = 0; i < TP_ARRAY_SIZE(img_files); i++)
    if (write_owned(im, img_files[i].path, img_files[i].text, strlen(img_files[i].text), 0644,
                    err) < 0)
      return -1;
  if (add_applets(im, applets, applets_len, err) < 0)
    return -1;
  if (fsync(im->dfd) < 0)
    return tp_error_errno(err, errno, "fsync the image root");
  return 0;
}

static void fsync_parent(const char *path) {
  cleanup_free char *copy = strdup(path);
  cleanup_close int fd = -1;
  if (copy == NULL)
    return;
  fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0)
    fsync(fd); /* best effort: the image is complete either way */
}

int tp_image_default_ensure(const char *rootfs, const void *busybox, size_t busybox_len,
                            const char *applets, size_t applets_len, uid_t uid_base, gid_t gid_base,
                            tp_error_t *err) {
  cleanup_free char *tmp = NULL;
  cleanup_close int dfd = -1;
  struct stat st;
  img_t im;
  int r;

  if (lstat(rootfs, &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return 0;
    return tp_error_set(err, EEXIST, "image '%s' exists and is not a directory", rootfs);
  }
  if (errno != ENOENT)
    return tp_error_errno(err, errno, "lstat '%s'", rootfs);
  if (busybox == NULL || busybox_len == 0)
    return tp_error_set(err, EINVAL, "image '%s': no busybox binary", rootfs);

  if (asprintf(&tmp, "%s.tmp-%d-XXXXXX", rootfs, (int) getpid()) < 0) {
    tmp = NULL;
    return tp_error_errno(err, ENOMEM, "image '%s'", rootfs);
  }
  if (mkdtemp(tmp) == NULL)
    return tp_error_errno(err, errno, "mkdtemp '%s'", tmp);
  dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  im = (img_t){dfd, uid_base, gid_base};
  if (dfd < 0)
    r = tp_error_errno(err, errno, "open '%s'", tmp);
  else
    r = build(&im, busybox, busybox_len, applets ? applets : "", applets ? applets_len : 0, err);
  if (r == 0 && renameat2(AT_FDCWD, tmp, AT_FDCWD, rootfs, RENAME_NOREPLACE) < 0) {
    if (errno == EEXIST || errno == ENOTEMPTY)
      r = 1; /* another creator won the race: theirs is as good */
    else
      r = tp_error_errno(err, errno, "rename '%s' to '%s'", tmp, rootfs);
  }
  if (r != 0) {
    tp_error_t ignored;
    tp_rmtree(tmp, &ignored);
    return r < 0 ? tp_error_prefix(err, "lay out image '%s'", rootfs) : 0;
  }
  fsync_parent(rootfs);
  return 0;
}
