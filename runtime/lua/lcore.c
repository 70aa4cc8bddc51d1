/* tupper.core: the C functions the Lua side calls.
 *
 * A box is a running sandbox of the linux backend seen from Lua: start it,
 * receive its agent's frames as Lua tables, send requests, destroy it.  The
 * frame bytes never reach Lua: C reassembles, bounds and validates them
 * (frame.c) and hands over decoded fields.  Bindings check every argument
 * before they take a C resource (STYLE 12). */
#include <errno.h>
#include <lauxlib.h>
#include <luv/luv.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base64.h"
#include "sha256.h"
#include "cgroup.h"
#include "nspid.h"
#include "tp_seccomp.h"
#include "embed.h"
#include "error.h"
#include "frame.h"
#include "ledit.h"
#include "image.h"
#include "linux.h"
#include "rmtree.h"
#include "microvm.h"
#include "tupper.h"
#include "utils.h"

#define TP_BOX_MT "tupper.box"
#define TP_CTX_KEY "tupper.core.ctx"

/* ---------------------------------------------------------------- helpers */

static int tp__push_err(lua_State *L, const tp_error_t *err) {
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushinteger(L, err->code);
  return 3;
}

/* Field names as Lua sees them; repeated tags become arrays. */
static const char *const tp__tag_names[TP_TAG_MAX_] = {
    [TP_TAG_VERSION] = "version", [TP_TAG_PID] = "pid",       [TP_TAG_STREAM] = "stream",
    [TP_TAG_DATA] = "data",       [TP_TAG_CODE] = "code",     [TP_TAG_SIGNAL] = "signal",
    [TP_TAG_ERRNO] = "errno",     [TP_TAG_MSG] = "msg",       [TP_TAG_ARG] = "args",
    [TP_TAG_ENV] = "env",         [TP_TAG_CWD] = "cwd",       [TP_TAG_FLAGS] = "flags",
    [TP_TAG_PATH] = "path",       [TP_TAG_PATH2] = "path2",   [TP_TAG_OFFSET] = "offset",
    [TP_TAG_LENGTH] = "length",   [TP_TAG_SIZE] = "size",     [TP_TAG_MODE] = "mode",
    [TP_TAG_MTIME] = "mtime",     [TP_TAG_UID] = "uid",       [TP_TAG_GID] = "gid",
    [TP_TAG_TYPE] = "type",       [TP_TAG_NAME] = "name",     [TP_TAG_LINK] = "link",
    [TP_TAG_ENTRY] = "entries",   [TP_TAG_CREATED] = "created", [TP_TAG_COLS] = "cols",
    [TP_TAG_ROWS] = "rows",       [TP_TAG_WATCH] = "watch",   [TP_TAG_EVENT] = "event",
    [TP_TAG_SID] = "sid",         [TP_TAG_KIND] = "kind",     [TP_TAG_PORT] = "port",
    [TP_TAG_GRACE] = "grace",
    [TP_TAG_GROUPS] = "groups",
    [TP_TAG_PIDS] = "pids",
};

static int tp__tag_repeated(unsigned tag) {
  return tag == TP_TAG_ARG || tag == TP_TAG_ENV || tag == TP_TAG_ENTRY;
}

/* Pushes a table for fields[0..n).  nested: 1 inside an ENTRY.  Returns -1
 * (nothing pushed) for a hostile payload: a duplicated single field, an
 * ENTRY inside an ENTRY, a nested group that does not parse. */
/* `seen` below holds one bit per tag */
_Static_assert(TP_TAG_MAX_ <= 64, "tags must fit the uint64_t of tp__push_fields");

static int tp__push_fields(lua_State *L, const tp_field_t *fs, int n, int nested,
                           tp_field_t *scratch, int scratch_max) {
  uint64_t seen = 0;
  lua_createtable(L, 0, n < 8 ? n : 8);
  for (int i = 0; i < n; i++) {
    const tp_field_t *f = &fs[i];
    const char *name = tp__tag_names[f->tag];
    if (!tp__tag_repeated(f->tag)) {
      if (seen & (UINT64_C(1) << f->tag))
        goto bad;
      seen |= UINT64_C(1) << f->tag;
    }
    switch (tp_tag_kind(f->tag)) {
    case TP_KIND_INT: {
      int64_t v;
      tp_field_int(f, &v);
      lua_pushinteger(L, (lua_Integer) v);
      lua_setfield(L, -2, name);
      break;
    }
    case TP_KIND_STR:
    case TP_KIND_BYTES:
      if (tp__tag_repeated(f->tag)) {
        if (lua_getfield(L, -1, name) != LUA_TTABLE) {
          lua_pop(L, 1);
          lua_newtable(L);
          lua_pushvalue(L, -1);
          lua_setfield(L, -3, name);
        }
        lua_pushlstring(L, (const char *) f->val, f->len);
        lua_rawseti(L, -2, (lua_Integer) luaL_len(L, -2) + 1);
        lua_pop(L, 1);
      } else {
        lua_pushlstring(L, (const char *) f->val, f->len);
        lua_setfield(L, -2, name);
      }
      break;
    case TP_KIND_NESTED: {
      int m;
      if (nested)
        goto bad;
      m = tp_fields_parse(f->val, f->len, scratch, scratch_max);
      if (m < 0)
        goto bad;
      if (lua_getfield(L, -1, name) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name);
      }
      if (tp__push_fields(L, scratch, m, 1, NULL, 0) < 0) {
        lua_pop(L, 1);
        goto bad;
      }
      lua_rawseti(L, -2, (lua_Integer) luaL_len(L, -2) + 1);
      lua_pop(L, 1);
      break;
    }
    default:
      goto bad;
    }
  }
  return 0;
bad:
  lua_pop(L, 1);
  return -1;
}

/* ------------------------------------------------------------------ boxes */

#define TP__LBOX_PATH_MAX 4096

typedef struct tp_lbox_s {
  lua_State *L;         /* main thread */
  tp_box_t box;
  char *dir;
  uv_pipe_t chan;
  uv_poll_t exitp;
  uv_work_t work;
  int open_handles;     /* initialised handles whose close callback is pending */
  int work_pending;
  int started;          /* on() called: handles exist */
  int down;             /* on_down delivered */
  int destroyed;        /* destroy() or __gc ran */
  int ud_dead;          /* the Lua userdata is gone: never call into Lua */
  int ref_frame, ref_down, ref_destroy;
  uint8_t *rbuf;
  size_t rlen, rcap;
  tp_field_t *fields;   /* TP_FIELDS_MAX, then as many for nested groups */
  tp_error_t werr;
  int wret;
  int has_cg;           /* cg is a live box cgroup */
  tp_cgroup_t cg;
  struct tp_lsub_s *subs; /* process trees, each in a sub cgroup */
  char *keep_upper;     /* destroy: move <dir>/upper here before removing dir */
  int vm;               /* a microVM: pid is QEMU's, cg holds QEMU, not the guest's processes */
} tp_lbox_t;

/* One process tree of a box: a sub cgroup named after its first pid. */
typedef struct tp_lsub_s {
  struct tp_lsub_s *next;
  char name[32];
  tp_cgroup_t cg;
} tp_lsub_t;

typedef struct tp_core_ctx_s {
  int agent_fd;
  int has_cgroups;
  tp_cgroup_root_t cgroot;
  int has_seccomp;
  struct sock_fprog seccomp; /* built once, loaded into every box */
} tp_core_ctx_t;

/* Removes the box's cgroups (after its processes are dead). */
static void tp__lbox_drop_cgroups(tp_lbox_t *b, tp_error_t *err) {
  while (b->subs != NULL) {
    tp_lsub_t *s = b->subs;
    b->subs = s->next;
    tp_cgroup_destroy(&s->cg, err);
    tp_cgroup_free(&s->cg);
    free(s);
  }
  if (b->has_cg) {
    if (tp_cgroup_destroy(&b->cg, err) < 0)
      tp_cgroup_free(&b->cg);
    b->has_cg = 0;
  }
}

static void tp__lbox_maybe_free(tp_lbox_t *b) {
  if (b->open_handles > 0 || b->work_pending || !b->ud_dead)
    return;
  free(b->rbuf);
  free(b->fields);
  free(b->dir);
  free(b->keep_upper);
  free(b);
}

static void tp__lbox_close_cb(uv_handle_t *h) {
  tp_lbox_t *b = h->data;
  b->open_handles--;
  tp__lbox_maybe_free(b);
}

static void tp__lbox_unref(tp_lbox_t *b) {
  if (b->L == NULL)
    return;
  luaL_unref(b->L, LUA_REGISTRYINDEX, b->ref_frame);
  luaL_unref(b->L, LUA_REGISTRYINDEX, b->ref_down);
  b->ref_frame = b->ref_down = LUA_NOREF;
}

