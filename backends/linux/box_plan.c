/* Turns a box spec into the ordered setup steps the cloned child replays.
 * Everything here runs in the parent, before clone: the child must not
 * allocate or format (see linux_int.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "box_dev.h"
#include "box_proc.h"
#include "linux_int.h"

/* A bind mount's flags, made read-only (the remount after the bind). */
#define TP__RO_REMOUNT (MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)

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
  b->p->ops[b->p->n_ops++] = (tp__op_t){kind, step, src, dst, fstype, flags, data, mode, 0, 0};
}

static void mnt(builder_t *b, const char *step, const char *src, const char *dst,
                const char *fstype, unsigned long flags, const char *data) {
  op(b, TP__OP_MOUNT, step, src, dst, fstype, flags, data, 0);
}

/* chown dst; chmod too where the child did not make it (chmod != 0). */
static void own(builder_t *b, const char *step, const char *dst, uid_t uid, gid_t gid,
                mode_t mode, int chmod) {
  op(b, TP__OP_OWN, step, NULL, dst, NULL, (unsigned long) chmod, NULL, mode);
  if (!b->failed) {
    b->p->ops[b->p->n_ops - 1].uid = uid;
    b->p->ops[b->p->n_ops - 1].gid = gid;
  }
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

/* A volume's mount point: absolute, bounded, each component a plain name
 * (no "", ".", "..", control character), not / itself nor under the
 * mounts the box gets from the host (/proc, /sys, /dev). */
static int check_target(const char *t, tp_error_t *err) {
  static const char *const host[] = {"proc", "sys", "dev"};
  size_t n;
  if (t == NULL || t[0] != '/')
    return tp_error_set(err, EINVAL, "volume mount point must be an absolute path");
  n = strlen(t);
  if (n < 2 || n > TP_VOLUME_TARGET_MAX)
    return tp_error_set(err, EINVAL, "volume mount point must be 2 to %d bytes, not /",
                        TP_VOLUME_TARGET_MAX);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char) t[i] < 0x20 || t[i] == 0x7f)
      return tp_error_set(err, EINVAL, "volume mount point contains a control character");
  for (const char *c = t + 1; c != NULL && *c != '\0';) {
    const char *e = strchr(c, '/');
    size_t len = e != NULL ? (size_t) (e - c) : strlen(c);
    if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
      return tp_error_set(err, EINVAL,
                          "volume mount point '%s': empty, '.' or '..' component", t);
    if (c == t + 1)
      for (size_t h = 0; h < sizeof(host) / sizeof(host[0]); h++)
        if (len == strlen(host[h]) && strncmp(c, host[h], len) == 0)
          return tp_error_set(err, EINVAL, "volume mount point '%s' is under /%s", t, host[h]);
    c = e != NULL ? e + 1 : NULL;
    if (c != NULL && *c == '\0')
      return tp_error_set(err, EINVAL, "volume mount point '%s' ends with /", t);
  }
  return 0;
}

static int check_volumes(const tp_box_spec_t *s, tp_error_t *err) {
  if (s->n_volumes < 0 || s->n_volumes > TP_VOLUMES_MAX)
    return tp_error_set(err, E2BIG, "0 to %d volumes, not %d", TP_VOLUMES_MAX, s->n_volumes);
  for (int i = 0; i < s->n_volumes; i++) {
    if (check_path("volume image", s->volumes[i].image, err) < 0 ||
        check_target(s->volumes[i].target, err) < 0)
      return -1;
    for (int j = 0; j < i; j++)
      if (strcmp(s->volumes[i].target, s->volumes[j].target) == 0)
        return tp_error_set(err, EINVAL, "two volumes at '%s'", s->volumes[i].target);
  }
  return 0;
}

