/* tupper.recipe.jail_core: runs untrusted Lua (recipes, policy files, their hooks)
 * inside the daemon's own state, with a budget.
 *
 * Two limits, both per run:
 *  - instructions: the run executes in a fresh coroutine with a count hook.
 *    Once the budget is spent the hook yields the coroutine out of the run
 *    (a yield is not an error: pcall cannot catch it), and re-arms itself
 *    with a count of 1, so code that catches the error it raises where it
 *    cannot yield dies again at its next instruction.
 *  - time: instructions are not all equal (an error unwinding through a
 *    coroutine's pcall costs about 100 times a plain one), so the hook also
 *    checks a monotonic deadline, as redis does for its scripts.
 *  - memory: the state's allocator counts the bytes in use; while a run is
 *    active, an allocation that would grow the heap beyond the run's budget
 *    fails (Lua raises "not enough memory").  A recipe that catches that
 *    error stays out of memory until the instruction hook ends it.
 *
 * The allocator is installed by lstate.c (lua_newstate), or, in a state we
 * did not create (busted loading this file as a C module), wrapped around
 * the state's allocator when the module opens.  Only the environment the
 * code runs in (lua/tupper/vm.lua) decides what it can reach; this file
 * only bounds what it can spend. */
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tupper.h"

#define TP_LVM_HEAP_KEY "tupper.recipe.jail_core.heap"
#define TP_LVM_STEP 1000 /* instructions between two hook calls */
#define TP_LVM_STR_(x) #x
#define TP_LVM_STR(x) TP_LVM_STR_(x)
#define TP_LVM_INSTR_MSG "recipe: instruction limit exceeded"
#define TP_LVM_TRIP_INSTR 1
#define TP_LVM_TRIP_TIME 2

/* ------------------------------------------------------------- allocator */

void tp_lvm_heap_init(tp_lvm_heap_t *h, lua_Alloc base, void *base_ud) {
  h->base = base;
  h->base_ud = base_ud;
  h->used = 0;
  h->limit = 0;
  h->limited = 0;
  h->mem_tripped = 0;
  h->running = 0;
  h->instr_left = 0;
  h->instr_tripped = 0;
  h->deadline_ns = 0;
  h->trip_source = NULL;
  h->trip_line = -1;
}

static long long tp__lvm_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void *tp_lvm_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  tp_lvm_heap_t *h = ud;
  size_t old = ptr != NULL ? osize : 0; /* without a block, osize is a type tag */
  void *p;

  if (nsize == 0) {
    if (h->base != NULL)
      h->base(h->base_ud, ptr, osize, 0);
    else
      free(ptr);
    h->used -= (long long) old;
    return NULL;
  }
  /* Lua assumes shrinking never fails: only growth is refused */
  if (h->limited && nsize > old && h->used + (long long) (nsize - old) > h->limit) {
    /* out of memory for good: the hook ends the run at its next call,
     * even if the code catches this error (and every retry would cost a
     * full collection of the heap) */
    h->mem_tripped = 1;
    h->instr_left = 0;
    return NULL;
  }
  p = h->base != NULL ? h->base(h->base_ud, ptr, osize, nsize) : realloc(ptr, nsize);
  if (p != NULL)
    h->used += (long long) nsize - (long long) old;
  return p;
}

/* The heap of L's state, or NULL when its allocator is not ours. */
static tp_lvm_heap_t *tp__lvm_heap(lua_State *L) {
  void *ud = NULL;
  if (lua_getallocf(L, &ud) != tp_lvm_alloc)
    return NULL;
  return ud;
}

/* ------------------------------------------------------------------ runs */

