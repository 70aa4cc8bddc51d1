/* tupper.wire.pump: the client's end of a data connection in C
 * (runtime/host/spump.h), for lua/tupper/wire/stream.lua.  The bytes of a
 * pumped stream never become Lua strings; Lua polls the connection (luv)
 * and gets the frames that are not pumped, and the end of pumped streams,
 * as events.  Compiled into the binary and also built as
 * build/lua/tupper/wire/pump.so for the Lua specs.
 *
 *   pump.new(fd, pre) -> p | nil, msg     (fd is dup'ed; pre: bytes read after the attach reply)
 *   p:fd() -> n
 *   p:read() -> events | nil, over        p:write() -> events | nil, over
 *   p:sink(sid, fd, limit) -> true | nil, msg, code
 *   p:source(sid, fd, credit, length) -> true | nil, msg, code
 *   p:drop(sid)   p:send(bytes) -> true | nil, msg   p:queued() -> n   p:close()
 *
 * An event is {type=, sid=, payload=} for a frame of the daemon, or
 * {type=4 (ERROR), sid=, err=, msg=, loc=true} for a failure here (the
 * daemon was told); sid 0: the connection is over. */
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "spump.h"
#include "tupper.h"

#define TP_L_PUMP_MT "tupper.pump"

typedef struct tp_lpump_s {
  tp_spump_t *p;
} tp_lpump_t;

typedef struct tp__lpump_evs_s {
  lua_State *L;
  int n; /* events pushed into the table at the top of L's stack; 0: no table yet */
} tp__lpump_evs_t;

static tp_lpump_t *tp__check_pump(lua_State *L) {
  tp_lpump_t *u = luaL_checkudata(L, 1, TP_L_PUMP_MT);
  if (u->p == NULL)
    luaL_error(L, "data connection is closed");
  return u;
}

static int tp__lpump_fail(lua_State *L, const tp_error_t *err) {
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushinteger(L, err->code);
  return 3;
}

/* The events table grows on the stack; a push can raise only when Lua is
 * out of memory, and the pump's state is whole between two callbacks. */
static void tp__lpump_cb(void *data, const tp_sframe_t *f, int local) {
  tp__lpump_evs_t *e = data;
  lua_State *L = e->L;
  if (e->n == 0)
    lua_createtable(L, 2, 0);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, f->type);
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer) f->sid);
  lua_setfield(L, -2, "sid");
  if (local) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "loc");
    lua_pushinteger(L, (lua_Integer) f->err);
    lua_setfield(L, -2, "err");
    lua_pushlstring(L, f->msg, f->msg_len);
    lua_setfield(L, -2, "msg");
  } else {
    lua_pushlstring(L, (const char *) f->payload, f->len);
    lua_setfield(L, -2, "payload");
  }
  lua_rawseti(L, -2, ++e->n);
}

/* pump.new(fd, pre) */
static int tp_lpump_new(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  size_t plen = 0;
  const char *pre = luaL_optlstring(L, 2, "", &plen);
  tp_error_t err = { 0 };
  tp_lpump_t *u;
  int nfd;
  luaL_argcheck(L, fd >= 0 && fd <= 0x7fffffff, 1, "not an fd");
  u = lua_newuserdatauv(L, sizeof(*u), 0);
  u->p = NULL;
  luaL_setmetatable(L, TP_L_PUMP_MT);
  /* nothing raises from here */
  nfd = fcntl((int) fd, F_DUPFD_CLOEXEC, 3);
  if (nfd < 0) {
    tp_error_errno(&err, errno, "data connection: dup");
    return tp__lpump_fail(L, &err);
  }
  u->p = tp_spump_new(nfd, (const uint8_t *) pre, plen, &err);
  if (u->p == NULL) {
    close(nfd);
    return tp__lpump_fail(L, &err);
  }
  return 1;
}

static int tp_lpump_fd(lua_State *L) {
  lua_pushinteger(L, tp_spump_fd(tp__check_pump(L)->p));
  return 1;
}

