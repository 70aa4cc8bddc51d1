/* tp_linux_box_start: the parent side (its destroy is tp_box_destroy,
 * backends/api).  See linux.h for the design and box_child.c for what the
 * child does. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "linux_int.h"
#include "rmtree.h"
#include "utils.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

static void cleanup_planp(tp__plan_t *p) { tp__plan_free(p); }

typedef struct fds_s {
  int fd[TP_VOLUMES_MAX];
  int n;
} fds_t;
static void cleanup_fdsp(fds_t *f) {
  for (int i = 0; i < f->n; i++)
    if (f->fd[i] >= 0)
      close(f->fd[i]);
}
#define cleanup_fds __attribute__((cleanup(cleanup_fdsp)))
#define cleanup_plan __attribute__((cleanup(cleanup_planp)))

/* Removes a half-made box dir on any early return; set to NULL to keep it. */
static void cleanup_box_dirp(const char **dir) {
  if (*dir != NULL) {
    int saved = errno;
    tp_rmtree(*dir, NULL);
    errno = saved;
  }
}
#define cleanup_box_dir __attribute__((cleanup(cleanup_box_dirp)))

/* Deletes a half-made box's subvolume on the pool; NULL to keep it. */
static void cleanup_pool_boxp(const tp_box_spec_t **s) {
  if (*s != NULL) {
    int saved = errno;
    tp_linux_pool_drop((*s)->pool, "boxes", (*s)->id, &(tp_error_t){0});
    errno = saved;
  }
}
#define cleanup_pool_box __attribute__((cleanup(cleanup_pool_boxp)))

/* box_dir (root, 0700) holds, without a disk cap, upper/ (the box's /, so
 * owned by its root) and work/ (overlay's, used with the mounter's
 * credentials); with one, nothing (disk.img, or the pool xattr, are added
 * below).  The child adds agent.sock, then mounts its tmpfs over box_dir
 * (or on box_dir/tmpfs without a disk cap) in its own mount namespace and
 * makes its mount points and the layer links there (box_plan.c): the
 * state dir's filesystem makes and removes as few inodes a box as it can
 * (docs/benchmarks.md, "Churn"). */
