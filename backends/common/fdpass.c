/* tp_fd_send, tp_fd_recv (fdpass.h). */
#define _GNU_SOURCE
#include "fdpass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

ssize_t tp_fd_send(int sock, const void *p, size_t len, int fd) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } cm;
  struct iovec iov = {.iov_base = (void *) p, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  struct cmsghdr *c;
  ssize_t n;
  if (len == 0 || fd < 0) {
    errno = EINVAL;
    return -1;
  }
  memset(cm.buf, 0, sizeof(cm.buf));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  do
    n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n == 0) { /* cannot happen for len >= 1; said as "none taken" */
    errno = EAGAIN;
    return -1;
  }
  return n;
}

ssize_t tp_fd_recv(int sock, void *buf, size_t len, int flags, int *fds, int max, int *nfds, int *cut) {
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int) * TP_FDPASS_MAX)];
  } cm;
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b)};
  ssize_t r;
  *nfds = 0;
  *cut = 0;
  if (max > TP_FDPASS_MAX)
    max = TP_FDPASS_MAX;
  do
    r = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | flags);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
      if (*nfds < max)
        fds[(*nfds)++] = fd;
      else
        close(fd);
    }
  }
  *cut = (mh.msg_flags & MSG_CTRUNC) != 0;
  return r;
}
