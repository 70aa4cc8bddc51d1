/* tupper linux backend, internals shared by box.c (parent side), box_plan.c
 * (turns a spec into setup steps) and box_child.c (runs them in the child).
 *
 * The daemon is multi-threaded, so the cloned child may only make
 * async-signal-safe calls: every path and option string it needs is built
 * by tp__plan_build() in the parent before the clone, and the child replays
 * the plan's ops in order (bubblewrap's SetupOp list, in spirit).
 *
 * The child is cloned with CLONE_VM, as posix_spawn does: no page tables are
 * copied and exec has no address space to tear down, which on a VM guest is
 * most of the cost of a start (about 2-4 ms of fork + exec).  Without
 * CLONE_VFORK, so that the calling thread (real root of the host user
 * namespace) writes the id maps of the user namespace the child unshares:
 * the thread waits on a socketpair (the child's end close-on-exec) for the
 * child's "u", writes /proc/<pid>/uid_map and gid_map, answers "m", and
 * reads on to the end, the exec or the child's death, before it leaves the
 * frame the child uses.  (An id-map helper the child cloned did that while
 * a CLONE_VFORK parent was suspended: one process more a box.) */
#ifndef TP_LINUX_INT_H
#define TP_LINUX_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "linux.h"
#include "proto.h" /* TP_AGENT_FD, TP_AGENT_LISTEN_FD */

enum tp__op_kind {
  TP__OP_CGROUP,   /* join a cgroup: write "0" to src (its v1 tasks file) if not NULL,
                      else or where src does not exist (v2) to dst (its cgroup.procs) */
  TP__OP_UNSHARE,  /* unshare(flags) */
  TP__OP_LISTEN,   /* unix stream socket bound at dst/src (0600), listening: the
                      agent's TP_AGENT_LISTEN_FD */
  TP__OP_MOUNT,    /* mount(src, dst, fstype, flags, data) */
  TP__OP_SYSFS,    /* mount sysfs at dst with flags from the plan's sysfs_netns (the
                      namespace's, one superblock for all boxes), or from the box's
                      own namespace if that is -1 */
  TP__OP_DIR,      /* mkdir dst with mode (the child's umask is 0); one that was there
                      (EEXIST) must be a real dir, not a symlink.  flags != 0: it is
                      likely there (lstat'ed first, made only on ENOENT) */
  TP__OP_OWN,      /* chown dst to uid:gid; then, if flags, chmod it to mode (a dir
                      the child made has its mode already) */
  TP__OP_FILE,     /* create an empty regular file dst with mode (a bind mount target) */
  TP__OP_SYMLINK,  /* symlink(src, dst) */
  TP__OP_HOSTNAME, /* sethostname(src) */
  TP__OP_LO_UP,    /* bring the loopback interface of the new netns up */
  TP__OP_PIVOT,    /* pivot_root into dst, detach the old root */
  TP__OP_CHDIR,    /* chdir dst (relative paths of later mounts start there) */
  TP__OP_RESOLV,   /* write data (the spec's resolv) to etc/resolv.conf under the rootfs
                      dst, never through a link; uid:gid own what it makes.  Not
                      fatal: the child's resolv says whether it was written */
  TP__OP_VOLUME,   /* bind-mount src (a volume mounted in box_dir) at dst, a path under
                      the rootfs (named by data), each missing component made (owned
                      uid:gid) and none followed if it is a symlink */
};

typedef struct tp__op_s {
  enum tp__op_kind kind;
  const char *step; /* static text naming the step in an error report */
  const char *src;
  const char *dst;
  const char *fstype;
  unsigned long flags;
  const char *data;
  mode_t mode;
  uid_t uid; /* TP__OP_OWN */
  gid_t gid;
} tp__op_t;