static int make_box_subdirs(int dfd, const tp_box_spec_t *s, tp_error_t *err) {
  if (s->disk_bytes > 0 || s->pool != NULL)
    return 0;
  if (mkdirat(dfd, "upper", 0755) < 0 || fchmodat(dfd, "upper", 0755, 0) < 0 ||
      fchownat(dfd, "upper", s->uid_base, s->gid_base, AT_SYMLINK_NOFOLLOW) < 0)
    return tp_error_errno(err, errno, "make '%s/upper'", s->box_dir);
  if (mkdirat(dfd, "work", 0700) < 0)
    return tp_error_errno(err, errno, "mkdir '%s/work'", s->box_dir);
  return 0;
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* A previous child's frames may have left ASan poison on an address range
 * this mmap reuses (the child never returns to unpoison them). */
#define TP__UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define TP__UNPOISON(p, n) ((void) 0)
#endif

/* The child's stack, above a guard page. */
#define TP__STACK_SIZE (64 * 1024)
#define TP__GUARD_SIZE 4096

typedef struct stacks_s {
  char *base;
  size_t len;
} stacks_t;

static void cleanup_stacksp(stacks_t *s) {
  if (s->base != NULL)
    munmap(s->base, s->len);
}
#define cleanup_stacks __attribute__((cleanup(cleanup_stacksp)))

static int stacks_map(stacks_t *s, tp_error_t *err) {
  s->len = TP__GUARD_SIZE + TP__STACK_SIZE;
  s->base = mmap(NULL, s->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s->base == MAP_FAILED) {
    s->base = NULL;
    return tp_error_errno(err, errno, "mmap child stack");
  }
  if (mprotect(s->base + TP__GUARD_SIZE, TP__STACK_SIZE, PROT_READ | PROT_WRITE) < 0)
    return tp_error_errno(err, errno, "mprotect child stack");
  TP__UNPOISON(s->base, s->len);
  return 0;
}
/* Stacks grow down: hand out the top. */
static void *stack_top(const stacks_t *s) { return s->base + s->len; }

/* The child's side of the set-up, from the parent: reads the sync socket
 * until the child asks for its id maps ("u": written to /proc/<pid>/uid_map
 * and gid_map, then "m" sent) and until its end closes, at the exec or the
 * child's death (the caller tells which).  -1 only when the maps could not
 * be written: the caller kills the child. */
static int child_sync(pid_t pid, int sync, const tp__plan_t *plan, tp_error_t *err) {
  char b, path[64];
  const char *file[] = {"uid_map", "gid_map"};
  const char *map[] = {plan->uid_map, plan->gid_map};
  ssize_t n;
  for (;;) {
    do
      n = read(sync, &b, 1);
    while (n < 0 && errno == EINTR);
    if (n <= 0 || b != 'u')
      return 0; /* its end closed (or broke): exec'd or dying */
    for (int i = 0; i < 2; i++) {
      cleanup_close int fd = -1;
      size_t len = strlen(map[i]);
      ssize_t w = -1;
      snprintf(path, sizeof(path), "/proc/%d/%s", (int) pid, file[i]);
      fd = open(path, O_WRONLY | O_CLOEXEC);
      if (fd >= 0)
        w = write(fd, map[i], len);
      if (w != (ssize_t) len)
        return tp_error_errno(err, w < 0 ? errno : EIO, "write %s", file[i]);
    }
    if (send(sync, "m", 1, MSG_NOSIGNAL) != 1)
      return 0; /* it died meanwhile: its end is closed */
  }
}

#define TP__EXEC_WAIT_MS 5000 /* bound of await_exec */

/* Did the child exec the agent, or is it dying?  The end of the sync
 * socket wakes us in an exit as in an exec (the child is killed by a
 * signal, say the seccomp filter refusing execveat), so its /proc/<pid>/exe
 * may still be ours.  Wait
 * until it is the agent's file (exec'd: 0) or the child is a zombie (< 0,
 * si filled in).  A /proc that cannot tell (not ENOENT) counts as exec'd. */
static int await_exec(pid_t pid, int pidfd, int agent_fd, siginfo_t *si, tp_error_t *err) {
  struct stat want, st;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/exe", (int) pid);
  if (fstat(agent_fd, &want) < 0)
    return 0;
  for (int i = 0; i < 64 + TP__EXEC_WAIT_MS; i++) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (stat(path, &st) == 0 ? st.st_dev == want.st_dev && st.st_ino == want.st_ino
                             : errno != ENOENT)
      return 0;
    memset(si, 0, sizeof(*si));
    if (waitid((idtype_t) P_PIDFD, (id_t) pidfd, si, WEXITED | WNOHANG | WNOWAIT) < 0)
      return tp_error_errno(err, errno, "waitid");
    if (si->si_pid != 0)
      return tp_error_set(err, ECHILD, "box exited during start (%s %d)",
                          si->si_code == CLD_EXITED ? "status" : "signal", si->si_status);
    if (i < 64)
      sched_yield(); /* the switch is a matter of microseconds */
    else
      poll(&p, 1, 1);
  }
  return tp_error_set(err, ETIMEDOUT, "box neither exec'd nor exited in %d ms",
                      TP__EXEC_WAIT_MS);
}

#define TP__CLONE_NS (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET)

/* The plan's last join, if of a cgroup2 cgroup (its dir's statfs says so),
 * opened for CLONE_INTO_CGROUP: the op's index, or -1.  The last only: a
 * host has one cgroup2 hierarchy, and the daemon's list is all v1 or one
 * v2 dir (a test's mixes v1 dirs and a cgroup2 one, that one last): one
 * statfs a start.
 * The child then is born there and skips that join, so the only write of
 * a cgroup.procs a box needed on v2 goes, with the kernel's write lock on
 * every thread group of the host it takes (v1 joins use tasks, which does
 * not: box_plan.c). */
