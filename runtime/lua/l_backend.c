/* tupper.core's backend functions: core.start(backend, spec, cb),
 * core.adopt(backend, spec), core.backends().  The backend is found by name
 * in the registry (backends/api); a spec table becomes one tp_start_spec_t
 * (every backend's fields, each backend checks what it uses) and the box
 * object (runtime/host/dbox.h) does the rest. */
#include <errno.h>
#include <lauxlib.h>
#include <luv/luv.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "l_core.h"
#include "tupper.h"

/* Integer field k of table t, or TP_SPEC_UNSET when nil; raises otherwise. */
static int64_t tp__opt_int(lua_State *L, int t, const char *k) {
  int64_t v = TP_SPEC_UNSET;
  if (lua_getfield(L, t, k) != LUA_TNIL)
    v = (int64_t) luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  return v;
}

/* String list field k of table 1 into v[0..n) (NULL-terminated; the strings
 * stay owned by the table); returns n, or -1 when absent. */
static int tp__opt_strs(lua_State *L, const char *k, const char **v) {
  lua_Integer n;
  if (lua_getfield(L, 1, k) == LUA_TNIL) {
    lua_pop(L, 1);
    return -1;
  }
  if (!lua_istable(L, -1))
    luaL_error(L, "start: %s must be a list of strings", k);
  n = (lua_Integer) luaL_len(L, -1);
  if (n > TP_SPEC_LIST_MAX)
    luaL_error(L, "start: %s: more than %d items", k, TP_SPEC_LIST_MAX);
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING)
      luaL_error(L, "start: %s[%d] is not a string", k, (int) i);
    v[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  v[n] = NULL;
  lua_pop(L, 1);
  return (int) n;
}

/* File descriptor list field k of table 1 into v; n or -1 when absent. */
static int tp__opt_fds(lua_State *L, const char *k, int *v) {
  lua_Integer n;
  if (lua_getfield(L, 1, k) == LUA_TNIL) {
    lua_pop(L, 1);
    return -1;
  }
  luaL_checktype(L, -1, LUA_TTABLE);
  n = (lua_Integer) luaL_len(L, -1);
  if (n > TP_SPEC_LIST_MAX)
    luaL_error(L, "start: %s: more than %d items", k, TP_SPEC_LIST_MAX);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > 0x7fffffff)
      luaL_error(L, "start: %s[%d] is not a file descriptor", k, (int) i);
    v[i - 1] = (int) lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return (int) n;
}

static const tp_backend_t *tp__check_backend(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  return tp_backend_find(name);
}

/* A start's callback, held while the job runs. */
typedef struct tp__lstart_s {
  lua_State *L; /* main thread */
  int ref_cb;
} tp__lstart_t;

static void tp__lstart_done(void *data, tp_dbox_t *b, const tp_error_t *err) {
  tp__lstart_t *s = data;
  lua_State *L = s->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, s->ref_cb);
  free(s);
  if (b == NULL) {
    lua_pushnil(L);
    lua_pushstring(L, err->msg);
    lua_pushinteger(L, err->code);
  } else {
    tp_l_box_push(L, b);
    lua_pushnil(L);
    lua_pushnil(L);
  }
  tp_lua_pcall(L, 3, 0, 0);
}

/* core.start(backend, spec, cb(box | nil, msg, code)) -> true | nil, msg
 * spec: id=, dir=, cgroup= (the box cgroup's name, default id: the daemon
 * prefixes it with a tag of its state dir so that two daemons never touch
 * each other's), limits = { memory=, pids=, cpu_quota=, cpu_period=, disk= },
 * and the backend's own fields:
 *   linux: layers = { dir, ... } (lowest first), uid_base=, gid_base=, id_count=,
 *     volumes = { image, target, ... } (pairs: an ext4 image, where it goes),
 *     pool = the btrfs pool's dir (core.pool_open) for the disk cap, or nil,
 *     resolv = true: the set-up writes the box's /etc/resolv.conf (box:resolv())
 *   microvm: argv = { qemu, ... }, fds = { fd, ... } (QEMU's 4, 5, ...; the
 *     caller closes its own once cb ran), uid=, gid=, console_fd=,
 *     die_with_parent= (a VM that is never re-adopted)
 * The box starts in the thread pool; cb runs on the loop when it is up (or
 * failed). */
