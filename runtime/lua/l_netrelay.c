/* tupper.core's network relay binding (runtime/host/netrelay.h): the C data
 * path of a box's allowed connections.  Lua judges a connection once and
 * hands the established stream over; its bytes never reach Lua again.
 *
 *   core.netrelay(box, on_end(sid, to_up, to_box, errno)) -> nr | nil, msg
 *   nr:take{ sid=, fd=, up=, up_head=, down=, out_unacked=, box_eof=,
 *            up_eof=, eof_sent= } -> true | nil, msg, code
 *   nr:drop(sid, notify) -> bool    nr:has(sid) -> bool    nr:count() -> n
 *   nr:close() */
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "l_core.h"
#include "netrelay.h"
#include "tupper.h"

#define TP_L_NETRELAY_MT "tupper.netrelay"

typedef struct tp_lnetrelay_s {
  tp_netrelay_t *nr;
  lua_State *L; /* main thread */
  int ref_end;
} tp_lnetrelay_t;

static void tp__lnr_end_cb(tp_netrelay_t *nr, uint32_t sid, uint64_t to_up, uint64_t to_box,
                           int err, void *data) {
  tp_lnetrelay_t *u = data;
  lua_State *L = u->L;
  (void) nr;
  if (u->ref_end == LUA_NOREF)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, u->ref_end);
  lua_pushinteger(L, (lua_Integer) sid);
  lua_pushinteger(L, (lua_Integer) to_up);
  lua_pushinteger(L, (lua_Integer) to_box);
  lua_pushinteger(L, err);
  tp_lua_pcall(L, 4, 0, 0);
}

/* core.netrelay(box, on_end [, window_down [, give]]): window_down, the
 * bytes a stream may have unacknowledged towards the box (default
 * NET.WINDOW); give, the box's agent answers NET_GIVE (tp_netrelay_give) */
static int tp_lcore_netrelay(lua_State *L) {
  tp_dbox_t *b = tp_l_box_check(L, 1);
  tp_error_t err = {0};
  tp_lnetrelay_t *u;
  lua_Integer wdown = luaL_optinteger(L, 3, TP_NET_WINDOW);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_argcheck(L, wdown >= TP_NET_CHUNK && wdown <= TP_NET_WINDOW_DOWN, 3, "window out of range");
  u = lua_newuserdatauv(L, sizeof(*u), 1);
  u->nr = NULL;
  u->ref_end = LUA_NOREF;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  u->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  luaL_setmetatable(L, TP_L_NETRELAY_MT);
  lua_pushvalue(L, 1); /* the box outlives its relay */
  lua_setiuservalue(L, -2, 1);
  u->nr = tp_netrelay_new(b, (uint32_t) wdown, tp__lnr_end_cb, u, &err);
  if (u->nr == NULL)
    return tp_l_push_err(L, &err);
  tp_netrelay_give(u->nr, lua_toboolean(L, 4));
  lua_pushvalue(L, 2);
  u->ref_end = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static tp_lnetrelay_t *tp__check_lnr(lua_State *L) {
  tp_lnetrelay_t *u = luaL_checkudata(L, 1, TP_L_NETRELAY_MT);
  if (u->nr == NULL)
    luaL_error(L, "network relay is closed");
  return u;
}

static lua_Integer tp__lnr_int(lua_State *L, const char *k, lua_Integer lo, lua_Integer hi,
                               int required) {
  lua_Integer v = 0;
  lua_getfield(L, 2, k);
  if (lua_isnil(L, -1) && required)
    luaL_error(L, "netrelay take: '%s' is missing", k);
  if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1))
      luaL_error(L, "netrelay take: '%s' is not an integer", k);
    v = lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  if (v < lo || v > hi)
    luaL_error(L, "netrelay take: '%s' out of range", k);
  return v;
}

