/* tp_microvm_start: QEMU as an unprivileged child in the sandbox's cgroups,
 * serving the agent's port on a unix socket the daemon bound in the VM's
 * dir.  tp_microvm_adopt: a restarted daemon connects to it again.  See
 * microvm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "microvm.h"
#include "utils.h"

#define TP__VM_CHAN_FD 3
#define TP__VM_FD_MAX 64
#define TP__VM_HIGH_FD 512 /* where passed fds wait before they are moved down */
#define TP__VM_SOCK "agent.sock" /* in the VM's dir: QEMU listens, the daemon connects */
#define TP__VM_PROC_MAX 4096     /* bytes read of /proc/<pid>/stat or status */

/* In the forked child: async-signal-safe calls only.  Reports errno on
 * status_fd (close-on-exec) when a step fails. */
static void vm_child(const tp_vm_spec_t *s, int chan, int status_fd) {
  static char *const envp[] = {"PATH=/usr/bin:/bin", NULL};
  int high[TP__VM_FD_MAX + 1];
  int e, nul, first = TP__VM_CHAN_FD + s->npass + 1;
  status_fd = fcntl(status_fd, F_DUPFD_CLOEXEC, TP__VM_HIGH_FD + TP__VM_FD_MAX + 1);
  if (status_fd < 0)
    _exit(127);
  for (const char *const *p = s->cgroup_procs; p != NULL && *p != NULL; p++) {
    int fd = open(*p, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1)
      goto fail;
    close(fd);
  }
  /* out of the way first, so that no dup2 below clobbers a source */
  high[0] = fcntl(chan, F_DUPFD_CLOEXEC, TP__VM_HIGH_FD);
  for (int i = 0; i < s->npass; i++)
    high[i + 1] = fcntl(s->pass_fds[i], F_DUPFD_CLOEXEC, TP__VM_HIGH_FD);
  for (int i = 0; i <= s->npass; i++)
    if (high[i] < 0)
      goto fail;
  nul = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (nul < 0 || dup2(nul, 0) < 0)
    goto fail;
  if (s->console_fd >= 0) {
    if (dup2(s->console_fd, 1) < 0 || dup2(s->console_fd, 2) < 0)
      goto fail;
  } else if (dup2(nul, 1) < 0 || dup2(nul, 2) < 0) {
    goto fail;
  }
  for (int i = 0; i <= s->npass; i++)
    if (dup2(high[i], TP__VM_CHAN_FD + i) < 0) /* dup2 clears close-on-exec */
      goto fail;
  if (setsid() < 0 || setgroups(0, NULL) < 0 || setresgid(s->gid, s->gid, s->gid) < 0 ||
      setresuid(s->uid, s->uid, s->uid) < 0)
    goto fail;
  /* after the uid change, which clears it: a snapshot's template dies with
   * the daemon; a sandbox's QEMU outlives a crash, for the next daemon */
  if (s->die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
    goto fail;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    goto fail;
  if (close_range((unsigned) first, (unsigned) status_fd - 1, 0) < 0 ||
      close_range((unsigned) status_fd + 1, ~0u, 0) < 0)
    goto fail;
  execve(s->argv[0], (char *const *) s->argv, envp);
fail:
  e = errno;
  if (write(status_fd, &e, sizeof(e)) < 0) {
    /* nothing left to tell */
  }
  _exit(127);
}

/* <dir>/agent.sock as a sockaddr, through dfd (an O_PATH fd of dir): dir
 * may be longer than sun_path. */
static void sock_addr(int dfd, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", dfd, TP__VM_SOCK);
}

/* A connection to <dir>/agent.sock, non-blocking (a full backlog fails with
 * EAGAIN, never hangs), close-on-exec. */
static int sock_connect(int dfd, const char *dir, tp_error_t *err) {
  struct sockaddr_un sa;
  cleanup_close int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int ret;
  if (fd < 0)
    return tp_error_errno(err, errno, "socket");
  sock_addr(dfd, &sa);
  if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
    return tp_error_errno(err, errno, "connect to '%s/%s'", dir, TP__VM_SOCK);
  ret = fd;
  fd = -1;
  return ret;
}

/* Binds and listens on <dir>/agent.sock (0600; dir is root's, 0700: no box,
 * no QEMU and no other user reaches it).  An old one is replaced. */
static int sock_listen(int dfd, const char *dir, tp_error_t *err) {
  struct sockaddr_un sa;
  cleanup_close int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ret;
  if (fd < 0)
    return tp_error_errno(err, errno, "socket");
  if (unlinkat(dfd, TP__VM_SOCK, 0) < 0 && errno != ENOENT)
    return tp_error_errno(err, errno, "unlink '%s/%s'", dir, TP__VM_SOCK);
  sock_addr(dfd, &sa);
  if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
      fchmodat(dfd, TP__VM_SOCK, 0600, 0) < 0 || listen(fd, 1) < 0)
    return tp_error_errno(err, errno, "listen on '%s/%s'", dir, TP__VM_SOCK);
  ret = fd;
  fd = -1;
  return ret;
}

