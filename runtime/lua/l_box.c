/* tupper.core's box userdata: a tp_dbox_t (runtime/host/dbox.h) seen from
 * Lua.  on() delivers the agent's frames as tables of decoded fields (the
 * bytes never reach Lua), send() encodes a request, destroy() runs in the
 * thread pool; the cgroup methods act on the box cgroup. */
#include <errno.h>
#include <lauxlib.h>
#include <luv/luv.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "l_core.h"
#include "tupper.h"

/* The userdata: the box object and the Lua side of its callbacks. */
typedef struct tp_lbox_s {
  tp_dbox_t *b;
  lua_State *L; /* main thread */
  int ref_frame, ref_down, ref_destroy, ref_dead;
} tp_lbox_t;

void tp_l_box_push(lua_State *L, tp_dbox_t *b) {
  tp_lbox_t *u = lua_newuserdatauv(L, sizeof(*u), 0);
  u->b = NULL;
  u->ref_frame = u->ref_down = u->ref_destroy = u->ref_dead = LUA_NOREF;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  u->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  luaL_setmetatable(L, TP_L_BOX_MT);
  if (b != NULL)
    tp_l_box_set(L, -1, b);
}

void tp_l_box_set(lua_State *L, int idx, tp_dbox_t *b) {
  tp_lbox_t *u = luaL_checkudata(L, idx, TP_L_BOX_MT);
  u->b = b;
  b->data = u;
}

static tp_lbox_t *tp__check_lbox(lua_State *L) {
  tp_lbox_t *u = luaL_checkudata(L, 1, TP_L_BOX_MT);
  if (u->b == NULL)
    luaL_error(L, "box is gone");
  return u;
}

static tp_dbox_t *tp__check_box(lua_State *L) { return tp__check_lbox(L)->b; }

tp_dbox_t *tp_l_box_check(lua_State *L, int idx) {
  tp_lbox_t *u = luaL_checkudata(L, idx, TP_L_BOX_MT);
  if (u->b == NULL)
    luaL_error(L, "box is gone");
  return u->b;
}

static tp_dbox_t *tp__check_cg(lua_State *L) {
  tp_dbox_t *b = tp__check_box(L);
  if (!tp_dbox_has_cgroup(b))
    luaL_error(L, "box has no cgroup");
  return b;
}

static void tp__lbox_unref(tp_lbox_t *u) {
  luaL_unref(u->L, LUA_REGISTRYINDEX, u->ref_frame);
  luaL_unref(u->L, LUA_REGISTRYINDEX, u->ref_down);
  u->ref_frame = u->ref_down = LUA_NOREF;
}

static int tp__lbox_frame_cb(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fs,
                             int n, tp_field_t *scratch, int scratch_max) {
  tp_lbox_t *u = b->data;
  lua_State *L = u->L;
  if (u->ref_frame == LUA_NOREF)
    return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, u->ref_frame);
  lua_pushinteger(L, type);
  lua_pushinteger(L, (lua_Integer) id);
  if (tp_l_push_fields(L, fs, n, 0, scratch, scratch_max) < 0) {
    lua_pop(L, 3);
    return -1;
  }
  tp_lua_pcall(L, 3, 0, 0);
  return 0;
}

static void tp__lbox_down_cb(tp_dbox_t *b, const char *reason) {
  tp_lbox_t *u = b->data;
  if (u->ref_down == LUA_NOREF)
    return;
  lua_rawgeti(u->L, LUA_REGISTRYINDEX, u->ref_down);
  lua_pushstring(u->L, reason);
  tp_lua_pcall(u->L, 1, 0, 0);
}

/* box:on(on_frame(type, id, fields), on_down(reason)): starts delivery. */
static int tp_lbox_on(lua_State *L) {
  tp_lbox_t *u = tp__check_lbox(L);
  tp_error_t err = {0};
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  if (tp_dbox_on(u->b, tp__lbox_frame_cb, tp__lbox_down_cb, &err) < 0) {
    if (err.code == EBUSY)
      return luaL_error(L, "%s", err.msg);
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushvalue(L, 2);
  u->ref_frame = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 3);
  u->ref_down = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushboolean(L, 1);
  return 1;
}

