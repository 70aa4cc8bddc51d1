/* Linux boxes and the daemon that started them: a box outlives its
 * daemon, and another process adopts it (a stand-in agent, then a real
 * box with a disk cap, destroyed from a bare pidfd too); boxes started
 * and destroyed from several threads at once; start and destroy times.
 * TAP-ish output; exit 0 pass, 1 fail, 77 skip (not root, no user
 * namespaces, no busybox, or no agent). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "tap.h"
#include "image.h"
#include "linux.h"
#include "rmtree.h"
#include "linux_box.h"

/* ------------------------------------------------------------ daemon death, adoption */

static int send_fd(int sock, int fd, pid_t pid) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&pid, sizeof(pid)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  return sendmsg(sock, &mh, 0) == sizeof(pid) ? 0 : -1;
}

static int recv_fd(int sock, pid_t *pid) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {pid, sizeof(*pid)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *cm;
  int fd = -1;
  if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != sizeof(*pid))
    return -1;
  cm = CMSG_FIRSTHDR(&mh);
  if (cm != NULL && cm->cmsg_type == SCM_RIGHTS)
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
  return fd;
}

/* No parent-death signal: the box outlives the process that started it.
 * That process hands us the channel (as a daemon's successor would find
 * the box), dies, and the box still answers. */
static void test_box_outlives_daemon(const env_t *e) {
  char *box_dir = path_in(tmp_root, "orphan");
  tp_error_t err = {0};
  tp_box_t box = {-1, -1, -1, 0};
  conn_t c = {-1, NULL, 0, 0, 0};
  pid_t kid;
  int sp[2], status, r;
  char *o, path[64], *st;
  size_t len;

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return;
  /* The orphaned box is reparented to us, so we reap it, not host init. */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  kid = fork();
  if (kid == 0) {
    tp_box_spec_t s = spec_for(e, "orphan", box_dir);
    tp_box_t b;
    tp_error_t e2 = {0};
    if (tp_linux_box_start(&s, &b, &e2) < 0 || send_fd(sp[1], b.chan_fd, b.pid) < 0)
      _exit(1);
    pause();
    _exit(0);
  }
  close(sp[1]);
  box.chan_fd = recv_fd(sp[0], &box.pid);
  close(sp[0]);
  if (box.chan_fd >= 0)
    box.pidfd = (int) syscall(SYS_pidfd_open, box.pid, 0);
  kill(kid, SIGKILL);
  waitpid(kid, &status, 0);
  check(box.pidfd >= 0, "orphan: box started by a process that is now dead");
  if (box.pidfd < 0)
    goto out;
  c.fd = box.chan_fd;
  o = box_out(&c, "echo alive");
  check(strcmp(o, "alive") == 0, "orphan: the box outlives its daemon and still answers ('%s')", o);
  free(o);
  snprintf(path, sizeof(path), "/proc/%d/status", (int) box.pid);
  st = slurp(path, &len);
  snprintf(path, sizeof(path), "\nPPid:\t%d\n", (int) getpid());
  check(st != NULL && strstr(st, path) != NULL, "orphan: reparented to the subreaper");
  free(st);
  r = tp_box_destroy(&box, box_dir, &err);
  check(r == 0 && !exists(box_dir), "orphan: destroyed by its new parent (%s)",
        r < 0 ? err.msg : "ok");
out:
  prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  check(no_children_left(), "orphan: reaped, nothing left");
  tp_rmtree(box_dir, &err);
  free(c.buf);
  free(box_dir);
}

/* Adoption against a stand-in agent (a process listening on agent.sock),
 * from a process that is not its parent: the exact situation of a
 * restarted daemon, whatever the agent does with its socket. */
