/* tupper.core's small utilities: base64, SHA-256 (l_digest.c's), random
 * ids, the state dir's lock, umask, signals, the log file, rmtree, the
 * embedded agent and default image. */
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base64.h"
#include "embed.h"
#include "image.h"
#include "l_core.h"
#include "rmtree.h"
#include "tupper.h"

static int tp_lcore_b64encode(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_Buffer B;
  char *out = luaL_buffinitsize(L, &B, tp_b64_enclen(n));
  luaL_pushresultsize(&B, tp_b64_encode((const unsigned char *) s, n, out));
  return 1;
}

static int tp_lcore_b64decode(lua_State *L) {
  size_t n, m;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_Buffer B;
  unsigned char *out = (unsigned char *) luaL_buffinitsize(L, &B, n / 4 * 3 + 1);
  m = tp_b64_decode(s, n, out);
  if (m == (size_t) -1) {
    lua_pushnil(L);
    lua_pushstring(L, "invalid base64");
    return 2;
  }
  luaL_pushresultsize(&B, m);
  return 1;
}

/* core.agent_binary() -> the embedded static agent, as a string (the
 * microVM initramfs's /init) */
static int tp_lcore_agent_binary(lua_State *L) {
  lua_pushlstring(L, (const char *) tp_blob_agent_start, TP_BLOB_SIZE(agent));
  return 1;
}

/* core.default_image(rootfs, uid_base, gid_base) */
static int tp_lcore_default_image(lua_State *L) {
  const char *rootfs = luaL_checkstring(L, 1);
  uid_t uid = (uid_t) luaL_checkinteger(L, 2);
  gid_t gid = (gid_t) luaL_optinteger(L, 3, uid);
  tp_error_t err = {0};
  if (tp_image_default_ensure(rootfs, tp_blob_busybox_start, TP_BLOB_SIZE(busybox),
                              (const char *) tp_blob_applets_start, TP_BLOB_SIZE(applets), uid,
                              gid, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lcore_rmtree(lua_State *L) {
  tp_error_t err = {0};
  if (tp_rmtree(luaL_checkstring(L, 1), &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.ignore_stop_signals(): SIGTERM, SIGINT and SIGHUP are ignored from
 * now on.  For the daemon's last moments, after its signal handles are
 * closed (closing the last one restores the default action): a user
 * pressing Ctrl-C again must not turn a clean exit into a death by signal. */
static int tp_lcore_ignore_stop_signals(lua_State *L) {
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_IGN;
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
    if (sigaction(sigs[i], &sa, NULL) < 0)
      return luaL_error(L, "sigaction: %s", strerror(errno));
  return 0;
}

/* core.keep_heap(): glibc's malloc keeps up to 4 MiB free at the top of
 * its heap instead of handing back every 128 KiB or more at once, and
 * serves blocks up to 1 MiB from it.  For the daemon, whose loop frees
 * each call's garbage in bursts (Lua's collector): with glibc's defaults
 * it shrank and regrew its heap about 7 times a box under churn, each a
 * brk() that unmaps pages and flushes the TLB, and then as many page faults
 * (docs/benchmarks.md, "Churn").  Returns whether glibc took both. */
static int tp_lcore_keep_heap(lua_State *L) {
#if defined(M_TRIM_THRESHOLD) && defined(M_MMAP_THRESHOLD)
  lua_pushboolean(L, mallopt(M_TRIM_THRESHOLD, 4 << 20) == 1 &&
                         mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);
#else
  lua_pushboolean(L, 0);
#endif
  return 1;
}

static int tp_lcore_umask(lua_State *L) {
  lua_pushinteger(L, umask((mode_t) luaL_checkinteger(L, 1)));
  return 1;
}

/* core.random_hex(nbytes): lowercase hex of nbytes random bytes. */
static int tp_lcore_random_hex(lua_State *L) {
  unsigned char raw[64];
  char hex[65];
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 1 && n <= 32, 1, "1..32 bytes");
  if (getrandom(raw, (size_t) n, 0) != (ssize_t) n)
    return luaL_error(L, "getrandom failed");
  for (lua_Integer i = 0; i < n; i++)
    snprintf(hex + 2 * i, 3, "%02x", raw[i]);
  lua_pushlstring(L, hex, (size_t) (2 * n));
  return 1;
}

/* core.lock(path): an exclusive lock on path, held by the returned fd
 * (close it with uv.fs_close); nil, msg when someone else holds it.
 *
 * A POSIX record lock (F_SETLK), not flock: a flock belongs to the open
 * file, so every child that inherited the fd held it too, and a box being
 * set up when the daemon was SIGKILLed (cloned without exec yet) kept the
 * next daemon out ("is locked") until it exec'ed.  A record lock belongs to
 * this process's fd table, which no child shares (nothing is cloned with
 * CLONE_FILES), and goes when the process does.  The daemon opens this file
 * nowhere else, so no other close drops the lock. */
static int tp_lcore_lock(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    tp_error_errno(&err, errno, "open '%s'", path);
    return tp_l_push_err(L, &err);
  }
  if (fcntl(fd, F_SETLK, &fl) < 0) {
    int e = errno;
    close(fd);
    if (e == EAGAIN || e == EACCES)
      tp_error_set(&err, e, "'%s' is locked: another daemon uses this state directory", path);
    else
      tp_error_errno(&err, e, "lock '%s'", path);
    return tp_l_push_err(L, &err);
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* core.log_to(path): points stdout and stderr at path (appending). */
static int tp_lcore_log_to(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    tp_error_errno(&err, errno, "open '%s'", path);
    return tp_l_push_err(L, &err);
  }
  fflush(stdout);
  fflush(stderr);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.fields_same(a, b, keys): whether a and b hold the same value (raw,
 * as rawequal: a table by its identity) under each key of the list keys.
 * For sandbox.list, which keeps each box's entry with the fields it was
 * made of and asks this of every listed box at each call: one call here
 * in place of a rawget of each field from Lua (daemon/api.lua). */
static int tp_lcore_fields_same(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_Unsigned n = lua_rawlen(L, 3);
  for (lua_Unsigned i = 1; i <= n; i++) {
    lua_rawgeti(L, 3, (lua_Integer) i);
    lua_pushvalue(L, -1);
    lua_rawget(L, 1);
    lua_insert(L, -2);
    lua_rawget(L, 2);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (!same) {
      lua_pushboolean(L, 0);
      return 1;
    }
  }
  lua_pushboolean(L, 1);
  return 1;
}

void tp_l_util_register(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"agent_binary", tp_lcore_agent_binary}, {"b64encode", tp_lcore_b64encode},
      {"b64decode", tp_lcore_b64decode},       {"default_image", tp_lcore_default_image},
      {"sha256", tp_ldigest_sha256},           {"rmtree", tp_lcore_rmtree},
      {"umask", tp_lcore_umask},               {"ignore_stop_signals", tp_lcore_ignore_stop_signals},
      {"random_hex", tp_lcore_random_hex},     {"lock", tp_lcore_lock},
      {"log_to", tp_lcore_log_to},             {"keep_heap", tp_lcore_keep_heap},
      {"fields_same", tp_lcore_fields_same},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
