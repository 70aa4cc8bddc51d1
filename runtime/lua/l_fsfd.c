/* tupper.core's open files of a box (docs/protocol.md, "Files as
 * descriptors"): the daemon's and the CLI's halves of the fd handover.
 *
 * The daemon side: an FS_OPEN goes to the agent with one end of a
 * socketpair (box:send's fifth argument); the agent opens the box's file as
 * the account and sends it back on that socket; the daemon takes it
 * (pair:take, a regular file not on FUSE, or nothing) and hands it to the client with
 * its JSON reply (core.send_fd, SCM_RIGHTS on the control connection).  It
 * never opens a path of a box itself.
 *
 *   core.fd_pair() -> pair          pair:take() -> file | nil, msg, errno
 *   pair:close()                    box:send(type, id, fields, pair)
 *   core.send_fd(sockfd, text, file) -> bytes sent | nil, msg, errno
 *
 * The CLI side: a connection of its own for these calls (the control
 * connection is luv's, whose read drops an fd), a blocking call with a
 * deadline, and the copy between a host fd and the box's file.
 *
 *   core.fd_connect(path) -> sock (a file) | nil, msg, errno
 *   core.fd_call(sock, text, timeout_ms) -> line, file | nil | nil, msg, errno
 *   core.file_copy(src, dst [, limit]) -> bytes | nil, msg, errno, side
 *   file:fileno() -> fd   file:close()   file:size() -> bytes | nil, msg
 *
 * A file or pair is closed by close or by the collector, never twice. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "l_core.h"

#define TP_L_FILE_MT "tupper.file"
#define TP_L_FDPAIR_MT "tupper.fdpair"
#define TP__FD_LINE_MAX 65536           /* bytes of an fd call's reply */
#define TP__COPY_STEP (1024u * 1024u * 1024u) /* bytes per copy_file_range/sendfile call */
#define TP__COPY_BUF (1024u * 1024u)    /* the read/write loop's buffer */
#define TP__FUSE_MAGIC 0x65735546       /* statfs f_type of a FUSE filesystem */

typedef struct tp_lfile_s {
  int fd;
} tp_lfile_t;

static void tp__push_file(lua_State *L, int fd) {
  tp_lfile_t *u = lua_newuserdatauv(L, sizeof(*u), 0);
  u->fd = fd;
  luaL_setmetatable(L, TP_L_FILE_MT);
}

static int tp__push_errno(lua_State *L, int e, const char *what) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", what, strerror(e));
  lua_pushinteger(L, e);
  return 3;
}

static tp_lfile_t *tp__check_file(lua_State *L, int idx) {
  tp_lfile_t *u = luaL_checkudata(L, idx, TP_L_FILE_MT);
  if (u->fd < 0)
    luaL_error(L, "file is closed");
  return u;
}

/* An fd argument: a file userdata or an integer (a luv fs fd). */
static int tp__fd_arg(lua_State *L, int idx) {
  tp_lfile_t *u = luaL_testudata(L, idx, TP_L_FILE_MT);
  lua_Integer fd;
  if (u != NULL) {
    if (u->fd < 0)
      luaL_error(L, "file is closed");
    return u->fd;
  }
  fd = luaL_checkinteger(L, idx);
  luaL_argcheck(L, fd >= 0 && fd <= 0x7fffffff, idx, "not an fd");
  return (int) fd;
}

int tp_l_file_fd(lua_State *L, int idx) { return tp__check_file(L, idx)->fd; }

static int tp_lfile_close(lua_State *L) {
  tp_lfile_t *u = luaL_checkudata(L, 1, TP_L_FILE_MT);
  if (u->fd >= 0) {
    close(u->fd);
    u->fd = -1;
  }
  return 0;
}

static int tp_lfile_fileno(lua_State *L) {
  lua_pushinteger(L, tp__check_file(L, 1)->fd);
  return 1;
}