static int tp__lpump_io(lua_State *L, int (*fn)(tp_spump_t *, tp_spump_cb, void *)) {
  tp_lpump_t *u = tp__check_pump(L);
  tp__lpump_evs_t e = { L, 0 };
  int r;
  lua_settop(L, 1);
  r = fn(u->p, tp__lpump_cb, &e);
  if (e.n == 0)
    lua_pushnil(L);
  lua_pushboolean(L, r < 0);
  return 2;
}

static int tp_lpump_read(lua_State *L) {
  return tp__lpump_io(L, tp_spump_read);
}

static int tp_lpump_write(lua_State *L) {
  return tp__lpump_io(L, tp_spump_write);
}

static uint32_t tp__check_sid(lua_State *L, int i) {
  lua_Integer sid = luaL_checkinteger(L, i);
  luaL_argcheck(L, sid > 0 && sid <= UINT32_MAX, i, "bad stream id");
  return (uint32_t) sid;
}

static int tp__check_fd(lua_State *L, int i) {
  lua_Integer fd = luaL_checkinteger(L, i);
  luaL_argcheck(L, fd >= 0 && fd <= 0x7fffffff, i, "not an fd");
  return (int) fd;
}

/* p:sink(sid, fd, limit): limit nil or < 0: none */
static int tp_lpump_sink(lua_State *L) {
  tp_lpump_t *u = tp__check_pump(L);
  uint32_t sid = tp__check_sid(L, 2);
  int fd = tp__check_fd(L, 3);
  lua_Integer limit = luaL_optinteger(L, 4, -1);
  tp_error_t err = { 0 };
  if (tp_spump_sink(u->p, sid, fd, limit < 0 ? UINT64_MAX : (uint64_t) limit, &err) < 0)
    return tp__lpump_fail(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* p:source(sid, fd, credit, length): length nil or < 0: to the end */
static int tp_lpump_source(lua_State *L) {
  tp_lpump_t *u = tp__check_pump(L);
  uint32_t sid = tp__check_sid(L, 2);
  int fd = tp__check_fd(L, 3);
  lua_Integer credit = luaL_checkinteger(L, 4);
  lua_Integer length = luaL_optinteger(L, 5, -1);
  tp_error_t err = { 0 };
  luaL_argcheck(L, credit >= 0, 4, "bad credit");
  if (tp_spump_source(u->p, sid, fd, (uint64_t) credit,
                      length < 0 ? UINT64_MAX : (uint64_t) length, &err) < 0)
    return tp__lpump_fail(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lpump_drop(lua_State *L) {
  tp_lpump_t *u = tp__check_pump(L);
  tp_spump_drop(u->p, tp__check_sid(L, 2));
  return 0;
}

static int tp_lpump_send(lua_State *L) {
  tp_lpump_t *u = tp__check_pump(L);
  size_t n;
  const char *b = luaL_checklstring(L, 2, &n);
  tp_error_t err = { 0 };
  if (tp_spump_send(u->p, b, n, &err) < 0)
    return tp__lpump_fail(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lpump_queued(lua_State *L) {
  lua_pushinteger(L, (lua_Integer) tp_spump_queued(tp__check_pump(L)->p));
  return 1;
}

static int tp_lpump_close(lua_State *L) {
  tp_lpump_t *u = luaL_checkudata(L, 1, TP_L_PUMP_MT);
  if (u->p != NULL) {
    tp_spump_t *p = u->p;
    u->p = NULL;
    tp_spump_free(p);
  }
  return 0;
}

int luaopen_tupper_wire_pump(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"fd", tp_lpump_fd},         {"read", tp_lpump_read}, {"write", tp_lpump_write},
    {"sink", tp_lpump_sink},     {"source", tp_lpump_source}, {"drop", tp_lpump_drop},
    {"send", tp_lpump_send},     {"queued", tp_lpump_queued}, {"close", tp_lpump_close},
    {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"new", tp_lpump_new}, {NULL, NULL}};
  if (luaL_newmetatable(L, TP_L_PUMP_MT)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, tp_lpump_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_newlib(L, funcs);
  return 1;
}
