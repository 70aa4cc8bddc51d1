/* tupper.core's HTTP binding for the registry client
 * (lua/tupper/registry.lua).  Each fetch runs on the loop's worker threads so the
 * daemon keeps serving while a layer downloads; its callback runs on the
 * loop.  Arguments are checked before any C resource is taken (STYLE 12). */
#include <errno.h>
#include <lauxlib.h>
#include <luv/luv.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "job.h"
#include "l_core.h"
#include "tupper.h"
#include "utils.h"

#define TP_HTTP_JOB_MT "tupper.http_job"

typedef struct tp_ljob_s {
  lua_State *L;            /* main thread */
  int ref_cb, ref_self;
  tp_http_spec_t spec;
  char *url, *file, *ca_file;
  char *headers[TP_HTTP_REQ_HEADERS_MAX];
  tp_http_result_t res;
  tp_error_t err;
  int ret;
  int done;                /* the after callback ran */
} tp_ljob_t;

static const char *const tp__kind_names[] = {
    [TP_HTTP_OK] = "ok",           [TP_HTTP_ENET] = "network",  [TP_HTTP_ETOOBIG] = "too_big",
    [TP_HTTP_EREDIRECT] = "redirect", [TP_HTTP_ECANCEL] = "cancelled", [TP_HTTP_EIO] = "io",
    [TP_HTTP_EPROTO] = "protocol",
};

static void tp__ljob_free(tp_ljob_t *j) {
  free(j->url);
  free(j->file);
  free(j->ca_file);
  for (int i = 0; i < TP_HTTP_REQ_HEADERS_MAX; i++)
    free(j->headers[i]);
  tp_http_result_free(&j->res);
  free(j);
}

static void tp__http_work(void *data) {
  tp_ljob_t *j = data;
  j->ret = tp_http_fetch(&j->spec, &j->res, &j->err);
}

static void tp__setstr(lua_State *L, const char *k, const char *v) {
  if (v == NULL)
    return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

static void tp__http_after(void *data, int status) {
  tp_ljob_t *j = data;
  lua_State *L = j->L;
  tp_http_result_t *r = &j->res;
  j->done = 1;
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  j->ref_cb = LUA_NOREF;
  if (j->ret < 0 || status < 0) {
    lua_pushnil(L);
    lua_pushstring(L, status < 0 ? uv_strerror(status) : j->err.msg);
    lua_pushstring(L, tp__kind_names[status < 0 ? TP_HTTP_ECANCEL : r->kind]);
  } else {
    lua_createtable(L, 0, 12);
    lua_pushinteger(L, r->status);
    lua_setfield(L, -2, "status");
    lua_createtable(L, 0, 5);
    tp__setstr(L, "content-type", r->content_type);
    tp__setstr(L, "www-authenticate", r->www_authenticate);
    tp__setstr(L, "docker-content-digest", r->docker_digest);
    tp__setstr(L, "location", r->location);
    tp__setstr(L, "content-range", r->content_range);
    lua_setfield(L, -2, "headers");
    tp__setstr(L, "url", r->effective_url);
    if (r->body != NULL) {
      lua_pushlstring(L, r->body, r->body_len);
      lua_setfield(L, -2, "body");
    }
    if (r->sha256[0] != '\0') {
      tp__setstr(L, "sha256", r->sha256);
      lua_pushinteger(L, r->size);
      lua_setfield(L, -2, "size");
    }
    lua_pushnil(L);
    lua_pushnil(L);
  }
  /* the userdata may go now: its __gc frees the job */
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_self);
  j->ref_self = LUA_NOREF;
  tp_lua_pcall(L, 3, 0, 0);
}

static tp_ljob_t *tp__check_job(lua_State *L) {
  tp_ljob_t **pj = luaL_checkudata(L, 1, TP_HTTP_JOB_MT);
  if (*pj == NULL)
    luaL_error(L, "http job already freed");
  return *pj;
}

static int tp_ljob_progress(lua_State *L) {
  tp_ljob_t *j = tp__check_job(L);
  lua_pushinteger(L, (lua_Integer) atomic_load(&j->res.progress));
  return 1;
}

static int tp_ljob_cancel(lua_State *L) {
  tp_ljob_t *j = tp__check_job(L);
  atomic_store(&j->res.cancel, 1);
  return 0;
}

static int tp_ljob_gc(lua_State *L) {
  tp_ljob_t **pj = luaL_checkudata(L, 1, TP_HTTP_JOB_MT);
  /* a job in flight holds a reference to its userdata: __gc only runs
   * after the after callback, or when the loop never ran it (state close) */
  if (*pj != NULL && (*pj)->done)
    tp__ljob_free(*pj);
  else if (*pj != NULL)
    atomic_store(&(*pj)->res.cancel, 1); /* leaked to the worker, which ends soon */
  *pj = NULL;
  return 0;
}

static long tp__opt_long(lua_State *L, const char *k, long def, long min, long max) {
  lua_Integer v;
  lua_getfield(L, 1, k);
  v = luaL_optinteger(L, -1, def);
  lua_pop(L, 1);
  if (v < min || v > max)
    luaL_error(L, "http_get: %s must be in %ld..%ld", k, min, max);
  return (long) v;
}