static void tp__lbox_stop(tp_lbox_t *b) {
  if (!b->started)
    return;
  b->started = 0;
  uv_read_stop((uv_stream_t *) &b->chan);
  uv_close((uv_handle_t *) &b->chan, tp__lbox_close_cb); /* closes chan_fd */
  b->box.chan_fd = -1;
  uv_close((uv_handle_t *) &b->exitp, tp__lbox_close_cb);
  /* uv_poll made the pidfd non-blocking; destroy waits on it */
  int fl = fcntl(b->box.pidfd, F_GETFL);
  if (fl >= 0)
    fcntl(b->box.pidfd, F_SETFL, fl & ~O_NONBLOCK);
}

/* The box is unusable from now on: tell Lua once. */
static void tp__lbox_down(tp_lbox_t *b, const char *reason) {
  if (b->down)
    return;
  b->down = 1;
  if (b->started) {
    uv_read_stop((uv_stream_t *) &b->chan);
    uv_poll_stop(&b->exitp);
  }
  if (b->ud_dead || b->ref_down == LUA_NOREF)
    return;
  lua_rawgeti(b->L, LUA_REGISTRYINDEX, b->ref_down);
  lua_pushstring(b->L, reason);
  tp_lua_pcall(b->L, 1, 0, 0);
}

static void tp__lbox_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tp_lbox_t *b = h->data;
  size_t max = TP_FRAME_HDR + TP_FRAME_MAX;
  (void) suggested;
  if (b->rcap - b->rlen < 65536 && b->rcap < max) {
    size_t cap = b->rcap ? b->rcap * 2 : 131072;
    if (cap > max)
      cap = max;
    uint8_t *p = realloc(b->rbuf, cap);
    if (p != NULL) {
      b->rbuf = p;
      b->rcap = cap;
    }
  }
  buf->base = (char *) b->rbuf + b->rlen;
  buf->len = b->rcap - b->rlen;
}

/* Delivers every complete frame in rbuf; returns -1 on a protocol error. */
static int tp__lbox_dispatch(tp_lbox_t *b) {
  size_t off = 0;
  int ret = 0;
  while (!b->down && !b->destroyed) {
    tp_frame_t f;
    long n = tp_frame_parse_header(b->rbuf + off, b->rlen - off, &f);
    if (n == 0)
      break;
    /* from the agent: events, replies and network stream frames only */
    if (n < 0 || (f.type >= TP_MSG_EXEC && !tp_msg_net_stream(f.type) && f.type != TP_MSG_WATCH_EVENT)) {
      ret = -1;
      break;
    }
    int m = tp_fields_parse(f.payload, f.len, b->fields, TP_FIELDS_MAX);
    if (m < 0) {
      ret = -1;
      break;
    }
    lua_State *L = b->L;
    if (!b->ud_dead && b->ref_frame != LUA_NOREF) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, b->ref_frame);
      lua_pushinteger(L, f.type);
      lua_pushinteger(L, (lua_Integer) f.id);
      if (tp__push_fields(L, b->fields, m, 0, b->fields + TP_FIELDS_MAX, TP_FIELDS_MAX) < 0) {
        lua_pop(L, 3);
        ret = -1;
        break;
      }
      off += (size_t) n; /* consumed before the call: it may destroy the box */
      tp_lua_pcall(L, 3, 0, 0);
      continue;
    }
    off += (size_t) n;
  }
  if (b->rbuf != NULL && off > 0) {
    memmove(b->rbuf, b->rbuf + off, b->rlen - off);
    b->rlen -= off;
  }
  return ret;
}

static void tp__lbox_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  tp_lbox_t *b = s->data;
  (void) buf;
  if (nread < 0) {
    tp__lbox_down(b, nread == UV_EOF ? "agent channel closed" : uv_strerror((int) nread));
    return;
  }
  b->rlen += (size_t) nread;
  if (tp__lbox_dispatch(b) < 0)
    tp__lbox_down(b, "agent protocol error: malformed frame");
}

static void tp__lbox_exit_cb(uv_poll_t *p, int status, int events) {
  tp_lbox_t *b = p->data;
  (void) status;
  (void) events;
  tp__lbox_down(b, "box init exited");
}

static tp_lbox_t *tp__check_box(lua_State *L) {
  tp_lbox_t **pb = luaL_checkudata(L, 1, TP_BOX_MT);
  if (*pb == NULL)
    luaL_error(L, "box is gone");
  return *pb;
}

static tp_core_ctx_t *tp__ctx(lua_State *L) {
  tp_core_ctx_t *c;
  lua_getfield(L, LUA_REGISTRYINDEX, TP_CTX_KEY);
  c = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return c;
}

static int64_t tp__opt_int(lua_State *L, int t, const char *k) {
  int64_t v;
  lua_getfield(L, t, k);
  v = (int64_t) luaL_optinteger(L, -1, 0);
  lua_pop(L, 1);
  return v;
}

/* A box start in flight: everything the worker thread needs, owned. */
typedef struct tp_start_job_s {
  uv_work_t work;
  lua_State *L;          /* main thread */
  int ref_cb;
  tp_core_ctx_t *ctx;
  tp_box_spec_t spec;
  tp_cgroup_limits_t lim;
  char *id, *dir, *cgname;
  char *layers[TP_LAYERS_MAX + 1]; /* NULL-terminated, lowest first */
  char procs[TP_CG_NCTRL][4200];
  const char *procs_list[TP_CG_NCTRL + 1];
  tp_lbox_t *b;
  tp_error_t err;
  int ret;
  int vm;                /* a microVM (core.vm_start): vm_spec instead of spec */
  tp_vm_spec_t vm_spec;
  char **argv;
  int *pass;
} tp_start_job_t;

static void tp__job_free(tp_start_job_t *j) {
  for (char **a = j->argv; a != NULL && *a != NULL; a++)
    free(*a);
  free(j->argv);
  free(j->pass);
  free(j->id);
  for (int i = 0; j->layers[i] != NULL; i++)
    free(j->layers[i]);
  free(j->dir);
  free(j->cgname);
  free(j);
}

/* In the thread pool: the box's cgroup, then the box (the clone blocks its
 * thread until the child execs: never the loop's). */
static void tp__start_work(uv_work_t *req) {
  tp_start_job_t *j = req->data;
  tp_lbox_t *b = j->b;
  int n = 0;
  j->ret = -1;
  if (j->ctx->has_cgroups) {
    if (tp_cgroup_create(&j->ctx->cgroot, j->cgname, &j->lim, &b->cg, &j->err) < 0)
      return;
    b->has_cg = 1;
    for (int c = 0; c < TP_CG_NCTRL; c++) {
      const char *dir = b->cg.version == 2 ? (c == 0 ? b->cg.path_v2 : NULL) : b->cg.path_v1[c];
      int dup = 0;
      if (dir == NULL)
        continue;
      for (int k = 0; k < c; k++)
        if (b->cg.version == 1 && b->cg.path_v1[k] != NULL && strcmp(b->cg.path_v1[k], dir) == 0)
          dup = 1;
      if (dup)
        continue;
      snprintf(j->procs[n], sizeof(j->procs[n]), "%s/cgroup.procs", dir);
      j->procs_list[n] = j->procs[n];
      n++;
    }
    j->procs_list[n] = NULL;
    j->spec.cgroup_procs = j->procs_list;
  }
  if (j->vm) {
    j->vm_spec.cgroup_procs = j->spec.cgroup_procs;
    j->ret = tp_microvm_start(&j->vm_spec, &b->box, &j->err);
  } else {
    j->ret = tp_linux_box_start(&j->spec, &b->box, &j->err);
  }
  if (j->ret == 0 && !j->vm) {
    /* the OOM killer should take a process of the box, never its agent;
     * without CAP_SYS_RESOURCE (EACCES) the agent, being tiny, is rarely
     * its pick anyway */
    tp_error_t oerr = {0};
    tp_oom_protect(b->box.pid, &oerr);
  }
  if (j->ret < 0 && b->has_cg) {
    tp_error_t e2 = {0};
    if (tp_cgroup_destroy(&b->cg, &e2) < 0)
      tp_cgroup_free(&b->cg);
    b->has_cg = 0;
  }
}