static void tp__lvm_hook(lua_State *L, lua_Debug *ar) {
  tp_lvm_heap_t *h = tp__lvm_heap(L);
  (void) ar;
  if (h == NULL || !h->running)
    return;
  if (!h->instr_tripped) {
    h->instr_left -= TP_LVM_STEP; /* may already be 0: out of memory */
    if (h->instr_left <= 0)
      h->instr_tripped = TP_LVM_TRIP_INSTR;
    else if (tp__lvm_now_ns() >= h->deadline_ns)
      h->instr_tripped = TP_LVM_TRIP_TIME;
    else
      return;
  }
  /* From now on the hook runs at every instruction of this thread.  It
   * yields: the run's lua_resume returns at once and the coroutine is
   * dropped, with no pcall on the way to catch anything (unwinding error
   * by error through pcalls can take quadratic time: a recovered error
   * resets the C-stack depth, so recursion through pcall grows without
   * bound).  Inside a C call that cannot yield (a sort comparator), it
   * raises instead, and yields at the first instruction back in Lua. */
  lua_sethook(L, tp__lvm_hook, LUA_MASKCOUNT, 1);
  /* a thread suspended by a hook reports the line before the one it ran:
   * keep the real one for messages (tp__lvm_where) */
  if (h->trip_line < 0 && lua_getinfo(L, "Sl", ar)) {
    h->trip_source = ar->source;
    h->trip_line = ar->currentline;
  }
  if (lua_isyieldable(L)) {
    lua_yield(L, 0);
    return;
  }
  luaL_error(L, TP_LVM_INSTR_MSG);
}

/* Pushes the message of a failed run: what the limits say first, since the
 * error object of a run that hit one is often a secondary error. */
static void tp__lvm_push_failure(lua_State *L, lua_State *co, int status,
                                 const tp_lvm_heap_t *h, lua_Integer mem_limit,
                                 lua_Integer time_limit) {
  if (h->mem_tripped && (status == LUA_ERRMEM || h->instr_tripped)) {
    lua_pushfstring(L, "recipe: memory limit exceeded (%I bytes)", mem_limit);
  } else if (h->instr_tripped == TP_LVM_TRIP_TIME) {
    lua_pushfstring(L, "recipe: time limit exceeded (%I ms)", time_limit);
  } else if (h->instr_tripped) {
    lua_pushstring(L, TP_LVM_INSTR_MSG);
  } else if (status == LUA_YIELD) {
    lua_pushstring(L, "recipe: yield outside a coroutine");
  } else if (lua_type(co, -1) == LUA_TSTRING || lua_type(co, -1) == LUA_TNUMBER) {
    /* never call __tostring: that would run recipe code without a budget */
    lua_pushstring(L, lua_tostring(co, -1));
  } else {
    lua_pushfstring(L, "recipe: error (a %s value)", luaL_typename(co, -1));
  }
}

/* run(fn, instruction_limit, memory_limit, time_limit_ms, ...)
 *   -> true, results... | nil, msg
 * Calls fn(...) in a fresh coroutine under the budgets.  memory_limit is
 * how many bytes the heap may grow by during the run; time_limit_ms is
 * checked every TP_LVM_STEP instructions. */