static int check_spec(const tp_box_spec_t *s, tp_error_t *err) {
  if (s->id == NULL || !valid_id(s->id))
    return tp_error_set(err, EINVAL, "invalid box id (want [a-z0-9][a-z0-9-]{0,62})");
  if (check_path("box_dir", s->box_dir, err) < 0)
    return -1;
  if (s->layers == NULL || s->layers[0] == NULL)
    return tp_error_set(err, EINVAL, "no layers");
  for (int i = 0; s->layers[i] != NULL; i++) {
    if (i == TP_LAYERS_MAX)
      return tp_error_set(err, E2BIG, "more than %d layers", TP_LAYERS_MAX);
    if (check_path("layer", s->layers[i], err) < 0)
      return -1;
  }
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
  for (int i = 0; s->cgroup_procs != NULL && s->cgroup_procs[i] != NULL; i++) {
    const char *cg = s->cgroup_procs[i];
    if (i == TP__CGROUPS_MAX)
      return tp_error_set(err, E2BIG, "more than %d cgroup_procs", TP__CGROUPS_MAX);
    if (cg[0] != '/' || strlen(cg) > TP__PATH_MAX_LEN)
      return tp_error_set(err, EINVAL,
                          "cgroup_procs: '%.64s' is not an absolute path of at most %d bytes", cg,
                          TP__PATH_MAX_LEN);
  }
  if (s->disk_bytes < 0 || (s->disk_bytes > 0 && s->disk_bytes < TP__DISK_MIN))
    return tp_error_set(err, EINVAL, "disk_bytes must be 0 (no cap) or at least %d",
                        TP__DISK_MIN);
  if (s->pool != NULL && s->disk_bytes <= 0)
    return tp_error_set(err, EINVAL, "a box on the pool needs a disk cap");
  if (s->pool != NULL && check_path("pool", s->pool, err) < 0)
    return -1;
  if (check_volumes(s, err) < 0)
    return -1;
  if (s->resolv != NULL && strlen(s->resolv) > TP_RESOLV_MAX)
    return tp_error_set(err, E2BIG, "resolv: more than %d bytes", TP_RESOLV_MAX);
  if (s->seccomp != NULL &&
      (s->seccomp->filter == NULL || s->seccomp->len == 0 || s->seccomp->len > BPF_MAXINSNS))
    return tp_error_set(err, EINVAL, "seccomp filter must have 1..%d instructions",
                        BPF_MAXINSNS);
  return 0;
}

/* /proc of the box (box_proc.h).  The box's proc is the host kernel's, so
 * what exists is decided by looking at the daemon's /proc: once, the first
 * time a plan is built (a kernel's /proc entries do not come and go). */

#define TP__PROC_MASKS                                                                   \
  (TP_BOX_PROC_N(tp_box_proc_masked) + TP_BOX_PROC_N(tp_box_proc_emptied) +            \
   TP_BOX_PROC_N(tp_box_proc_readonly))
static unsigned char host_proc[TP__PROC_MASKS]; /* masked, then emptied, then readonly */
static pthread_once_t host_proc_once = PTHREAD_ONCE_INIT;

static int host_proc_has(const char *name, int dir) {
  char path[64];
  struct stat st;
  snprintf(path, sizeof(path), "/proc/%s", name);
  return stat(path, &st) == 0 && (S_ISDIR(st.st_mode) != 0) == (dir != 0);
}

static void host_proc_probe(void) {
  size_t k = 0;
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_masked); i++)
    host_proc[k++] = (unsigned char) host_proc_has(tp_box_proc_masked[i], 0);
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_emptied); i++)
    host_proc[k++] = (unsigned char) host_proc_has(tp_box_proc_emptied[i], 1);
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_readonly); i++)
    host_proc[k++] = (unsigned char) host_proc_has(tp_box_proc_readonly[i], 1);
}

/* The masks take their flags from three read-only sources, so that no
 * mask needs a remount of its own (a bind copies its source mount's
 * flags): the stage itself, remounted ro,nosuid,nodev,noexec once
 * everything in it is made (its empty/ goes over the hardware dirs);
 * /dev/null bound on its null file and made read-only (over the masked
 * files); and a bind of the box's /proc on its proc/, made read-only (its
 * kernel knob dirs go over the same in the box's /proc).  A mask was a
 * bind and a remount each: 20 mount calls on this kernel came to 15, and
 * at most 22 instead of 34 where all 17 entries exist. */
