/* tupper.core's open files of a box (docs/protocol.md, "Files as
 * descriptors"): the daemon's and the CLI's halves of the fd handover.
 *
 * The daemon side: an FS_OPEN goes to the agent with one end of a
 * socketpair (box:send's fifth argument); the agent opens the box's file as
 * the account and sends it back on that socket; the daemon takes it
 * (pair:take, a regular file of a disk or memory filesystem, or nothing) and hands it to the client with
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

#include "fdpass.h"
#include "l_core.h"

#define TP_L_FILE_MT "tupper.file"
#define TP_L_FDPAIR_MT "tupper.fdpair"
#define TP__FD_LINE_MAX 65536           /* bytes of an fd call's reply */
#define TP__COPY_STEP (1024u * 1024u * 1024u) /* bytes per copy_file_range/sendfile call */
#define TP__COPY_BUF (1024u * 1024u)    /* the read/write loop's buffer */

/* The filesystems whose files the daemon takes from an agent (statfs
 * f_type, linux/magic.h): disk and memory filesystems whose reads and
 * writes check nothing of the caller.  Not the kernel's own (procfs,
 * sysfs, cgroupfs, debugfs, ...: some of their files check the writer's
 * or reader's credentials at each call, which would be the daemon's or
 * the CLI's, not the box's), nor one served by a process (FUSE, NFS, 9p:
 * their waits would hold a pool thread).  Anything else takes the agent's
 * way (the streams). */
static int tp__fs_takes(unsigned long type) {
  switch (type) {
  case 0xEF53UL:      /* ext2, ext3, ext4 */
  case 0x9123683EUL:  /* btrfs */
  case 0x58465342UL:  /* xfs */
  case 0x01021994UL:  /* tmpfs */
  case 0x794C7630UL:  /* overlayfs */
  case 0xF2F52010UL:  /* f2fs */
  case 0x2FC12FC1UL:  /* zfs */
    return 1;
  default:
    return 0;
  }
}

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

static void tp_lfile_close_fd(tp_lfile_t *u) {
  if (u->fd >= 0) {
    close(u->fd);
    u->fd = -1;
  }
}

static int tp_lfile_close(lua_State *L) {
  tp_lfile_close_fd(luaL_checkudata(L, 1, TP_L_FILE_MT));
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
  char byte;
  int fds[TP_FDPASS_MAX], n = 0, cut = 0;
  struct stat st;
  ssize_t r;
  if (u->near < 0)
    return luaL_error(L, "fd pair is closed");
  r = tp_fd_recv(u->near, &byte, 1, 0, fds, TP_FDPASS_MAX, &n, &cut);
  if (r < 0)
    return tp__push_errno(L, errno == EAGAIN ? EPROTO : errno, "the agent's file");
  if (n != 1 || cut || fstat(fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
    for (int i = 0; i < n; i++)
      close(fds[i]);
    lua_pushnil(L);
    lua_pushstring(L, "the agent's file: not one regular file");
    lua_pushinteger(L, EPROTO);
    return 3;
  }
  /* only a file of a disk or memory filesystem (tp__fs_takes): for any
   * other the agent's way is taken */
  {
    struct statfs sf;
    if (fstatfs(fds[0], &sf) < 0 || !tp__fs_takes((unsigned long) sf.f_type)) {
      close(fds[0]);
      lua_pushnil(L);
      lua_pushstring(L, "the agent's file is not on a disk or memory filesystem");
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
  struct sockaddr_storage sa;
  socklen_t sl = sizeof(sa);
  ssize_t w;
  luaL_argcheck(L, sock >= 0 && sock <= 0x7fffffff, 1, "not an fd");
  luaL_argcheck(L, len > 0, 2, "empty");
  if (getsockname((int) sock, (struct sockaddr *) &sa, &sl) < 0)
    return tp__push_errno(L, errno, "the client's connection");
  if (sa.ss_family != AF_UNIX)
    return tp__push_errno(L, EOPNOTSUPP, "the client's connection");
  if ((w = tp_fd_send((int) sock, text, len, fd)) < 0)
    return tp__push_errno(L, errno, "the client's connection");
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
  tp_lfile_t *file;
  int got = -1, e = 0;
  const char *why = NULL;
  while (off < len) {
    ssize_t w = send(sock, text + off, len - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return tp__push_errno(L, w < 0 ? errno : EPIPE, "send");
    off += (size_t) w;
  }
  /* what may hold a descriptor or memory is the collector's from the start:
   * a Lua error on the way (out of memory) leaks neither */
  buf = lua_newuserdatauv(L, TP__FD_LINE_MAX, 0);
  file = lua_newuserdatauv(L, sizeof(*file), 0);
  file->fd = -1;
  luaL_setmetatable(L, TP_L_FILE_MT);
  for (;;) {
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    long long left = deadline - tp__now_ms();
    int fds[TP_FDPASS_MAX], nfds = 0, cut = 0;
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
    r = tp_fd_recv(sock, buf + have, TP__FD_LINE_MAX - have, 0, fds, TP_FDPASS_MAX, &nfds, &cut);
    if (r < 0 && errno == EAGAIN)
      continue;
    for (int i = 0; i < nfds; i++) { /* the first is the reply's; any other is closed */
      if (file->fd < 0)
        file->fd = got = fds[i];
      else
        close(fds[i]);
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
      if (got >= 0)
        lua_pushvalue(L, -2); /* the file */
      else
        lua_pushnil(L);
      return 2;
    }
  }
  tp_lfile_close_fd(file);
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
 * "write" or "copy": which end failed, where the call tells).  It opens
 * nothing; its one buffer (the read/write way) is freed on every exit. */
static int tp_lcore_file_copy(lua_State *L) {
  int src = tp__fd_arg(L, 1), dst = tp__fd_arg(L, 2);
  lua_Integer lim = luaL_optinteger(L, 3, -1);
  uint64_t left = lim < 0 ? UINT64_MAX : (uint64_t) lim, done = 0;
  int how = 0; /* 0 copy_file_range, 1 sendfile, 2 read/write */
  int e = 0;
  const char *side = NULL;
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
      if (n < 0 && (errno == EINVAL || errno == ENOSYS)) { /* positions moved as copied */
        how = 2;
        continue;
      }
    } else {
      size_t k = step < TP__COPY_BUF ? step : TP__COPY_BUF, w = 0;
      if (buf == NULL && (buf = malloc(TP__COPY_BUF)) == NULL) {
        e = ENOMEM, side = "copy";
        break;
      }
      n = read(src, buf, k);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0) {
        e = errno, side = "read";
        break;
      }
      while (w < (size_t) n) {
        ssize_t m = write(dst, buf + w, (size_t) n - w);
        if (m < 0 && errno == EINTR)
          continue;
        if (m <= 0) { /* 0 for a write of more than 0 bytes: never taken, never retried */
          e = m < 0 ? errno : EIO, side = "write";
          break;
        }
        w += (size_t) m;
      }
      if (side != NULL)
        break;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      e = errno, side = tp__side(e);
      break;
    }
    if (n == 0)
      break;
    done += (uint64_t) n;
    left -= (uint64_t) n;
  }
  free(buf);
  if (side != NULL) {
    tp__push_errno(L, e, side);
    lua_pushstring(L, side);
    return 4;
  }
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