static void tp__start_after(uv_work_t *req, int status) {
  tp_start_job_t *j = req->data;
  lua_State *L = j->L;
  tp_lbox_t *b = j->b;
  if (status < 0 && j->ret == 0) {
    /* the work never ran (UV_ECANCELED): nothing was started */
    j->ret = tp_error_set(&j->err, ECANCELED, "start: %s", uv_strerror(status));
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  if (j->ret < 0) {
    free(b->fields);
    free(b->dir);
    free(b);
    lua_pushnil(L);
    lua_pushstring(L, j->err.msg);
    lua_pushinteger(L, j->err.code);
  } else {
    tp_lbox_t **pb = lua_newuserdatauv(L, sizeof(*pb), 0);
    *pb = b;
    luaL_setmetatable(L, TP_BOX_MT);
    b->L = L;
    lua_pushnil(L);
    lua_pushnil(L);
  }
  tp__job_free(j);
  tp_lua_pcall(L, 3, 0, 0);
}

/* Queues start job j (box or VM) with the callback at stack index 2; on
 * failure frees j and its box.  Returns what the Lua function returns:
 * true, or nil and "<what>: <error>". */
static int tp__job_queue(lua_State *L, tp_start_job_t *j, const char *what) {
  int r;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  j->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_pushvalue(L, 2);
  j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  j->work.data = j;
  r = uv_queue_work(luv_loop(L), &j->work, tp__start_work, tp__start_after);
  if (r < 0) {
    luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
    free(j->b->fields);
    free(j->b->dir);
    free(j->b);
    tp__job_free(j);
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", what, uv_strerror(r));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static char *tp__field_dup(lua_State *L, const char *k, int required) {
  const char *v;
  lua_getfield(L, 1, k);
  v = required ? luaL_checkstring(L, -1) : luaL_optstring(L, -1, NULL);
  lua_pop(L, 1);
  return v ? strdup(v) : NULL;
}

/* core.box_start({ id=, layers = { dir, ... } (lowest first), dir=, uid_base=, gid_base=, id_count=, cgroup=,
 *                  limits = { memory=, pids=, cpu_quota=, cpu_period=, disk= } },
 *                cb(box | nil, msg, code))
 * Starts a box in the thread pool; cb runs on the loop when it is up (or
 * failed).  cgroup names the box's cgroup (default: id); the daemon prefixes
 * it with a tag of its state dir so that two daemons never touch each
 * other's.  With cgroups (core.cgroup_init), the box gets tupper/<cgroup>
 * carrying the limits; its PID 1 joins it before anything of the box runs. */
static int tp_lcore_box_start(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  tp_cgroup_limits_t lim = {0};
  uid_t uid_base;
  gid_t gid_base;
  uint32_t id_count;
  int64_t disk = 0;
  tp_start_job_t *j;
  int n_layers, layers_ok = 1;

  /* every argument is checked before a C resource is taken */
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_getfield(L, 1, "id");
  luaL_checkstring(L, -1);
  if (lua_getfield(L, 1, "layers") != LUA_TTABLE)
    return luaL_error(L, "box_start: layers must be a list of dirs");
  n_layers = (int) luaL_len(L, -1);
  if (n_layers < 1 || n_layers > TP_LAYERS_MAX)
    return luaL_error(L, "box_start: 1 to %d layers, not %d", TP_LAYERS_MAX, n_layers);
  for (int i = 1; i <= n_layers; i++) {
    if (lua_geti(L, -1, i) != LUA_TSTRING)
      return luaL_error(L, "box_start: layer %d is not a string", i);
    lua_pop(L, 1);
  }
  lua_getfield(L, 1, "dir");
  luaL_checkstring(L, -1);
  lua_getfield(L, 1, "uid_base");
  uid_base = (uid_t) luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "gid_base");
  gid_base = (gid_t) luaL_optinteger(L, -1, uid_base);
  lua_getfield(L, 1, "id_count");
  id_count = (uint32_t) luaL_optinteger(L, -1, 65536);
  lua_getfield(L, 1, "cgroup");
  luaL_optstring(L, -1, NULL);
  lua_settop(L, 2);
  if (lua_getfield(L, 1, "limits") == LUA_TTABLE) {
    int t = lua_gettop(L);
    lim.memory = tp__opt_int(L, t, "memory");
    lim.pids = tp__opt_int(L, t, "pids");
    lim.cpu_quota = tp__opt_int(L, t, "cpu_quota");
    lim.cpu_period = tp__opt_int(L, t, "cpu_period");
    disk = tp__opt_int(L, t, "disk");
  }
  lua_settop(L, 2);
  if ((lim.memory || lim.pids || lim.cpu_quota) && !ctx->has_cgroups) {
    lua_pushnil(L);
    lua_pushstring(L, "limits need cgroups, and none are usable on this host");
    return 2;
  }
  /* once per daemon, on the loop: the agent's memfd and the seccomp filter */
  if (ctx->agent_fd < 0) {
    ctx->agent_fd = tp_agent_memfd(tp_blob_agent_start, TP_BLOB_SIZE(agent), &err);
    if (ctx->agent_fd < 0)
      return tp__push_err(L, &err);
  }
  if (!ctx->has_seccomp) {
    if (tp_seccomp_build(&ctx->seccomp, &err) < 0)
      return tp__push_err(L, &err); /* no box runs without its filter */
    ctx->has_seccomp = 1;
  }

  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->id = tp__field_dup(L, "id", 1);
  lua_getfield(L, 1, "layers");
  for (int i = 0; i < n_layers; i++) {
    lua_geti(L, -1, i + 1);
    j->layers[i] = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (j->layers[i] == NULL) {
      layers_ok = 0;
      break;
    }
  }
  lua_pop(L, 1);
  j->dir = tp__field_dup(L, "dir", 1);
  j->cgname = tp__field_dup(L, "cgroup", 0);
  if (j->cgname == NULL && j->id != NULL)
    j->cgname = strdup(j->id);
  j->b = calloc(1, sizeof(*j->b));
  if (j->id == NULL || !layers_ok || j->dir == NULL || j->cgname == NULL || j->b == NULL ||
      (j->b->dir = strdup(j->dir)) == NULL ||
      (j->b->fields = malloc(sizeof(tp_field_t) * TP_FIELDS_MAX * 2)) == NULL) {
    if (j->b != NULL) {
      free(j->b->dir);
      free(j->b);
    }
    tp__job_free(j);
    tp_error_set(&err, ENOMEM, "start box: out of memory");
    return tp__push_err(L, &err);
  }
  j->b->ref_frame = j->b->ref_down = j->b->ref_destroy = LUA_NOREF;
  j->b->box.pidfd = j->b->box.chan_fd = -1;
  j->ctx = ctx;
  j->lim = lim;
  j->spec.id = j->id;
  j->spec.layers = (const char *const *) j->layers;
  j->spec.box_dir = j->dir;
  j->spec.uid_base = uid_base;
  j->spec.gid_base = gid_base;
  j->spec.id_count = id_count;
  j->spec.disk_bytes = disk;
  j->spec.agent_fd = ctx->agent_fd;
  j->spec.seccomp = &ctx->seccomp;
  return tp__job_queue(L, j, "start box");
}

/* core.vm_start({ id=, dir=, argv = { "/usr/bin/qemu-system-x86_64", ... }, fds = { fd, ... },
 *                 uid=, gid=, cgroup=, console_fd=, die_with_parent=,
 *                 limits = { memory=, pids=, cpu_quota=, cpu_period= } }, cb(box | nil, msg, code))
 * Starts a microVM's QEMU in the thread pool (backends/microvm/microvm.h):
 * with cgroups, in tupper/<cgroup> carrying the limits; as uid:gid; fds
 * become QEMU's fds 4, 5, ... (the caller closes its own once cb ran); a
 * unix socket listening at <dir>/agent.sock is its fd 3, and the box's
 * channel a connection to it.  die_with_parent: QEMU gets a parent-death
 * signal (a VM that is never re-adopted).  The box behaves as box_start's,
 * and destroy kills QEMU and removes dir. */
static int tp_lcore_vm_start(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  tp_cgroup_limits_t lim = {0};
  tp_start_job_t *j;
  lua_Integer uid, gid, console_fd, argc, nfds;
  int die_with_parent;

  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_getfield(L, 1, "id");
  if (!tp_cgroup_valid_name(luaL_checkstring(L, -1)))
    return luaL_error(L, "vm_start: bad id");
  lua_getfield(L, 1, "dir");
  if (luaL_checkstring(L, -1)[0] != '/')
    return luaL_error(L, "vm_start: dir must be absolute");
  lua_getfield(L, 1, "die_with_parent");
  die_with_parent = lua_toboolean(L, -1);
  lua_getfield(L, 1, "cgroup");
  luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "uid");
  uid = luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "gid");
  gid = luaL_optinteger(L, -1, uid);
  lua_getfield(L, 1, "console_fd");
  console_fd = luaL_optinteger(L, -1, -1);
  if (uid <= 0 || uid > 0x7fffffff || gid <= 0 || gid > 0x7fffffff)
    return luaL_error(L, "vm_start: QEMU must run as an unprivileged uid and gid");
  if (console_fd < -1 || console_fd > 0x7fffffff)
    return luaL_error(L, "vm_start: bad console_fd");
  lua_getfield(L, 1, "fds");
  luaL_checktype(L, -1, LUA_TTABLE);
  nfds = (lua_Integer) luaL_len(L, -1);
  if (nfds > 64)
    return luaL_error(L, "vm_start: at most 64 fds");
  for (lua_Integer i = 1; i <= nfds; i++) {
    lua_rawgeti(L, -1, i);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > 0x7fffffff)
      return luaL_error(L, "vm_start: fds[%d] is not a file descriptor", (int) i);
    lua_pop(L, 1);
  }
  lua_getfield(L, 1, "argv");
  luaL_checktype(L, -1, LUA_TTABLE);
  argc = (lua_Integer) luaL_len(L, -1);
  if (argc < 1 || argc > 512)
    return luaL_error(L, "vm_start: argv must have 1 to 512 items");
  for (lua_Integer i = 1; i <= argc; i++) {
    lua_rawgeti(L, -1, i);
    if (lua_type(L, -1) != LUA_TSTRING)
      return luaL_error(L, "vm_start: argv[%d] is not a string", (int) i);
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  if (lua_getfield(L, 1, "limits") == LUA_TTABLE) {
    int t = lua_gettop(L);
    lim.memory = tp__opt_int(L, t, "memory");
    lim.pids = tp__opt_int(L, t, "pids");
    lim.cpu_quota = tp__opt_int(L, t, "cpu_quota");
    lim.cpu_period = tp__opt_int(L, t, "cpu_period");
  }
  lua_settop(L, 2);

  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "out of memory");
  j->argv = calloc((size_t) argc + 1, sizeof(char *));
  j->pass = calloc((size_t) nfds + 1, sizeof(int));
  j->vm = 1;
  j->id = tp__field_dup(L, "id", 1);
  j->dir = tp__field_dup(L, "dir", 1);
  j->cgname = tp__field_dup(L, "cgroup", 0);
  if (j->cgname == NULL && j->id != NULL)
    j->cgname = strdup(j->id);
  j->b = calloc(1, sizeof(*j->b));
  int oom = j->argv == NULL || j->pass == NULL || j->id == NULL || j->dir == NULL ||
            j->cgname == NULL || j->b == NULL;
  if (!oom) {
    lua_getfield(L, 1, "fds");
    for (lua_Integer i = 1; i <= nfds; i++) {
      lua_rawgeti(L, -1, i);
      j->pass[i - 1] = (int) lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    lua_settop(L, 2);
  }
  if (!oom) {
    lua_getfield(L, 1, "argv");
    for (lua_Integer i = 1; i <= argc && !oom; i++) {
      lua_rawgeti(L, -1, i);
      j->argv[i - 1] = strdup(lua_tostring(L, -1));
      oom = j->argv[i - 1] == NULL;
      lua_pop(L, 1);
    }
    lua_settop(L, 2);
  }
  if (oom || (j->b->dir = strdup(j->dir)) == NULL ||
      (j->b->fields = malloc(sizeof(tp_field_t) * TP_FIELDS_MAX * 2)) == NULL) {
    if (j->b != NULL) {
      free(j->b->dir);
      free(j->b);
    }
    tp__job_free(j);
    tp_error_set(&err, ENOMEM, "start VM: out of memory");
    return tp__push_err(L, &err);
  }
  j->b->ref_frame = j->b->ref_down = j->b->ref_destroy = LUA_NOREF;
  j->b->box.pidfd = j->b->box.chan_fd = -1;
  j->b->vm = 1;
  j->ctx = ctx;
  j->lim = lim;
  j->vm_spec.argv = (const char *const *) j->argv;
  j->vm_spec.pass_fds = j->pass;
  j->vm_spec.npass = (int) nfds;
  j->vm_spec.uid = (uid_t) uid;
  j->vm_spec.gid = (gid_t) gid;
  j->vm_spec.console_fd = (int) console_fd;
  j->vm_spec.dir = j->dir;
  j->vm_spec.die_with_parent = die_with_parent;
  return tp__job_queue(L, j, "start VM");
}