static int tp_lfile_size(lua_State *L) {
  struct stat st;
  if (fstat(tp__check_file(L, 1)->fd, &st) < 0)
    return tp__push_errno(L, errno, "fstat");
  lua_pushinteger(L, (lua_Integer) st.st_size);
  return 1;
}

/* ---- the daemon's side ------------------------------------------------------------ */

typedef struct tp_lfdpair_s {
  int near, far; /* the daemon keeps near; far goes to the agent with the request */
} tp_lfdpair_t;

static int tp_lcore_fd_pair(lua_State *L) {
  int sv[2];
  tp_lfdpair_t *u;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
    return tp__push_errno(L, errno, "socketpair");
  u = lua_newuserdatauv(L, sizeof(*u), 0);
  u->near = sv[0];
  u->far = sv[1];
  luaL_setmetatable(L, TP_L_FDPAIR_MT);
  return 1;
}

int tp_l_fdpair_far(lua_State *L, int idx) {
  tp_lfdpair_t *u = luaL_testudata(L, idx, TP_L_FDPAIR_MT);
  return u != NULL ? u->far : -2;
}

void tp_l_fdpair_sent(lua_State *L, int idx) {
  tp_lfdpair_t *u = luaL_checkudata(L, idx, TP_L_FDPAIR_MT);
  if (u->far >= 0) { /* the kernel holds the agent's reference now */
    close(u->far);
    u->far = -1;
  }
}

static int tp_lfdpair_close(lua_State *L) {
  tp_lfdpair_t *u = luaL_checkudata(L, 1, TP_L_FDPAIR_MT);
  if (u->near >= 0)
    close(u->near);
  if (u->far >= 0)
    close(u->far);
  u->near = u->far = -1;
  return 0;
}

/* pair:take(): the file the agent sent (after its OK): exactly one fd, a
 * regular file; anything else is closed and refused. */
static int tp_lfdpair_take(lua_State *L) {
  tp_lfdpair_t *u = luaL_checkudata(L, 1, TP_L_FDPAIR_MT);
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * 4)];
  } cm;
  char byte;
  struct iovec iov = {.iov_base = &byte, .iov_len = 1};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  int fds[4], n = 0;
  struct stat st;
  ssize_t r;
  if (u->near < 0)
    return luaL_error(L, "fd pair is closed");
  do
    r = recvmsg(u->near, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  for (struct cmsghdr *c = r >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c != NULL; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
      if (n < 4)
        fds[n++] = fd;
      else
        close(fd);
    }
  }
  if (r < 0)
    return tp__push_errno(L, errno == EAGAIN ? EPROTO : errno, "the agent's file");
  if (n != 1 || (mh.msg_flags & MSG_CTRUNC) || fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
    for (int i = 0; i < n; i++)
      close(fds[i]);
    lua_pushnil(L);
    lua_pushstring(L, "the agent's file: not one regular file");
    lua_pushinteger(L, EPROTO);
    return 3;
  }
  /* a file whose reads and writes wait on a process (a FUSE mount a box
   * made) would hold a pool thread of the daemon or the client: the
   * agent's way is taken for it */
  {
    struct statfs sf;
    if (fstatfs(fds[0], &sf) < 0 || (unsigned long) sf.f_type == TP__FUSE_MAGIC) {
      close(fds[0]);
      lua_pushnil(L);
      lua_pushstring(L, "the agent's file is on a filesystem served by a process");
      lua_pushinteger(L, EOPNOTSUPP);
      return 3;
    }
  }
  tp__push_file(L, fds[0]);
  return 1;
}

/* core.send_fd(sockfd, text, file): text on the unix socket sockfd (a
 * client's connection, nothing queued on it) with file attached to its
 * first byte: the bytes the socket took (>= 1; the caller writes the
 * rest), or nil, msg, errno (EAGAIN: none taken). */