/* box:send(type, id, fields [, tree]) -> true | nil, msg [, errno]: with
 * tree (a name box:tree_take gave), the frame carries that tree's cgroup
 * fds (an EXEC with FLAGS TREE); with an fd pair (core.fd_pair) instead,
 * the pair's far end (an FS_OPEN); errno EAGAIN: not sent, the channel had
 * other bytes queued. */
static int tp_lbox_send(lua_State *L) {
  tp_dbox_t *b = tp__check_box(L);
  lua_Integer type = luaL_checkinteger(L, 2);
  lua_Integer id = luaL_checkinteger(L, 3);
  tp_error_t err = {0};
  tp_dbox_tree_t *t = NULL;
  int far = -2, rc;
  tp_buf_t buf;

  luaL_checktype(L, 4, LUA_TTABLE);
  if (!tp_msg_type_valid((unsigned) type) || type < TP_MSG_EXEC || type == TP_MSG_WATCH_EVENT)
    return luaL_error(L, "send: not a request type: %d", (int) type);
  if ((id <= 0 && !(id == 0 && tp_msg_net_stream((unsigned) type))) || id > (lua_Integer) UINT32_MAX)
    return luaL_error(L, "send: bad request id");
  /* pass 1: every value has the right type (may raise: nothing held yet) */
  tp_l_check_fields(L, 4);
  if (!lua_isnoneornil(L, 5) && (far = tp_l_fdpair_far(L, 5)) == -1)
    return luaL_error(L, "send: the fd pair was sent already");
  if (!lua_isnoneornil(L, 5) && far == -2 && (t = tp_dbox_tree_find(b, luaL_checkstring(L, 5))) == NULL)
    return luaL_error(L, "send: no such tree");
  if (!tp_dbox_running(b)) {
    lua_pushnil(L);
    lua_pushstring(L, "box is not running");
    return 2;
  }
  /* pass 2: encode (no Lua error can happen while buf is held) */
  memset(&buf, 0, sizeof(buf));
  if (tp_l_encode_fields(L, 4, (unsigned) type, (uint32_t) id, &buf) < 0) {
    tp_buf_free(&buf);
    lua_pushnil(L);
    lua_pushstring(L, "request too large for one frame");
    return 2;
  }
  if (far >= 0)
    rc = tp_dbox_send_fds(b, &buf, &far, 1, &err);
  else
    rc = t != NULL ? tp_dbox_send_tree(b, &buf, t, &err) : tp_dbox_send(b, &buf, &err);
  if (far >= 0 && rc == 0)
    tp_l_fdpair_sent(L, 5);
  if (rc < 0) {
    lua_pushnil(L); /* buf is freed */
    lua_pushstring(L, err.msg);
    lua_pushinteger(L, err.code);
    return 3;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* box:set_limits{ memory=, pids=, cpu_quota=, cpu_period= } -> true | nil, msg */
static int tp_lbox_set_limits(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  tp_cgroup_limits_t lim;
  tp_error_t err = {0};
  luaL_checktype(L, 2, LUA_TTABLE);
  tp_l_limits(L, 2, &lim, NULL);
  if (tp_cgroup_set_limits(&b->cg, &lim, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* box:stats() -> { memory_current=, ... } (fields the kernel lacks are absent) */
static int tp_lbox_stats(lua_State *L) {
  static const char *const names[] = {"memory_current", "memory_peak",  "cpu_usage_usec",
                                      "nr_throttled",   "throttled_usec", "pids_current",
                                      "oom_kills"};
  tp_dbox_t *b = tp__check_cg(L);
  tp_cgroup_stats_t st;
  tp_error_t err = {0};
  if (tp_cgroup_stats(&b->cg, &st, &err) < 0)
    return tp_l_push_err(L, &err);
  if (st.oom_kills >= 0)
    st.oom_kills += b->oom_gone; /* v1: those of trees already removed */
  const int64_t vals[] = {st.memory_current, st.memory_peak,    st.cpu_usage_usec,
                          st.nr_throttled,   st.throttled_usec, st.pids_current,
                          st.oom_kills};
  _Static_assert(sizeof(vals) / sizeof(vals[0]) == sizeof(names) / sizeof(names[0]),
                 "one name per counter");
  lua_createtable(L, 0, 7);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    if (vals[i] >= 0) {
      lua_pushinteger(L, (lua_Integer) vals[i]);
      lua_setfield(L, -2, names[i]);
    }
  }
  return 1;
}

/* An async box:tree's Lua side: the callback and the box, held until it ends. */
typedef struct tp__ltree_s {
  lua_State *L; /* main thread */
  int ref_cb, ref_box;
} tp__ltree_t;

static lua_State *tp__main_thread(lua_State *L) {
  lua_State *m;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  m = lua_tothread(L, -1);
  lua_pop(L, 1);
  return m;
}

static void tp__ltree_done(void *data, const tp_error_t *err) {
  tp__ltree_t *j = data;
  lua_State *L = j->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_box);
  free(j);
  if (err == NULL) {
    lua_pushboolean(L, 1);
    lua_pushnil(L);
  } else {
    lua_pushnil(L);
    lua_pushstring(L, err->msg);
  }
  tp_lua_pcall(L, 2, 0, 0);
}

/* box:tree(name, box_pid [, cb]): moves process box_pid (as the box sees it)
 * into a new sub cgroup `name`, so that its whole tree can be signalled or
 * killed, setsid and double-fork included.  true | nil, msg; with cb the
 * work runs in the thread pool (the loop goes on) and cb(true) or cb(nil,
 * msg) runs after, the call returning true or nil, msg (not queued). */
static int tp_lbox_tree(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  const char *name = luaL_checkstring(L, 2);
  pid_t bpid = (pid_t) luaL_checkinteger(L, 3);
  int async = !lua_isnoneornil(L, 4);
  tp_error_t err = {0};
  tp__ltree_t *j;
  luaL_argcheck(L, strlen(name) < sizeof(((tp_dbox_tree_t *) 0)->name) && tp_cgroup_valid_name(name),
                2, "bad name");
  if (async)
    luaL_checktype(L, 4, LUA_TFUNCTION);
  if (tp_dbox_tree_find(b, name) != NULL)
    return luaL_error(L, "tree '%s' exists", name);
  if (!async) {
    if (tp_dbox_tree(b, name, bpid, &err) < 0)
      return tp_l_push_err(L, &err);
    lua_pushboolean(L, 1);
    return 1;
  }
  j = malloc(sizeof(*j));
  if (j == NULL)
    return luaL_error(L, "tree: out of memory");
  j->L = tp__main_thread(L);
  lua_pushvalue(L, 4);
  j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, 1);
  j->ref_box = luaL_ref(L, LUA_REGISTRYINDEX);
  if (tp_dbox_tree_start(b, name, bpid, tp__ltree_done, j, &err) < 0) {
    luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
    luaL_unref(L, LUA_REGISTRYINDEX, j->ref_box);
    free(j);
    return tp_l_push_err(L, &err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static tp_dbox_tree_t *tp__check_tree(lua_State *L, tp_dbox_t *b) {
  tp_dbox_tree_t *t = tp_dbox_tree_find(b, luaL_checkstring(L, 2));
  if (t == NULL)
    luaL_error(L, "no such tree");
  return t;
}

static void tp__lkill_done(void *data, size_t n, const tp_error_t *err) {
  tp__ltree_t *j = data;
  lua_State *L = j->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
  luaL_unref(L, LUA_REGISTRYINDEX, j->ref_box);
  free(j);
  if (err == NULL) {
    lua_pushinteger(L, (lua_Integer) n);
    lua_pushnil(L);
  } else {
    lua_pushnil(L);
    lua_pushstring(L, err->msg);
  }
  tp_lua_pcall(L, 2, 0, 0);
}

/* box:freeze(true|false [, cb]) -> true | nil, msg: freezes or thaws the
 * box cgroup and waits until the kernel says so.  With cb the freeze runs
 * in the thread pool (its wait can last TP_CGROUP_TIMEOUT_MS, which must
 * not hold the loop) and cb(true) or cb(nil, msg) runs after; the call
 * returns true | nil, msg (nothing queued). */
static int tp_lbox_freeze(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  int frozen = lua_toboolean(L, 2);
  tp_error_t err = {0};
  if (!lua_isnoneornil(L, 3)) {
    tp__ltree_t *j;
    luaL_checktype(L, 3, LUA_TFUNCTION);
    j = malloc(sizeof(*j));
    if (j == NULL)
      return luaL_error(L, "freeze: out of memory");
    j->L = tp__main_thread(L);
    lua_pushvalue(L, 3);
    j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 1); /* the box stays (not collected) until cb ran */
    j->ref_box = luaL_ref(L, LUA_REGISTRYINDEX);
    if (tp_dbox_freeze_start(b, frozen, tp__ltree_done, j, &err) < 0) {
      luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
      luaL_unref(L, LUA_REGISTRYINDEX, j->ref_box);
      free(j);
      return tp_l_push_err(L, &err);
    }
    lua_pushboolean(L, 1);
    return 1;
  }
  if (tp_cgroup_freeze(&b->cg, frozen, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

/* box:tree_take() -> name | nil: a spare tree (a cgroup made ahead) for the
 * next process, to send its EXEC with (box:send's tree); nil when none is
 * spare (then box:tree after a held EXEC).  A take that finds none, past
 * the box's first, has them made up in the thread pool (dbox.h). */
static int tp_lbox_tree_take(lua_State *L) {
  tp_dbox_t *b = tp__check_box(L);
  tp_dbox_tree_t *t = tp_dbox_tree_take(b);
  if (t == NULL)
    lua_pushnil(L);
  else
    lua_pushstring(L, t->name);
  return 1;
}

/* box:tree_refill([n]): has the spare trees made up to n (default and at
 * most TP_DBOX_SPARES) in the thread pool; none where the box keeps none
 * (no cgroup, or its processes not in it). */
static int tp_lbox_tree_refill(lua_State *L) {
  tp_dbox_t *b = tp__check_box(L);
  lua_Integer n = luaL_optinteger(L, 2, TP_DBOX_SPARES);
  luaL_argcheck(L, n >= 1 && n <= TP_DBOX_SPARES, 2, "out of range");
  tp_dbox_tree_refill_to(b, (int) n);
  return 0;
}

/* box:tree_signal(name, sig [, cb]): sig to every process of the tree;
 * SIGKILL kills it whole and waits until it is gone.  -> number signalled |
 * nil, msg.  With cb (SIGKILL only) the kill runs in the thread pool and
 * cb(n) or cb(nil, msg) runs after; the call returns true | nil, msg. */
static int tp_lbox_tree_signal(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  tp_dbox_tree_t *t = tp__check_tree(L, b);
  int sig = (int) luaL_checkinteger(L, 3);
  tp_error_t err = {0};
  size_t n = 0;
  luaL_argcheck(L, sig >= 1 && sig <= 64, 3, "bad signal");
  if (!lua_isnoneornil(L, 4)) {
    tp__ltree_t *j;
    luaL_checktype(L, 4, LUA_TFUNCTION);
    luaL_argcheck(L, sig == SIGKILL, 3, "only SIGKILL runs in the pool");
    j = malloc(sizeof(*j));
    if (j == NULL)
      return luaL_error(L, "tree: out of memory");
    j->L = tp__main_thread(L);
    lua_pushvalue(L, 4);
    j->ref_cb = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 1);
    j->ref_box = luaL_ref(L, LUA_REGISTRYINDEX);
    if (tp_dbox_tree_kill_start(b, t, tp__lkill_done, j, &err) < 0) {
      luaL_unref(L, LUA_REGISTRYINDEX, j->ref_cb);
      luaL_unref(L, LUA_REGISTRYINDEX, j->ref_box);
      free(j);
      return tp_l_push_err(L, &err);
    }
    lua_pushboolean(L, 1);
    return 1;
  }
  if (tp_dbox_tree_signal(b, t, sig, &n, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushinteger(L, (lua_Integer) n);
  return 1;
}

/* box:tree_count(name) -> processes left in the tree */
static int tp_lbox_tree_count(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  tp_dbox_tree_t *t = tp__check_tree(L, b);
  tp_error_t err = {0};
  size_t n = 0;
  if (tp_dbox_tree_count(b, t, &n, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushinteger(L, (lua_Integer) n);
  return 1;
}

/* box:tree_oom(name) -> the OOM kills counted in the tree's own cgroup, or
 * nil where its cgroup keeps no such counter (v2: a tree's sub has no
 * memory controller; the box's memory.events counts its kills). */
static int tp_lbox_tree_oom(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  tp_dbox_tree_t *t = tp__check_tree(L, b);
  int64_t n = t->cg.version == 1 ? tp_cgroup_oom_kills(&t->cg) : -1;
  if (n < 0)
    lua_pushnil(L);
  else
    lua_pushinteger(L, (lua_Integer) n);
  return 1;
}

/* box:tree_remove(name [, in_pool [, reuse]]): kills what is left of the
 * tree, removes its cgroup; in_pool: the tree is gone at once, its cgroup
 * removed in the thread pool (left to the box's destroy if that fails);
 * reuse (the caller counted no process left, and no kill touched it): it
 * may become a spare instead (tp_dbox_tree_recycle). */
static int tp_lbox_tree_remove(lua_State *L) {
  tp_dbox_t *b = tp__check_cg(L);
  tp_dbox_tree_t *t = tp__check_tree(L, b);
  tp_error_t err = {0};
  if (lua_toboolean(L, 3) && lua_toboolean(L, 4) && tp_dbox_tree_recycle(b, t)) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if ((lua_toboolean(L, 3) ? tp_dbox_tree_remove_start : tp_dbox_tree_remove)(b, t, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lbox_has_cgroup(lua_State *L) {
  lua_pushboolean(L, tp_dbox_has_cgroup(tp__check_box(L)));
  return 1;
}

/* box:resolv() -> true if the box's set-up wrote its /etc/resolv.conf
 * (core.start's resolv): the daemon need not have the agent write it */
static int tp_lbox_resolv(lua_State *L) {
  lua_pushboolean(L, tp__check_box(L)->box.resolv);
  return 1;
}

static int tp_lbox_pid(lua_State *L) {
  lua_pushinteger(L, tp__check_box(L)->box.pid);
  return 1;
}

static int tp_lbox_queued(lua_State *L) {
  lua_pushinteger(L, (lua_Integer) tp_dbox_queued(tp__check_box(L)));
  return 1;
}

static void tp__lbox_done_cb(tp_dbox_t *b, int ret, const tp_error_t *err) {
  tp_lbox_t *u = b->data;
  lua_State *L = u->L;
  int ref = u->ref_destroy;
  u->ref_destroy = LUA_NOREF;
  luaL_unref(L, LUA_REGISTRYINDEX, u->ref_dead); /* dead never ran: done says it */
  u->ref_dead = LUA_NOREF;
  if (ref == LUA_NOREF)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  if (ret < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err->msg);
  } else {
    lua_pushboolean(L, 1);
    lua_pushnil(L);
  }
  tp_lua_pcall(L, 2, 0, 0);
}

static void tp__lbox_dead_cb(tp_dbox_t *b, int ret, const tp_error_t *err) {
  tp_lbox_t *u = b->data;
  lua_State *L = u->L;
  int ref = u->ref_dead;
  (void) ret;
  (void) err;
  u->ref_dead = LUA_NOREF;
  if (ref == LUA_NOREF)
    return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  tp_lua_pcall(L, 0, 0, 0);
}

/* box:destroy(cb(ok, err)[, keep_upper[, dead()]]): kills every process of
 * the box and removes its directory in the thread pool; cb runs on the loop
 * when done.  dead (not with keep_upper): runs on the loop once every
 * process of the box is dead, before the removal (it may not run: a box
 * without a pidfd; cb still does).  keep_upper (an absolute path on the box dir's filesystem that does
 * not exist): the box's writable layer is moved there first (recipe setup
 * layers; a box with a disk cap has none to keep). */
static int tp_lbox_destroy(lua_State *L) {
  tp_lbox_t *u = tp__check_lbox(L);
  const char *keep = luaL_optstring(L, 3, NULL);
  tp_error_t err = {0};
  int queued;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (!lua_isnoneornil(L, 4))
    luaL_checktype(L, 4, LUA_TFUNCTION);
  if (u->b->destroyed)
    return luaL_error(L, "box already destroyed");
  luaL_argcheck(L, keep == NULL || (keep[0] == '/' && strlen(keep) < 4096), 3,
                "must be an absolute path");
  tp__lbox_unref(u);
  lua_pushvalue(L, 2);
  u->ref_destroy = luaL_ref(L, LUA_REGISTRYINDEX);
  if (!lua_isnoneornil(L, 4) && keep == NULL) {
    lua_pushvalue(L, 4);
    u->ref_dead = luaL_ref(L, LUA_REGISTRYINDEX);
    tp_dbox_on_dead(u->b, tp__lbox_dead_cb);
  }
  int r = tp_dbox_destroy(u->b, keep, tp__lbox_done_cb, &queued, &err);
  if (r < 0 || !queued) { /* not queued: done here, cb never runs */
    luaL_unref(L, LUA_REGISTRYINDEX, u->ref_destroy);
    u->ref_destroy = LUA_NOREF;
    luaL_unref(L, LUA_REGISTRYINDEX, u->ref_dead);
    u->ref_dead = LUA_NOREF;
    if (r < 0)
      return tp_l_push_err(L, &err);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int tp_lbox_gc(lua_State *L) {
  tp_lbox_t *u = luaL_checkudata(L, 1, TP_L_BOX_MT);
  tp_dbox_t *b = u->b;
  u->b = NULL;
  if (b == NULL)
    return 0;
  tp__lbox_unref(u);
  luaL_unref(L, LUA_REGISTRYINDEX, u->ref_destroy);
  u->ref_destroy = LUA_NOREF;
  luaL_unref(L, LUA_REGISTRYINDEX, u->ref_dead);
  u->ref_dead = LUA_NOREF;
  b->data = NULL;
  tp_dbox_release(b); /* destroys it here if destroy() never ran */
  return 0;
}

void tp_l_box_register(lua_State *L) {
  static const luaL_Reg box_methods[] = {
      {"on", tp_lbox_on},       {"send", tp_lbox_send},       {"pid", tp_lbox_pid},
      {"queued", tp_lbox_queued}, {"destroy", tp_lbox_destroy}, {"freeze", tp_lbox_freeze},
      {"stats", tp_lbox_stats}, {"tree", tp_lbox_tree}, {"tree_signal", tp_lbox_tree_signal},
      {"tree_count", tp_lbox_tree_count}, {"tree_remove", tp_lbox_tree_remove},
      {"tree_oom", tp_lbox_tree_oom}, {"tree_take", tp_lbox_tree_take},
      {"tree_refill", tp_lbox_tree_refill},
      {"has_cgroup", tp_lbox_has_cgroup}, {"resolv", tp_lbox_resolv},
      {"set_limits", tp_lbox_set_limits}, {NULL, NULL}};
  if (luaL_newmetatable(L, TP_L_BOX_MT)) {
    luaL_newlib(L, box_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, tp_lbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
}