/* The cgroup.procs file of b's cgroup (the first controller's dir), into
 * buf; "" without cgroups. */
static void tp__lbox_procs_path(tp_lbox_t *b, char *buf, size_t cap) {
  buf[0] = '\0';
  if (!b->has_cg)
    return;
  for (int c = 0; c < TP_CG_NCTRL; c++) {
    const char *dir = b->cg.version == 2 ? (c == 0 ? b->cg.path_v2 : NULL) : b->cg.path_v1[c];
    if (dir != NULL) {
      snprintf(buf, cap, "%s/cgroup.procs", dir);
      return;
    }
  }
}

/* For box_adopt and vm_adopt: pushes an empty box userdata and returns it
 * with *pb set to a new box for dir whose cgroup cgname is re-opened; NULL
 * (and err, the userdata pushed but empty) on failure.  The caller clears
 * *pb until tp__adopt_done. */
static tp_lbox_t **tp__adopt_new(lua_State *L, tp_core_ctx_t *ctx, const char *dir,
                                 const char *cgname, const char *what, tp_error_t *err) {
  tp_lbox_t **pb = lua_newuserdatauv(L, sizeof(*pb), 0);
  tp_lbox_t *b;
  *pb = NULL;
  luaL_setmetatable(L, TP_BOX_MT);
  b = calloc(1, sizeof(*b));
  if (b == NULL || (b->dir = strdup(dir)) == NULL ||
      (b->fields = malloc(sizeof(tp_field_t) * TP_FIELDS_MAX * 2)) == NULL) {
    if (b != NULL) {
      free(b->dir);
      free(b);
    }
    tp_error_set(err, ENOMEM, "%s: out of memory", what);
    return NULL;
  }
  b->ref_frame = b->ref_down = b->ref_destroy = LUA_NOREF;
  b->box.pidfd = b->box.chan_fd = -1;
  if (ctx->has_cgroups) {
    if (tp_cgroup_open(&ctx->cgroot, cgname, &b->cg, err) < 0) {
      free(b->fields);
      free(b->dir);
      free(b);
      return NULL;
    }
    b->has_cg = 1;
  }
  *pb = b;
  return pb;
}

/* An adoption that failed after tp__adopt_new: frees b, returns nil, err. */
static int tp__adopt_fail(lua_State *L, tp_lbox_t *b, tp_error_t *err) {
  if (b->has_cg)
    tp_cgroup_free(&b->cg);
  free(b->fields);
  free(b->dir);
  free(b);
  return tp__push_err(L, err);
}

/* An adoption that worked: the userdata on top of the stack owns b. */
static int tp__adopt_done(lua_State *L, tp_lbox_t **pb, tp_lbox_t *b) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  b->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  *pb = b;
  return 1;
}

/* core.vm_adopt{ id=, dir=, pid=, uid=, start_time=, cgroup= }: reconnects to
 * the agent of a microVM a previous daemon started (after a crash), once pid
 * proved to be its QEMU (tp_microvm_adopt), and re-opens its cgroup.  Every
 * value but dir comes from the VM's record: hostile. */
static int tp_lcore_vm_adopt(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  tp_vm_adopt_t a = {0};
  char procs[4200];
  tp_lbox_t *b;
  tp_lbox_t **pb;
  const char *id, *cgname;
  lua_Integer pid, uid, start;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "id");
  id = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "dir");
  a.dir = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "pid");
  pid = luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "uid");
  uid = luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "start_time");
  start = luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "cgroup");
  cgname = luaL_optstring(L, -1, id);
  if (!tp_cgroup_valid_name(id) || !tp_cgroup_valid_name(cgname) || a.dir[0] != '/')
    return luaL_error(L, "vm_adopt: bad id, cgroup or dir");
  if (pid < 2 || pid > 0x7fffffff || uid < 1 || uid > 0x7fffffff || start < 0) {
    tp_error_set(&err, EINVAL, "adopt VM: bad pid, uid or start time in its record");
    return tp__push_err(L, &err);
  }
  a.pid = (pid_t) pid;
  a.uid = (uid_t) uid;
  a.start_time = (unsigned long long) start;

  pb = tp__adopt_new(L, ctx, a.dir, cgname, "adopt VM", &err);
  if (pb == NULL)
    return tp__push_err(L, &err);
  b = *pb;
  *pb = NULL;
  b->vm = 1;
  tp__lbox_procs_path(b, procs, sizeof(procs));
  a.cgroup_procs = procs[0] ? procs : NULL;
  if (tp_microvm_adopt(&a, &b->box, &err) < 0)
    return tp__adopt_fail(L, b, &err);
  return tp__adopt_done(L, pb, b);
}

/* core.proc_start_time(pid) -> clock ticks since boot | nil, msg */
static int tp_lcore_proc_start_time(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  unsigned long long t;
  tp_error_t err = {0};
  if (pid < 1 || pid > 0x7fffffff)
    return luaL_error(L, "proc_start_time: bad pid");
  if (tp_microvm_start_time((pid_t) pid, &t, &err) < 0)
    return tp__push_err(L, &err);
  lua_pushinteger(L, (lua_Integer) t);
  return 1;
}

/* core.box_adopt{ id=, dir=, pid=, cgroup= }: reconnects to the agent of a
 * box a previous daemon started (after a crash), and re-opens its cgroup. */