static int tp_lcore_send_fd(lua_State *L) {
  lua_Integer sock = luaL_checkinteger(L, 1);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  int fd = tp__check_file(L, 3)->fd;
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } cm;
  struct iovec iov = {.iov_base = (void *) text, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  struct sockaddr_storage sa;
  socklen_t sl = sizeof(sa);
  struct cmsghdr *c;
  ssize_t w;
  luaL_argcheck(L, sock >= 0 && sock <= 0x7fffffff, 1, "not an fd");
  luaL_argcheck(L, len > 0, 2, "empty");
  if (getsockname((int) sock, (struct sockaddr *) &sa, &sl) < 0)
    return tp__push_errno(L, errno, "the client's connection");
  if (sa.ss_family != AF_UNIX)
    return tp__push_errno(L, EOPNOTSUPP, "the client's connection");
  memset(cm.buf, 0, sizeof(cm.buf));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  do
    w = sendmsg((int) sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w <= 0)
    return tp__push_errno(L, w < 0 ? errno : EAGAIN, "the client's connection");
  lua_pushinteger(L, (lua_Integer) w);
  return 1;
}

/* ---- the CLI's side --------------------------------------------------------------- */

static long long tp__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* core.fd_connect(path): a blocking connection to the daemon's socket. */
static int tp_lcore_fd_connect(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd;
  if (plen >= sizeof(sa.sun_path))
    return tp__push_errno(L, ENAMETOOLONG, "connect");
  memcpy(sa.sun_path, path, plen + 1);
  if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
    return tp__push_errno(L, errno, "socket");
  if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
    int e = errno;
    close(fd);
    return tp__push_errno(L, e, "connect");
  }
  tp__push_file(L, fd);
  return 1;
}

/* core.fd_call(sock, text, timeout_ms): writes text (one request line) and
 * reads one reply line, with the fd that came with it (if one did; a
 * second is closed).  A reply longer than TP__FD_LINE_MAX, bytes after its
 * newline, the deadline or the daemon's close: nil, msg, errno. */
static int tp_lcore_fd_call(lua_State *L) {
  int sock = tp__check_file(L, 1)->fd;
  size_t len, off = 0, have = 0;
  const char *text = luaL_checklstring(L, 2, &len);
  lua_Integer timeout = luaL_checkinteger(L, 3);
  long long deadline = tp__now_ms() + (timeout > 0 ? timeout : 0);
  char *buf;
  int got = -1, e = 0;
  const char *why = NULL;
  while (off < len) {
    ssize_t w = send(sock, text + off, len - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return tp__push_errno(L, errno, "send");
    off += (size_t) w;
  }
  if ((buf = malloc(TP__FD_LINE_MAX)) == NULL)
    return tp__push_errno(L, ENOMEM, "reply");
  for (;;) {
    union {
      struct cmsghdr h;
      char b[CMSG_SPACE(sizeof(int) * 4)];
    } cm;
    struct iovec iov = {.iov_base = buf + have, .iov_len = TP__FD_LINE_MAX - have};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b)};
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    long long left = deadline - tp__now_ms();
    ssize_t r;
    char *nl;
    if (have == TP__FD_LINE_MAX) {
      e = EMSGSIZE, why = "the daemon's reply is too long";
      break;
    }
    if (left <= 0) {
      e = ETIMEDOUT, why = "the daemon did not answer in time";
      break;
    }
    r = poll(&pfd, 1, left > 60000 ? 60000 : (int) left);
    if (r < 0 && errno != EINTR) {
      e = errno, why = "poll";
      break;
    }
    if (r <= 0)
      continue;
    r = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    for (struct cmsghdr *c = r >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c != NULL; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        if (got < 0)
          got = fd;
        else
          close(fd);
      }
    }
    if (r <= 0) {
      e = r < 0 ? errno : ECONNRESET, why = "the daemon closed the connection";
      break;
    }
    nl = memchr(buf + have, '\n', (size_t) r);
    have += (size_t) r;
    if (nl != NULL) {
      if ((size_t) (nl - buf) + 1 != have) {
        e = EPROTO, why = "bytes after the daemon's reply";
        break;
      }
      lua_pushlstring(L, buf, (size_t) (nl - buf));
      free(buf);
      if (got >= 0)
        tp__push_file(L, got);
      else
        lua_pushnil(L);
      return 2;
    }
  }
  free(buf);
  if (got >= 0)
    close(got);
  return tp__push_errno(L, e, why);
}

