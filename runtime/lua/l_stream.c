/* tupper.core's data plane binding (runtime/host/stream_fs.h): a client's
 * data connection as a userdata.  Lua attaches it and opens file streams
 * on it; the bytes stay in C.
 *
 *   core.stream_attach(fd, window, idle_ms, reply, on_close) -> dc | nil, msg
 *   dc:file(box, sid, write, {path=, offset=, length=, flags=, mode=,
 *           uid=, gid=, groups=}) -> true | nil, msg, code
 *   dc:file_fd(box, sid, file, {path=, offset=, append=}) -> true | nil, msg, code
 *   dc:file_fd_read(box, sid, file, {path=, offset=, length=}) -> true | nil, msg, code
 *   dc:process(box, pid, {stdout=, stderr=, stdin=, pty=}) -> true | nil, msg, code
 *   core.stream_proc_known(box, pid) -> bool
 *   core.stream_proc_ring(box, pid, take) -> {{stream=, data=}...}, dropped | nil
 *   core.stream_proc_mirror(box, pid) -> bool
 *   dc:streams() -> n      dc:alive() -> bool      dc:close() */
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <luv/luv.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "l_core.h"
#include "stream_fs.h"
#include "stream_proc.h"
#include "tupper.h"

#define TP_L_SDC_MT "tupper.sdc"

typedef struct tp_lsdc_s {
  tp_sdc_t *d;
  lua_State *L; /* main thread */
  int ref_close;
} tp_lsdc_t;

static void tp__lsdc_close_cb(tp_sdc_t *d, int err, const char *reason) {
  tp_lsdc_t *u = tp_sdc_data(d);
  lua_State *L = u->L;
  if (u->ref_close == LUA_NOREF)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, u->ref_close);
  lua_pushinteger(L, err);
  lua_pushstring(L, reason);
  tp_lua_pcall(L, 2, 0, 0);
}

/* core.stream_attach(fd, window, idle_ms, reply, on_close): fd is dup'ed
 * (the caller closes its own handle); reply is written first. */
static int tp_lcore_stream_attach(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  lua_Integer window = luaL_checkinteger(L, 2);
  lua_Integer idle = luaL_checkinteger(L, 3);
  size_t plen;
  const char *reply = luaL_checklstring(L, 4, &plen);
  tp_error_t err = { 0 };
  tp_lsdc_t *u;
  int nfd;
  luaL_checktype(L, 5, LUA_TFUNCTION);
  luaL_argcheck(L, fd >= 0 && fd <= 0x7fffffff, 1, "not an fd");
  luaL_argcheck(L, window > 0 && window <= UINT32_MAX, 2, "bad window");
  luaL_argcheck(L, idle >= 0, 3, "bad idle time");
  u = lua_newuserdatauv(L, sizeof(*u), 0);
  u->d = NULL;
  u->ref_close = LUA_NOREF;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  u->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  luaL_setmetatable(L, TP_L_SDC_MT);
  /* nothing raises from here */
  nfd = fcntl((int) fd, F_DUPFD_CLOEXEC, 3);
  if (nfd < 0) {
    tp_error_errno(&err, errno, "data connection: dup");
    return tp_l_push_err(L, &err);
  }
  u->d = tp_sdc_new(luv_loop(L), nfd, (uint32_t) window, (uint64_t) idle, reply, plen,
                    tp__lsdc_close_cb, u, &err);
  if (u->d == NULL)
    return tp_l_push_err(L, &err);
  lua_pushvalue(L, 5);
  u->ref_close = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static tp_lsdc_t *tp__check_lsdc(lua_State *L) {
  tp_lsdc_t *u = luaL_checkudata(L, 1, TP_L_SDC_MT);
  if (u->d == NULL)
    luaL_error(L, "data connection is closed");
  return u;
}

static lua_Integer tp__opt_int(lua_State *L, int t, const char *k, lua_Integer def, int *has) {
  lua_Integer v = def;
  lua_getfield(L, t, k);
  if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1))
      luaL_error(L, "file stream: '%s' is not an integer", k);
    v = lua_tointeger(L, -1);
    if (has)
      *has = 1;
  }
  lua_pop(L, 1);
  return v;
}