static int tp_lcore_box_adopt(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  tp_lbox_t *b;
  tp_lbox_t **pb;
  const char *id, *dir, *cgname;
  pid_t pid;

  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "id");
  id = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "dir");
  dir = luaL_checkstring(L, -1);
  lua_getfield(L, 1, "pid");
  pid = (pid_t) luaL_checkinteger(L, -1);
  lua_getfield(L, 1, "cgroup");
  cgname = luaL_optstring(L, -1, id);
  if (!tp_cgroup_valid_name(id) || pid < 1)
    return luaL_error(L, "box_adopt: bad id or pid");

  pb = tp__adopt_new(L, ctx, dir, cgname, "adopt box", &err);
  if (pb == NULL)
    return tp__push_err(L, &err);
  b = *pb;
  *pb = NULL;
  if (tp_linux_box_adopt(dir, pid, &b->box, &err) < 0)
    return tp__adopt_fail(L, b, &err);
  return tp__adopt_done(L, pb, b);
}

/* box:on(on_frame(type, id, fields), on_down(reason)): starts delivery. */
static int tp_lbox_on(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  uv_loop_t *loop = luv_loop(L);
  int r;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (b->started || b->destroyed || b->open_handles > 0)
    return luaL_error(L, "box: on() called twice or after destroy");
  if ((r = uv_pipe_init(loop, &b->chan, 0)) < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "box channel: %s", uv_strerror(r));
    return 2;
  }
  b->chan.data = b;
  b->open_handles++;
  /* from here the pipe is in the loop's handle queue: every failure must
   * close it before b can be freed (the box keeps chan_fd: uv_pipe_open
   * took it only if it succeeded) */
  if ((r = uv_pipe_open(&b->chan, b->box.chan_fd)) == 0 &&
      (r = uv_poll_init(loop, &b->exitp, b->box.pidfd)) < 0)
    b->box.chan_fd = -1; /* the pipe owns it now: uv_close closes it */
  if (r < 0) {
    uv_close((uv_handle_t *) &b->chan, tp__lbox_close_cb);
    lua_pushnil(L);
    lua_pushfstring(L, "box channel: %s", uv_strerror(r));
    return 2;
  }
  b->exitp.data = b;
  b->open_handles++;
  b->started = 1;
  lua_pushvalue(L, 2);
  b->ref_frame = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 3);
  b->ref_down = luaL_ref(L, LUA_REGISTRYINDEX);
  uv_read_start((uv_stream_t *) &b->chan, tp__lbox_alloc_cb, tp__lbox_read_cb);
  uv_poll_start(&b->exitp, UV_READABLE, tp__lbox_exit_cb);
  lua_pushboolean(L, 1);
  return 1;
}

typedef struct tp_wreq_s {
  uv_write_t req;
  tp_buf_t buf;
} tp_wreq_t;

static void tp__write_cb(uv_write_t *req, int status) {
  tp_wreq_t *w = (tp_wreq_t *) req;
  (void) status; /* a failed write shows up as EOF on the read side */
  tp_buf_free(&w->buf);
  free(w);
}

/* Validates one value of fields table t for tag; raises on a wrong type. */
static void tp__check_field(lua_State *L, unsigned tag, int idx) {
  const char *name = tp__tag_names[tag];
  size_t len;
  switch (tp_tag_kind(tag)) {
  case TP_KIND_INT:
    if (!lua_isinteger(L, idx))
      luaL_error(L, "field '%s' must be an integer", name);
    break;
  case TP_KIND_STR:
  case TP_KIND_BYTES: {
    const char *s = lua_tolstring(L, idx, &len);
    if (s == NULL || lua_type(L, idx) != LUA_TSTRING)
      luaL_error(L, "field '%s' must be a string", name);
    if (len > TP_CHUNK_MAX)
      luaL_error(L, "field '%s' is longer than %d bytes", name, (int) TP_CHUNK_MAX);
    if (tp_tag_kind(tag) == TP_KIND_STR && memchr(s, '\0', len) != NULL)
      luaL_error(L, "field '%s' contains a NUL byte", name);
    break;
  }
  default:
    luaL_error(L, "field '%s' cannot be sent", name);
  }
}