int tp_lvm_run(lua_State *L) {
  tp_lvm_heap_t *h;
  lua_State *co;
  lua_Integer instr_limit, mem_limit, time_limit;
  int nargs, nres = 0, status;

  luaL_checktype(L, 1, LUA_TFUNCTION);
  instr_limit = luaL_checkinteger(L, 2);
  mem_limit = luaL_checkinteger(L, 3);
  time_limit = luaL_checkinteger(L, 4);
  luaL_argcheck(L, instr_limit > 0, 2, "must be positive");
  luaL_argcheck(L, mem_limit > 0, 3, "must be positive");
  luaL_argcheck(L, time_limit > 0 && time_limit < 86400000, 4, "must be 1 ms to a day");
  h = tp__lvm_heap(L);
  if (h == NULL)
    return luaL_error(L, "vm run: the Lua state's allocator is not tupper's");
  if (h->running) {
    lua_pushnil(L);
    lua_pushstring(L, "recipe: a VM run cannot start another one");
    return 2;
  }
  nargs = lua_gettop(L) - 4;

  /* everything the run needs is allocated before the budget starts */
  co = lua_newthread(L);
  lua_insert(L, 1); /* keep the thread below the arguments (6..top) */
  lua_pushvalue(L, 2);             /* fn */
  lua_xmove(L, co, 1);
  if (nargs > 0) {
    if (!lua_checkstack(co, nargs + LUA_MINSTACK))
      return luaL_error(L, "vm run: too many arguments");
    lua_xmove(L, co, nargs);
  }

  h->running = 1;
  h->instr_tripped = 0;
  h->mem_tripped = 0;
  h->trip_source = NULL;
  h->trip_line = -1;
  h->instr_left = instr_limit;
  h->limit = h->used + mem_limit;
  h->deadline_ns = tp__lvm_now_ns() + (long long) time_limit * 1000000LL;
  h->limited = 1;
  lua_sethook(co, tp__lvm_hook, LUA_MASKCOUNT,
              instr_limit < TP_LVM_STEP ? (int) instr_limit : TP_LVM_STEP);
  if (instr_limit < TP_LVM_STEP)
    h->instr_left = TP_LVM_STEP; /* one hook call spends the whole budget */

  status = lua_resume(co, L, nargs, &nres);

  h->limited = 0;
  h->running = 0;
  lua_sethook(co, NULL, 0, 0);

  if (status == LUA_OK) {
    if (!lua_checkstack(L, nres + 1)) {
      lua_pushnil(L);
      lua_pushstring(L, "recipe: too many results");
      return 2;
    }
    lua_pushboolean(L, 1);
    lua_xmove(co, L, nres);
    return nres + 1;
  }
  lua_pushnil(L);
  tp__lvm_push_failure(L, co, status, h, mem_limit, time_limit);
  return 2;
}

/* --------------------------------------------------------------- sessions
 *
 * A session is a run that may pause: recipe setup calls box:run, which
 * yields out of the run to the daemon (a request to the agent), and the
 * daemon resumes it with the answer.  The budgets hold across the slices:
 * instructions and memory growth add up, and the time budget counts only
 * the time spent inside slices (Lua running), not the waits between them.
 * Instructions between two hook calls are not seen by the hook, and a box
 * call costs the daemon far more than an instruction, so each slice is
 * charged TP_LVM_SLICE_COST more: a setup that loops over cheap box calls
 * runs out too (after 5000 of them with the setup's budget). */

#define TP_LVM_SLICE_COST 10000

#define TP_LVM_SESSION_MT "tupper.recipe.jail_core.session"

typedef struct tp_lvm_session_s {
  long long instr_left;  /* instructions left over every slice */
  long long mem_limit;   /* bytes the heap may grow by over the session */
  long long mem_grown;   /* net growth of the slices so far */
  long long ns_left;     /* Lua time left */
  lua_Integer time_limit; /* ms, for messages */
  int state;             /* 0 new, 1 suspended, 2 ended */
  char chunk[256];       /* source of the code whose line a failure names */
} tp_lvm_session_t;

/* session(fn, instruction_limit, memory_limit, time_limit_ms[, chunk])
 *   -> session
 * chunk: the source name of the code run ("@recipes/x.lua"); a run stopped
 * by a budget is reported at its line there. */
static int tp__lvm_session(lua_State *L) {
  tp_lvm_session_t *s;
  lua_State *co;
  lua_Integer instr_limit, mem_limit, time_limit;

  luaL_checktype(L, 1, LUA_TFUNCTION);
  instr_limit = luaL_checkinteger(L, 2);
  mem_limit = luaL_checkinteger(L, 3);
  time_limit = luaL_checkinteger(L, 4);
  luaL_argcheck(L, instr_limit >= TP_LVM_STEP, 2, "must be at least " TP_LVM_STR(TP_LVM_STEP));
  luaL_argcheck(L, mem_limit > 0, 3, "must be positive");
  luaL_argcheck(L, time_limit > 0 && time_limit < 86400000, 4, "must be 1 ms to a day");
  const char *chunk = luaL_optstring(L, 5, "");
  if (tp__lvm_heap(L) == NULL)
    return luaL_error(L, "vm session: the Lua state's allocator is not tupper's");
  lua_settop(L, 4);
  s = lua_newuserdatauv(L, sizeof(*s), 1);
  snprintf(s->chunk, sizeof(s->chunk), "%s", chunk);
  s->instr_left = instr_limit;
  s->mem_limit = mem_limit;
  s->mem_grown = 0;
  s->ns_left = (long long) time_limit * 1000000LL;
  s->time_limit = time_limit;
  s->state = 0;
  co = lua_newthread(L);
  lua_pushvalue(L, 1);
  lua_xmove(L, co, 1);
  lua_setiuservalue(L, -2, 1);
  luaL_setmetatable(L, TP_LVM_SESSION_MT);
  return 1;
}