static char *tp__opt_dup(lua_State *L, const char *k, int *oom) {
  const char *v;
  char *d = NULL;
  lua_getfield(L, 1, k);
  v = luaL_optstring(L, -1, NULL);
  if (v != NULL && (d = strdup(v)) == NULL)
    *oom = 1;
  lua_pop(L, 1);
  return d;
}

/* core.http_get({ url=, headers={ "K: v", ... }, max_bytes=, file=, offset=,
 *                 exact=, allow_http=, ca_file=, connect_timeout=, timeout=,
 *                 low_speed_time=, low_speed_limit=, max_redirects= }, cb)
 *   -> job (job:progress(), job:cancel())
 * cb(res | nil, msg, kind): res = { status=, headers={ [lowercase name]=v },
 * url=, body= (memory mode or an error answer), sha256=, size= (file mode) }.
 * kind: network, too_big, redirect, cancelled, io, protocol. */
static int tp_lcore_http_get(lua_State *L) {
  tp_ljob_t *j, **pj;
  int oom = 0, nh = 0, r;
  lua_Integer max_bytes, offset;
  long cto, to, lst, lsl, redirs;

  static int inited; /* libcurl's set-up, on the loop's thread, at first use:
                        the CLI's other verbs never pay for it */
  tp_error_t err = {0};

  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (!inited) {
    if (tp_http_global_init(&err) < 0)
      return luaL_error(L, "%s", err.msg);
    inited = 1;
  }
  lua_getfield(L, 1, "url");
  luaL_checkstring(L, -1);
  lua_getfield(L, 1, "max_bytes");
  max_bytes = luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "offset");
  offset = luaL_optinteger(L, -1, 0);
  lua_getfield(L, 1, "file");
  luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "ca_file");
  luaL_optstring(L, -1, NULL);
  lua_settop(L, 2);
  if (max_bytes < 0 || offset < 0)
    return luaL_error(L, "http_get: max_bytes and offset must be >= 0");
  cto = tp__opt_long(L, "connect_timeout", 30, 1, 3600);
  to = tp__opt_long(L, "timeout", 0, 0, 86400);
  lst = tp__opt_long(L, "low_speed_time", 30, 1, 3600);
  lsl = tp__opt_long(L, "low_speed_limit", 1024, 1, 1L << 30);
  redirs = tp__opt_long(L, "max_redirects", 3, 0, 10);
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) {
    nh = (int) luaL_len(L, -1);
    if (nh > TP_HTTP_REQ_HEADERS_MAX)
      return luaL_error(L, "http_get: at most %d headers", TP_HTTP_REQ_HEADERS_MAX);
    for (int i = 1; i <= nh; i++) {
      const char *h;
      lua_rawgeti(L, -1, i);
      h = luaL_checkstring(L, -1);
      if (strpbrk(h, "\r\n") != NULL)
        return luaL_error(L, "http_get: a header with a line break");
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    return luaL_error(L, "http_get: headers must be a list");
  }
  lua_settop(L, 2);

  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->ref_cb = j->ref_self = LUA_NOREF;
  j->url = tp__opt_dup(L, "url", &oom);
  j->file = tp__opt_dup(L, "file", &oom);
  j->ca_file = tp__opt_dup(L, "ca_file", &oom);
  lua_getfield(L, 1, "headers");
  for (int i = 0; i < nh; i++) {
    lua_rawgeti(L, -1, i + 1);
    if ((j->headers[i] = strdup(lua_tostring(L, -1))) == NULL)
      oom = 1;
    j->spec.headers[i] = j->headers[i];
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (oom) {
    tp__ljob_free(j);
    return luaL_error(L, "out of memory");
  }
  lua_getfield(L, 1, "exact");
  j->spec.exact = lua_toboolean(L, -1);
  lua_getfield(L, 1, "allow_http");
  j->spec.allow_http = lua_toboolean(L, -1);
  lua_settop(L, 2);
  j->spec.url = j->url;
  j->spec.file = j->file;
  j->spec.ca_file = j->ca_file;
  j->spec.max_bytes = max_bytes;
  j->spec.offset = offset;
  j->spec.connect_timeout = cto;
  j->spec.timeout = to;
  j->spec.low_speed_time = lst;
  j->spec.low_speed_limit = lsl;
  j->spec.max_redirects = redirs;

  pj = lua_newuserdatauv(L, sizeof(*pj), 0);
  *pj = j;
  luaL_setmetatable(L, TP_HTTP_JOB_MT);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  j->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  r = tp_job_queue_long(luv_loop(L), tp__http_work, tp__http_after, j);
  if (r < 0) {
    j->done = 1; /* __gc frees it */
    lua_pushnil(L);
    lua_pushfstring(L, "http: %s", uv_strerror(r));
    return 2;
  }
  lua_pushvalue(L, 2);
  j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  j->ref_self = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

void tp_l_http_register(lua_State *L) {
  static const luaL_Reg job_methods[] = {
      {"progress", tp_ljob_progress}, {"cancel", tp_ljob_cancel}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"http_get", tp_lcore_http_get},
                                   {NULL, NULL}};
  if (luaL_newmetatable(L, TP_HTTP_JOB_MT)) {
    luaL_newlib(L, job_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, tp_ljob_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0); /* into the module table on the stack top */
}