/* box:send(type, id, fields) -> true | nil, msg */
static int tp_lbox_send(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  lua_Integer type = luaL_checkinteger(L, 2);
  lua_Integer id = luaL_checkinteger(L, 3);
  tp_wreq_t *w;
  uv_buf_t ub;
  int r;

  luaL_checktype(L, 4, LUA_TTABLE);
  if (!tp_msg_type_valid((unsigned) type) || type < TP_MSG_EXEC || type == TP_MSG_WATCH_EVENT)
    return luaL_error(L, "send: not a request type: %d", (int) type);
  if ((id <= 0 && !(id == 0 && tp_msg_net_stream((unsigned) type))) || id > (lua_Integer) UINT32_MAX)
    return luaL_error(L, "send: bad request id");
  /* pass 1: every value has the right type (may raise: nothing held yet) */
  for (unsigned tag = 1; tag < TP_TAG_MAX_; tag++) {
    if (tp__tag_names[tag] == NULL) /* a gap in the tag numbers (ranges reserved per feature) */
      continue;
    if (lua_getfield(L, 4, tp__tag_names[tag]) != LUA_TNIL) {
      if (tp__tag_repeated(tag)) {
        luaL_checktype(L, -1, LUA_TTABLE);
        lua_Integer n = (lua_Integer) luaL_len(L, -1);
        if (n > TP_ARGS_MAX)
          return luaL_error(L, "field '%s' has too many items", tp__tag_names[tag]);
        for (lua_Integer i = 1; i <= n; i++) {
          lua_rawgeti(L, -1, i);
          tp__check_field(L, TP_TAG_ARG, -1);
          lua_pop(L, 1);
        }
      } else {
        tp__check_field(L, tag, -1);
      }
    }
    lua_pop(L, 1);
  }
  if (!b->started || b->down || b->destroyed) {
    lua_pushnil(L);
    lua_pushstring(L, "box is not running");
    return 2;
  }
  /* pass 2: encode (no Lua error can happen while w is held) */
  w = calloc(1, sizeof(*w));
  if (w == NULL)
    return luaL_error(L, "out of memory");
  tp_frame_begin(&w->buf, (uint8_t) type, (uint32_t) id);
  for (unsigned tag = 1; tag < TP_TAG_MAX_; tag++) {
    if (tp__tag_names[tag] == NULL)
      continue;
    lua_getfield(L, 4, tp__tag_names[tag]);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      continue;
    }
    if (tp__tag_repeated(tag)) {
      lua_Integer n = (lua_Integer) luaL_len(L, -1);
      for (lua_Integer i = 1; i <= n; i++) {
        size_t len;
        lua_rawgeti(L, -1, i);
        const char *s = lua_tolstring(L, -1, &len);
        tp_frame_add(&w->buf, (uint16_t) tag, s, (uint32_t) len);
        lua_pop(L, 1);
      }
    } else if (tp_tag_kind(tag) == TP_KIND_INT) {
      tp_frame_add_int(&w->buf, (uint16_t) tag, (int64_t) lua_tointeger(L, -1));
    } else {
      size_t len;
      const char *s = lua_tolstring(L, -1, &len);
      tp_frame_add(&w->buf, (uint16_t) tag, s, (uint32_t) len);
    }
    lua_pop(L, 1);
  }
  if (tp_frame_end(&w->buf) < 0) {
    tp_buf_free(&w->buf);
    free(w);
    lua_pushnil(L);
    lua_pushstring(L, "request too large for one frame");
    return 2;
  }
  ub = uv_buf_init((char *) w->buf.data, (unsigned) w->buf.len);
  r = uv_write(&w->req, (uv_stream_t *) &b->chan, &ub, 1, tp__write_cb);
  if (r < 0) {
    tp_buf_free(&w->buf);
    free(w);
    lua_pushnil(L);
    lua_pushfstring(L, "box channel: %s", uv_strerror(r));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static tp_lbox_t *tp__check_cg(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  if (!b->has_cg || b->destroyed)
    luaL_error(L, "box has no cgroup");
  return b;
}

/* box:freeze(true|false) -> true | nil, msg */
static int tp_lbox_freeze(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  tp_error_t err = {0};
  if (tp_cgroup_freeze(&b->cg, lua_toboolean(L, 2), &err) < 0)
    return tp__push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* box:set_limits{ memory=, pids=, cpu_quota=, cpu_period= } -> true | nil, msg */
static int tp_lbox_set_limits(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  tp_cgroup_limits_t lim = {0};
  tp_error_t err = {0};
  luaL_checktype(L, 2, LUA_TTABLE);
  lim.memory = tp__opt_int(L, 2, "memory");
  lim.pids = tp__opt_int(L, 2, "pids");
  lim.cpu_quota = tp__opt_int(L, 2, "cpu_quota");
  lim.cpu_period = tp__opt_int(L, 2, "cpu_period");
  if (tp_cgroup_set_limits(&b->cg, &lim, &err) < 0)
    return tp__push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* box:stats() -> { memory_current=, ... } (fields the kernel lacks are absent) */
static int tp_lbox_stats(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  tp_cgroup_stats_t st;
  tp_error_t err = {0};
  if (tp_cgroup_stats(&b->cg, &st, &err) < 0)
    return tp__push_err(L, &err);
  lua_createtable(L, 0, 7);
#define TP_STAT(f)                          \
  if (st.f >= 0) {                          \
    lua_pushinteger(L, (lua_Integer) st.f); \
    lua_setfield(L, -2, #f);                \
  }
  TP_STAT(memory_current)
  TP_STAT(memory_peak)
  TP_STAT(cpu_usage_usec)
  TP_STAT(nr_throttled)
  TP_STAT(throttled_usec)
  TP_STAT(pids_current)
  TP_STAT(oom_kills)
#undef TP_STAT
  return 1;
}

static tp_lsub_t *tp__find_sub(tp_lbox_t *b, const char *name) {
  for (tp_lsub_t *s = b->subs; s != NULL; s = s->next)
    if (strcmp(s->name, name) == 0)
      return s;
  return NULL;
}

/* box:tree(name, box_pid): moves process box_pid (as the box sees it) into a
 * new sub cgroup `name`, so that its whole tree can be signalled or killed,
 * setsid and double-fork included.  true | nil, msg */
static int tp_lbox_tree(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  const char *name = luaL_checkstring(L, 2);
  pid_t bpid = (pid_t) luaL_checkinteger(L, 3);
  tp_error_t err = {0};
  cleanup_free pid_t *pids = NULL;
  size_t n = 0;
  pid_t host;
  tp_lsub_t *s;
  luaL_argcheck(L, strlen(name) < sizeof(s->name) && tp_cgroup_valid_name(name), 2, "bad name");
  if (tp__find_sub(b, name) != NULL)
    return luaL_error(L, "tree '%s' exists", name);
  if (tp_cgroup_pids(&b->cg, &pids, &n, &err) < 0 ||
      tp_linux_host_pid(pids, n, bpid, &host, &err) < 0)
    return tp__push_err(L, &err);
  s = calloc(1, sizeof(*s));
  if (s == NULL) {
    tp_error_set(&err, ENOMEM, "tree: out of memory");
    return tp__push_err(L, &err);
  }
  snprintf(s->name, sizeof(s->name), "%s", name);
  if (tp_cgroup_sub(&b->cg, name, &s->cg, &err) < 0) {
    free(s);
    return tp__push_err(L, &err);
  }
  if (tp_cgroup_attach(&s->cg, host, &err) < 0) {
    tp_error_t e2 = {0};
    tp_cgroup_destroy(&s->cg, &e2);
    tp_cgroup_free(&s->cg);
    free(s);
    return tp__push_err(L, &err);
  }
  s->next = b->subs;
  b->subs = s;
  lua_pushboolean(L, 1);
  return 1;
}

/* box:tree_signal(name, sig): sig to every process of the tree; SIGKILL
 * kills it whole and waits until it is gone.  -> number signalled | nil, msg */
static int tp_lbox_tree_signal(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  tp_lsub_t *s = tp__find_sub(b, luaL_checkstring(L, 2));
  int sig = (int) luaL_checkinteger(L, 3);
  tp_error_t err = {0};
  cleanup_free pid_t *pids = NULL;
  size_t n = 0;
  luaL_argcheck(L, sig >= 1 && sig <= 64, 3, "bad signal");
  if (s == NULL)
    return luaL_error(L, "no such tree");
  if (tp_cgroup_pids(&s->cg, &pids, &n, &err) < 0)
    return tp__push_err(L, &err);
  if (sig == SIGKILL) {
    if (tp_cgroup_kill(&s->cg, &err) < 0)
      return tp__push_err(L, &err);
  } else {
    for (size_t i = 0; i < n; i++)
      kill(pids[i], sig);
  }
  lua_pushinteger(L, (lua_Integer) n);
  return 1;
}

/* box:tree_count(name) -> processes left in the tree */
static int tp_lbox_tree_count(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  tp_lsub_t *s = tp__find_sub(b, luaL_checkstring(L, 2));
  tp_error_t err = {0};
  cleanup_free pid_t *pids = NULL;
  size_t n = 0;
  if (s == NULL)
    return luaL_error(L, "no such tree");
  if (tp_cgroup_pids(&s->cg, &pids, &n, &err) < 0)
    return tp__push_err(L, &err);
  lua_pushinteger(L, (lua_Integer) n);
  return 1;
}

/* box:tree_remove(name): kills what is left of the tree, removes its cgroup. */
static int tp_lbox_tree_remove(lua_State *L) {
  tp_lbox_t *b = tp__check_cg(L);
  const char *name = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  for (tp_lsub_t **pp = &b->subs; *pp != NULL; pp = &(*pp)->next) {
    if (strcmp((*pp)->name, name) == 0) {
      tp_lsub_t *s = *pp;
      if (tp_cgroup_destroy(&s->cg, &err) < 0)
        return tp__push_err(L, &err);
      *pp = s->next;
      free(s);
      lua_pushboolean(L, 1);
      return 1;
    }
  }
  return luaL_error(L, "no such tree");
}

static int tp_lbox_has_cgroup(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  lua_pushboolean(L, b->has_cg && !b->destroyed);
  return 1;
}

static int tp_lbox_pid(lua_State *L) {
  lua_pushinteger(L, tp__check_box(L)->box.pid);
  return 1;
}

static int tp_lbox_queued(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  lua_pushinteger(L, b->started ? (lua_Integer) uv_stream_get_write_queue_size((uv_stream_t *) &b->chan) : 0);
  return 1;
}

/* Destroys the box; with keep_upper, once every process of it is gone
 * (the overlay is unmounted with its mount namespace), its upper dir is
 * moved to keep_upper (same filesystem) before the rest is removed. */
static int tp__lbox_destroy_dir(tp_lbox_t *b, tp_error_t *err) {
  char upper[TP__LBOX_PATH_MAX];
  if (b->keep_upper == NULL)
    return tp_box_destroy(&b->box, b->dir, err);
  if (tp_box_destroy(&b->box, NULL, err) < 0)
    return -1;
  if (snprintf(upper, sizeof(upper), "%s/upper", b->dir) >= (int) sizeof(upper)) {
    tp_rmtree(b->dir, NULL);
    return tp_error_set(err, ENAMETOOLONG, "destroy box: path too long");
  }
  if (rename(upper, b->keep_upper) < 0) {
    int e = errno;
    tp_rmtree(b->dir, NULL);
    return tp_error_errno(err, e, "destroy box: keep %s", upper);
  }
  return tp_rmtree(b->dir, err);
}

static void tp__destroy_work(uv_work_t *req) {
  tp_lbox_t *b = req->data;
  tp_error_t cgerr = {0};
  b->wret = tp__lbox_destroy_dir(b, &b->werr);
  tp__lbox_drop_cgroups(b, &cgerr);
  if (b->wret == 0 && cgerr.code != 0) {
    b->werr = cgerr;
    b->wret = -1;
  }
}

static void tp__destroy_after(uv_work_t *req, int status) {
  tp_lbox_t *b = req->data;
  lua_State *L = b->L;
  int ref = b->ref_destroy;
  (void) status;
  b->ref_destroy = LUA_NOREF;
  if (!b->ud_dead && ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    if (b->wret < 0) {
      lua_pushnil(L);
      lua_pushstring(L, b->werr.msg);
    } else {
      lua_pushboolean(L, 1);
      lua_pushnil(L);
    }
    /* the callback resumes Lua code that may run a full GC and collect the
     * box's userdata: work_pending, still set, keeps b alive through it */
    tp_lua_pcall(L, 2, 0, 0);
  }
  b->work_pending = 0;
  tp__lbox_maybe_free(b);
}

/* box:destroy(cb(ok, err)[, keep_upper]): kills every process of the box
 * and removes its directory in the thread pool; cb runs on the loop when
 * done.  keep_upper (an absolute path on the box dir's filesystem that does
 * not exist): the box's writable layer is moved there first (recipe setup
 * layers; a box with a disk cap has none to keep). */
static int tp_lbox_destroy(lua_State *L) {
  tp_lbox_t *b = tp__check_box(L);
  const char *keep = luaL_optstring(L, 3, NULL);
  int r;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (b->destroyed)
    return luaL_error(L, "box already destroyed");
  if (keep != NULL) {
    luaL_argcheck(L, keep[0] == '/' && strlen(keep) < TP__LBOX_PATH_MAX, 3,
                  "must be an absolute path");
    if ((b->keep_upper = strdup(keep)) == NULL)
      return luaL_error(L, "out of memory");
  }
  b->destroyed = 1;
  b->down = 1;
  tp__lbox_stop(b);
  tp__lbox_unref(b);
  if (b->box.pid > 0)
    kill(b->box.pid, SIGKILL); /* at once; reaping and rm happen in the pool */
  lua_pushvalue(L, 2);
  b->ref_destroy = luaL_ref(L, LUA_REGISTRYINDEX);
  b->work.data = b;
  r = uv_queue_work(luv_loop(L), &b->work, tp__destroy_work, tp__destroy_after);
  if (r < 0) {
    tp_error_t err = {0};
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_destroy);
    b->ref_destroy = LUA_NOREF;
    int r2 = tp__lbox_destroy_dir(b, &err);
    tp__lbox_drop_cgroups(b, &err);
    if (r2 < 0)
      return tp__push_err(L, &err);
    lua_pushboolean(L, 1);
    return 1;
  }
  b->work_pending = 1;
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lbox_gc(lua_State *L) {
  tp_lbox_t **pb = luaL_checkudata(L, 1, TP_BOX_MT);
  tp_lbox_t *b = *pb;
  *pb = NULL;
  if (b == NULL)
    return 0;
  b->ud_dead = 1;
  if (!b->destroyed) {
    tp_error_t err = {0};
    b->destroyed = 1;
    tp__lbox_stop(b);
    tp__lbox_unref(b);
    tp_box_destroy(&b->box, b->dir, &err);
    tp__lbox_drop_cgroups(b, &err);
  } else if (b->ref_destroy != LUA_NOREF) {
    luaL_unref(L, LUA_REGISTRYINDEX, b->ref_destroy);
    b->ref_destroy = LUA_NOREF;
  }
  tp__lbox_maybe_free(b);
  return 0;
}

/* ------------------------------------------------------------- backends */

/* The backends the Lua side can start boxes on, by name.  Each takes its
 * own spec table (box_start's, vm_start's above); a box behaves the same
 * whichever started it. */
static const struct {
  const char *name;
  lua_CFunction start, adopt;
} tp__backends[] = {
    {"linux", tp_lcore_box_start, tp_lcore_box_adopt},
    {"microvm", tp_lcore_vm_start, tp_lcore_vm_adopt},
};

static int tp__backend_index(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  for (size_t i = 0; i < sizeof(tp__backends) / sizeof(tp__backends[0]); i++)
    if (strcmp(tp__backends[i].name, name) == 0)
      return (int) i;
  return -1;
}

/* core.start(backend, spec, cb(box | nil, msg, code)) -> true | nil, msg */
static int tp_lcore_start(lua_State *L) {
  int i = tp__backend_index(L);
  if (i < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "unknown backend '%s'", lua_tostring(L, 1));
    return 2;
  }
  lua_remove(L, 1);
  return tp__backends[i].start(L);
}

/* core.adopt(backend, spec) -> box | nil, msg, code */
static int tp_lcore_adopt(lua_State *L) {
  int i = tp__backend_index(L);
  if (i < 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "unknown backend '%s'", lua_tostring(L, 1));
    return 2;
  }
  lua_remove(L, 1);
  return tp__backends[i].adopt(L);
}

/* core.backends() -> { "linux", "microvm", ... } */
static int tp_lcore_backends(lua_State *L) {
  size_t n = sizeof(tp__backends) / sizeof(tp__backends[0]);
  lua_createtable(L, (int) n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, tp__backends[i].name);
    lua_rawseti(L, -2, (lua_Integer) i + 1);
  }
  return 1;
}

/* ------------------------------------------------------------ utilities */

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

/* core.sha256(s...) -> the hex SHA-256 of the strings, concatenated. */
static int tp_lcore_sha256(lua_State *L) {
  tp_sha256_t c;
  unsigned char d[32];
  char hex[65];
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++)
    luaL_checkstring(L, i);
  tp_sha256_init(&c);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = lua_tolstring(L, i, &len);
    tp_sha256_update(&c, s, len);
  }
  tp_sha256_final(&c, d);
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", d[i]);
  lua_pushlstring(L, hex, 64);
  return 1;
}

