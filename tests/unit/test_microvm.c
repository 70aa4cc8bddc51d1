/* tp_microvm_adopt: a restarted daemon takes a microVM's QEMU over only when
 * the pid of its record proves to be that QEMU.  No QEMU here: a child plays
 * its part as far as the checks see it (it runs as QEMU's uid and calls
 * listen() on the socket the "daemon" bound, as QEMU does), and a plain file
 * stands for the cgroup.procs of the VM's cgroup.  Every refusal leaves the
 * process it names alive and unsignalled. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "microvm.h"
#include "tap.h"

#define QUID 100130000u /* a microVM uid (microvm.lua: 100065536 + n) */

static char dir[256], procs[300];

/* A child running as uid that calls listen() on lsock (-1: none) and then
 * waits until its pipe closes.  Returns its pid; *ctl is the pipe's write end. */
static pid_t spawn(uid_t uid, int lsock, int *ctl) {
  int p[2], ready[2];
  char c;
  pid_t pid;
  if (pipe(p) < 0 || pipe(ready) < 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    close(p[1]);
    close(ready[0]);
    if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
      _exit(1);
    if (lsock >= 0 && listen(lsock, 1) < 0)
      _exit(1);
    if (write(ready[1], "x", 1) != 1)
      _exit(1);
    while (read(p[0], &c, 1) > 0)
      ;
    _exit(0);
  }
  close(p[0]);
  close(ready[1]);
  if (pid < 0 || read(ready[0], &c, 1) != 1) {
    close(ready[0]);
    close(p[1]);
    return -1;
  }
  close(ready[0]);
  *ctl = p[1];
  return pid;
}

static void write_procs(pid_t a, pid_t b) {
  FILE *f = fopen(procs, "w");
  if (f == NULL)
    return;
  fprintf(f, "%d\n%d\n", (int) a, (int) b);
  fclose(f);
}

/* Alive and not a zombie, so never killed by a refused adoption. */
static int alive(pid_t pid) {
  int status;
  return kill(pid, 0) == 0 && waitpid(pid, &status, WNOHANG) == 0;
}

static void expect_refused(const tp_vm_adopt_t *a, int code, const char *needle, const char *what) {
  tp_box_t box;
  tp_error_t err = {0};
  int r = tp_microvm_adopt(a, &box, &err);
  check(r < 0 && err.code == code && strstr(err.msg, needle) != NULL && box.pidfd < 0 &&
            box.chan_fd < 0,
        "%s: refused (%s)", what, err.msg);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR");
  struct sockaddr_un sa;
  tp_error_t err = {0};
  tp_vm_adopt_t a = {0};
  tp_box_t box;
  unsigned long long st_q = 0, st_o = 0;
  int lsock, ctl_q = -1, ctl_o = -1, status;
  pid_t q, o, gone;

  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root (the fake QEMU changes its uid)\n");
    return 77;
  }
  snprintf(dir, sizeof(dir), "%s/tupper-test-microvm.XXXXXX", tmpdir ? tmpdir : "/tmp");
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);

  /* the daemon's part: a listening socket at <dir>/agent.sock */
  lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (strlen(dir) + sizeof("/agent.sock") > sizeof(sa.sun_path)) {
    printf("1..0 # SKIP TMPDIR is too long for a socket path\n");
    rmdir(dir);
    return 77;
  }
  memcpy(sa.sun_path, dir, strlen(dir));
  memcpy(sa.sun_path + strlen(dir), "/agent.sock", sizeof("/agent.sock"));
  if (lsock < 0 || bind(lsock, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(lsock, 4) < 0) {
    perror("socket");
    return 1;
  }
  q = spawn(QUID, lsock, &ctl_q);  /* QEMU: it listens */
  o = spawn(QUID, -1, &ctl_o);     /* an unrelated process with QEMU's uid */
  close(lsock);
  check(q > 0 && o > 0, "start a fake QEMU and an unrelated process as uid %u", QUID);
  status = tp_microvm_start_time(q, &st_q, &err) == 0 && tp_microvm_start_time(o, &st_o, &err) == 0;
  check(status && st_q > 0 && st_o > 0, "their start times (%llu, %llu)", st_q, st_o);
  write_procs(q, o);

  a = (tp_vm_adopt_t){.dir = dir, .pid = q, .uid = QUID, .start_time = st_q, .cgroup_procs = procs};
  tp_error_clear(&err);
  check(tp_microvm_adopt(&a, &box, &err) == 0 && box.pid == q && box.pidfd >= 0 && box.chan_fd >= 0,
        "the VM's QEMU is adopted (%s)", err.msg);
  if (box.pidfd >= 0)
    close(box.pidfd);
  if (box.chan_fd >= 0)
    close(box.chan_fd);

  a.start_time = st_q + 1;
  expect_refused(&a, ESRCH, "not this VM's QEMU", "a later start time (a reused pid)");
  a.start_time = st_q;
  a.uid = QUID + 1;
  expect_refused(&a, EPERM, "not as QEMU's uid", "another uid");
  a.uid = QUID;
  write_procs(o, o);
  expect_refused(&a, EPERM, "not in the VM's cgroup", "a pid outside the VM's cgroup");
  write_procs(q, o);
  /* everything right but the socket: only QEMU listens on it */
  a = (tp_vm_adopt_t){.dir = dir, .pid = o, .uid = QUID, .start_time = st_o, .cgroup_procs = procs};
  expect_refused(&a, ESRCH, "agent socket belongs to pid", "a process that is not the socket's listener");
  a = (tp_vm_adopt_t){.dir = dir, .pid = 1, .uid = QUID, .start_time = st_q, .cgroup_procs = procs};
  expect_refused(&a, EINVAL, "need an absolute dir", "pid 1");
  a = (tp_vm_adopt_t){.dir = dir, .pid = q, .uid = 0, .start_time = st_q, .cgroup_procs = procs};
  expect_refused(&a, EINVAL, "need an absolute dir", "uid 0");
  check(alive(q) && alive(o), "no refusal signalled the processes it named");

  /* a QEMU that died: as a zombie, then reaped */
  close(ctl_o);
  for (int i = 0; i < 500 && kill(o, 0) == 0; i++) {
    siginfo_t si = {0};
    if (waitid(P_PID, (id_t) o, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == o)
      break;
    usleep(10000);
  }
  a = (tp_vm_adopt_t){.dir = dir, .pid = o, .uid = QUID, .start_time = st_o, .cgroup_procs = procs};
  expect_refused(&a, ESRCH, "is gone", "an exited process (a zombie)");
  gone = waitpid(o, &status, 0);
  expect_refused(&a, ESRCH, "is gone", "a reaped process");
  check(gone == o, "reap the unrelated process");

  close(ctl_q);
  waitpid(q, &status, 0);
  unlink(sa.sun_path);
  unlink(procs);
  rmdir(dir);
  return tap_done();
}
