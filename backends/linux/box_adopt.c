/* tp_linux_box_adopt: a restarted daemon takes over a box that outlived its
 * predecessor.  The box's child bound agent.sock as host root (0600, in a
 * 0700 dir: box_dir, or the root of the box's subvolume on the btrfs pool,
 * which box_dir names) and listened on it before it became the agent; the
 * agent keeps it at TP_AGENT_LISTEN_FD and accepts a new channel there once
 * its old one closed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "linux_int.h"
#include "utils.h"

/* Identity: pidfd_open first, then the socket, whose listener must be that
 * pid (SO_PEERCRED is recorded at listen()).  A listener that is still
 * there means the agent is alive (every holder of the socket lives in the
 * box, and the box dies with its agent), so its pid cannot have been reused
 * for another process before our pidfd_open: the pidfd is the agent's. */
static int adopt(const char *box_dir, pid_t pid, tp_box_t *box, tp_error_t *err) {
  cleanup_close int pidfd = -1, dfd = -1, sock = -1;
  struct sockaddr_un sa;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  struct pollfd p;
  char sub[TP__PATH_MAX_LEN + 80];
  const char *dir = box_dir;

  if (box_dir == NULL || box_dir[0] != '/' || pid <= 0)
    return tp_error_set(err, EINVAL, "need an absolute box_dir and a pid");
  pidfd = (int) syscall(SYS_pidfd_open, pid, 0); /* close-on-exec */
  if (pidfd < 0)
    return tp_error_errno(err, errno, "pidfd_open %d", (int) pid);
  /* the socket's dir: the pool subvolume box_dir names, if any and it
   * holds the socket (a box of an older daemon has it in box_dir) */
  if (tp__pool_name(box_dir, sub, sizeof(sub)) > 0 && sub[0] == '/') {
    dfd = open(sub, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd >= 0 && faccessat(dfd, TP__AGENT_SOCK, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
      dir = sub;
    else if (dfd >= 0)
      close(dfd);
  }
  if (dir == box_dir)
    dfd = open(box_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return tp_error_errno(err, errno, "open '%s'", box_dir);

  /* Through the dir's fd, so its path may be longer than sun_path.  Non-
   * blocking from the start: a full backlog fails (EAGAIN), never hangs. */
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s", dfd, TP__AGENT_SOCK);
  sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0)
    return tp_error_errno(err, errno, "socket");
  if (connect(sock, (struct sockaddr *) &sa, sizeof(sa)) < 0)
    return tp_error_errno(err, errno, "connect to '%s/%s'", dir, TP__AGENT_SOCK);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return tp_error_errno(err, errno, "SO_PEERCRED");
  if (cred.pid != pid || cred.uid != 0)
    return tp_error_set(err, ESRCH, "agent socket belongs to pid %d uid %u, not to pid %d",
                        (int) cred.pid, (unsigned) cred.uid, (int) pid);

  p = (struct pollfd){.fd = pidfd, .events = POLLIN};
  if (poll(&p, 1, 0) != 0)
    return tp_error_set(err, ESRCH, "pid %d has exited", (int) pid);

  box->pid = pid;
  box->pidfd = pidfd;
  box->chan_fd = sock;
  pidfd = -1;
  sock = -1;
  return 0;
}

int tp_linux_box_adopt(const char *box_dir, pid_t pid, tp_box_t *box, tp_error_t *err) {
  tp_error_t local;
  if (err == NULL)
    err = &local;
  box->pid = 0;
  box->pidfd = -1;
  box->chan_fd = -1;
  if (adopt(box_dir, pid, box, err) < 0)
    return tp_error_prefix(err, "adopt box (pid %d)", (int) pid);
  return 0;
}
