/* The image store's C half, for lua/tupper/images.lua: layer unpacking,
 * blob hashing and tarring a rootfs dir (backends/linux/layer.c), each run
 * on the loop's worker threads (job.h) so the daemon keeps serving
 * meanwhile.
 *
 *   core.layer_unpack({ blob=, dir= (layers dir), uid_base=, gid_base=,
 *                       id_count=, max_tar_bytes=, max_bytes=, max_entries=,
 *                       digest= (want, optional), diff_id= (want, optional) },
 *                     cb(info | nil, msg))
 *       info = { digest=, diff_id=, tar_bytes=, bytes=, entries=, existed= }
 *   core.blob_put(src, blobs_dir | nil, want | nil, max_bytes, cb(digest | nil, msg))
 *   core.tar_dir(dir, out_path, uid_base, gid_base, id_count, cb(true | nil, msg))
 *   core.digest_valid(s) -> boolean */
#define _GNU_SOURCE
#include <lauxlib.h>
#include <lua.h>
#include <luv/luv.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "job.h"
#include "layer.h"
#include "linux.h" /* tp_linux_volume_make */
#include "l_core.h"
#include "tupper.h"

enum job_kind { JOB_UNPACK, JOB_BLOB, JOB_TAR, JOB_VOLUME };

typedef struct img_job_s {
  lua_State *L; /* main thread */
  int ref_cb;
  enum job_kind kind;
  char *a, *b, *want, *want2; /* owned strings: paths and wanted digests */
  tp_layer_opts_t opts;
  uint64_t max_bytes;
  tp_layer_info_t info;
  char digest[TP_DIGEST_LEN + 1];
  tp_error_t err;
  int ret;
} img_job_t;

static void job_free(img_job_t *j) {
  free(j->a);
  free(j->b);
  free(j->want);
  free(j->want2);
  free(j);
}

static void job_work(void *data) {
  img_job_t *j = data;
  switch (j->kind) {
  case JOB_UNPACK:
    j->opts.want_digest = j->want;
    j->opts.want_diff_id = j->want2;
    j->ret = tp_layer_unpack(j->a, j->b, &j->opts, &j->info, &j->err);
    break;
  case JOB_BLOB:
    j->ret = tp_blob_put(j->a, j->b, j->want, j->max_bytes, j->digest, &j->err);
    break;
  case JOB_TAR:
    j->ret = tp_tar_dir(j->a, j->b, j->opts.uid_base, j->opts.gid_base, j->opts.id_count, &j->err);
    break;
  case JOB_VOLUME:
    j->ret = tp_linux_volume_make(j->a, (int64_t) j->max_bytes, &j->err);
    break;
  }
}

static void job_after(void *data, int status) {
  img_job_t *j = data;
  lua_State *L = j->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  if (status < 0 || j->ret < 0) {
    lua_pushnil(L);
    lua_pushstring(L, status < 0 ? uv_strerror(status) : j->err.msg);
  } else if (j->kind == JOB_UNPACK) {
    lua_createtable(L, 0, 6);
    lua_pushstring(L, j->info.digest);
    lua_setfield(L, -2, "digest");
    lua_pushstring(L, j->info.diff_id);
    lua_setfield(L, -2, "diff_id");
    lua_pushinteger(L, (lua_Integer) j->info.tar_bytes);
    lua_setfield(L, -2, "tar_bytes");
    lua_pushinteger(L, (lua_Integer) j->info.bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, (lua_Integer) j->info.entries);
    lua_setfield(L, -2, "entries");
    lua_pushboolean(L, j->info.existed);
    lua_setfield(L, -2, "existed");
    lua_pushnil(L);
  } else if (j->kind == JOB_BLOB) {
    lua_pushstring(L, j->digest);
    lua_pushnil(L);
  } else {
    lua_pushboolean(L, 1);
    lua_pushnil(L);
  }
  job_free(j);
  tp_lua_pcall(L, 2, 0, 0);
}

/* Queues j; the callback is at stack index cb.  Returns 1 (true) or 2 (nil,
 * msg) values pushed. */
