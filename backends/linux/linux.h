/* tupper linux backend: one box = one set of namespaces around the agent.
 *
 * Design (docs/architecture.md): the daemon (host root) clones a child into new
 * mount, PID, UTS, IPC, network and cgroup namespaces.  As real root, still in
 * the host user namespace, the child builds the rootfs (overlayfs over the
 * read-only image, per-box upper dir), mounts a fresh /proc, a minimal /dev and
 * a read-only /sys, sets the hostname, brings `lo` up and pivot_roots.  Only
 * then does it unshare a user namespace, become root in it (0..count-1 inside
 * -> base..base+count-1 on the host; the maps are written by the thread
 * that cloned it, real root of the host) and exec the agent from a sealed memfd as
 * PID 1, with the channel at fd 3.
 * So every namespace but the user one is owned by the host user namespace:
 * root in the box holds no capability over its own mounts, network or
 * hostname, and maps to an unprivileged host uid.
 *
 * A box outlives the daemon that started it (no parent-death signal): the
 * child also binds <box_dir>/agent.sock (host root, 0600) and hands it,
 * listening, to the agent at TP_AGENT_LISTEN_FD; a restarted daemon connects
 * there with tp_linux_box_adopt.  The cgroup namespace is unshared by the
 * child right after it joined cgroup_procs, so it is rooted at the box's
 * cgroups.  Every writable mount is nosuid and nodev (but the device nodes
 * of /dev and /dev/pts); /proc's kernel files are masked or read-only;
 * RLIMIT_CORE is 0 and RLIMIT_NOFILE at most 2^20. */
#ifndef TP_LINUX_H
#define TP_LINUX_H

#include <stdint.h>
#include <linux/filter.h>
#include <sys/types.h>

#include "backend.h" /* tp_box_t */
#include "error.h"

#define TP_LAYERS_MAX 128 /* layers of one box (Docker allows 127; overlay 500) */
#define TP_VOLUMES_MAX 16 /* volumes mounted in one box */
#define TP_VOLUME_TARGET_MAX 255 /* bytes of a volume's mount point in the box */

/* A volume mounted in a box: an ext4 image (tp_linux_volume_make) attached
 * to a loop device and mounted nosuid,nodev at target, an absolute path in
 * the box whose components are made (no symlink followed) if missing.  The
 * volume's root is owned by root in the box, mode 1777, at each mount. */
typedef struct tp_box_volume_s {
  const char *image;  /* absolute path of the image file (not a symlink) */
  const char *target; /* "/mnt/data": no "." or ".." component, no //, under none of
                         /proc /sys /dev */
} tp_box_volume_t;

typedef struct tp_box_spec_s {
  const char *id;        /* sandbox id: [a-z0-9-]{1,63}; also the hostname */
  /* The read-only layers of the rootfs (overlay lower dirs, owned by the
   * mapped range), lowest first, NULL-terminated; 1..TP_LAYERS_MAX absolute
   * paths.  The box's root is their merge, the highest winning; whiteouts
   * (char 0:0) and opaque dirs (trusted.overlay.opaque) in a layer hide what
   * lies below.  The overlay is mounted with short names for them (links in
   * box_dir/l/), so the number and length of layer paths never hit the
   * one-page limit of the mount options. */
  const char *const *layers;
  const char *box_dir;   /* per-box dir, must not exist; created here (upper/, work/, rootfs/) */
  int agent_fd;          /* executable fd (sealed memfd) run as PID 1 in the box */
  uid_t uid_base;        /* host uid of root in the box */
  gid_t gid_base;
  uint32_t id_count;     /* size of the mapped range */
  /* NULL-terminated list of cgroup.procs (v2) / tasks (v1) files that the
   * box's PID 1 joins, written "0" by the child while still real root, before
   * anything of the box runs; NULL = none. */
  const char *const *cgroup_procs;
  int64_t disk_bytes;    /* 0 = no cap; else upper/ and work/ live on an ext4 image of this size */
  /* NULL, or the mounted btrfs pool (tp_linux_pool_open): upper/ and work/
   * are then a subvolume <pool>/boxes/<id> with a qgroup limit of
   * disk_bytes (which must be > 0) instead of an ext4 image */
  const char *pool;
  const struct sock_fprog *seccomp; /* NULL = none; loaded with no_new_privs just before the agent's exec */
  const tp_box_volume_t *volumes;   /* n_volumes of them (0..TP_VOLUMES_MAX) */
  int n_volumes;
  /* NULL, or the text of the box's /etc/resolv.conf, written by the set-up
   * right after the overlay's mount (at most TP_RESOLV_MAX bytes).  Never
   * through a link: where /etc or the file is a symlink (or not a dir, not
   * a regular file) it is left alone and box->resolv stays 0.  A file it
   * makes (and /etc, if missing) is owned by root in the box, 0644 (0755). */
  const char *resolv;
} tp_box_spec_t;
#define TP_RESOLV_MAX 4096