/* Prefixes the message on top of L with "file:line: ", the innermost line
 * of co running code of source chunk (what a budget stopped). */
static void tp__lvm_where(lua_State *L, lua_State *co, const tp_lvm_heap_t *h, const char *chunk) {
  lua_Debug ar;
  if (chunk[0] == '\0')
    return;
  for (int level = 0; lua_getstack(co, level, &ar); level++) {
    int line;
    if (!lua_getinfo(co, "Sl", &ar) || strcmp(ar.source, chunk) != 0)
      continue;
    line = ar.currentline;
    if (level == 0 && h->trip_line > 0 && h->trip_source == ar.source)
      line = h->trip_line;
    if (line <= 0)
      continue;
    lua_pushfstring(L, "%s:%d: %s", chunk[0] == '@' ? chunk + 1 : chunk, line, lua_tostring(L, -1));
    lua_remove(L, -2);
    return;
  }
}

static void tp__lvm_session_end(lua_State *L, tp_lvm_session_t *s, int idx) {
  s->state = 2;
  lua_pushnil(L);
  lua_setiuservalue(L, idx, 1); /* the thread is dropped, unfinished */
}

/* session:resume(...) -> "yield", values... | "done", results... | nil, msg
 * Runs the session's function (first call: with ... as arguments) until it
 * yields (a box call), returns, fails or spends a budget.  After "done" or
 * a failure the session is over. */
static int tp__lvm_session_resume(lua_State *L) {
  tp_lvm_session_t *s = luaL_checkudata(L, 1, TP_LVM_SESSION_MT);
  tp_lvm_heap_t *h = tp__lvm_heap(L);
  lua_State *co;
  int nargs = lua_gettop(L) - 1, nres = 0, status;
  long long start_ns, start_used, mem_left;

  if (s->state == 2)
    return luaL_error(L, "vm session: already ended");
  if (h == NULL)
    return luaL_error(L, "vm session: the Lua state's allocator is not tupper's");
  if (h->running) {
    lua_pushnil(L);
    lua_pushstring(L, "recipe: a VM run cannot start another one");
    return 2;
  }
  lua_getiuservalue(L, 1, 1);
  co = lua_tothread(L, -1);
  if (co == NULL)
    return luaL_error(L, "vm session: no thread");
  lua_insert(L, 2); /* kept on the stack, below the arguments, until we return */
  if (s->instr_left <= 0 || s->ns_left <= 0 || s->mem_grown >= s->mem_limit) {
    tp__lvm_session_end(L, s, 1);
    lua_pushnil(L);
    if (s->mem_grown >= s->mem_limit)
      lua_pushfstring(L, "recipe: memory limit exceeded (%I bytes)", (lua_Integer) s->mem_limit);
    else if (s->ns_left <= 0)
      lua_pushfstring(L, "recipe: time limit exceeded (%I ms)", s->time_limit);
    else
      lua_pushstring(L, TP_LVM_INSTR_MSG);
    tp__lvm_where(L, co, h, s->chunk);
    return 2;
  }
  if (nargs > 0) {
    if (!lua_checkstack(co, nargs + LUA_MINSTACK))
      return luaL_error(L, "vm session: too many arguments");
    lua_xmove(L, co, nargs);
  }

  mem_left = s->mem_limit - s->mem_grown;
  h->running = 1;
  h->instr_tripped = 0;
  h->mem_tripped = 0;
  h->instr_left = s->instr_left;
  h->trip_source = NULL;
  h->trip_line = -1;
  start_used = h->used;
  h->limit = h->used + mem_left;
  start_ns = tp__lvm_now_ns();
  h->deadline_ns = start_ns + s->ns_left;
  h->limited = 1;
  lua_sethook(co, tp__lvm_hook, LUA_MASKCOUNT, TP_LVM_STEP);

  status = lua_resume(co, L, nargs, &nres);
  s->state = 1;

  h->limited = 0;
  h->running = 0;
  lua_sethook(co, NULL, 0, 0);
  s->instr_left = h->instr_left - TP_LVM_SLICE_COST;
  s->ns_left -= tp__lvm_now_ns() - start_ns;
  s->mem_grown += h->used - start_used;

  if ((status == LUA_OK || status == LUA_YIELD) && !h->instr_tripped && !h->mem_tripped) {
    if (!lua_checkstack(L, nres + 1)) {
      tp__lvm_session_end(L, s, 1);
      lua_pushnil(L);
      lua_pushstring(L, "recipe: too many results");
      return 2;
    }
    lua_pushstring(L, status == LUA_OK ? "done" : "yield");
    lua_xmove(co, L, nres);
    if (status == LUA_OK)
      tp__lvm_session_end(L, s, 1);
    return nres + 1;
  }
  lua_pushnil(L);
  tp__lvm_push_failure(L, co, h->mem_tripped ? LUA_ERRMEM : status == LUA_YIELD ? LUA_ERRRUN : status, h,
                       (lua_Integer) s->mem_limit, s->time_limit);
  if (h->instr_tripped || h->mem_tripped)
    tp__lvm_where(L, co, h, s->chunk);
  tp__lvm_session_end(L, s, 1);
  return 2;
}