static int tp_lcore_start(lua_State *L) {
  const tp_backend_t *be = tp__check_backend(L);
  tp_daemon_t *d = tp_l_daemon(L);
  const char *layers[TP_SPEC_LIST_MAX + 1], *argv[TP_SPEC_LIST_MAX + 1];
  const char *volumes[TP_SPEC_LIST_MAX + 1];
  int fds[TP_SPEC_LIST_MAX];
  tp_dbox_start_t req;
  tp_error_t err = {0};
  tp__lstart_t *s;
  int n;

  if (be == NULL) {
    lua_pushnil(L);
    lua_pushfstring(L, "unknown backend '%s'", lua_tostring(L, 1));
    return 2;
  }
  lua_remove(L, 1); /* spec at 1, cb at 2 */
  /* every argument is checked before a C resource is taken */
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  memset(&req, 0, sizeof(req));
  lua_getfield(L, 1, "id");
  req.spec.id = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "dir");
  req.spec.dir = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "cgroup");
  req.cgroup = luaL_optstring(L, -1, NULL);
  lua_settop(L, 2); /* the strings stay referenced by the spec table */
  n = tp__opt_strs(L, "layers", layers);
  req.spec.layers = n < 0 ? NULL : layers;
  req.spec.n_layers = n < 0 ? 0 : n;
  req.spec.uid_base = tp__opt_int(L, 1, "uid_base");
  req.spec.gid_base = tp__opt_int(L, 1, "gid_base");
  req.spec.id_count = tp__opt_int(L, 1, "id_count");
  n = tp__opt_strs(L, "argv", argv);
  req.spec.argv = n < 0 ? NULL : argv;
  req.spec.argc = n < 0 ? 0 : n;
  if (lua_getfield(L, 1, "pool") != LUA_TNIL)
    req.spec.pool = luaL_checkstring(L, -1); /* stays referenced by the spec table */
  lua_pop(L, 1);
  n = tp__opt_strs(L, "volumes", volumes);
  req.spec.volumes = n < 0 ? NULL : volumes;
  req.spec.n_volumes = n < 0 ? 0 : n;
  n = tp__opt_fds(L, "fds", fds);
  req.spec.fds = n < 0 ? NULL : fds;
  req.spec.nfds = n < 0 ? 0 : n;
  req.spec.uid = tp__opt_int(L, 1, "uid");
  req.spec.gid = tp__opt_int(L, 1, "gid");
  req.spec.console_fd = tp__opt_int(L, 1, "console_fd");
  lua_getfield(L, 1, "die_with_parent");
  req.spec.die_with_parent = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 1, "resolv");
  req.spec.resolv = lua_toboolean(L, -1);
  lua_pop(L, 1);
  req.spec.disk_bytes = TP_SPEC_UNSET;
  if (lua_getfield(L, 1, "limits") == LUA_TTABLE)
    tp_l_limits(L, lua_gettop(L), &req.limits, &req.spec.disk_bytes);
  lua_settop(L, 2);
  if (be->check_start(&req.spec, &err) < 0)
    return luaL_error(L, "%s", err.msg);

  s = malloc(sizeof(*s));
  if (s == NULL)
    return luaL_error(L, "out of memory");
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  s->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_pushvalue(L, 2);
  s->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  if (tp_dbox_start(d, luv_loop(L), be, &req, tp__lstart_done, s, &err) < 0) {
    luaL_unref(L, LUA_REGISTRYINDEX, s->ref_cb);
    free(s);
    return tp_l_push_err(L, &err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.adopt(backend, spec) -> box | nil, msg, code
 * spec: id=, dir=, cgroup= (default id), pid=, and the backend's own
 * fields (microvm: uid=, start_time=).  Reconnects to the agent of a box a
 * previous daemon started (after a crash), once the backend proved pid is
 * that box's, and re-opens its cgroup.  Every value but id, dir and cgroup
 * comes from the box's record: hostile. */
static int tp_lcore_adopt(lua_State *L) {
  const tp_backend_t *be = tp__check_backend(L);
  tp_daemon_t *d = tp_l_daemon(L);
  tp_adopt_spec_t spec;
  tp_error_t err = {0};
  const char *cgname;
  tp_dbox_t *b;

  if (be == NULL) {
    lua_pushnil(L);
    lua_pushfstring(L, "unknown backend '%s'", lua_tostring(L, 1));
    return 2;
  }
  lua_remove(L, 1);
  luaL_checktype(L, 1, LUA_TTABLE);
  memset(&spec, 0, sizeof(spec));
  lua_getfield(L, 1, "id");
  spec.id = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "dir");
  spec.dir = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "pid");
  spec.pid = (int64_t) luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "cgroup");
  cgname = luaL_optstring(L, -1, spec.id);
  spec.uid = tp__opt_int(L, 1, "uid");
  spec.start_time = tp__opt_int(L, 1, "start_time");
  if (!tp_cgroup_valid_name(spec.id) || !tp_cgroup_valid_name(cgname))
    return luaL_error(L, "adopt: bad id or cgroup");

  tp_l_box_push(L, NULL); /* before the box exists: pushing may raise */
  b = tp_dbox_adopt(d, luv_loop(L), be, &spec, cgname, &err);
  if (b == NULL)
    return tp_l_push_err(L, &err);
  tp_l_box_set(L, -1, b);
  return 1;
}

/* core.backends() -> { "linux", "microvm", ... } */
static int tp_lcore_backends(lua_State *L) {
  const char *const *names = tp_backend_names();
  lua_newtable(L);
  for (lua_Integer i = 0; names[i] != NULL; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

void tp_l_backend_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"start", tp_lcore_start},
                                   {"adopt", tp_lcore_adopt},
                                   {"backends", tp_lcore_backends},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