/* dc:file(box, sid, write, spec) */
static int tp_lsdc_file(lua_State *L) {
  tp_lsdc_t *u = tp__check_lsdc(L);
  tp_dbox_t *b = tp_l_box_check(L, 2);
  lua_Integer sid = luaL_checkinteger(L, 3);
  int write = lua_toboolean(L, 4);
  tp_sfs_spec_t spec;
  tp_error_t err = { 0 };
  size_t glen = 0;
  int has_uid = 0, has_gid = 0;
  luaL_checktype(L, 5, LUA_TTABLE);
  luaL_argcheck(L, sid > 0 && sid < (lua_Integer) TP_SF_CLIENT_SID, 3, "bad stream id");
  memset(&spec, 0, sizeof(spec));
  lua_getfield(L, 5, "path");
  spec.path = luaL_checkstring(L, -1); /* the table keeps it alive */
  lua_pop(L, 1);
  lua_Integer off = tp__opt_int(L, 5, "offset", 0, NULL);
  lua_Integer len = tp__opt_int(L, 5, "length", -1, NULL);
  lua_Integer flags = tp__opt_int(L, 5, "flags", 0, NULL);
  lua_Integer mode = tp__opt_int(L, 5, "mode", 0644, NULL);
  spec.uid = tp__opt_int(L, 5, "uid", 0, &has_uid);
  spec.gid = tp__opt_int(L, 5, "gid", 0, &has_gid);
  luaL_argcheck(L, off >= 0 && mode >= 0 && mode <= 07777 && flags >= 0 && flags <= 7, 5,
                "bad offset, mode or flags");
  luaL_argcheck(L, has_uid == has_gid, 5, "uid and gid go together");
  lua_getfield(L, 5, "groups");
  if (!lua_isnil(L, -1))
    spec.groups = (const uint8_t *) luaL_checklstring(L, -1, &glen);
  lua_pop(L, 1);
  spec.offset = (uint64_t) off;
  spec.length = len < 0 ? UINT64_MAX : (uint64_t) len;
  spec.flags = (uint32_t) flags;
  spec.mode = (uint32_t) mode;
  spec.has_account = has_uid;
  spec.glen = (uint32_t) glen;
  if (tp_sdc_file(u->d, b, (uint32_t) sid, write, &spec, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* dc:file_fd(box, sid, file, {path=, offset=, append=}): a write stream
 * into file (core.file: the box's file from its agent, FS_OPEN); the
 * caller closes its own file afterwards. */
static int tp_lsdc_file_fd(lua_State *L) {
  tp_lsdc_t *u = tp__check_lsdc(L);
  tp_dbox_t *b = tp_l_box_check(L, 2);
  lua_Integer sid = luaL_checkinteger(L, 3);
  int fd = tp_l_file_fd(L, 4);
  tp_error_t err = { 0 };
  const char *path;
  int append;
  luaL_checktype(L, 5, LUA_TTABLE);
  luaL_argcheck(L, sid > 0 && sid < (lua_Integer) TP_SF_CLIENT_SID, 3, "bad stream id");
  lua_getfield(L, 5, "path");
  path = luaL_checkstring(L, -1); /* the table keeps it alive */
  lua_pop(L, 1);
  lua_Integer off = tp__opt_int(L, 5, "offset", 0, NULL);
  luaL_argcheck(L, off >= 0, 5, "bad offset");
  lua_getfield(L, 5, "append");
  append = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (tp_sdc_file_fd(u->d, b, (uint32_t) sid, fd, path, (uint64_t) off, append, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* dc:file_fd_read(box, sid, file, {path=, offset=, length=}): a read
 * stream of file (core.file from FS_OPEN); the caller closes its own. */
static int tp_lsdc_file_fd_read(lua_State *L) {
  tp_lsdc_t *u = tp__check_lsdc(L);
  tp_dbox_t *b = tp_l_box_check(L, 2);
  lua_Integer sid = luaL_checkinteger(L, 3);
  int fd = tp_l_file_fd(L, 4);
  tp_error_t err = { 0 };
  const char *path;
  luaL_checktype(L, 5, LUA_TTABLE);
  luaL_argcheck(L, sid > 0 && sid < (lua_Integer) TP_SF_CLIENT_SID, 3, "bad stream id");
  lua_getfield(L, 5, "path");
  path = luaL_checkstring(L, -1); /* the table keeps it alive */
  lua_pop(L, 1);
  lua_Integer off = tp__opt_int(L, 5, "offset", 0, NULL);
  lua_Integer len = tp__opt_int(L, 5, "length", -1, NULL);
  luaL_argcheck(L, off >= 0, 5, "bad offset");
  if (tp_sdc_file_fd_read(u->d, b, (uint32_t) sid, fd, path, (uint64_t) off,
                          len < 0 ? UINT64_MAX : (uint64_t) len, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static uint32_t tp__opt_sid(lua_State *L, const char *k) {
  lua_Integer v = tp__opt_int(L, 4, k, 0, NULL);
  if (v < 0 || v >= (lua_Integer) TP_SF_CLIENT_SID)
    luaL_error(L, "process streams: bad stream id '%s'", k);
  return (uint32_t) v;
}

/* dc:process(box, pid, sids): binds a credit process's streams to dc. */
static int tp_lsdc_process(lua_State *L) {
  tp_lsdc_t *u = tp__check_lsdc(L);
  tp_dbox_t *b = tp_l_box_check(L, 2);
  lua_Integer pid = luaL_checkinteger(L, 3);
  tp_sproc_sids_t sids;
  tp_error_t err = { 0 };
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_argcheck(L, pid > 0 && pid <= 0x7fffffff, 3, "bad pid");
  memset(&sids, 0, sizeof(sids));
  sids.out = tp__opt_sid(L, "stdout");
  sids.err = tp__opt_sid(L, "stderr");
  sids.in = tp__opt_sid(L, "stdin");
  lua_getfield(L, 4, "pty");
  sids.pty = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (tp_sdc_proc(u->d, b, pid, &sids, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.stream_proc_known(box, pid): a credit process that has not exited. */
static int tp_lcore_stream_proc_known(lua_State *L) {
  tp_dbox_t *b = tp_l_box_check(L, 1);
  lua_Integer pid = luaL_checkinteger(L, 2);
  lua_pushboolean(L, tp_sproc_known(b, pid));
  return 1;
}

static void tp__lring_cb(void *data, int stream, const uint8_t *p, size_t n) {
  lua_State *L = data;
  lua_createtable(L, 0, 2);
  lua_pushstring(L, stream == 0 ? "stdout" : "stderr");
  lua_setfield(L, -2, "stream");
  lua_pushlstring(L, (const char *) p, n);
  lua_setfield(L, -2, "data");
  lua_rawseti(L, -2, (lua_Integer) lua_rawlen(L, -2) + 1);
}

/* core.stream_proc_ring(box, pid, take): the output a registered process
 * kept (its owner's ring is not fed), and what came before it. */
static int tp_lcore_stream_proc_ring(lua_State *L) {
  tp_dbox_t *b = tp_l_box_check(L, 1);
  lua_Integer pid = luaL_checkinteger(L, 2);
  int take = lua_toboolean(L, 3);
  uint64_t dropped = 0;
  lua_createtable(L, 8, 0); /* at most TP_SPROC_RING bytes: the pushes cannot fail for long */
  if (tp_sproc_ring(b, pid, take, tp__lring_cb, L, &dropped) < 0) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushinteger(L, (lua_Integer) dropped);
  return 2;
}

/* core.stream_proc_mirror(box, pid): its output reaches Lua too (listeners). */
static int tp_lcore_stream_proc_mirror(lua_State *L) {
  tp_dbox_t *b = tp_l_box_check(L, 1);
  lua_Integer pid = luaL_checkinteger(L, 2);
  lua_pushboolean(L, tp_sproc_mirror(b, pid) == 0);
  return 1;
}

static int tp_lsdc_streams(lua_State *L) {
  lua_pushinteger(L, (lua_Integer) tp_sdc_streams(tp__check_lsdc(L)->d));
  return 1;
}

/* dc:flush(): the frames held for the loop turn go now (before a reply). */
static int tp_lsdc_flush(lua_State *L) {
  tp_lsdc_t *u = luaL_checkudata(L, 1, TP_L_SDC_MT);
  if (u->d != NULL)
    tp_sdc_flush(u->d);
  return 0;
}

static int tp_lsdc_alive(lua_State *L) {
  tp_lsdc_t *u = luaL_checkudata(L, 1, TP_L_SDC_MT);
  lua_pushboolean(L, u->d != NULL && tp_sdc_alive(u->d));
  return 1;
}

static int tp_lsdc_close(lua_State *L) {
  tp_lsdc_t *u = luaL_checkudata(L, 1, TP_L_SDC_MT);
  if (u->d != NULL) {
    tp_sdc_t *d = u->d;
    u->d = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, u->ref_close);
    u->ref_close = LUA_NOREF;
    tp_sdc_close(d);
  }
  return 0;
}

void tp_l_stream_register(lua_State *L) {
  static const luaL_Reg methods[] = {{"file", tp_lsdc_file},   {"process", tp_lsdc_process},
                                     {"file_fd", tp_lsdc_file_fd}, {"file_fd_read", tp_lsdc_file_fd_read},
                                     {"streams", tp_lsdc_streams},
                                     {"alive", tp_lsdc_alive}, {"flush", tp_lsdc_flush},
                                     {"close", tp_lsdc_close},
                                     {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"stream_attach", tp_lcore_stream_attach},
                                   {"stream_proc_known", tp_lcore_stream_proc_known},
                                   {"stream_proc_ring", tp_lcore_stream_proc_ring},
                                   {"stream_proc_mirror", tp_lcore_stream_proc_mirror},
                                   {NULL, NULL}};
  luaL_newmetatable(L, TP_L_SDC_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, tp_lsdc_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}