/* core.vm_ram_memfd(path, size) -> fd | nil, msg: a microVM snapshot's
 * guest memory file as a sealed memfd (tp_microvm_ram_memfd), which the
 * caller passes to QEMU and closes with uv.fs_close. */
static int tp_lcore_vm_ram_memfd(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer size = luaL_checkinteger(L, 2);
  tp_error_t err = {0};
  int fd;
  if (size <= 0)
    return luaL_error(L, "vm_ram_memfd: bad size");
  fd = tp_microvm_ram_memfd(path, (uint64_t) size, &err);
  if (fd < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* core.vm_ram_new(size) -> fd | nil, msg (tp_microvm_ram_new) */
static int tp_lcore_vm_ram_new(lua_State *L) {
  lua_Integer size = luaL_checkinteger(L, 1);
  tp_error_t err = {0};
  int fd;
  if (size <= 0)
    return luaL_error(L, "vm_ram_new: bad size");
  fd = tp_microvm_ram_new((uint64_t) size, &err);
  if (fd < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* core.vm_ram_save(fd, path) -> true | nil, msg (tp_microvm_ram_save) */
static int tp_lcore_vm_ram_save(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  const char *path = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  if (fd < 0 || fd > 0x7fffffff)
    return luaL_error(L, "vm_ram_save: bad fd");
  if (tp_microvm_ram_save((int) fd, path, &err) < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.vm_copy_sparse(src, dst) -> true | nil, msg (tp_microvm_copy_sparse) */
static int tp_lcore_vm_copy_sparse(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  const char *dst = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  if (tp_microvm_copy_sparse(src, dst, &err) < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.send_with_fd(sock, data, fd) -> true | nil, msg: writes data on the
 * unix socket sock with fd attached (SCM_RIGHTS), in one sendmsg: how QMP's
 * getfd receives a file (the microVM snapshot). */
static int tp_lcore_send_with_fd(lua_State *L) {
  lua_Integer sock = luaL_checkinteger(L, 1);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  lua_Integer fd = luaL_checkinteger(L, 3);
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = (void *) data, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *c;
  int f = (int) fd;
  ssize_t n;
  if (sock < 0 || sock > 0x7fffffff || fd < 0 || fd > 0x7fffffff || len == 0 || len > 65536)
    return luaL_error(L, "send_with_fd: bad arguments");
  memset(cbuf, 0, sizeof(cbuf));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &f, sizeof(int));
  do
    n = sendmsg((int) sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t) len) {
    lua_pushnil(L);
    lua_pushfstring(L, "sendmsg: %s", n < 0 ? strerror(errno) : "short write");
    return 2;
  }
  lua_pushboolean(L, 1);
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
    return tp__push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lcore_rmtree(lua_State *L) {
  tp_error_t err = {0};
  if (tp_rmtree(luaL_checkstring(L, 1), &err) < 0)
    return tp__push_err(L, &err);
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

/* core.lock(path): an exclusive flock on path, held by the returned fd
 * (close it with uv.fs_close); nil, msg when someone else holds it. */
static int tp_lcore_lock(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    tp_error_errno(&err, errno, "open '%s'", path);
    return tp__push_err(L, &err);
  }
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    close(fd);
    if (e == EWOULDBLOCK)
      tp_error_set(&err, e, "'%s' is locked: another daemon uses this state directory", path);
    else
      tp_error_errno(&err, e, "lock '%s'", path);
    return tp__push_err(L, &err);
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
    return tp__push_err(L, &err);
  }
  fflush(stdout);
  fflush(stderr);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.cgroup_init([root]) -> { version=, memory=, pids=, cpu=, freezer= }
 * | nil, msg: finds the cgroup filesystems; boxes started after it get a
 * cgroup each. */
static int tp_lcore_cgroup_init(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  const char *root = luaL_optstring(L, 1, NULL);
  tp_error_t err = {0};
  if (ctx->has_cgroups) {
    tp_cgroup_root_free(&ctx->cgroot);
    ctx->has_cgroups = 0;
  }
  if (tp_cgroup_detect(root, &ctx->cgroot, &err) < 0)
    return tp__push_err(L, &err);
  ctx->has_cgroups = 1;
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, ctx->cgroot.version);
  lua_setfield(L, -2, "version");
  static const struct { const char *name; int c; } ctrls[] = {
      {"memory", TP_CG_MEMORY}, {"pids", TP_CG_PIDS}, {"cpu", TP_CG_CPU}, {"freezer", TP_CG_FREEZER}};
  for (size_t i = 0; i < TP_ARRAY_SIZE(ctrls); i++) {
    int ok = (ctx->cgroot.avail & (1u << ctrls[i].c)) != 0;
    if (ctrls[i].c == TP_CG_FREEZER && ctx->cgroot.version == 2)
      ok = 1; /* cgroup.freeze is a core file on v2 */
    lua_pushboolean(L, ok);
    lua_setfield(L, -2, ctrls[i].name);
  }
  return 1;
}

/* core.cgroup_orphans() -> { id, ... }: box cgroups present on the host. */
static int tp_lcore_cgroup_orphans(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  char **ids = NULL;
  size_t n = 0;
  lua_newtable(L);
  if (!ctx->has_cgroups)
    return 1;
  if (tp_cgroup_list(&ctx->cgroot, &ids, &n, &err) < 0)
    return tp__push_err(L, &err);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, ids[i]);
    lua_rawseti(L, -2, (lua_Integer) i + 1);
  }
  tp_cgroup_list_free(ids, n);
  return 1;
}

/* core.cgroup_remove(id): kills everything in tupper/<id> and removes it. */
static int tp_lcore_cgroup_remove(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  const char *id = luaL_checkstring(L, 1);
  tp_error_t err = {0};
  tp_cgroup_t cg;
  if (!ctx->has_cgroups || !tp_cgroup_valid_name(id))
    return luaL_error(L, "cgroup_remove: no cgroups or bad id");
  if (tp_cgroup_open(&ctx->cgroot, id, &cg, &err) < 0) {
    if (err.code == ENOENT) {
      lua_pushboolean(L, 1);
      return 1;
    }
    return tp__push_err(L, &err);
  }
  if (tp_cgroup_destroy(&cg, &err) < 0) {
    tp_cgroup_free(&cg);
    return tp__push_err(L, &err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.cgroup_prune(): removes the empty tupper parents (daemon shutdown). */
static int tp_lcore_cgroup_prune(lua_State *L) {
  tp_core_ctx_t *ctx = tp__ctx(L);
  tp_error_t err = {0};
  if (ctx->has_cgroups && tp_cgroup_prune(&ctx->cgroot, &err) < 0)
    return tp__push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lcore_ctx_gc(lua_State *L) {
  tp_core_ctx_t *c = lua_touserdata(L, 1);
  if (c->has_cgroups) {
    tp_cgroup_root_free(&c->cgroot);
    c->has_cgroups = 0;
  }
  if (c->has_seccomp) {
    tp_seccomp_free(&c->seccomp);
    c->has_seccomp = 0;
  }
  if (c->agent_fd >= 0)
    close(c->agent_fd);
  c->agent_fd = -1;
  return 0;
}

int luaopen_tupper_core(lua_State *L) {
  static const luaL_Reg box_methods[] = {
      {"on", tp_lbox_on},       {"send", tp_lbox_send},       {"pid", tp_lbox_pid},
      {"queued", tp_lbox_queued}, {"destroy", tp_lbox_destroy}, {"freeze", tp_lbox_freeze},
      {"stats", tp_lbox_stats}, {"tree", tp_lbox_tree}, {"tree_signal", tp_lbox_tree_signal},
      {"tree_count", tp_lbox_tree_count}, {"tree_remove", tp_lbox_tree_remove},
      {"has_cgroup", tp_lbox_has_cgroup}, {"set_limits", tp_lbox_set_limits}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"start", tp_lcore_start},           {"adopt", tp_lcore_adopt},
      {"backends", tp_lcore_backends},     {"agent_binary", tp_lcore_agent_binary},
      {"proc_start_time", tp_lcore_proc_start_time},
      {"send_with_fd", tp_lcore_send_with_fd}, {"vm_ram_memfd", tp_lcore_vm_ram_memfd},
      {"vm_ram_new", tp_lcore_vm_ram_new},       {"vm_ram_save", tp_lcore_vm_ram_save},
      {"vm_copy_sparse", tp_lcore_vm_copy_sparse},
      {"b64encode", tp_lcore_b64encode},
      {"b64decode", tp_lcore_b64decode},   {"default_image", tp_lcore_default_image},
      {"sha256", tp_lcore_sha256},
      {"rmtree", tp_lcore_rmtree},         {"umask", tp_lcore_umask},
      {"ignore_stop_signals", tp_lcore_ignore_stop_signals},
      {"random_hex", tp_lcore_random_hex}, {"lock", tp_lcore_lock},
      {"log_to", tp_lcore_log_to},         {"cgroup_init", tp_lcore_cgroup_init},
      {"cgroup_orphans", tp_lcore_cgroup_orphans}, {"cgroup_remove", tp_lcore_cgroup_remove},
      {"cgroup_prune", tp_lcore_cgroup_prune},
      {"jail_run", tp_lvm_run},              {"embedded_source", tp_lua_embedded_source},
      {"ledit_open", tp_lcore_ledit_open}, {"ledit_prompt", tp_lcore_ledit_prompt},
      {"ledit_feed", tp_lcore_ledit_feed}, {"ledit_clear", tp_lcore_ledit_clear},
      {"ledit_add_history", tp_lcore_ledit_add_history}, {"ledit_close", tp_lcore_ledit_close},
      {NULL, NULL}};
  static const struct { const char *name; int v; } msgs[] = {
      {"READY", TP_MSG_READY}, {"OUTPUT", TP_MSG_OUTPUT}, {"EXIT", TP_MSG_EXIT},
      {"OK", TP_MSG_OK}, {"ERR", TP_MSG_ERR}, {"EXEC", TP_MSG_EXEC}, {"STDIN", TP_MSG_STDIN},
      {"STDIN_CLOSE", TP_MSG_STDIN_CLOSE}, {"SIGNAL", TP_MSG_SIGNAL},
      {"RELEASE", TP_MSG_RELEASE}, {"PS", TP_MSG_PS},
      {"FS_READ", TP_MSG_FS_READ}, {"FS_WRITE", TP_MSG_FS_WRITE}, {"FS_STAT", TP_MSG_FS_STAT},
      {"FS_LIST", TP_MSG_FS_LIST}, {"FS_MKDIR", TP_MSG_FS_MKDIR},
      {"FS_REMOVE", TP_MSG_FS_REMOVE}, {"FS_RENAME", TP_MSG_FS_RENAME},
      {"NET_LISTEN", TP_MSG_NET_LISTEN}, {"NET_OPEN", TP_MSG_NET_OPEN},
      {"NET_DATA", TP_MSG_NET_DATA}, {"NET_ACK", TP_MSG_NET_ACK}, {"NET_EOF", TP_MSG_NET_EOF},
      {"NET_CLOSE", TP_MSG_NET_CLOSE}, {"NET_DNS", TP_MSG_NET_DNS},
      {"NET_CONNECT", TP_MSG_NET_CONNECT},
      {"PTY_RESIZE", TP_MSG_PTY_RESIZE}, {"WATCH_ADD", TP_MSG_WATCH_ADD},
      {"WATCH_REMOVE", TP_MSG_WATCH_REMOVE}, {"WATCH_EVENT", TP_MSG_WATCH_EVENT},
      {"VM_INIT", TP_MSG_VM_INIT}, {"VM_ATTACH", TP_MSG_VM_ATTACH},
      {"VM_LIMITS", TP_MSG_VM_LIMITS}};

  if (luaL_newmetatable(L, TP_BOX_MT)) {
    luaL_newlib(L, box_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, tp_lbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);

  if (lua_getfield(L, LUA_REGISTRYINDEX, TP_CTX_KEY) == LUA_TNIL) {
    tp_core_ctx_t *c = lua_newuserdatauv(L, sizeof(*c), 0);
    c->agent_fd = -1;
    c->has_cgroups = 0;
    c->has_seccomp = 0;
    lua_newtable(L);
    lua_pushcfunction(L, tp_lcore_ctx_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, TP_CTX_KEY);
  }
  lua_pop(L, 1);

  luaL_newlib(L, funcs);
  tp_lhttp_register(L);
  tp_limage_register(L); /* the image store's functions (limage.c) */
  lua_newtable(L);
  for (size_t i = 0; i < TP_ARRAY_SIZE(msgs); i++) {
    lua_pushinteger(L, msgs[i].v);
    lua_setfield(L, -2, msgs[i].name);
  }
  lua_setfield(L, -2, "MSG");
  lua_pushinteger(L, TP_PROTO_VERSION);
  lua_setfield(L, -2, "AGENT_PROTO");
  lua_pushinteger(L, TP_CHUNK_MAX);
  lua_setfield(L, -2, "CHUNK_MAX");
  {
    static const struct { const char *name; lua_Integer v; } net[] = {
        {"WINDOW", TP_NET_WINDOW},     {"CHUNK", TP_NET_CHUNK},
        {"STREAMS_MAX", TP_NET_STREAMS_MAX}, {"DNS_MAX", TP_NET_DNS_MAX},
        {"HTTP_PORT", TP_NET_HTTP_PORT}, {"SOCKS_PORT", TP_NET_SOCKS_PORT},
        {"DNS_PORT", TP_NET_DNS_PORT}, {"HTTP", TP_NET_HTTP},
        {"SOCKS", TP_NET_SOCKS},       {"DNS_TCP", TP_NET_DNS_TCP},
        {"CONNECTED", TP_NET_CONNECTED}};
    lua_newtable(L);
    for (size_t i = 0; i < TP_ARRAY_SIZE(net); i++) {
      lua_pushinteger(L, net[i].v);
      lua_setfield(L, -2, net[i].name);
    }
    lua_setfield(L, -2, "NET"); /* the network relay's constants (proto.h) */
  }
  lua_pushstring(L, "0.1.0");
  lua_setfield(L, -2, "version");
  return 1;
}
