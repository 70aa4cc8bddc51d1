#ifndef TP_TUPPER_H
#define TP_TUPPER_H

#include <lua.h>
#include <uv.h>

/* Runs the Lua entry point `tupper.main` with argv on a fresh loop; returns
 * the process exit code. */
int tp_main(int argc, char **argv);

/* Creates a Lua state bound to loop: standard libraries, luv on the same
 * loop with our own callback runner, cjson and tupper.core preloaded, and a
 * searcher for the Lua modules compiled into the binary.  NULL on OOM. */
lua_State *tp_lua_new(uv_loop_t *loop);

/* Calls the function below nargs arguments with a traceback handler.  Errors
 * are logged to stderr, never fatal.  Returns the number of results, or a
 * negative Lua status on error (the error is popped). */
int tp_lua_pcall(lua_State *L, int nargs, int nresults, int flags);

/* luaopen function of the `tupper.core` module (l_core.c). */
int luaopen_tupper_core(lua_State *L);

/* Closes a state made by tp_lua_new and frees its allocator's heap. */
void tp_lua_close(lua_State *L);

/* embedded_source(name) -> the text of an embedded Lua source ("recipes/
 * default"), or nil (lstate.c; registered in tupper.core). */
int tp_lua_embedded_source(lua_State *L);

/* The recipe VM (l_jail.c).  The state's allocator counts the bytes in use and,
 * while a run is active, refuses growth beyond the run's budget; the same
 * struct holds the run's instruction budget, read by the count hook. */
typedef struct tp_lvm_heap_s {
  lua_Alloc base;       /* the allocator wrapped, or NULL: realloc/free */
  void *base_ud;
  long long used;       /* bytes in use (signed: a wrapped state's older blocks) */
  long long limit;      /* while limited: used may not grow beyond this */
  int limited;
  int mem_tripped;      /* an allocation was refused in this run */
  int running;          /* a run is active (runs do not nest) */
  long long instr_left; /* instructions left in this run */
  int instr_tripped;    /* the run spent its instructions (1) or time (2) */
  long long deadline_ns; /* CLOCK_MONOTONIC end of the run */
  const char *trip_source; /* where the hook stopped the run: the source */
  int trip_line;           /* and line of the innermost function (or -1) */
} tp_lvm_heap_t;

void tp_lvm_heap_init(tp_lvm_heap_t *h, lua_Alloc base, void *base_ud);
/* lua_Alloc over a tp_lvm_heap_t. */
void *tp_lvm_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* run(fn, instruction_limit, memory_limit, time_limit_ms, ...)
 *   -> true, results... | nil, msg
 * (tupper.recipe.jail_core.run, and tupper.core.jail_run). */
int tp_lvm_run(lua_State *L);
/* luaopen function of `tupper.recipe.jail_core` (also built as a loadable module for
 * the Lua specs: build/lua/tupper/recipe/jail_core.so). */
int luaopen_tupper_recipe_jail_core(lua_State *L);

/* sha256(s...) -> the hex SHA-256 of the strings, concatenated; raises when
 * libcrypto cannot be loaded (l_digest.c: tupper.util.digest.sha256, and
 * tupper.core.sha256). */
int tp_ldigest_sha256(lua_State *L);
/* luaopen function of `tupper.util.digest` (also built as a loadable module
 * for the Lua specs: build/lua/tupper/util/digest.so). */
int luaopen_tupper_util_digest(lua_State *L);
/* luaopen function of `tupper.wire.pump`, the client's data connection in C
 * (l_pump.c; also built as build/lua/tupper/wire/pump.so for the specs). */
int luaopen_tupper_wire_pump(lua_State *L);

#endif