static void test_adopt(void) {
  char *dir = path_in(tmp_root, "adopt");
  char *sock_path = path_in(dir, "agent.sock");
  tp_error_t err = {0};
  tp_box_t b;
  int p[2], status = 0, r;
  pid_t listener, adopter;
  char ready;

  mkdir(dir, 0700);
  if (pipe2(p, O_CLOEXEC) < 0)
    return;
  listener = fork();
  if (listener == 0) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
      _exit(1);
    if (write(p[1], "r", 1) != 1)
      _exit(1);
    for (;;)
      pause();
  }
  close(p[1]);
  r = (int) read(p[0], &ready, 1);
  close(p[0]);
  check(r == 1, "adopt: stand-in agent listening");

  adopter = fork();
  if (adopter == 0) {
    tp_error_t e2 = {0};
    siginfo_t si;
    if (tp_linux_box_adopt(dir, getppid(), &b, &e2) == 0 || e2.code != ESRCH)
      _exit(10); /* the socket is not the test process's */
    if (tp_linux_box_adopt(dir, listener, &b, &e2) < 0)
      _exit(11);
    if (b.pid != listener || !(fcntl(b.chan_fd, F_GETFL) & O_NONBLOCK) ||
        !(fcntl(b.chan_fd, F_GETFD) & FD_CLOEXEC) || !(fcntl(b.pidfd, F_GETFD) & FD_CLOEXEC))
      _exit(12);
    if (waitid((idtype_t) 3 /* P_PIDFD */, (id_t) b.pidfd, &si, WEXITED | WNOHANG) == 0 ||
        errno != ECHILD)
      _exit(13); /* not ours to reap: destroy must take the other path */
    if (tp_box_destroy(&b, dir, &e2) < 0)
      _exit(14);
    if (exists(dir) || b.pidfd != -1 || b.chan_fd != -1)
      _exit(15);
    _exit(0);
  }
  waitpid(adopter, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "adopt: a non-parent adopts (pidfd, connect, SO_PEERCRED), refuses a wrong pid, "
        "destroys via the pidfd (exit %d)",
        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  waitpid(listener, &status, 0);
  check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "adopt: the adopted pid was killed");
  r = tp_linux_box_adopt(dir, listener, &b, &err);
  check(r < 0 && err.code == ESRCH && b.pidfd == -1 && b.chan_fd == -1,
        "adopt: a gone pid is ESRCH (%s)", err.msg);
  mkdir(dir, 0700);
  r = tp_linux_box_adopt(dir, getpid(), &b, &err);
  check(r < 0 && err.code == ENOENT, "adopt: no agent.sock is ENOENT (%s)", err.msg);
  rmdir(dir);
  free(sock_path);
  free(dir);
}

/* A restarted daemon's view of a real box: adopt it (the agent answers
 * READY on the new channel, a command runs) and destroy it from a
 * process that is not its parent.  The first connect may come while the
 * agent still holds its old channel (it then closes the newcomer at once):
 * retried for up to 2 s. */
static int adopt_and_talk(const char *box_dir, pid_t pid, tp_box_t *b) {
  tp_error_t err = {0};
  for (int i = 0; i < 200; i++) {
    conn_t c = {-1, NULL, 0, 0, 0};
    msg_t m;
    char *o;
    int r;
    if (tp_linux_box_adopt(box_dir, pid, b, &err) < 0)
      return 11;
    c.fd = b->chan_fd;
    r = conn_next(&c, &m);
    if (r == 1 && m.type == TP_MSG_READY) {
      free(m.payload);
      o = box_out(&c, "echo adopted");
      r = strcmp(o, "adopted") == 0 ? 0 : 12;
      free(o);
      free(c.buf);
      return r;
    }
    if (r == 1)
      free(m.payload);
    free(c.buf);
    close(b->chan_fd);
    close(b->pidfd);
    usleep(10000);
  }
  return 13;
}

/* A real box (with a disk cap) after its daemon "crashed" (closed the
 * channel), adopted and destroyed by a process that is not its parent; with
 * an agent that does not keep its listening socket, destroyed from a bare
 * pidfd.  Its loop device must go all the same. */
static void test_box_readopt(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "rabox");
  tp_box_spec_t s = spec_for(e, "readopt", box_dir);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  char fd4[64], link[64] = "";
  int r, status = 0, keeps;
  pid_t kid;
  double t0;

  s.disk_bytes = 32 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "readopt: box with a disk started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;
  r = conn_next(&c, &m); /* the agent has set itself up (and kept or closed fds) */
  check(r == 1 && m.type == TP_MSG_READY, "readopt: agent READY");
  if (r == 1)
    free(m.payload);
  snprintf(fd4, sizeof(fd4), "/proc/%d/fd/%d", (int) box.pid, TP_AGENT_LISTEN_FD);
  r = (int) readlink(fd4, link, sizeof(link) - 1);
  link[r > 0 ? r : 0] = '\0';
  keeps = strncmp(link, "socket:", 7) == 0;
  if (keeps) {
    close(box.chan_fd); /* the daemon is gone: the agent detaches */
    box.chan_fd = -1;
  } else {
    diag("the agent closed fd %d: destroying from a bare pidfd, not an adopted box",
         TP_AGENT_LISTEN_FD);
  }
  t0 = now_ms();
  kid = fork();
  if (kid == 0) {
    tp_box_t b = {box.pid, -1, -1, 0};
    tp_error_t e2 = {0};
    if (keeps) {
      if ((r = adopt_and_talk(box_dir, box.pid, &b)) != 0)
        _exit(r);
    } else if ((b.pidfd = (int) syscall(SYS_pidfd_open, box.pid, 0)) < 0) {
      _exit(14);
    }
    _exit(tp_box_destroy(&b, box_dir, &e2) == 0 ? 0 : 15);
  }
  waitpid(kid, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "readopt: %s, destroyed by a non-parent in %.1f ms (exit %d)",
        keeps ? "adopted after the channel closed, the agent answers" : "from a pidfd",
        now_ms() - t0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  check(loops_backed_by(box_dir) == 0 && !exists(box_dir),
        "readopt: by then no loop device and no file left");
  r = tp_box_destroy(&box, box_dir, &err); /* reaps the zombie */
  check(r == 0 && no_children_left(), "readopt: the parent's destroy still works after (%s)",
        r < 0 ? err.msg : "ok");
out:
  free(c.buf);
  free(box_dir);
}

