/* The cloned child of tp_linux_box_start.  It runs in the daemon's memory
 * (CLONE_VM) while the calling thread waits for it (linux_int.h) and the
 * daemon's other threads keep running, so only async-signal-safe calls are
 * allowed: plain syscall wrappers, no malloc, no stdio, nothing that takes a
 * lock.  glibc's setresuid & co. would try to signal the daemon's threads
 * (setxid broadcast): use syscall().  Of the shared memory it writes only
 * its own fields of tp__child_t, the report last, just before _exit(127). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "linux_int.h"

#define TP__HIGH_FD 10 /* fds are parked at or above this while being arranged */
#define TP__AGENT_EXEC_FD (TP_AGENT_LISTEN_FD + 1) /* the agent's fd, waiting for execveat */
#define TP__SYNC_FD (TP__AGENT_EXEC_FD + 1) /* the parent's sync socket, until the exec */
#define TP__NOFILE_MAX 1048576 /* RLIMIT_NOFILE of the box, if the daemon's hard limit is higher */
_Static_assert(TP_AGENT_FD > 2 && TP_AGENT_LISTEN_FD == TP_AGENT_FD + 1 &&
                   TP__SYNC_FD + 1 < TP__HIGH_FD,
               "fd layout");

/* Bounded copy; returns the new end.  No strlcpy/snprintf here. */
static size_t put(char *buf, size_t off, size_t cap, const char *s) {
  while (s != NULL && *s != '\0' && off + 1 < cap)
    buf[off++] = *s++;
  buf[off] = '\0';
  return off;
}

static void report(tp__child_report_t *r, int code, const char *step, const char *path) {
  size_t off;
  off = put(r->msg, 0, sizeof(r->msg), step);
  if (path != NULL) {
    off = put(r->msg, off, sizeof(r->msg), " '");
    off = put(r->msg, off, sizeof(r->msg), path);
    put(r->msg, off, sizeof(r->msg), "'");
  }
  r->err = code ? code : EIO; /* err != 0 is what marks a report */
}

__attribute__((noreturn)) static void fail(tp__child_t *c, int code, const char *step,
                                           const char *path) {
  report(&c->report, code, step, path);
  _exit(127);
}

/* Writes all of text to an existing file (cgroup.procs, uid_map...). */
static int write_file(const char *path, const char *text) {
  size_t len = strlen(text);
  ssize_t n;
  int saved, fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  n = write(fd, text, len);
  if (n >= 0 && (size_t) n != len) {
    n = -1;
    errno = EIO;
  }
  saved = errno;
  close(fd);
  errno = saved;
  return n < 0 ? -1 : 0;
}

/* Brings lo up, and lets the agent (root of a user namespace that does not
 * own this netns, so without CAP_NET_BIND_SERVICE here) bind the DNS port:
 * ports from 53 up need no privilege in the box's own network namespace
 * (a per-netns sysctl; /proc/sys/net follows the writer's netns).  Nothing
 * outside the box is reachable from it, so low ports guard nothing here. */
static int lo_up(void) {
  struct ifreq ifr;
  int ret = -1, saved;
  int fd;
  if (write_file("/proc/sys/net/ipv4/ip_unprivileged_port_start", "53") < 0)
    return -1;
  fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ret = ioctl(fd, SIOCSIFFLAGS, &ifr);
  }
  saved = errno;
  close(fd);
  errno = saved;
  return ret;
}

/* The agent's listening socket, bound as op->src relative to op->dst (our
 * own cwd: no CLONE_FS), so the length of box_dir does not matter. */