static void plan_proc(builder_t *b, const char *proc, const char *stage) {
  const char *null = str(b, "%s/null", stage);
  const char *proc_ro = str(b, "%s/proc", stage);
  const char *empty = str(b, "%s/empty", stage);
  size_t k = 0, n_masked = 0, n_ro = 0;

  pthread_once(&host_proc_once, host_proc_probe);
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_masked); i++)
    n_masked += host_proc[i];
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_readonly); i++)
    n_ro += host_proc[TP__PROC_MASKS - TP_BOX_PROC_N(tp_box_proc_readonly) + i];

  mnt(b, "make tmpfs stage read-only", NULL, stage, NULL, TP__RO_REMOUNT, NULL);
  /* Files: /dev/null over them, read-only and nodev, so opening fails. */
  if (n_masked > 0) {
    mnt(b, "bind /dev/null for /proc masks", "/dev/null", null, NULL, MS_BIND, NULL);
    mnt(b, "make /proc masks' /dev/null read-only", NULL, null, NULL, TP__RO_REMOUNT, NULL);
  }
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_masked); i++, k++)
    if (host_proc[k])
      mnt(b, "mask /proc file", null, str(b, "%s/%s", proc, tp_box_proc_masked[i]), NULL, MS_BIND,
          NULL);
  /* Hardware dirs: the stage's empty dir over them (read-only with it). */
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_emptied); i++, k++)
    if (host_proc[k])
      mnt(b, "hide /proc dir", empty, str(b, "%s/%s", proc, tp_box_proc_emptied[i]), NULL,
          MS_BIND, NULL);
  /* Kernel knobs: readable, never writable (from the read-only /proc). */
  if (n_ro > 0) {
    mnt(b, "bind /proc for its read-only dirs", proc, proc_ro, NULL, MS_BIND, NULL);
    mnt(b, "make /proc's bind read-only", NULL, proc_ro, NULL, TP__RO_REMOUNT, NULL);
  }
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_readonly); i++, k++)
    if (host_proc[k])
      mnt(b, "bind /proc dir read-only", str(b, "%s/%s", proc_ro, tp_box_proc_readonly[i]),
          str(b, "%s/%s", proc, tp_box_proc_readonly[i]), NULL, MS_BIND, NULL);
}

/* The box's one tmpfs (64 MiB, nosuid,nodev,noexec), mounted at stage
 * (box_dir or box_dir/tmpfs: tp__plan_build; dropped with the old root at
 * pivot_root) and holding three dirs the box sees: dev/ (the box's /dev,
 * owned by its root), shm/ (its /dev/shm, 1777) and empty/ (the empty dir
 * over /proc's hardware dirs, read-only with the stage: plan_proc), each
 * bound where the box sees it; and the mount points and links of the
 * setup, which it never sees: null and proc/ (plan_proc's read-only
 * sources),
 * rootfs/ (the overlay), l/ (the layer links), disk/ (the disk cap) and
 * v<i>/ (the volumes).  They cost the state dir's filesystem nothing: it
 * had made and removed them per box, about half of the inodes a box made
 * there (docs/benchmarks.md, "Churn").  One tmpfs instead of one each, because
 * every superblock is a shrinker that every memory cgroup on the host keeps
 * room for (docs/benchmarks.md, "Loop"): /dev and /dev/shm share the 64 MiB,
 * and a bind of a subdir shows nothing of its siblings. */
static void plan_tmpfs(builder_t *b, const tp_box_spec_t *s, const char *stage) {
  const char *dev = str(b, "%s/dev", stage);
  const char *shm = str(b, "%s/shm", stage);
  const char *empty = str(b, "%s/empty", stage);

  /* with a disk cap the stage is box_dir, which the parent made */
  op(b, TP__OP_DIR, "mkdir tmpfs stage", NULL, stage, NULL, s->disk_bytes > 0, NULL, 0700);
  mnt(b, "mount tmpfs", "tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
      "mode=0700,size=64m");
  op(b, TP__OP_DIR, "mkdir tmpfs dev", NULL, dev, NULL, 0, NULL, 0755);
  own(b, "own tmpfs dev", dev, s->uid_base, s->gid_base, 0755, 0);
  op(b, TP__OP_DIR, "mkdir tmpfs shm", NULL, shm, NULL, 0, NULL, 01777);
  own(b, "own tmpfs shm", shm, s->uid_base, s->gid_base, 01777, 0);
  op(b, TP__OP_DIR, "mkdir tmpfs empty", NULL, empty, NULL, 0, NULL, 0555);
  own(b, "own tmpfs empty", empty, 0, 0, 0555, 0);
  op(b, TP__OP_FILE, "create tmpfs null", NULL, str(b, "%s/null", stage), NULL, 0, NULL, 0);
  op(b, TP__OP_DIR, "mkdir tmpfs proc", NULL, str(b, "%s/proc", stage), NULL, 0, NULL, 0555);
  op(b, TP__OP_DIR, "mkdir rootfs", NULL, str(b, "%s/rootfs", stage), NULL, 0, NULL, 0755);
}

/* l/<i> -> layers[i] in the stage (the child's cwd by then): the short
 * names the overlay mount uses (the kernel follows them when it looks the
 * lower dirs up). */