/* Entries of tmp_root named like a box dir of test_box_threads. */
static int leftover_boxes(void) {
  DIR *d = opendir(tmp_root);
  struct dirent *e;
  int n = 0;
  while (d != NULL && (e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "thread-", 7) == 0)
      n++;
  if (d != NULL)
    closedir(d);
  return n;
}

typedef struct worker_s {
  const env_t *e;
  int index;
  int failures;
  pthread_t thread;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int i = 0; i < 5; i++) {
    char dir[300], id[32];
    tp_box_spec_t s;
    tp_box_t box;
    tp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/thread-%d-%d", tmp_root, w->index, i);
    snprintf(id, sizeof(id), "thread-%d-%d", w->index, i);
    s = spec_for(w->e, id, dir);
    if (w->index < 2)
      s.disk_bytes = 32 << 20; /* loop devices taken concurrently */
    if (tp_linux_box_start(&s, &box, &err) < 0 || tp_box_destroy(&box, dir, &err) < 0) {
      diag("thread %d: %s", w->index, err.msg);
      w->failures++;
    }
  }
  return NULL;
}

/* The daemon starts boxes from several threads at once. */
static void test_box_threads(const env_t *e) {
  worker_t w[4];
  int failures = 0;
  for (int i = 0; i < 4; i++) {
    w[i] = (worker_t){e, i, 0, 0};
    pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(w[i].thread, NULL);
    failures += w[i].failures;
  }
  check(failures == 0 && leftover_boxes() == 0 && no_children_left() &&
            mounts_matching(tmp_root) == 0 && loops_backed_by(tmp_root) == 0,
        "threads: 4 threads x 5 boxes (10 with disks) started and destroyed concurrently, "
        "nothing left");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* Start and destroy times, without and with a disk cap (1 GiB, sparse).
 * TUPPER_TIME_RUNS sets the number of boxes of each (default 10). */
static void time_boxes(const env_t *e) {
  const char *env = getenv("TUPPER_TIME_RUNS");
  int runs = env != NULL && atoi(env) > 0 ? atoi(env) : 10;
  double *t_start = calloc((size_t) runs, sizeof(double));
  double *t_destroy = calloc((size_t) runs, sizeof(double));

  for (int disk = 0; disk < 2; disk++) {
    double start = 0, destroy = 0;
    int ok = 1, n = 0;
    for (int i = 0; i < runs && ok; i++, n++) {
      char dir[300];
      tp_box_spec_t s;
      tp_box_t box;
      tp_error_t err = {0};
      double t0, t1;
      snprintf(dir, sizeof(dir), "%s/timed-%d", tmp_root, i);
      s = spec_for(e, "timed", dir);
      s.disk_bytes = disk ? (int64_t) 1 << 30 : 0;
      t0 = now_ms();
      ok = tp_linux_box_start(&s, &box, &err) == 0;
      t1 = now_ms();
      ok = ok && tp_box_destroy(&box, dir, &err) == 0;
      if (!ok)
        diag("timing: %s", err.msg);
      t_start[i] = t1 - t0;
      t_destroy[i] = now_ms() - t1;
      start += t_start[i];
      destroy += t_destroy[i];
    }
    check(ok, "timing: %d boxes %s started and destroyed", runs,
          disk ? "with a 1 GiB disk cap" : "without a disk cap");
    qsort(t_start, (size_t) n, sizeof(double), cmp_double);
    qsort(t_destroy, (size_t) n, sizeof(double), cmp_double);
    diag("%s: start mean %.2f median %.2f ms, destroy mean %.2f median %.2f ms",
         disk ? "disk cap 1 GiB" : "no disk cap", start / n, t_start[n / 2], destroy / n,
         t_destroy[n / 2]);
  }
  free(t_start);
  free(t_destroy);
}

int main(void) {
  env_t env = {NULL, {NULL, NULL}, -1};
  int r = box_env_begin(&env, 0);

  if (r == 0) {
    test_box_outlives_daemon(&env);
    test_adopt();
    test_box_readopt(&env);
    test_box_threads(&env);
    time_boxes(&env);
  }
  return r > 0 ? r : linux_test_end(&env, 0);
}