static int agent_listen(tp__child_t *c, const tp__op_t *op) {
  struct sockaddr_un sa;
  size_t n = strlen(op->src);
  mode_t old;
  int fd, r, saved;

  if (n >= sizeof(sa.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (chdir(op->dst) < 0)
    return -1;
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, op->src, n);
  old = umask(0777 & ~op->mode); /* the socket file is made with the mode already */
  r = bind(fd, (struct sockaddr *) &sa, sizeof(sa));
  umask(old);
  if (r == 0)
    r = listen(fd, 4);
  if (r < 0) {
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  c->listen = fd;
  return 0;
}

/* mkdir dst unless present; either way it must be a directory and not a
 * symlink, so no mount below can be redirected by the image.  A dir this
 * mkdir made is one (and has its mode: the child's umask is 0); only one
 * that was there is looked at. */
static int real_dir(const char *dst, mode_t mode, int likely) {
  struct stat st;
  int fd;
  /* one there most times (the image's /dev, a subvolume's upper/): a look
   * first, one call instead of a failed mkdir, an open and a close */
  if (likely) {
    if (fstatat(AT_FDCWD, dst, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(st.st_mode))
        return 0;
      errno = ENOTDIR;
      return -1;
    }
    if (errno != ENOENT)
      return -1;
  }
  if (mkdir(dst, mode) == 0)
    return 0;
  if (errno != EEXIST)
    return -1;
  fd = open(dst, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  close(fd);
  return 0;
}

/* TP__OP_VOLUME: walks op->dst (relative, checked by the plan) under the
 * rootfs op->data one component at a time, making what is missing (owned
 * uid:gid) and refusing a symlink anywhere (O_NOFOLLOW), then binds op->src
 * on the dir reached, named by its fd.  Async-signal-safe calls only. */
static int volume_bind(const tp__op_t *op) {
  char rel[TP_VOLUME_TARGET_MAX + 1], fdpath[32] = "/proc/self/fd/";
  size_t n = strlen(op->dst), off = 14;
  int dfd, r, e;
  char digits[12];
  int nd = 0;

  if (n > TP_VOLUME_TARGET_MAX) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(rel, op->dst, n + 1);
  dfd = open(op->data, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return -1;
  for (char *c = rel; c != NULL;) {
    char *slash = strchr(c, '/');
    int nfd;
    if (slash != NULL)
      *slash = '\0';
    if (mkdirat(dfd, c, op->mode) == 0) {
      if (fchownat(dfd, c, op->uid, op->gid, AT_SYMLINK_NOFOLLOW) < 0)
        goto fail;
    } else if (errno != EEXIST) {
      goto fail;
    }
    nfd = openat(dfd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd < 0)
      goto fail;
    close(dfd);
    dfd = nfd;
    c = slash != NULL ? slash + 1 : NULL;
  }
  for (int v = dfd; nd == 0 || v > 0; v /= 10)
    digits[nd++] = (char) ('0' + v % 10);
  while (nd > 0)
    fdpath[off++] = digits[--nd];
  fdpath[off] = '\0';
  r = mount(op->src, fdpath, NULL, MS_BIND, NULL);
  e = errno;
  close(dfd);
  errno = e;
  return r;
fail:
  e = errno;
  close(dfd);
  errno = e;
  return -1;
}

/* TP__OP_RESOLV: data written to etc/resolv.conf under the rootfs op->dst
 * (nothing mounted under it yet but the overlay), each component opened
 * from the one above with O_NOFOLLOW: a symlink (to a host path, to a file
 * of the box, dangling), an /etc that is not a dir, a file that is not a
 * regular one (a FIFO, a device node) is left alone and c->resolv stays 0;
 * the daemon then has the agent write it, as root of the box, inside it.
 * A missing /etc (only on ENOENT) or file is made, owned op->uid:op->gid. */
static void resolv_write(tp__child_t *c, const tp__op_t *op) {
  const int dirfl = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  /* O_TRUNC: overlayfs copies a lower file up without its data; it does
   * nothing to what is not a regular file (refused below, unwritten) */
  const int filefl = O_WRONLY | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  size_t len = strlen(op->data), done = 0;
  int root, etc, fd = -1;
  struct stat st;

  root = open(op->dst, dirfl);
  if (root < 0)
    return;
  etc = openat(root, "etc", dirfl);
  if (etc < 0 && errno == ENOENT && mkdirat(root, "etc", 0755) == 0 &&
      fchownat(root, "etc", op->uid, op->gid, AT_SYMLINK_NOFOLLOW) == 0)
    etc = openat(root, "etc", dirfl);
  close(root);
  if (etc < 0)
    return;
  fd = openat(etc, "resolv.conf", filefl);
  if (fd < 0 && errno == ENOENT) {
    fd = openat(etc, "resolv.conf", filefl | O_CREAT | O_EXCL, op->mode);
    if (fd >= 0 && fchown(fd, op->uid, op->gid) < 0) {
      close(fd);
      fd = -1;
    }
  }
  close(etc);
  if (fd < 0)
    return;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
    goto out;
  while (done < len) {
    ssize_t n = write(fd, op->data + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      goto out;
    done += (size_t) n;
  }
  c->resolv = 1;
out:
  close(fd);
}

/* TP__OP_SYSFS: the mount made while in the plan's sysfs namespace, then
 * back to the box's own (named by an fd taken first); where that namespace
 * cannot be entered, a sysfs of the box's own, as before.  Should the way
 * back fail, the child fails the step and exits: the box never runs in
 * the shared namespace. */
static int sysfs_mount(const tp__plan_t *plan, const tp__op_t *op) {
  int own, r, e;
  if (plan->sysfs_netns < 0)
    return mount(op->src, op->dst, op->fstype, op->flags, op->data);
  own = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC); /* one process: self is the thread */
  if (own < 0)
    return -1;
  if (setns(plan->sysfs_netns, CLONE_NEWNET) < 0) { /* still in its own: a sysfs of its own */
    close(own);
    return mount(op->src, op->dst, op->fstype, op->flags, op->data);
  }
  r = mount(op->src, op->dst, op->fstype, op->flags, op->data);
  e = errno;
  if (setns(own, CLONE_NEWNET) < 0) {
    r = -1;
    e = errno;
  }
  close(own);
  errno = e;
  return r;
}

static int run_op(tp__child_t *c, const tp__op_t *op) {
  switch (op->kind) {
  case TP__OP_CGROUP:
    /* v1: through its tasks file (box_plan.c); ENOENT there is v2 */
    if (op->src != NULL) {
      if (write_file(op->src, "0") == 0)
        return 0;
      if (errno != ENOENT)
        return -1;
    }
    return write_file(op->dst, "0");
  case TP__OP_UNSHARE:
    return unshare((int) op->flags);
  case TP__OP_LISTEN:
    return agent_listen(c, op);
  case TP__OP_MOUNT:
    return mount(op->src, op->dst, op->fstype, op->flags, op->data);
  case TP__OP_SYSFS:
    return sysfs_mount(c->plan, op);
  case TP__OP_DIR:
    return real_dir(op->dst, op->mode, op->flags != 0);
  case TP__OP_OWN:
    if (fchownat(AT_FDCWD, op->dst, op->uid, op->gid, AT_SYMLINK_NOFOLLOW) < 0)
      return -1;
    return op->flags != 0 ? chmod(op->dst, op->mode) : 0;
  case TP__OP_FILE:
    /* a regular file: one call, no open file; like O_CREAT | O_EXCL, it
     * fails on anything there, a symlink included */
    return mknod(op->dst, S_IFREG | op->mode, 0);
  case TP__OP_SYMLINK:
    return symlink(op->src, op->dst);
  case TP__OP_CHDIR:
    return chdir(op->dst);
  case TP__OP_RESOLV:
    resolv_write(c, op);
    return 0;
  case TP__OP_VOLUME:
    return volume_bind(op);
  case TP__OP_HOSTNAME:
    return sethostname(op->src, strlen(op->src));
  case TP__OP_LO_UP:
    return lo_up();
  case TP__OP_PIVOT:
    /* pivot_root(".", "."): the old root ends up stacked on the new one and
     * is detached at once; no put_old directory is needed. */
    if (chdir(op->dst) < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
      return -1;
    if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
      return -1;
    return 0;
  }
  errno = EINVAL;
  return -1;
}

static void reset_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP)
      sigaction(sig, &sa, NULL); /* fails harmlessly for libc-reserved signals */
}

static int park(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, TP__HIGH_FD); }

/* Closes every fd of this copy of the daemon's fd table but 0-2 and the
 * ones the set-up uses (the channel, the agent, the parent's sync socket,
 * the sysfs namespace): the
 * daemon's listening socket and its clients' connections first of all.  A
 * clone without exec inherits them whatever their close-on-exec flag, and
 * the set-up takes milliseconds: should the daemon crash meanwhile, a
 * client connecting to its socket would reach a listener nobody answers
 * until this child died of its parent-death signal. */
static int close_daemon_fds(const tp__child_t *c) {
  int keep[] = {c->chan, c->agent, c->sync, c->plan->sysfs_netns};
  int n = (int) (sizeof(keep) / sizeof(keep[0]));
  unsigned from = 3;
  for (int i = 1; i < n; i++) /* insertion sort: no qsort here */
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  for (int i = 0; i < n; i++) {
    if (keep[i] < (int) from)
      continue; /* -1 (no sysfs namespace), or one of 0-2 */
    if ((unsigned) keep[i] > from && syscall(SYS_close_range, from, keep[i] - 1, 0) < 0)
      return -1;
    from = (unsigned) keep[i] + 1;
  }
  return (int) syscall(SYS_close_range, from, ~0U, 0);
}

/* Only ever lowers (root here may lack CAP_SYS_RESOURCE): no core files,
 * and as many fds as the daemon may have, at most TP__NOFILE_MAX. */
static int lower_rlimits(void) {
  struct rlimit core = {0, 0}, nofile;
  if (setrlimit(RLIMIT_CORE, &core) < 0 || getrlimit(RLIMIT_NOFILE, &nofile) < 0)
    return -1;
  if (nofile.rlim_max > TP__NOFILE_MAX)
    nofile.rlim_max = TP__NOFILE_MAX;
  nofile.rlim_cur = nofile.rlim_max;
  return setrlimit(RLIMIT_NOFILE, &nofile);
}

/* unshare a user namespace and have the parent map it (root -> uid_base):
 * the parent is still real root of the host user namespace, which this
 * child stops being here.  "u" says the namespace exists; the parent
 * answers "m" once both maps are written, or kills this child. */
static void enter_user_ns(tp__child_t *c) {
  char b = 'u';
  ssize_t n;

  if (unshare(CLONE_NEWUSER) < 0)
    fail(c, errno, "unshare user namespace", NULL);
  do
    n = write(c->sync, &b, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1)
    fail(c, n < 0 ? errno : EIO, "ask for the id maps", NULL);
  do
    n = read(c->sync, &b, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1 || b != 'm')
    fail(c, n < 0 ? errno : ECHILD, "wait for the id maps", NULL);
}

int tp__box_child(void *arg) {
  tp__child_t *c = arg;
  const tp__plan_t *plan = c->plan;
  char *const argv[] = {"tupper-agent", NULL};
  char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  int chan, listen_fd, agent, sync, null_fd;
  sigset_t none;

  /* Signals stay blocked (the parent blocked them around clone) until exec;
   * the daemon's handlers must never run in this copy of its thread. */
  reset_signals();
  /* Should the daemon die during the set-up, the half-made box goes with
   * it (a restarted daemon removes what is left); it holds none of the
   * daemon's fds but the few it uses by then (close_daemon_fds).  Set
   * again after the uid change, which clears it; cleared before exec: a
   * box outlives a crash. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
    fail(c, errno, "set parent-death signal", NULL);
  if (close_daemon_fds(c) < 0)
    fail(c, errno, "close the daemon's fds", NULL);

  /* The plan's modes are the modes made (mkdir, mknod): no chmod after
   * each.  The agent gets 022 back before its exec. */
  umask(0);
  for (int i = 0; i < plan->n_ops; i++)
    if (i != plan->born_in && run_op(c, &plan->ops[i]) < 0)
      fail(c, errno, plan->ops[i].step, plan->ops[i].dst);

  /* Only now, with every mount in place, the user namespace: the mount, net,
   * UTS... namespaces stay owned by the host one. */
  enter_user_ns(c);
  if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setgroups, 0, NULL) < 0 ||
      syscall(SYS_setresuid, 0, 0, 0) < 0)
    fail(c, errno, "become root in the user namespace", NULL);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
    fail(c, errno, "set parent-death signal", NULL);
  /* Leave the daemon's session: /dev/tty must not reach its terminal. */
  if (setsid() < 0)
    fail(c, errno, "setsid", NULL);

  /* Arrange 0-2 = /dev/null, TP_AGENT_FD = channel, TP_AGENT_LISTEN_FD =
   * the agent socket, the next = agent and then the sync socket (both close
   * on exec: the parent's read of the sync socket ends at the exec), close
   * the rest: the daemon's fds.  Park everything high first so no dup2
   * clobbers a source. */
  null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0)
    fail(c, errno, "open /dev/null", NULL);
  if ((null_fd = park(null_fd)) < 0 || (chan = park(c->chan)) < 0 ||
      (listen_fd = park(c->listen)) < 0 || (agent = park(c->agent)) < 0 ||
      (sync = park(c->sync)) < 0)
    fail(c, errno, "arrange fds", NULL);
  if (dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0 ||
      dup2(chan, TP_AGENT_FD) < 0 || dup2(listen_fd, TP_AGENT_LISTEN_FD) < 0 ||
      dup3(agent, TP__AGENT_EXEC_FD, O_CLOEXEC) < 0 || dup3(sync, TP__SYNC_FD, O_CLOEXEC) < 0 ||
      syscall(SYS_close_range, TP__SYNC_FD + 1, ~0U, 0) < 0)
    fail(c, errno, "arrange fds", NULL);
  /* No daemon fd is left: from here on the box outlives a crashed daemon,
   * and the next one re-adopts it through the agent socket
   * (docs/architecture.md). */
  if (prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0) < 0)
    fail(c, errno, "clear parent-death signal", NULL);

  umask(022);
  if (lower_rlimits() < 0)
    fail(c, errno, "lower rlimits", NULL);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* The very last step: from here on only execveat (and exit_group, should
   * it fail) must pass the filter. */
  if (plan->seccomp != NULL) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
      fail(c, errno, "set no_new_privs", NULL);
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, plan->seccomp) < 0)
      fail(c, errno, "load seccomp filter", NULL);
  }
  syscall(SYS_execveat, TP__AGENT_EXEC_FD, "", argv, envp, AT_EMPTY_PATH);
  fail(c, errno, "exec agent", NULL);
}
