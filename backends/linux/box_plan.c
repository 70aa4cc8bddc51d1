/* Turns a box spec into the ordered setup steps the cloned child replays.
 * Everything here runs in the parent, before clone: the child must not
 * allocate or format (see linux_int.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "linux_int.h"

#define TP__PATH_MAX_LEN 1024 /* keeps the overlay option string under a page */

typedef struct builder_s {
  tp__plan_t *p;
  int failed; /* errno of the first failure; later calls are no-ops */
} builder_t;

static const char *str(builder_t *b, const char *fmt, ...) TP_PRINTF(2, 3);

static const char *str(builder_t *b, const char *fmt, ...) {
  va_list ap;
  char *s = NULL;
  int n;
  if (b->failed)
    return NULL;
  if (b->p->n_strs == TP__STRS_MAX) {
    b->failed = E2BIG;
    return NULL;
  }
  va_start(ap, fmt);
  n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = ENOMEM;
    return NULL;
  }
  b->p->strs[b->p->n_strs++] = s;
  return s;
}

static void op(builder_t *b, enum tp__op_kind kind, const char *step, const char *src,
               const char *dst, const char *fstype, unsigned long flags, const char *data,
               mode_t mode) {
  if (b->failed)
    return;
  if (b->p->n_ops == TP__OPS_MAX) {
    b->failed = E2BIG;
    return;
  }
  b->p->ops[b->p->n_ops++] = (tp__op_t){kind, step, src, dst, fstype, flags, data, mode};
}

static void mnt(builder_t *b, const char *step, const char *src, const char *dst,
                const char *fstype, unsigned long flags, const char *data) {
  op(b, TP__OP_MOUNT, step, src, dst, fstype, flags, data, 0);
}

static int valid_id(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > 63 || id[0] == '-')
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '-'))
      return 0;
  return 1;
}

/* Absolute, bounded, and free of the characters overlayfs treats as
 * separators or escapes in its option string. */
static int check_path(const char *what, const char *path, tp_error_t *err) {
  if (path == NULL || path[0] != '/')
    return tp_error_set(err, EINVAL, "%s must be an absolute path", what);
  if (strlen(path) > TP__PATH_MAX_LEN)
    return tp_error_set(err, ENAMETOOLONG, "%s is longer than %d bytes", what, TP__PATH_MAX_LEN);
  if (strpbrk(path, ",:\\\n") != NULL)
    return tp_error_set(err, EINVAL, "%s '%s' contains one of ',', ':', '\\', newline", what, path);
  return 0;
}

static int check_spec(const tp_box_spec_t *s, tp_error_t *err) {
  if (s->id == NULL || !valid_id(s->id))
    return tp_error_set(err, EINVAL, "invalid box id (want [a-z0-9][a-z0-9-]{0,62})");
  if (check_path("image_dir", s->image_dir, err) < 0 || check_path("box_dir", s->box_dir, err) < 0)
    return -1;
  if (s->agent_fd < 0)
    return tp_error_set(err, EBADF, "no agent fd");
  if (s->id_count < 1)
    return tp_error_set(err, EINVAL, "id_count must be at least 1");
  /* Box root must never be host root, and the range must stay below (uid_t)-1. */
  if (s->uid_base == 0 || s->gid_base == 0)
    return tp_error_set(err, EINVAL, "uid_base and gid_base must not be 0");
  if ((uint64_t) s->uid_base + s->id_count > UINT32_MAX ||
      (uint64_t) s->gid_base + s->id_count > UINT32_MAX)
    return tp_error_set(err, ERANGE, "uid/gid range past 2^32-1");
  return 0;
}

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};