/* usage() -> bytes the state holds, as the allocator counts them. */
static int tp__lvm_usage(lua_State *L) {
  tp_lvm_heap_t *h = tp__lvm_heap(L);
  if (h == NULL)
    return luaL_error(L, "vm usage: the Lua state's allocator is not tupper's");
  lua_pushinteger(L, (lua_Integer) h->used);
  return 1;
}

/* ------------------------------------------------- foreign states (tests) */

/* __gc of the heap userdata of a state we did not create: lua_close runs
 * finalizers before it frees the other objects, so handing the allocator
 * back here is safe; the blocks were all made by that allocator anyway. */
static int tp__lvm_heap_gc(lua_State *L) {
  tp_lvm_heap_t *h = lua_touserdata(L, 1);
  if (lua_getallocf(L, NULL) == tp_lvm_alloc)
    lua_setallocf(L, h->base, h->base_ud);
  return 0;
}

static void tp__lvm_install(lua_State *L) {
  void *ud = NULL;
  lua_Alloc f = lua_getallocf(L, &ud);
  tp_lvm_heap_t *h;

  if (f == tp_lvm_alloc)
    return;
  h = lua_newuserdatauv(L, sizeof(*h), 0);
  tp_lvm_heap_init(h, f, ud);
  lua_newtable(L);
  lua_pushcfunction(L, tp__lvm_heap_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, TP_LVM_HEAP_KEY);
  lua_setallocf(L, tp_lvm_alloc, h);
}

int luaopen_tupper_recipe_jail_core(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"run", tp_lvm_run}, {"session", tp__lvm_session}, {"usage", tp__lvm_usage}, {NULL, NULL}};
  static const luaL_Reg session_methods[] = {{"resume", tp__lvm_session_resume}, {NULL, NULL}};
  tp__lvm_install(L);
  if (luaL_newmetatable(L, TP_LVM_SESSION_MT)) {
    luaL_newlib(L, session_methods);
    lua_setfield(L, -2, "__index");
    lua_pushliteral(L, "locked");
    lua_setfield(L, -2, "__metatable");
  }
  lua_pop(L, 1);
  luaL_newlib(L, funcs);
  lua_pushinteger(L, TP_LVM_STEP);
  lua_setfield(L, -2, "STEP");
  return 1;
}
