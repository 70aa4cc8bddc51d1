/* tp_microvm_start: QEMU as an unprivileged child in the sandbox's cgroups,
 * one end of a socketpair as the agent channel.  See microvm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "microvm.h"
#include "utils.h"

#define TP__VM_CHAN_FD 3
#define TP__VM_FD_MAX 64
#define TP__VM_HIGH_FD 512 /* where passed fds wait before they are moved down */

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
  /* after the uid change, which clears it: QEMU dies with the daemon (a VM
   * is not re-adopted) */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
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

int tp_microvm_start(const tp_vm_spec_t *s, tp_box_t *box, tp_error_t *err) {
  cleanup_close int pidfd = -1;
  cleanup_pid pid_t pid = -1;
  int sv[2], st[2], e = 0;
  ssize_t n;

  if (s->argv == NULL || s->argv[0] == NULL || s->argv[0][0] != '/')
    return tp_error_set(err, EINVAL, "start VM: QEMU's path must be absolute");
  if (s->npass < 0 || s->npass > TP__VM_FD_MAX)
    return tp_error_set(err, EINVAL, "start VM: too many fds to pass");
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return tp_error_errno(err, errno, "start VM: socketpair");
  if (pipe2(st, O_CLOEXEC) < 0) {
    e = errno;
    close(sv[0]);
    close(sv[1]);
    return tp_error_errno(err, e, "start VM: pipe");
  }
  pid = fork();
  if (pid < 0) {
    e = errno;
    close(st[0]);
    close(st[1]);
    close(sv[0]);
    close(sv[1]);
    return tp_error_errno(err, e, "start VM: fork");
  }
  if (pid == 0) {
    close(st[0]);
    vm_child(s, sv[1], st[1]);
  }
  close(st[1]);
  close(sv[1]);
  do
    n = read(st[0], &e, sizeof(e));
  while (n < 0 && errno == EINTR);
  close(st[0]);
  if (n > 0) {
    close(sv[0]);
    return tp_error_errno(err, e, "start VM: exec %s", s->argv[0]);
  }
  pidfd = (int) syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0 || fcntl(sv[0], F_SETFL, O_NONBLOCK) < 0) {
    e = errno;
    close(sv[0]);
    return tp_error_errno(err, e, "start VM: pidfd_open");
  }
  box->pid = pid;
  box->pidfd = pidfd;
  box->chan_fd = sv[0];
  pid = -1;
  pidfd = -1;
  return 0;
}