/* each layer adds a link op and its name (plan_layer_links) */
#define TP__OPS_MAX (192 + TP_LAYERS_MAX)
#define TP__STRS_MAX (96 + TP__CGROUPS_MAX + TP_LAYERS_MAX)
#define TP__CGROUPS_MAX 16    /* entries of spec.cgroup_procs */
#define TP__PATH_MAX_LEN 1024 /* box_dir, layers, cgroup files */
#define TP__LAYER_LINKS "l" /* in the stage: l/<i> -> layers[i], the overlay's short lower names */
#define TP__STAGE "tmpfs" /* in box_dir, the stage's mount point when box_dir holds upper/ */
#define TP__DISK_MIN (1 << 20)
#define TP__AGENT_SOCK "agent.sock" /* in box_dir: the agent's listening socket */

typedef struct tp__plan_s {
  tp__op_t ops[TP__OPS_MAX];
  int n_ops;
  char *strs[TP__STRS_MAX]; /* strings the ops point into, owned */
  int n_strs;
  char *uid_map; /* "0 <base> <count>\n", written by the parent (box.c) */
  char *gid_map;
  char disk_dev[32]; /* "/dev/loopN" of the disk cap, filled in by the parent after
                        tp__disk_make; the "mount disk" op's source */
  char vol_dev[TP_VOLUMES_MAX][32]; /* the volumes' loop devices, likewise */
  const struct sock_fprog *seccomp; /* spec's filter, or NULL */
  int born_in; /* the TP__OP_CGROUP step the child skips, -1 if none: the parent
                  cloned it into that cgroup (box.c, CLONE_INTO_CGROUP) */
  int sysfs_netns; /* tp__sysfs_netns(), for TP__OP_SYSFS */
} tp__plan_t;

/* The network namespace the boxes mount /sys from (sysfs_net.c): made on
 * first use, only lo in it (up); the fd (CLOEXEC) is kept for the daemon's
 * life.  -1 if it could not be made (each box then mounts its own). */
int tp__sysfs_netns(void);

/* Validates the parts of spec the plan depends on and fills plan; on failure
 * the plan is freed.  tp__plan_free is idempotent. */
int tp__plan_build(tp__plan_t *plan, const tp_box_spec_t *spec, tp_error_t *err);
void tp__plan_free(tp__plan_t *plan);

/* The disk cap: creates <box_dir>/disk.img (sparse, `bytes` long; box_dfd is
 * box_dir opened), formats it ext4 (mkfs.ext4) and attaches it to a free loop
 * device with LO_FLAGS_AUTOCLEAR.  Returns the loop device's fd (CLOEXEC) and
 * its path in dev.  Keep the fd open until the child has mounted the device:
 * closing it before detaches it (disk.c). */
int tp__disk_make(int box_dfd, const char *box_dir, int64_t bytes, char *dev, size_t dev_len,
                  tp_error_t *err);

/* The box's subvolume on the pool (pool_btrfs.c): <pool>/boxes/<id>, its
 * qgroup limited to bytes of referenced data, with upper/ (owned uid:gid,
 * 0755) and work/ (0700) in it.  On failure nothing is left. */
int tp__pool_box_make(const char *pool, const char *id, int64_t bytes, uid_t uid, gid_t gid,
                      tp_error_t *err);
/* The destroy's end of a box's subvolume, its box gone: kept as a spare
 * for a next tp__pool_box_make where the box left little (then removed)
 * (pool_btrfs.c), else deleted (tp_linux_pool_drop). */
int tp__pool_box_keep(const char *pool, const char *id, tp_error_t *err);
/* <pool>/boxes/<id>, for the destroy: an xattr of box_dir (no inode of
 * its own), or a link in box_dir where the state dir's filesystem has no
 * trusted xattrs */
#define TP__POOL_XATTR "trusted.tupper.pool"
#define TP__POOL_LINK "pool"
/* That name of box_dir's subvolume, NUL-terminated in buf: its length, or
 * -1 (errno) when box_dir has none (no disk cap on the pool). */
ssize_t tp__pool_name(const char *box_dir, char *buf, size_t len);