static int v2_join(const tp__plan_t *plan, int *fd) {
  for (int i = plan->n_ops - 1; i >= 0; i--) {
    const tp__op_t *op = &plan->ops[i];
    char dir[TP__PATH_MAX_LEN + 1];
    const char *slash;
    struct statfs sf;
    if (op->kind != TP__OP_CGROUP)
      continue;
    slash = strrchr(op->dst, '/');
    if (slash == NULL || (size_t) (slash - op->dst) >= sizeof(dir))
      return -1;
    memcpy(dir, op->dst, (size_t) (slash - op->dst));
    dir[slash - op->dst] = '\0';
    if (statfs(dir, &sf) < 0 || sf.f_type != CGROUP2_SUPER_MAGIC)
      return -1;
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return *fd >= 0 ? i : -1;
  }
  return -1;
}

/* The child, born in plan's cgroup2 cgroup where there is one and the
 * kernel (5.7) and this architecture allow, else cloned as before and left
 * to join it.  Signals are blocked by the caller. */
static pid_t clone_child(tp__plan_t *plan, tp__child_t *child, const stacks_t *stacks, int *pfd) {
  cleanup_close int cg = -1;
  int op = v2_join(plan, &cg);
  if (op >= 0) {
    tp__clone_args_t a = {.flags = CLONE_VM | CLONE_PIDFD | TP__CLONE_NS | CLONE_INTO_CGROUP,
                          .pidfd = (uint64_t) (uintptr_t) pfd,
                          .exit_signal = SIGCHLD,
                          .stack = (uint64_t) (uintptr_t) (stacks->base + TP__GUARD_SIZE),
                          .stack_size = TP__STACK_SIZE,
                          .cgroup = (uint64_t) cg};
    pid_t pid;
    plan->born_in = op; /* before the clone: the child reads it */
    pid = tp__clone3(&a, tp__box_child, child);
    if (pid >= 0)
      return pid;
    plan->born_in = -1; /* no child: clone as before, it joins */
  }
  return clone(tp__box_child, stack_top(stacks), CLONE_VM | CLONE_PIDFD | TP__CLONE_NS | SIGCHLD,
               child, pfd);
}

