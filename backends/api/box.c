/* tp_box_destroy: the end of a box of any backend whose PID 1 (the agent,
 * or an engine such as QEMU) is a host process with a pidfd. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "rmtree.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define TP__DESTROY_TIMEOUT_MS 10000 /* a SIGKILLed box that is not our child */

/* Waits until the process of pidfd has exited: its pidfd turns readable
 * (whether or not it has been reaped).  ETIMEDOUT after timeout_ms. */
static int poll_exit(int pidfd, int timeout_ms) {
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  struct timespec t0, t;
  int left = timeout_ms, r;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    r = poll(&p, 1, left);
    if (r > 0)
      return 0;
    if (r == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (errno != EINTR)
      return -1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    left = timeout_ms - (int) ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
    if (left < 0)
      left = 0;
  }
}

int tp_box_destroy(tp_box_t *box, const char *box_dir, tp_error_t *err) {
  siginfo_t si;
  int r;

  if (box->pidfd >= 0) {
    /* Killing PID 1 of the box takes its whole PID namespace down; waitid
     * returns once PID 1 is reaped, i.e. after every other box process. */
    if (syscall(SYS_pidfd_send_signal, box->pidfd, SIGKILL, NULL, 0) < 0 && errno != ESRCH)
      return tp_error_errno(err, errno, "destroy box: kill pid %d", (int) box->pid);
    for (;;) {
      r = waitid((idtype_t) P_PIDFD, (id_t) box->pidfd, &si, WEXITED);
      if (r == 0 || (errno != EINTR && errno != EAGAIN))
        break;
      if (errno == EAGAIN) { /* the pidfd was made non-blocking (uv_poll) */
        struct pollfd p = {.fd = box->pidfd, .events = POLLIN};
        poll(&p, 1, -1);
      }
    }
    /* ECHILD: not our child (adopted after a daemon restart: the box was
     * reparented to init or a subreaper) or reaped elsewhere.  Its pidfd
     * turns readable once PID 1 has exited, and PID 1 exits last: after
     * every other box process, with the box's mounts gone. */
    if (r < 0 && errno == ECHILD && poll_exit(box->pidfd, TP__DESTROY_TIMEOUT_MS) == 0)
      r = 0;
    if (r < 0)
      return tp_error_errno(err, errno, "destroy box: wait for pid %d", (int) box->pid);
    close(box->pidfd);
    box->pidfd = -1;
  }
  box->pid = 0;
  if (box->chan_fd >= 0) {
    close(box->chan_fd);
    box->chan_fd = -1;
  }
  if (box_dir != NULL && tp_rmtree(box_dir, err) < 0)
    return tp_error_prefix(err, "destroy box");
  return 0;
}
