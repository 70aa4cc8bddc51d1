/* tupper.core's btrfs pool functions (backends/linux/pool_btrfs.c), for
 * lua/tupper/daemon/disk_pool.lua and daemon/snapshots.lua:
 *
 *   core.pool_probe() -> true | nil, msg      can this host have one
 *   core.pool_open(dir, bytes) -> { adopted = bool } | nil, msg
 *   core.pool_close(dir) -> true | nil, msg   unmount (daemon stop)
 *   core.pool_snapshot(dir, box_id, name, cb(true | nil, msg))
 *   core.pool_drop(dir, "boxes" | "snaps", name, cb(true | nil, msg))
 *   core.pool_is_subvol(path) -> 0 | 1 | 2    not one, a subvolume, read-only
 *
 * open and close run on the loop (daemon start and stop, once each: a
 * mkfs.btrfs the first time); a snapshot (syncfs, a transaction commit)
 * and a drop run in the thread pool. */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <luv/luv.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "job.h"
#include "l_core.h"
#include "linux.h"
#include "tupper.h"

typedef struct pool_job_s {
  lua_State *L; /* main thread */
  int ref_cb;
  int snapshot; /* else a drop */
  char *dir, *a, *b;
  tp_error_t err;
  int ret;
} pool_job_t;

static void job_free(pool_job_t *j) {
  free(j->dir);
  free(j->a);
  free(j->b);
  free(j);
}

static void job_work(void *data) {
  pool_job_t *j = data;
  if (j->snapshot)
    j->ret = tp_linux_pool_snapshot(j->dir, j->a, j->b, &j->err);
  else
    j->ret = tp_linux_pool_drop(j->dir, j->a, j->b, &j->err);
}

static void job_after(void *data, int status) {
  pool_job_t *j = data;
  lua_State *L = j->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  if (status < 0 || j->ret < 0) {
    lua_pushnil(L);
    lua_pushstring(L, status < 0 ? uv_strerror(status) : j->err.msg);
  } else {
    lua_pushboolean(L, 1);
    lua_pushnil(L);
  }
  job_free(j);
  tp_lua_pcall(L, 2, 0, 0);
}

/* (dir, a, b, cb): every argument checked first, then the job. */
static int pool_job(lua_State *L, int snapshot) {
  pool_job_t *j;
  int r;
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  luaL_checkstring(L, 3);
  luaL_checktype(L, 4, LUA_TFUNCTION);
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->snapshot = snapshot;
  j->dir = strdup(lua_tostring(L, 1));
  j->a = strdup(lua_tostring(L, 2));
  j->b = strdup(lua_tostring(L, 3));
  if (j->dir == NULL || j->a == NULL || j->b == NULL) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  j->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_pushvalue(L, 4);
  j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  r = tp_job_queue(luv_loop(L), job_work, job_after, j);
  if (r < 0) {
    luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
    job_free(j);
    lua_pushnil(L);
    lua_pushfstring(L, "queue work: %s", uv_strerror(r));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pool_snapshot(lua_State *L) { return pool_job(L, 1); }
static int l_pool_drop(lua_State *L) { return pool_job(L, 0); }

static int push_err(lua_State *L, const tp_error_t *err) {
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushinteger(L, err->code);
  return 3;
}

static int l_pool_probe(lua_State *L) {
  tp_error_t err = {0};
  if (tp_linux_pool_probe(&err) < 0)
    return push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pool_open(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  lua_Integer bytes = luaL_checkinteger(L, 2);
  tp_error_t err = {0};
  int adopted = 0;
  if (bytes < 0)
    return luaL_error(L, "pool_open: bad size");
  if (tp_linux_pool_open(dir, (int64_t) bytes, &adopted, &err) < 0)
    return push_err(L, &err);
  lua_createtable(L, 0, 1);
  lua_pushboolean(L, adopted);
  lua_setfield(L, -2, "adopted");
  return 1;
}

static int l_pool_close(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  if (tp_linux_pool_close(dir, &err) < 0)
    return push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pool_is_subvol(lua_State *L) {
  lua_pushinteger(L, tp_linux_pool_is_subvol(luaL_checkstring(L, 1)));
  return 1;
}

void tp_l_pool_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"pool_probe", l_pool_probe},     {"pool_open", l_pool_open},
                                   {"pool_close", l_pool_close},     {"pool_snapshot", l_pool_snapshot},
                                   {"pool_drop", l_pool_drop},       {"pool_is_subvol", l_pool_is_subvol},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