int tp_microvm_start(const tp_vm_spec_t *s, tp_box_t *box, tp_error_t *err) {
  cleanup_close int pidfd = -1, dfd = -1, lsock = -1, chan = -1;
  cleanup_pid pid_t pid = -1;
  int st[2], e = 0;
  ssize_t n;

  if (s->argv == NULL || s->argv[0] == NULL || s->argv[0][0] != '/')
    return tp_error_set(err, EINVAL, "start VM: QEMU's path must be absolute");
  if (s->npass < 0 || s->npass > TP__VM_FD_MAX)
    return tp_error_set(err, EINVAL, "start VM: too many fds to pass");
  if (s->dir == NULL || s->dir[0] != '/')
    return tp_error_set(err, EINVAL, "start VM: need the VM's absolute dir");
  dfd = open(s->dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return tp_error_errno(err, errno, "start VM: open '%s'", s->dir);
  lsock = sock_listen(dfd, s->dir, err);
  if (lsock < 0)
    return tp_error_prefix(err, "start VM");
  /* connected before QEMU runs: the connection waits in the backlog, and
   * the guest finds its port's host end open from the start */
  chan = sock_connect(dfd, s->dir, err);
  if (chan < 0)
    return tp_error_prefix(err, "start VM");
  if (pipe2(st, O_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "start VM: pipe");
  pid = fork();
  if (pid < 0) {
    e = errno;
    close(st[0]);
    close(st[1]);
    return tp_error_errno(err, e, "start VM: fork");
  }
  if (pid == 0) {
    close(st[0]);
    vm_child(s, lsock, st[1]);
  }
  close(st[1]);
  do
    n = read(st[0], &e, sizeof(e));
  while (n < 0 && errno == EINTR);
  close(st[0]);
  if (n > 0)
    return tp_error_errno(err, e, "start VM: exec %s", s->argv[0]);
  pidfd = (int) syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0)
    return tp_error_errno(err, errno, "start VM: pidfd_open");
  box->pid = pid;
  box->pidfd = pidfd;
  box->chan_fd = chan;
  pid = -1;
  pidfd = -1;
  chan = -1;
  return 0;
}

/* Reads up to TP__VM_PROC_MAX - 1 bytes of /proc/<pid>/<name> into buf. */
static int read_proc(pid_t pid, const char *name, char *buf, tp_error_t *err) {
  char path[64];
  cleanup_close int fd = -1;
  ssize_t n;
  snprintf(path, sizeof(path), "/proc/%d/%s", (int) pid, name);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "open %s", path);
  n = read(fd, buf, TP__VM_PROC_MAX - 1);
  if (n < 0)
    return tp_error_errno(err, errno, "read %s", path);
  buf[n] = '\0';
  return 0;
}

int tp_microvm_start_time(pid_t pid, unsigned long long *out, tp_error_t *err) {
  char buf[TP__VM_PROC_MAX];
  char *p, *end;
  if (read_proc(pid, "stat", buf, err) < 0)
    return -1;
  /* after the command name, which may hold anything but ends at the last ')' */
  p = strrchr(buf, ')');
  if (p == NULL)
    return tp_error_set(err, EINVAL, "/proc/%d/stat: no command name", (int) pid);
  p++;
  for (int field = 3; field < 22; field++) { /* p is at the space before field `field` */
    p = strchr(p + 1, ' ');
    if (p == NULL)
      return tp_error_set(err, EINVAL, "/proc/%d/stat: too few fields", (int) pid);
  }
  errno = 0;
  *out = strtoull(p + 1, &end, 10);
  if (errno != 0 || end == p + 1)
    return tp_error_set(err, EINVAL, "/proc/%d/stat: bad start time", (int) pid);
  return 0;
}

