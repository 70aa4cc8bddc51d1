/* The daemon as a service: an activated listening socket, sd_notify
 * datagrams (service.h). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "service.h"
#include "utils.h"

static int tp__sockopt(int fd, int opt, int *val, tp_error_t *err) {
  socklen_t len = sizeof(*val);
  if (getsockopt(fd, SOL_SOCKET, opt, val, &len) < 0)
    return tp_error_errno(err, errno, "getsockopt on fd %d", fd);
  return 0;
}

int tp_service_listen_fd(int fd, char *path, size_t size, tp_error_t *err) {
  struct stat st;
  int domain, type, listening, flags;
  struct sockaddr_un sa;
  socklen_t len = sizeof(sa);

  if (size > 0)
    path[0] = '\0';
  /* an fd the manager passed survived exec, so it has no FD_CLOEXEC; one
   * that has it was opened by this process (the loop's epoll fd takes the
   * lowest free number): fd was not passed at all */
  flags = fcntl(fd, F_GETFD);
  if (flags < 0)
    return tp_error_errno(err, errno, "fd %d", fd);
  if (flags & FD_CLOEXEC)
    return tp_error_set(err, EBADF, "fd %d was not passed in (not open when the daemon started)", fd);
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "fd %d", fd);
  if (!S_ISSOCK(st.st_mode))
    return tp_error_set(err, ENOTSOCK, "fd %d is not a socket", fd);
  if (tp__sockopt(fd, SO_DOMAIN, &domain, err) < 0 || tp__sockopt(fd, SO_TYPE, &type, err) < 0 ||
      tp__sockopt(fd, SO_ACCEPTCONN, &listening, err) < 0)
    return -1;
  if (domain != AF_UNIX)
    return tp_error_set(err, EAFNOSUPPORT,
                        "fd %d is not a unix socket (ListenStream= wants a path)", fd);
  if (type != SOCK_STREAM)
    return tp_error_set(err, EPROTOTYPE, "fd %d is not a stream socket (ListenStream=)", fd);
  if (!listening)
    return tp_error_set(err, EINVAL, "fd %d is not listening (Accept=no)", fd);
  if (fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "fd %d: FD_CLOEXEC", fd);
  memset(&sa, 0, sizeof(sa));
  if (getsockname(fd, (struct sockaddr *) &sa, &len) < 0)
    return tp_error_errno(err, errno, "getsockname on fd %d", fd);
  if (size > 0 && len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != '\0') {
    size_t n = strnlen(sa.sun_path, len - offsetof(struct sockaddr_un, sun_path));
    if (n >= size)
      return tp_error_set(err, ENAMETOOLONG, "fd %d: its path is too long", fd);
    memcpy(path, sa.sun_path, n);
    path[n] = '\0';
  }
  return 0;
}

int tp_service_notify(const char *addr, const char *state, tp_error_t *err) {
  struct sockaddr_un sa;
  size_t n = strlen(addr);
  socklen_t len;
  ssize_t sent;
  cleanup_close int fd = -1;

  if (n == 0 || (addr[0] != '/' && addr[0] != '@'))
    return tp_error_set(err, EAFNOSUPPORT, "NOTIFY_SOCKET '%s': not a path or an abstract name",
                        addr);
  if (n >= sizeof(sa.sun_path))
    return tp_error_set(err, ENAMETOOLONG, "NOTIFY_SOCKET '%s': too long", addr);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, addr, n);
  if (addr[0] == '@')
    sa.sun_path[0] = '\0'; /* abstract: no NUL at the end, the length says it */
  len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + n + (addr[0] == '/' ? 1 : 0));
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return tp_error_errno(err, errno, "socket");
  do
    sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *) &sa, len);
  while (sent < 0 && errno == EINTR);
  if (sent < 0)
    return tp_error_errno(err, errno, "notify '%s'", addr);
  return 0;
}