static int box_start(const tp_box_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  cleanup_plan tp__plan_t plan;
  cleanup_box_dir const char *dir_guard = NULL; /* declared early: runs after the reap */
  /* the box's subvolume on the pool, dropped on failure (after the reap) */
  cleanup_pool_box const tp_box_spec_t *pool_guard = NULL;
  cleanup_close int dfd = -1;
  /* The disk's loop device: held until the child has mounted it (AUTOCLEAR
   * would detach it on this last close otherwise), released on return. */
  cleanup_close int loop_fd = -1;
  cleanup_fds fds_t vol_fds = {{-1}, 0}; /* the volumes' loop devices, likewise */
  cleanup_stacks stacks_t stacks = {NULL, 0};
  cleanup_close int chan_p = -1, chan_c = -1;
  cleanup_close int sync_p = -1, sync_c = -1;
  cleanup_close int pidfd = -1;
  cleanup_pid pid_t pid = -1;
  tp__child_t child;
  int pair[2], pfd = -1;
  sigset_t all, old;
  siginfo_t si;
  pid_t ret;

  if (tp__plan_build(&plan, spec, err) < 0)
    return -1;
  /* a removed box's dir where one is spare, else a new one */
  if (tp__spare_dir_take(spec->box_dir) < 0 && mkdir(spec->box_dir, 0700) < 0)
    return tp_error_errno(err, errno, "mkdir '%s'", spec->box_dir);
  dir_guard = spec->box_dir;
  dfd = open(spec->box_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return tp_error_errno(err, errno, "open '%s'", spec->box_dir);
  if (make_box_subdirs(dfd, spec, err) < 0)
    return -1;
  if (spec->pool != NULL) {
    char sub[TP__PATH_MAX_LEN + 80];
    snprintf(sub, sizeof(sub), "%s/boxes/%s", spec->pool, spec->id);
    /* the name first: a failed start's rmtree of box_dir and the destroy
     * both find the subvolume through it.  An xattr, where the filesystem
     * has them: each inode a box makes on the state dir costs every later
     * create (docs/benchmarks.md, "Churn") */
    if (fsetxattr(dfd, TP__POOL_XATTR, sub, strlen(sub), XATTR_CREATE) < 0 &&
        (errno != EOPNOTSUPP || symlinkat(sub, dfd, TP__POOL_LINK) < 0))
      return tp_error_errno(err, errno, "name the pool subvolume in '%s'", spec->box_dir);
    if (tp__pool_box_make(spec->pool, spec->id, spec->disk_bytes, spec->uid_base,
                          spec->gid_base, err) < 0)
      return tp_error_prefix(err, "disk cap on the pool");
    pool_guard = spec;
  } else if (spec->disk_bytes > 0) {
    loop_fd = tp__disk_make(dfd, spec->box_dir, spec->disk_bytes, plan.disk_dev,
                            sizeof(plan.disk_dev), err);
    if (loop_fd < 0)
      return tp_error_prefix(err, "disk cap");
  }
  for (int i = 0; i < spec->n_volumes; i++) {
    cleanup_close int img = open(spec->volumes[i].image,
                                 O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (img < 0)
      return tp_error_errno(err, errno, "volume: open '%s'", spec->volumes[i].image);
    if (fstat(img, &st) < 0 || !S_ISREG(st.st_mode))
      return tp_error_set(err, EINVAL, "volume: '%s' is not a regular file",
                          spec->volumes[i].image);
    vol_fds.fd[i] = tp__loop_attach(img, plan.vol_dev[i], sizeof(plan.vol_dev[i]), err);
    if (vol_fds.fd[i] < 0)
      return tp_error_prefix(err, "volume '%s'", spec->volumes[i].image);
    vol_fds.n = i + 1;
  }
  if (stacks_map(&stacks, err) < 0)
    return -1;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
    return tp_error_errno(err, errno, "socketpair");
  chan_p = pair[0];
  chan_c = pair[1];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
    return tp_error_errno(err, errno, "socketpair");
  sync_p = pair[0];
  sync_c = pair[1];

  memset(&child, 0, sizeof(child));
  child.plan = &plan;
  child.chan = chan_c;
  child.agent = spec->agent_fd;
  child.sync = sync_c;
  child.listen = -1;

  /* No handler of the daemon may run in the child: block everything across
   * the clone (the child keeps that mask); the child resets dispositions
   * before unblocking.  The cgroup namespace comes later (a plan step):
   * after the child has joined the box's cgroups, so that it is rooted
   * there. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  ret = clone_child(&plan, &child, &stacks, &pfd);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (ret < 0)
    return tp_error_errno(err, errno, "clone");
  pid = ret;
  pidfd = pfd;
  /* Its end is the child's alone now: the read below ends when the child
   * execs the agent (close on exec) or dies.  Until then this thread waits
   * in child_sync: the child uses the plan, its stack and child, all of
   * this frame, and the cleanups (a kill and a reap first) run only after. */
  close(sync_c);
  sync_c = -1;
  if (child_sync(pid, sync_p, &plan, err) < 0)
    return -1;

  if (child.report.err != 0) {
    child.report.msg[sizeof(child.report.msg) - 1] = '\0';
    return tp_error_errno(err, child.report.err, "%s", child.report.msg);
  }
  /* No report: it exec'd, unless a signal killed it first. */
  if (await_exec(pid, pidfd, spec->agent_fd, &si, err) < 0)
    return -1;
  if (fcntl(chan_p, F_SETFL, O_NONBLOCK) < 0)
    return tp_error_errno(err, errno, "fcntl channel");

  box->pid = pid;
  box->pidfd = pidfd;
  box->chan_fd = chan_p;
  box->resolv = child.resolv;
  pid = -1;
  pidfd = -1;
  chan_p = -1;
  dir_guard = NULL;
  pool_guard = NULL;
  return 0;
}

int tp_linux_box_start(const tp_box_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  tp_error_t local;
  if (err == NULL)
    err = &local;
  box->pid = 0;
  box->pidfd = -1;
  box->chan_fd = -1;
  box->resolv = 0;
  if (box_start(spec, box, err) < 0) {
    /* The id was validated unless the plan said otherwise; print it safely. */
    return tp_error_prefix(err, "start box %.63s", spec->id ? spec->id : "(null)");
  }
  return 0;
}
