/* The body of a libFuzzer target whose code under test is Lua (fuzz_rpc.c,
 * fuzz_net.c): one Lua state loads the modules of TUPPER_ROOT (or the source
 * tree this was built from) and tests/fuzz/FZ_HARNESS, which returns the
 * function that takes each input; any Lua error that escapes it is a
 * finding, printed with its traceback, and the target aborts so libFuzzer
 * saves the input.
 *
 * Neither liblua nor lua-cjson is built with coverage instrumentation, so the
 * fuzzer would be blind inside the Lua code.  A line hook gives it eyes: each
 * (previous line, line) pair of the running Lua code bumps a counter in
 * libFuzzer's extra-counters section, which it treats like edge coverage.
 *
 * Include it once, after defining FZ_NAME ("fuzz_rpc") and FZ_HARNESS
 * ("rpc_harness.lua"). */
#ifndef FZ_NAME
#error "define FZ_NAME and FZ_HARNESS before including lua_target.h"
#endif

#include <lauxlib.h>
#include <lua-cjson.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TP_SOURCE_DIR
#define TP_SOURCE_DIR "."
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_EDGES (1u << 16)

__attribute__((used, section("__libfuzzer_extra_counters"))) static uint8_t fz_edges[FZ_EDGES];

/* The fuzzer's one Lua state, made once by LLVMFuzzerInitialize. */
typedef struct fz_lua_s {
  lua_State *L;
  int ref_one;      /* the harness function */
  uintptr_t prev;   /* previous location, for edge hashing */
} fz_lua_t;

static fz_lua_t fz;

static void fz_hook(lua_State *L, lua_Debug *ar) {
  uintptr_t loc;
  if (!lua_getinfo(L, "S", ar))
    return;
  /* ar->source is the chunk's interned source name: stable while the
   * modules stay loaded, which they do for the whole run */
  loc = ((uintptr_t) ar->source * 0x9E3779B97F4A7C15u) ^ ((uintptr_t) ar->currentline * 0x85EBCA6Bu);
  loc ^= loc >> 29;
  fz_edges[(loc ^ (fz.prev >> 1)) & (FZ_EDGES - 1)]++;
  fz.prev = loc;
}

static int fz_traceback(lua_State *L) {
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

static void fz_die(const char *what) {
  fprintf(stderr, FZ_NAME ": %s: %s\n", what, lua_tostring(fz.L, -1));
  abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *root = getenv("TUPPER_ROOT");
  lua_State *L;
  (void) argc;
  (void) argv;
  if (root == NULL || *root == '\0')
    root = TP_SOURCE_DIR;
  L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, FZ_NAME ": no memory for a Lua state\n");
    abort();
  }
  fz.L = L;
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_cjson);
  lua_setfield(L, -2, "cjson");
  lua_pop(L, 1);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/lua/?.lua", root);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, "");
  lua_setfield(L, -2, "cpath"); /* only the modules of this tree */
  lua_pop(L, 1);

  lua_pushcfunction(L, fz_traceback);
  lua_pushfstring(L, "%s/tests/fuzz/" FZ_HARNESS, root);
  if (luaL_loadfile(L, lua_tostring(L, -1)) != LUA_OK)
    fz_die("load harness");
  lua_remove(L, -2);
  if (lua_pcall(L, 0, 1, -2) != LUA_OK)
    fz_die("run harness");
  if (!lua_isfunction(L, -1)) {
    lua_pushstring(L, "the harness must return a function");
    fz_die("harness");
  }
  fz.ref_one = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  lua_sethook(L, fz_hook, LUA_MASKLINE, 0);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L = fz.L;
  fz.prev = 0;
  lua_pushcfunction(L, fz_traceback);
  lua_rawgeti(L, LUA_REGISTRYINDEX, fz.ref_one);
  lua_pushlstring(L, (const char *) data, size);
  if (lua_pcall(L, 1, 0, -3) != LUA_OK)
    fz_die("a Lua error escaped");
  lua_pop(L, 1);
  return 0;
}
