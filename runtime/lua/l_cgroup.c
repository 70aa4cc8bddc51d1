/* tupper.core's cgroup functions: the daemon's cgroup root (the boxes'
 * cgroups are the box objects'), and the one limits parser. */
#include <errno.h>
#include <lauxlib.h>

#include "l_core.h"
#include "utils.h"

static int64_t tp__limit(lua_State *L, int t, const char *k) {
  int64_t v;
  lua_getfield(L, t, k);
  v = (int64_t) luaL_optinteger(L, -1, 0);
  lua_pop(L, 1);
  return v;
}

void tp_l_limits(lua_State *L, int t, tp_cgroup_limits_t *lim, int64_t *disk) {
  lim->memory = tp__limit(L, t, "memory");
  lim->pids = tp__limit(L, t, "pids");
  lim->cpu_quota = tp__limit(L, t, "cpu_quota");
  lim->cpu_period = tp__limit(L, t, "cpu_period");
  if (disk != NULL)
    *disk = tp__limit(L, t, "disk");
}

/* core.cgroup_init([root]) -> { version=, memory=, pids=, cpu=, freezer= }
 * | nil, msg: finds the cgroup filesystems; boxes started after it get a
 * cgroup each. */
static int tp_lcore_cgroup_init(lua_State *L) {
  tp_daemon_t *d = tp_l_daemon(L);
  const char *root = luaL_optstring(L, 1, NULL);
  tp_error_t err = {0};
  if (tp_daemon_cgroup_init(d, root, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, d->cgroot.version);
  lua_setfield(L, -2, "version");
  static const struct { const char *name; int c; } ctrls[] = {
      {"memory", TP_CG_MEMORY}, {"pids", TP_CG_PIDS}, {"cpu", TP_CG_CPU}, {"freezer", TP_CG_FREEZER}};
  for (size_t i = 0; i < TP_ARRAY_SIZE(ctrls); i++) {
    int ok = (d->cgroot.avail & (1u << ctrls[i].c)) != 0;
    if (ctrls[i].c == TP_CG_FREEZER && d->cgroot.version == 2)
      ok = 1; /* cgroup.freeze is a core file on v2 */
    lua_pushboolean(L, ok);
    lua_setfield(L, -2, ctrls[i].name);
  }
  return 1;
}

/* core.cgroup_orphans() -> { id, ... }: box cgroups present on the host. */
static int tp_lcore_cgroup_orphans(lua_State *L) {
  tp_daemon_t *d = tp_l_daemon(L);
  tp_error_t err = {0};
  char **ids = NULL;
  size_t n = 0;
  lua_newtable(L);
  if (!d->has_cgroups)
    return 1;
  if (tp_cgroup_list(&d->cgroot, &ids, &n, &err) < 0)
    return tp_l_push_err(L, &err);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, ids[i]);
    lua_rawseti(L, -2, (lua_Integer) i + 1);
  }
  tp_cgroup_list_free(ids, n);
  return 1;
}

/* core.cgroup_remove(id): kills everything in tupper/<id> and removes it. */
static int tp_lcore_cgroup_remove(lua_State *L) {
  tp_daemon_t *d = tp_l_daemon(L);
  const char *id = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  tp_cgroup_t cg;
  if (!d->has_cgroups || !tp_cgroup_valid_name(id))
    return luaL_error(L, "cgroup_remove: no cgroups or bad id");
  if (tp_cgroup_open(&d->cgroot, id, &cg, &err) < 0) {
    if (err.code == ENOENT) {
      lua_pushboolean(L, 1);
      return 1;
    }
    return tp_l_push_err(L, &err);
  }
  if (tp_cgroup_destroy(&cg, &err) < 0) {
    tp_cgroup_free(&cg);
    return tp_l_push_err(L, &err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.cgroup_prune(): removes the empty tupper parents (daemon shutdown). */
static int tp_lcore_cgroup_prune(lua_State *L) {
  tp_daemon_t *d = tp_l_daemon(L);
  tp_error_t err = {0};
  if (d->has_cgroups && tp_cgroup_prune(&d->cgroot, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

void tp_l_cgroup_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"cgroup_init", tp_lcore_cgroup_init},
                                   {"cgroup_orphans", tp_lcore_cgroup_orphans},
                                   {"cgroup_remove", tp_lcore_cgroup_remove},
                                   {"cgroup_prune", tp_lcore_cgroup_prune},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