/* Spare box dirs (box_spare.c): where <parent of box_dir>/.spare exists, a
 * removed box's emptied dir is moved there (keep: 0, or -1 and the caller
 * removes it) and a start renames one to its box_dir (take: 0, or -1 and
 * the caller makes it), so that no inode is made or freed on the state
 * dir's filesystem for it.  At most TP__SPARES_MAX are kept. */
#define TP__SPARE_DIR ".spare"
int tp__spare_dir_take(const char *box_dir);
int tp__spare_dir_keep(const char *box_dir);
/* A process-wide list of spare paths, newest last, under its lock (starts
 * and removals run in the thread pool): box_spare.c's dirs, pool_btrfs.c's
 * subvolumes.  put: 0 and the list owns path, or -1 (full: the caller
 * still does); take: the newest path "<prefix><name>" whose name has no
 * '/', the caller's to free, or NULL (box_spare.c). */
#define TP__SPARES_MAX 64
typedef struct {
  pthread_mutex_t lock;
  char *path[TP__SPARES_MAX];
  int n;
} tp__spares_t;
#define TP__SPARES_INIT {PTHREAD_MUTEX_INITIALIZER, {NULL}, 0}
int tp__spares_full(tp__spares_t *s);
int tp__spares_put(tp__spares_t *s, char *path);
char *tp__spares_take(tp__spares_t *s, const char *prefix);
/* 1 if the dir open at dfd (read from its offset) holds nothing but . and ..
 * and the names of the NULL-ended list names (may be NULL); else 0, or -1
 * (box_spare.c). */
int tp__dir_only(int dfd, const char *const *names);

/* Runs the tool at exe with argv (fixed PATH, stdin/stdout /dev/null) and
 * reaps it: 0 with its wait status in *status and the start of its stderr in
 * msg, or -1 with err set (pkg: the Debian package to install). */
int tp__run_tool(const char *exe, char *const argv[], const char *pkg, int *status, char *msg,
                 size_t msg_len, tp_error_t *err);

/* Attaches the image open at img to a free loop device (LO_FLAGS_AUTOCLEAR,
 * direct I/O where the backing file allows it);
 * returns the device's fd (CLOEXEC) and its path in dev. */
int tp__loop_attach(int img, char *dev, size_t dev_len, tp_error_t *err);

/* A failed step, as the child leaves it for the parent. */
typedef struct tp__child_report_s {
  int32_t err;
  char msg[252];
} tp__child_report_t;

/* Shared by the parent and the child: the child runs with CLONE_VM, so it
 * lives in the parent's memory while the parent waits for its exec or exit
 * (on the sync socket).  The child writes only its own fields (listen, resolv) and,
 * just before it exits, the report. */
typedef struct tp__child_s {
  const tp__plan_t *plan;
  int chan;           /* child end of the agent channel -> TP_AGENT_FD */
  int agent;          /* the agent executable */
  int sync;           /* child end of the parent's sync socket (close on exec) */
  int listen;         /* the agent socket (TP__OP_LISTEN) -> TP_AGENT_LISTEN_FD */
  int resolv;         /* 1: TP__OP_RESOLV wrote the box's /etc/resolv.conf */
  tp__child_report_t report; /* set by a failed child step */
} tp__child_t;

/* clone3(2)'s arguments (linux/sched.h's struct clone_args, up to cgroup:
 * kernel 5.7). */
typedef struct tp__clone_args_s {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
} tp__clone_args_t;
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
/* clone3 with fn(arg) run in the child on args->stack (clone3.c); the
 * child's pid, or -1 with errno (ENOSYS where the architecture has no
 * trampoline here, or the kernel no clone3). */
pid_t tp__clone3(tp__clone_args_t *args, int (*fn)(void *), void *arg);

/* Entry point for clone(): runs the plan, enters a user namespace (its maps
 * written by the parent, asked on the sync socket), becomes
 * root in it, lowers its rlimits, loads the seccomp filter and execs the
 * agent.  Returns only through _exit. */
int tp__box_child(void *child);

#endif