static int job_queue(lua_State *L, img_job_t *j, int cb) {
  int r;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  j->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_pushvalue(L, cb);
  j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  r = tp_job_queue_long(luv_loop(L), job_work, job_after, j);
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

static char *dup_opt(lua_State *L, int idx) {
  const char *s = luaL_optstring(L, idx, NULL);
  return s ? strdup(s) : NULL;
}

static uint64_t field_u64(lua_State *L, const char *k, uint64_t dflt) {
  lua_Integer v;
  lua_getfield(L, 1, k);
  v = luaL_optinteger(L, -1, (lua_Integer) dflt);
  lua_pop(L, 1);
  if (v < 0)
    luaL_error(L, "layer_unpack: %s must not be negative", k);
  return (uint64_t) v;
}

static char *field_str(lua_State *L, const char *k, int required) {
  const char *s;
  lua_getfield(L, 1, k);
  s = required ? luaL_checkstring(L, -1) : luaL_optstring(L, -1, NULL);
  lua_pop(L, 1);
  return s ? strdup(s) : NULL;
}

static int l_layer_unpack(lua_State *L) {
  img_job_t *j;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_getfield(L, 1, "blob");
  luaL_checkstring(L, -1);
  lua_getfield(L, 1, "dir");
  luaL_checkstring(L, -1);
  lua_pop(L, 2);
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->kind = JOB_UNPACK;
  j->opts.uid_base = (uid_t) field_u64(L, "uid_base", 0);
  j->opts.gid_base = (gid_t) field_u64(L, "gid_base", j->opts.uid_base);
  j->opts.id_count = (uint32_t) field_u64(L, "id_count", 65536);
  j->opts.max_tar_bytes = field_u64(L, "max_tar_bytes", (uint64_t) 16 << 30);
  j->opts.max_bytes = field_u64(L, "max_bytes", (uint64_t) 16 << 30);
  j->opts.max_entries = field_u64(L, "max_entries", 1000000);
  j->a = field_str(L, "blob", 1);
  j->b = field_str(L, "dir", 1);
  j->want = field_str(L, "digest", 0);
  j->want2 = field_str(L, "diff_id", 0);
  if (j->a == NULL || j->b == NULL) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  return job_queue(L, j, 2);
}

static int l_blob_put(lua_State *L) {
  img_job_t *j;
  luaL_checkstring(L, 1);
  luaL_optstring(L, 2, NULL);
  luaL_optstring(L, 3, NULL);
  lua_Integer max = luaL_checkinteger(L, 4);
  luaL_checktype(L, 5, LUA_TFUNCTION);
  if (max < 0)
    return luaL_error(L, "blob_put: max_bytes must not be negative");
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->kind = JOB_BLOB;
  j->a = strdup(lua_tostring(L, 1));
  j->b = dup_opt(L, 2);
  j->want = dup_opt(L, 3);
  j->max_bytes = (uint64_t) max;
  if (j->a == NULL) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  return job_queue(L, j, 5);
}

static int l_tar_dir(lua_State *L) {
  img_job_t *j;
  lua_Integer ub, gb, n;
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  ub = luaL_checkinteger(L, 3);
  gb = luaL_checkinteger(L, 4);
  n = luaL_checkinteger(L, 5);
  luaL_checktype(L, 6, LUA_TFUNCTION);
  if (ub < 0 || gb < 0 || n < 0 || ub > UINT32_MAX || gb > UINT32_MAX || n > UINT32_MAX)
    return luaL_error(L, "tar_dir: bad id range");
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->kind = JOB_TAR;
  j->opts.uid_base = (uid_t) ub;
  j->opts.gid_base = (gid_t) gb;
  j->opts.id_count = (uint32_t) n;
  j->a = strdup(lua_tostring(L, 1));
  j->b = strdup(lua_tostring(L, 2));
  if (j->a == NULL || j->b == NULL) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  return job_queue(L, j, 6);
}

/* core.volume_make(path, bytes, cb(true | nil, msg)): a volume's ext4
 * image (tp_linux_volume_make), made in the thread pool (mkfs runs). */
static int l_volume_make(lua_State *L) {
  img_job_t *j;
  lua_Integer n;
  luaL_checkstring(L, 1);
  n = luaL_checkinteger(L, 2);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (n <= 0)
    return luaL_error(L, "volume_make: bad size");
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->kind = JOB_VOLUME;
  j->max_bytes = (uint64_t) n;
  j->a = strdup(lua_tostring(L, 1));
  if (j->a == NULL) {
    job_free(j);
    return luaL_error(L, "out of memory");
  }
  return job_queue(L, j, 3);
}

static int l_digest_valid(lua_State *L) {
  lua_pushboolean(L, lua_type(L, 1) == LUA_TSTRING && tp_digest_valid(lua_tostring(L, 1)));
  return 1;
}

void tp_l_image_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"layer_unpack", l_layer_unpack},
                                   {"blob_put", l_blob_put},
                                   {"tar_dir", l_tar_dir},
                                   {"volume_make", l_volume_make},
                                   {"digest_valid", l_digest_valid},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
