/* runtime/host/service.c: the checks on an activated socket (a listening
 * unix stream socket that was passed in is taken and made close-on-exec;
 * anything else is refused) and sd_notify datagrams to a path and to an
 * abstract name, with real sockets.  TAP output; exit 0 pass, 1 fail. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "service.h"
#include "tap.h"
#include "utils.h"

static char dir[64]; /* its sockets' paths must fit sun_path */

/* A unix socket of type bound to path (NULL: unbound), listening if asked,
 * without FD_CLOEXEC as a passed fd is. */
static int unix_socket(int type, const char *path, int listening) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, type, 0);
  if (fd < 0)
    return -1;
  if (path != NULL) {
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || (listening && listen(fd, 8) < 0)) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

static int has_cloexec(int fd) {
  return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
}

static void test_listen_fd(void) {
  char path[256], got[128];
  tp_error_t err = {0};
  snprintf(path, sizeof(path), "%s/listen.sock", dir);
  cleanup_close int fd = unix_socket(SOCK_STREAM, path, 1);
  check(fd >= 0 && !has_cloexec(fd), "a listening unix stream socket without FD_CLOEXEC");
  check(tp_service_listen_fd(fd, got, sizeof(got), &err) == 0, "taken: %s", err.msg);
  check(strcmp(got, path) == 0, "its path: '%s'", got);
  check(has_cloexec(fd), "made close-on-exec");

  /* close-on-exec already: opened by this process, not passed */
  err.msg[0] = '\0';
  check(tp_service_listen_fd(fd, got, sizeof(got), &err) < 0 && err.code == EBADF &&
            strstr(err.msg, "was not passed in") != NULL,
        "an fd with FD_CLOEXEC is refused: %s", err.msg);

  char small[4];
  snprintf(path, sizeof(path), "%s/l2.sock", dir);
  int fd2 = unix_socket(SOCK_STREAM, path, 1);
  check(tp_service_listen_fd(fd2, small, sizeof(small), &err) < 0 && err.code == ENAMETOOLONG,
        "a path longer than the buffer is an error, not a cut: %s", err.msg);
  close(fd2);
}

static void refused(int fd, int code, const char *what, const char *words) {
  char got[128];
  tp_error_t err = {0};
  int r = tp_service_listen_fd(fd, got, sizeof(got), &err);
  check(r < 0 && err.code == code && strstr(err.msg, words) != NULL, "%s is refused: %s", what,
        err.msg);
  check(!has_cloexec(fd) || fd < 0, "%s: flags untouched", what);
}

static void test_refused(void) {
  char path[256];
  int fd;

  fd = unix_socket(SOCK_DGRAM, NULL, 0);
  refused(fd, EPROTOTYPE, "a unix datagram socket", "not a stream socket");
  close(fd);
  fd = unix_socket(SOCK_STREAM, NULL, 0);
  refused(fd, EINVAL, "a unix stream socket that does not listen", "not listening");
  close(fd);
  snprintf(path, sizeof(path), "%s/bound.sock", dir);
  fd = unix_socket(SOCK_STREAM, path, 0);
  refused(fd, EINVAL, "a bound unix stream socket that does not listen", "not listening");
  close(fd);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && (bind(fd, (struct sockaddr *) &in, sizeof(in)) < 0 || listen(fd, 1) < 0))
    diag("tcp socket: %s", strerror(errno));
  refused(fd, EAFNOSUPPORT, "a listening TCP socket", "not a unix socket");
  close(fd);
  fd = open("/dev/null", O_RDONLY);
  refused(fd, ENOTSOCK, "/dev/null", "not a socket");
  close(fd);
  fd = dup(1);
  close(fd); /* a number nothing holds */
  {
    char got[8];
    tp_error_t err = {0};
    check(tp_service_listen_fd(fd, got, sizeof(got), &err) < 0 && err.code == EBADF,
          "a closed fd is refused: %s", err.msg);
  }
}

/* Receives one datagram on fd (waiting at most a second). */
static ssize_t receive(int fd, char *buf, size_t n) {
  struct timeval tv = {.tv_sec = 1};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ssize_t r = recv(fd, buf, n - 1, 0);
  if (r >= 0)
    buf[r] = '\0';
  return r;
}

static void test_notify(void) {
  char path[256], buf[64], name[64];
  tp_error_t err = {0};
  snprintf(path, sizeof(path), "%s/notify", dir);
  cleanup_close int fd = unix_socket(SOCK_DGRAM, path, 0);
  check(tp_service_notify(path, "READY=1", &err) == 0, "notify to a path: %s", err.msg);
  check(receive(fd, buf, sizeof(buf)) == 7 && strcmp(buf, "READY=1") == 0, "got '%s'", buf);

  /* an abstract name: '@' stands for the leading NUL */
  snprintf(name, sizeof(name), "@tupper-test-%d", (int) getpid());
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(name);
  memcpy(sa.sun_path, name, n);
  sa.sun_path[0] = '\0';
  cleanup_close int afd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  check(bind(afd, (struct sockaddr *) &sa, (socklen_t) (offsetof(struct sockaddr_un, sun_path) + n)) == 0,
        "an abstract datagram socket");
  check(tp_service_notify(name, "STOPPING=1", &err) == 0, "notify to an abstract name: %s", err.msg);
  check(receive(afd, buf, sizeof(buf)) == 10 && strcmp(buf, "STOPPING=1") == 0, "got '%s'", buf);

  check(tp_service_notify("relative/path", "READY=1", &err) < 0 && err.code == EAFNOSUPPORT,
        "a relative NOTIFY_SOCKET is refused: %s", err.msg);
  check(tp_service_notify("vsock:2:1", "READY=1", &err) < 0, "a vsock NOTIFY_SOCKET is refused: %s",
        err.msg);
  check(tp_service_notify("", "READY=1", &err) < 0, "an empty one is refused");
  char longp[200];
  memset(longp, 'x', sizeof(longp) - 1);
  longp[0] = '/';
  longp[sizeof(longp) - 1] = '\0';
  check(tp_service_notify(longp, "READY=1", &err) < 0 && err.code == ENAMETOOLONG,
        "an over-long one is refused: %s", err.msg);
  snprintf(path, sizeof(path), "%s/nobody", dir);
  check(tp_service_notify(path, "READY=1", &err) < 0 && err.code == ENOENT,
        "nobody listening is an error: %s", err.msg);
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || *tmp == '\0' || strlen(tmp) > 40)
    tmp = "/tmp";
  snprintf(dir, sizeof(dir), "%s/tupper-service-XXXXXX", tmp);
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_listen_fd();
  test_refused();
  test_notify();
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    diag("rm -rf %s failed", dir);
  return tap_done();
}