static const struct {
  const char *name;
  const char *target;
} dev_links[] = {
    {"ptmx", "pts/ptmx"},          {"fd", "/proc/self/fd"},       {"stdin", "/proc/self/fd/0"},
    {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"},
};

static void plan_dev(builder_t *b, const tp_box_spec_t *s, const char *rootfs) {
  const char *dev = str(b, "%s/dev", rootfs);
  const char *pts = str(b, "%s/dev/pts", rootfs);
  const char *shm = str(b, "%s/dev/shm", rootfs);
  const char *pts_opts;

  op(b, TP__OP_DIR, "mkdir /dev", NULL, dev, NULL, 0, NULL, 0755);
  /* Only the mounts below hold device nodes, so the tmpfs itself is nodev. */
  mnt(b, "mount /dev", "tmpfs", dev, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
      str(b, "mode=0755,size=64k,nr_inodes=64,uid=%u,gid=%u", (unsigned) s->uid_base,
          (unsigned) s->gid_base));
  for (size_t i = 0; i < sizeof(dev_nodes) / sizeof(dev_nodes[0]); i++) {
    const char *dst = str(b, "%s/dev/%s", rootfs, dev_nodes[i]);
    op(b, TP__OP_FILE, "create dev node", NULL, dst, NULL, 0, NULL, 0666);
    mnt(b, "bind dev node", str(b, "/dev/%s", dev_nodes[i]), dst, NULL, MS_BIND, NULL);
  }

  op(b, TP__OP_DIR, "mkdir /dev/pts", NULL, pts, NULL, 0, NULL, 0755);
  /* gid= is read in the mounter's (host) user namespace: gid 5 (tty) inside. */
  if (s->id_count > 5)
    pts_opts = str(b, "newinstance,ptmxmode=0666,mode=0620,gid=%u", (unsigned) s->gid_base + 5);
  else
    pts_opts = "newinstance,ptmxmode=0666,mode=0620";
  mnt(b, "mount /dev/pts", "devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC, pts_opts);

  op(b, TP__OP_DIR, "mkdir /dev/shm", NULL, shm, NULL, 0, NULL, 01777);
  mnt(b, "mount /dev/shm", "tmpfs", shm, "tmpfs", MS_NOSUID | MS_NODEV,
      str(b, "mode=1777,uid=%u,gid=%u", (unsigned) s->uid_base, (unsigned) s->gid_base));

  for (size_t i = 0; i < sizeof(dev_links) / sizeof(dev_links[0]); i++)
    op(b, TP__OP_SYMLINK, "symlink in /dev", dev_links[i].target,
       str(b, "%s/dev/%s", rootfs, dev_links[i].name), NULL, 0, NULL, 0);
}

int tp__plan_build(tp__plan_t *p, const tp_box_spec_t *s, tp_error_t *err) {
  builder_t b = {p, 0};
  const char *rootfs, *proc, *sys;

  memset(p, 0, sizeof(*p));
  if (check_spec(s, err) < 0)
    return -1;

  rootfs = str(&b, "%s/rootfs", s->box_dir);
  proc = str(&b, "%s/proc", rootfs);
  sys = str(&b, "%s/sys", rootfs);

  /* Nothing we mount may propagate back to the host. */
  mnt(&b, "make / private", "", "/", NULL, MS_REC | MS_PRIVATE, NULL);
  /* The upper dir is thrown away with the box: no need for overlay to sync
   * it (volatile).  Mounted by real root, so no userxattr.  nodev: a device
   * node smuggled into an image must not open a host device. */
  mnt(&b, "mount overlay", "overlay", rootfs, "overlay", MS_NODEV,
      str(&b, "lowerdir=%s,upperdir=%s/upper,workdir=%s/work,index=off,xino=off,volatile",
          s->image_dir, s->box_dir, s->box_dir));

  op(&b, TP__OP_DIR, "mkdir /proc", NULL, proc, NULL, 0, NULL, 0555);
  mnt(&b, "mount /proc", "proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);

  plan_dev(&b, s, rootfs);

  /* A fresh sysfs in the new netns shows only the box's interfaces. */
  op(&b, TP__OP_DIR, "mkdir /sys", NULL, sys, NULL, 0, NULL, 0555);
  mnt(&b, "mount /sys", "sysfs", sys, "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);

  op(&b, TP__OP_HOSTNAME, "sethostname", s->id, NULL, NULL, 0, NULL, 0);
  op(&b, TP__OP_LO_UP, "bring lo up", NULL, NULL, NULL, 0, NULL, 0);
  op(&b, TP__OP_PIVOT, "pivot_root", NULL, rootfs, NULL, 0, NULL, 0);

  if (!b.failed) {
    p->uid_map = (char *) str(&b, "0 %u %u\n", (unsigned) s->uid_base, (unsigned) s->id_count);
    p->gid_map = (char *) str(&b, "0 %u %u\n", (unsigned) s->gid_base, (unsigned) s->id_count);
  }
  if (b.failed) {
    tp__plan_free(p);
    return tp_error_errno(err, b.failed, "build setup plan");
  }
  return 0;
}

void tp__plan_free(tp__plan_t *p) {
  for (int i = 0; i < p->n_strs; i++)
    free(p->strs[i]);
  p->n_strs = 0;
  p->n_ops = 0;
  p->uid_map = p->gid_map = NULL;
}