static const uint8_t *tp__lnr_str(lua_State *L, const char *k, size_t *len) {
  const char *p;
  lua_getfield(L, 2, k);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    *len = 0;
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "netrelay take: '%s' is not a string", k);
  p = lua_tolstring(L, -1, len);
  lua_pop(L, 1); /* the table keeps it alive */
  return (const uint8_t *) p;
}

static int tp__lnr_bool(lua_State *L, const char *k) {
  int v;
  lua_getfield(L, 2, k);
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* nr:take(t): t.fd is dup'ed (the caller closes its own handle after). */
static int tp_lnr_take(lua_State *L) {
  tp_lnetrelay_t *u = tp__check_lnr(L);
  tp_netrelay_take_t t;
  tp_error_t err = {0};
  lua_Integer fd;
  luaL_checktype(L, 2, LUA_TTABLE);
  /* pass 1: every argument (may raise: nothing held yet) */
  memset(&t, 0, sizeof(t));
  t.sid = (uint32_t) tp__lnr_int(L, "sid", 1, 0x7fffffff, 1);
  fd = tp__lnr_int(L, "fd", 0, 0x7fffffff, 1);
  t.up_head = (size_t) tp__lnr_int(L, "up_head", 0, INT32_MAX, 0);
  t.out_unacked = (uint32_t) tp__lnr_int(L, "out_unacked", 0, UINT32_MAX, 0);
  t.up = tp__lnr_str(L, "up", &t.up_len);
  t.down = tp__lnr_str(L, "down", &t.down_len);
  t.box_eof = tp__lnr_bool(L, "box_eof");
  t.up_eof = tp__lnr_bool(L, "up_eof");
  t.eof_sent = tp__lnr_bool(L, "eof_sent");
  /* pass 2: the fd is ours; nothing raises */
  t.fd = fcntl((int) fd, F_DUPFD_CLOEXEC, 3);
  if (t.fd < 0) {
    tp_error_errno(&err, errno, "network relay: dup");
    return tp_l_push_err(L, &err);
  }
  if (tp_netrelay_take(u->nr, &t, &err) < 0) /* closes t.fd on failure */
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lnr_drop(lua_State *L) {
  tp_lnetrelay_t *u = tp__check_lnr(L);
  lua_Integer sid = luaL_checkinteger(L, 2);
  int notify = lua_toboolean(L, 3);
  lua_pushboolean(L, sid > 0 && sid <= UINT32_MAX &&
                         tp_netrelay_drop(u->nr, (uint32_t) sid, notify) == 0);
  return 1;
}

static int tp_lnr_has(lua_State *L) {
  tp_lnetrelay_t *u = tp__check_lnr(L);
  lua_Integer sid = luaL_checkinteger(L, 2);
  lua_pushboolean(L, sid > 0 && sid <= UINT32_MAX && tp_netrelay_has(u->nr, (uint32_t) sid));
  return 1;
}

static int tp_lnr_count(lua_State *L) {
  lua_pushinteger(L, tp_netrelay_count(tp__check_lnr(L)->nr));
  return 1;
}

static int tp_lnr_close(lua_State *L) {
  tp_lnetrelay_t *u = luaL_checkudata(L, 1, TP_L_NETRELAY_MT);
  if (u->nr != NULL) {
    tp_netrelay_t *nr = u->nr;
    u->nr = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, u->ref_end);
    u->ref_end = LUA_NOREF;
    tp_netrelay_release(nr);
  }
  return 0;
}

void tp_l_netrelay_register(lua_State *L) {
  static const luaL_Reg methods[] = {{"take", tp_lnr_take},   {"drop", tp_lnr_drop},
                                     {"has", tp_lnr_has},     {"count", tp_lnr_count},
                                     {"close", tp_lnr_close}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"netrelay", tp_lcore_netrelay}, {NULL, NULL}};
  luaL_newmetatable(L, TP_L_NETRELAY_MT);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, tp_lnr_close);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}