/* Real, effective, saved and filesystem uids of pid all equal uid? */
static int proc_uid_is(pid_t pid, uid_t uid, tp_error_t *err) {
  char buf[TP__VM_PROC_MAX];
  unsigned long u[4];
  const char *p;
  if (read_proc(pid, "status", buf, err) < 0)
    return -1;
  p = strstr(buf, "\nUid:");
  if (p == NULL || sscanf(p + 5, "%lu %lu %lu %lu", &u[0], &u[1], &u[2], &u[3]) != 4)
    return tp_error_set(err, EINVAL, "/proc/%d/status: no Uid line", (int) pid);
  for (int i = 0; i < 4; i++)
    if (u[i] != (unsigned long) uid)
      return tp_error_set(err, EPERM, "pid %d runs as uid %lu, not as QEMU's uid %u", (int) pid,
                          u[i], (unsigned) uid);
  return 0;
}

/* Does the cgroup.procs file at path list pid? */
static int cgroup_has(const char *path, pid_t pid, tp_error_t *err) {
  FILE *f = fopen(path, "re");
  char line[32];
  int found = 0;
  if (f == NULL)
    return tp_error_errno(err, errno, "open %s", path);
  while (!found && fgets(line, sizeof(line), f) != NULL)
    found = strtol(line, NULL, 10) == (long) pid;
  fclose(f);
  if (!found)
    return tp_error_set(err, EPERM, "pid %d is not in the VM's cgroup", (int) pid);
  return 0;
}

static int adopt(const tp_vm_adopt_t *a, tp_box_t *box, tp_error_t *err) {
  cleanup_close int pidfd = -1, dfd = -1, sock = -1;
  unsigned long long start;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  struct pollfd p;

  if (a->dir == NULL || a->dir[0] != '/' || a->pid <= 1 || a->uid == 0)
    return tp_error_set(err, EINVAL, "need an absolute dir, a pid and QEMU's uid");
  /* the pidfd first: the checks below are of /proc/<pid>, which is the
   * pidfd's process if that is still alive after them */
  pidfd = (int) syscall(SYS_pidfd_open, a->pid, 0);
  if (pidfd < 0)
    return errno == ESRCH ? tp_error_set(err, ESRCH, "QEMU (pid %d) is gone", (int) a->pid)
                          : tp_error_errno(err, errno, "pidfd_open %d", (int) a->pid);
  p = (struct pollfd){.fd = pidfd, .events = POLLIN};
  if (poll(&p, 1, 0) != 0) /* a zombie left to its new parent */
    return tp_error_set(err, ESRCH, "QEMU (pid %d) is gone", (int) a->pid);
  if (tp_microvm_start_time(a->pid, &start, err) < 0)
    return -1;
  if (start != a->start_time)
    return tp_error_set(err, ESRCH, "pid %d started at %llu, not at %llu: not this VM's QEMU",
                        (int) a->pid, start, a->start_time);
  if (proc_uid_is(a->pid, a->uid, err) < 0)
    return -1;
  if (a->cgroup_procs != NULL && cgroup_has(a->cgroup_procs, a->pid, err) < 0)
    return -1;
  p = (struct pollfd){.fd = pidfd, .events = POLLIN};
  if (poll(&p, 1, 0) != 0)
    return tp_error_set(err, ESRCH, "QEMU (pid %d) has exited", (int) a->pid);

  /* QEMU listens on the socket the dead daemon bound (it called listen()
   * again, which records its own credentials): the listener must be pid */
  dfd = open(a->dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return tp_error_errno(err, errno, "open '%s'", a->dir);
  sock = sock_connect(dfd, a->dir, err);
  if (sock < 0)
    return -1;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return tp_error_errno(err, errno, "SO_PEERCRED");
  if (cred.pid != a->pid || cred.uid != a->uid)
    return tp_error_set(err, ESRCH, "agent socket belongs to pid %d uid %u, not to QEMU (pid %d uid %u)",
                        (int) cred.pid, (unsigned) cred.uid, (int) a->pid, (unsigned) a->uid);
  box->pid = a->pid;
  box->pidfd = pidfd;
  box->chan_fd = sock;
  pidfd = -1;
  sock = -1;
  return 0;
}

int tp_microvm_adopt(const tp_vm_adopt_t *a, tp_box_t *box, tp_error_t *err) {
  box->pid = 0;
  box->pidfd = -1;
  box->chan_fd = -1;
  if (adopt(a, box, err) < 0)
    return tp_error_prefix(err, "adopt VM (pid %d)", (int) a->pid);
  return 0;
}