/* Makes a volume's image: path (must not exist) created 0600, sparse,
 * `bytes` long, formatted ext4 with a journal (mkfs.ext4), fsync'd. */
int tp_linux_volume_make(const char *path, int64_t bytes, tp_error_t *err);

/* The btrfs pool of box upper dirs (pool_btrfs.c): an image <dir>.img,
 * loop-mounted at dir, quotas on, boxes/ and snaps/ in it.
 * tp_linux_pool_probe: 0 if this host can have one, else err says why.
 * tp_linux_pool_open: mounts it (making a sparse image of `bytes`, at least
 * 1 GiB, if there is none), or adopts the mount an earlier daemon left
 * (*adopted = 1) once it proved to be this image's.
 * tp_linux_pool_close: unmounts it (boxes still running keep their own
 * hold on it; the loop device goes with the last).
 * tp_linux_pool_snapshot: syncfs, then a read-only snapshot of
 * boxes/<box_id> as snaps/<name> (made as snaps/.tmp-<name>, renamed).
 * tp_linux_pool_drop: deletes the subvolume <sub>/<name> (sub: "boxes" or
 * "snaps"); a missing one is success.
 * tp_linux_pool_is_subvol: 0 not a subvolume root on btrfs, 1 one, 2 a
 * read-only one. */
int tp_linux_pool_probe(tp_error_t *err);
int tp_linux_pool_open(const char *dir, int64_t bytes, int *adopted, tp_error_t *err);
int tp_linux_pool_close(const char *dir, tp_error_t *err);
int tp_linux_pool_snapshot(const char *dir, const char *box_id, const char *name, tp_error_t *err);
int tp_linux_pool_drop(const char *dir, const char *sub, const char *name, tp_error_t *err);
int tp_linux_pool_is_subvol(const char *path);

/* The linux backend's destroy: tp_box_destroy, and the box's subvolume on
 * the pool (named by the box dir's `pool` link) deleted before box_dir. */
int tp_linux_box_destroy(tp_box_t *box, const char *box_dir, tp_error_t *err);

/* Creates box_dir (with l/0..l/n-1: symlinks to the layers, for the overlay
 * mount) and starts the box.  On failure nothing is left behind (no
 * process, no directory) and err says which step failed. */
int tp_linux_box_start(const tp_box_spec_t *spec, tp_box_t *box, tp_error_t *err);

/* The box's end is tp_box_destroy (backend.h): killing its PID 1 takes
 * its whole PID namespace down, and its mounts need no cleanup: they live
 * only in the box's own mount namespace, which dies with its last process. */

/* Takes over a live box started by an earlier daemon: opens a pidfd of pid
 * and connects to <box_dir>/agent.sock, whose listener must be pid (checked
 * with SO_PEERCRED).  box->chan_fd is the new channel (CLOEXEC, non-blocking);
 * the agent accepts it once its previous channel has closed.  ESRCH if pid
 * is gone or is not that box's agent, ECONNREFUSED if nothing listens. */
int tp_linux_box_adopt(const char *box_dir, pid_t pid, tp_box_t *box, tp_error_t *err);

/* A sealed, executable memfd holding the agent binary (for spec.agent_fd). */
int tp_agent_memfd(const void *bin, size_t len, tp_error_t *err);

/* The linux backend's vtable (backend.c): its state is the sealed agent
 * memfd and the seccomp filter, built once per daemon. */
extern const tp_backend_t tp_backend_linux;

#endif