static int tp__fallback(int e) {
  return e == EXDEV || e == EINVAL || e == ENOSYS || e == EOPNOTSUPP || e == ENOTSUP;
}

/* Errors that are the destination's: a full or capped disk, a file too large. */
static const char *tp__side(int e) {
  return e == ENOSPC || e == EDQUOT || e == EFBIG || e == EROFS ? "write" : "copy";
}

/* core.file_copy(src, dst [, limit]): copies from src's position to dst's
 * until src's end (or limit bytes): copy_file_range, else sendfile, else
 * read and write.  The bytes copied, or nil, msg, errno, side ("read",
 * "write" or "copy": which end failed, where the call tells). */
static int tp_lcore_file_copy(lua_State *L) {
  int src = tp__fd_arg(L, 1), dst = tp__fd_arg(L, 2);
  lua_Integer lim = luaL_optinteger(L, 3, -1);
  uint64_t left = lim < 0 ? UINT64_MAX : (uint64_t) lim, done = 0;
  int how = 0; /* 0 copy_file_range, 1 sendfile, 2 read/write */
  char *buf = NULL;
  while (left > 0) {
    size_t step = left < TP__COPY_STEP ? (size_t) left : TP__COPY_STEP;
    ssize_t n;
    if (how == 0) {
      n = copy_file_range(src, NULL, dst, NULL, step, 0);
      if (n < 0 && done == 0 && tp__fallback(errno)) {
        how = 1;
        continue;
      }
    } else if (how == 1) {
      n = sendfile(dst, src, NULL, step);
      if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
        how = 2;
        continue;
      }
    } else {
      size_t k = step < TP__COPY_BUF ? step : TP__COPY_BUF, w = 0;
      if (buf == NULL && (buf = malloc(TP__COPY_BUF)) == NULL)
        return tp__push_errno(L, ENOMEM, "copy");
      n = read(src, buf, k);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0) {
        int e = errno;
        free(buf);
        tp__push_errno(L, e, "read");
        lua_pushstring(L, "read");
        return 4;
      }
      while (w < (size_t) n) {
        ssize_t m = write(dst, buf + w, (size_t) n - w);
        if (m < 0 && errno == EINTR)
          continue;
        if (m < 0) {
          int e = errno;
          free(buf);
          tp__push_errno(L, e, "write");
          lua_pushstring(L, "write");
          return 4;
        }
        w += (size_t) m;
      }
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int e = errno;
      free(buf);
      tp__push_errno(L, e, tp__side(e));
      lua_pushstring(L, tp__side(e));
      return 4;
    }
    if (n == 0)
      break;
    done += (uint64_t) n;
    left -= (uint64_t) n;
  }
  free(buf);
  lua_pushinteger(L, (lua_Integer) done);
  return 1;
}

void tp_l_fsfd_register(lua_State *L) {
  static const luaL_Reg fmethods[] = {{"close", tp_lfile_close}, {"fileno", tp_lfile_fileno},
                                      {"size", tp_lfile_size}, {NULL, NULL}};
  static const luaL_Reg pmethods[] = {{"take", tp_lfdpair_take}, {"close", tp_lfdpair_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"fd_pair", tp_lcore_fd_pair},       {"send_fd", tp_lcore_send_fd},
                                   {"fd_connect", tp_lcore_fd_connect}, {"fd_call", tp_lcore_fd_call},
                                   {"file_copy", tp_lcore_file_copy},   {NULL, NULL}};
  luaL_newmetatable(L, TP_L_FILE_MT);
  lua_newtable(L);
  luaL_setfuncs(L, fmethods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, tp_lfile_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, TP_L_FDPAIR_MT);
  lua_newtable(L);
  luaL_setfuncs(L, pmethods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, tp_lfdpair_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}