static void plan_layer_links(builder_t *b, const tp_box_spec_t *s) {
  op(b, TP__OP_DIR, "mkdir layer links", NULL, TP__LAYER_LINKS, NULL, 0, NULL, 0700);
  for (int i = 0; s->layers[i] != NULL; i++)
    op(b, TP__OP_SYMLINK, "link layer", s->layers[i], str(b, TP__LAYER_LINKS "/%d", i), NULL, 0,
       NULL, 0);
}

static void plan_dev(builder_t *b, const tp_box_spec_t *s, const char *rootfs,
                     const char *stage) {
  const char *dev = str(b, "%s/dev", rootfs);
  const char *pts = str(b, "%s/dev/pts", rootfs);
  const char *shm = str(b, "%s/dev/shm", rootfs);
  const char *pts_opts;

  op(b, TP__OP_DIR, "mkdir /dev", NULL, dev, NULL, 1, NULL, 0755); /* the image's, most times */
  /* A bind keeps the tmpfs's nosuid,nodev,noexec: only the mounts below
   * hold device nodes. */
  mnt(b, "bind /dev", str(b, "%s/dev", stage), dev, NULL, MS_BIND, NULL);
  for (size_t i = 0; i < TP_BOX_DEV_NODES; i++) {
    const char *dst = str(b, "%s/dev/%s", rootfs, tp_box_dev_nodes[i].name);
    op(b, TP__OP_FILE, "create dev node", NULL, dst, NULL, 0, NULL, 0666);
    /* The only mounts without nodev: each is one host device node. */
    mnt(b, "bind dev node", str(b, "/dev/%s", tp_box_dev_nodes[i].name), dst, NULL, MS_BIND, NULL);
  }

  op(b, TP__OP_DIR, "mkdir /dev/pts", NULL, pts, NULL, 0, NULL, 0755);
  /* gid= is read in the mounter's (host) user namespace: gid 5 (tty) inside. */
  if (s->id_count > 5)
    pts_opts = str(b, "newinstance,ptmxmode=0666,mode=0620,gid=%u", (unsigned) s->gid_base + 5);
  else
    pts_opts = "newinstance,ptmxmode=0666,mode=0620";
  /* Not nodev (its nodes are the box's ptys); the box cannot create any. */
  mnt(b, "mount /dev/pts", "devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC, pts_opts);

  op(b, TP__OP_DIR, "mkdir /dev/shm", NULL, shm, NULL, 0, NULL, 01777);
  mnt(b, "bind /dev/shm", str(b, "%s/shm", stage), shm, NULL, MS_BIND, NULL);

  for (size_t i = 0; i < TP_BOX_DEV_LINKS; i++)
    op(b, TP__OP_SYMLINK, "symlink in /dev", tp_box_dev_links[i].target,
       str(b, "%s/dev/%s", rootfs, tp_box_dev_links[i].name), NULL, 0, NULL, 0);
}

/* The disk cap: the ext4 image (attached by the parent, which fills in
 * disk_dev) mounted at <stage>/disk, holding upper/ and work/; or, on the
 * btrfs pool, the box's subvolume bound there. */
static void plan_disk(builder_t *b, const tp_box_spec_t *s, const char *stage) {
  const char *disk = str(b, "%s/disk", stage);
  const char *upper = str(b, "%s/disk/upper", stage);
  const char *work = str(b, "%s/disk/work", stage);
  /* noinit_itable: the image is a fresh sparse file whose inode tables read
   * as zeros already; no kernel thread needs to write them out. */
  op(b, TP__OP_DIR, "mkdir disk", NULL, disk, NULL, 0, NULL, 0700);
  if (s->pool != NULL)
    /* the box's subvolume on the btrfs pool (made by the parent): a bind
     * keeps the pool mount's nosuid,nodev and the overlay's short names */
    mnt(b, "bind pool subvolume", str(b, "%s/boxes/%s", s->pool, s->id), disk, NULL, MS_BIND,
        NULL);
  else
    mnt(b, "mount disk", b->p->disk_dev, disk, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME,
        "noinit_itable");
  /* on the pool, tp__pool_box_make made both */
  op(b, TP__OP_DIR, "mkdir disk upper", NULL, upper, NULL, s->pool != NULL, NULL, 0755);
  own(b, "own disk upper", upper, s->uid_base, s->gid_base, 0755, 0);
  op(b, TP__OP_DIR, "mkdir disk work", NULL, work, NULL, s->pool != NULL, NULL, 0700);
}

/* The volumes: each image's loop device (attached by the parent, which
 * fills in vol_dev[i]) mounted at <stage>/v<i>, its root given to root in
 * the box (mode 1777: every account of the box may write there), then
 * bound at its mount point in the rootfs, which the child walks without
 * following a symlink (the image owns those dirs).  The staging mount is
 * dropped with the old root at pivot_root. */
static void plan_volumes(builder_t *b, const tp_box_spec_t *s, const char *rootfs,
                         const char *stage) {
  for (int i = 0; i < s->n_volumes; i++) {
    const char *vol = str(b, "%s/v%d", stage, i);
    op(b, TP__OP_DIR, "mkdir volume stage", NULL, vol, NULL, 0, NULL, 0700);
    mnt(b, "mount volume", b->p->vol_dev[i], vol, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME,
        NULL);
    own(b, "own volume root", vol, s->uid_base, s->gid_base, 01777, 1);
    op(b, TP__OP_VOLUME, "bind volume", vol, s->volumes[i].target + 1, NULL, 0, rootfs, 0755);
    if (!b->failed) {
      b->p->ops[b->p->n_ops - 1].uid = s->uid_base;
      b->p->ops[b->p->n_ops - 1].gid = s->gid_base;
    }
  }
}

/* overlay's lowerdir: the links plan_layer_links makes in the stage, top
 * layer first ("l/2:l/1:l/0"), read relative to the stage (the child's cwd
 * by then).  At
 * most TP_LAYERS_MAX * 6 bytes whatever the layers' paths, so the option
 * string stays well inside the page the kernel copies (4.x-6.x alike: no
 * need for fsconfig's lowerdir+, which 6.1 lacks). */
static const char *lowerdir(builder_t *b, const tp_box_spec_t *s) {
  char buf[TP_LAYERS_MAX * 8];
  size_t off = 0;
  int n = 0;
  while (s->layers[n] != NULL)
    n++;
  buf[0] = '\0';
  for (int i = n - 1; i >= 0; i--)
    off += (size_t) snprintf(buf + off, sizeof(buf) - off, "%s" TP__LAYER_LINKS "/%d",
                             i == n - 1 ? "" : ":", i);
  return str(b, "%s", buf);
}

/* The "tasks" file beside a cgroup.procs, or NULL: on a v1 hierarchy the
 * child joins through it.  It moves the writer's thread only, which is the
 * whole child (a process of one thread; the box's later threads and
 * processes are born in the cgroup), and for "0", the writer itself, the
 * kernel takes no write lock on every thread group of the host: a
 * cgroup.procs write does, and that lock's writer waits for an RCU grace
 * period, some milliseconds on a loaded host (docs/benchmarks.md).  v2 has
 * no tasks file: there the child's open fails ENOENT and it writes
 * cgroup.procs. */
static const char *tasks_of(builder_t *b, const char *procs) {
  static const char leaf[] = "/cgroup.procs";
  size_t n = strlen(procs), l = sizeof(leaf) - 1;
  if (n <= l || strcmp(procs + n - l, leaf) != 0)
    return NULL;
  return str(b, "%.*s/tasks", (int) (n - l), procs);
}

/* 1 if a volume's mount point is /etc or /etc/resolv.conf (checked by
 * check_target: no "//", "." or "..", no trailing "/") */
static int resolv_under_volume(const tp_box_spec_t *s) {
  for (int i = 0; i < s->n_volumes; i++)
    if (strcmp(s->volumes[i].target, "/etc") == 0 ||
        strcmp(s->volumes[i].target, "/etc/resolv.conf") == 0)
      return 1;
  return 0;
}

int tp__plan_build(tp__plan_t *p, const tp_box_spec_t *s, tp_error_t *err) {
  builder_t b = {p, 0};
  const char *rootfs, *proc, *sys, *stage;

  memset(p, 0, sizeof(*p));
  if (check_spec(s, err) < 0)
    return -1;
  p->seccomp = s->seccomp;
  p->born_in = -1;
  p->sysfs_netns = tp__sysfs_netns();

  /* The stage, where the box's tmpfs goes (plan_tmpfs), in the child's
   * mount namespace only.  With a disk cap nothing in box_dir is needed
   * after the agent socket's bind, so the tmpfs covers box_dir itself and
   * the state dir gets no dir for it; without one box_dir holds upper/ and
   * work/, and the tmpfs goes on box_dir/tmpfs. */
  stage = s->disk_bytes > 0 ? s->box_dir : str(&b, "%s/" TP__STAGE, s->box_dir);
  rootfs = str(&b, "%s/rootfs", stage);
  proc = str(&b, "%s/proc", rootfs);
  sys = str(&b, "%s/sys", rootfs);

  /* Into the box's cgroups first, before anything of the box runs (the
   * mounts below are charged there already), then a cgroup namespace rooted
   * at them: inside, /proc/self/cgroup says "/". */
  for (int i = 0; s->cgroup_procs != NULL && s->cgroup_procs[i] != NULL; i++)
    op(&b, TP__OP_CGROUP, "join cgroup", tasks_of(&b, s->cgroup_procs[i]), s->cgroup_procs[i],
       NULL, 0, NULL, 0);
  op(&b, TP__OP_UNSHARE, "unshare cgroup namespace", NULL, NULL, NULL, CLONE_NEWCGROUP, NULL,
     0);
  /* Bound as host root while box_dir is still visible: a restarted daemon
   * connects there (tp_linux_box_adopt); the box never sees it.  On the
   * btrfs pool, in the root of the box's subvolume (which the box sees
   * only its upper/ of), not in box_dir: an inode made there costs the
   * state dir's filesystem nothing, and goes with the subvolume
   * (docs/benchmarks.md, "Churn"). */
  op(&b, TP__OP_LISTEN, "bind agent socket", TP__AGENT_SOCK,
     s->pool != NULL ? str(&b, "%s/boxes/%s", s->pool, s->id) : s->box_dir, NULL, 0, NULL, 0600);

  /* Nothing we mount may propagate back to the host. */
  mnt(&b, "make / private", "", "/", NULL, MS_REC | MS_PRIVATE, NULL);
  plan_tmpfs(&b, s, stage);
  if (s->disk_bytes > 0)
    plan_disk(&b, s, stage);
  /* The upper dir is thrown away with the box: no need for overlay to sync
   * it (volatile).  Mounted by real root, so no userxattr.  nodev and
   * nosuid, as every writable mount: a device node or a setuid file
   * smuggled into an image must not open a host device or raise anything.
   * Every dir is named relative to the stage, short whatever its path
   * (without a disk cap upper/ and work/ are the stage's siblings in
   * box_dir: "../upper" from the tmpfs's root is box_dir/upper). */
  op(&b, TP__OP_CHDIR, "chdir stage", NULL, stage, NULL, 0, NULL, 0);
  plan_layer_links(&b, s);
  mnt(&b, "mount overlay", "overlay", rootfs, "overlay", MS_NODEV | MS_NOSUID,
      s->disk_bytes > 0
          ? str(&b, "lowerdir=%s,upperdir=disk/upper,workdir=disk/work,index=off,xino=off,volatile",
                lowerdir(&b, s))
          : str(&b, "lowerdir=%s,upperdir=../upper,workdir=../work,index=off,xino=off,volatile",
                lowerdir(&b, s)));

  /* The box's /etc/resolv.conf, while the overlay is the only mount under
   * the rootfs; not where a volume goes over /etc or the file (the agent
   * writes it there, into the volume, as before).  The agent did it on
   * request: a round trip a create, and its /etc mkdir
   * (docs/benchmarks.md, "Churn"). */
  if (s->resolv != NULL && !resolv_under_volume(s)) {
    op(&b, TP__OP_RESOLV, "write /etc/resolv.conf", NULL, rootfs, NULL, 0, s->resolv, 0644);
    if (!b.failed) {
      b.p->ops[b.p->n_ops - 1].uid = s->uid_base;
      b.p->ops[b.p->n_ops - 1].gid = s->gid_base;
    }
  }

  /* /dev before /proc's masks: the first mount of the tmpfs is the one
   * df and the like name it by. */
  plan_dev(&b, s, rootfs, stage);

  op(&b, TP__OP_DIR, "mkdir /proc", NULL, proc, NULL, 1, NULL, 0555);
  mnt(&b, "mount /proc", "proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);

  /* A sysfs that shows only a lo: mounted from a namespace that holds
   * nothing else, one superblock for every box (sysfs_net.c). */
  op(&b, TP__OP_DIR, "mkdir /sys", NULL, sys, NULL, 1, NULL, 0555);
  op(&b, TP__OP_SYSFS, "mount /sys", "sysfs", sys, "sysfs",
     MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0);

  plan_volumes(&b, s, rootfs, stage);
  /* /proc's masks last: the stage is made read-only there, when nothing
   * more is made in it. */
  plan_proc(&b, proc, stage);

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
