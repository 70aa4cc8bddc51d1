#define _GNU_SOURCE /* O_PATH, dup3 */
/* The Lua state shared with the libuv loop (luv), and the process entry. */
#include "tupper.h"

#include <lauxlib.h>
#include <lua-cjson.h>
#include <lualib.h>
#include <luv/luv.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "fast.h"
#include "job.h"

int tp_lua_pcall(lua_State *L, int nargs, int nresults, int flags) {
  int base = lua_gettop(L) - nargs; /* index of the function */
  int ret;
  (void) flags;
  lua_getglobal(L, "debug");
  lua_getfield(L, -1, "traceback");
  lua_remove(L, -2);
  lua_insert(L, base);
  ret = lua_pcall(L, nargs, nresults, base);
  if (ret != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "tupper: error in callback: %s\n", msg ? msg : "(not a string)");
    lua_pop(L, 1);
    lua_remove(L, base);
    return -ret;
  }
  lua_remove(L, base);
  if (nresults == LUA_MULTRET)
    nresults = lua_gettop(L) - base + 1;
  return nresults;
}

/* package.searchers entry: finds modules compiled into the binary.  The
 * environment variable TUPPER_LUA_DIR, when set, wins (development). */
static int tp__embedded_searcher(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  for (size_t i = 0; i < tp_lua_sources_count; i++) {
    if (strcmp(tp_lua_sources[i].name, name) == 0) {
      char chunk[256];
      snprintf(chunk, sizeof(chunk), "@embedded:%s", name);
      /* our own modules, compiled at build time; never code from outside
       * (recipes and policies load as text into a locked-down state) */
      if (luaL_loadbufferx(L, tp_lua_sources[i].src, tp_lua_sources[i].len, chunk, "bt") != LUA_OK)
        return lua_error(L);
      lua_pushstring(L, chunk);
      return 2;
    }
  }
  lua_pushfstring(L, "no embedded module '%s'", name);
  return 1;
}

static int tp__open_luv(lua_State *L) { return luaopen_luv(L); }

/* Lua's default panic handler, as luaL_newstate installs it. */
static int tp__lua_panic(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "tupper: unprotected error in Lua: %s\n", msg ? msg : "(not a string)");
  return 0; /* Lua aborts */
}

int tp_lua_embedded_source(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  for (size_t i = 0; i < tp_lua_sources_count; i++) {
    if (strcmp(tp_lua_sources[i].name, name) == 0) {
      lua_pushlstring(L, tp_lua_sources[i].src, tp_lua_sources[i].len);
      return 1;
    }
  }
  lua_pushnil(L);
  return 1;
}

lua_State *tp_lua_new(uv_loop_t *loop) {
  /* the counting allocator of lvm.c: recipe and policy runs get a memory
   * budget (its heap outlives the state: tp_lua_close frees it) */
  tp_lvm_heap_t *heap = malloc(sizeof(*heap));
  lua_State *L;
  if (heap == NULL)
    return NULL;
  tp_lvm_heap_init(heap, NULL, NULL);
  L = lua_newstate(tp_lvm_alloc, heap);
  if (L == NULL) {
    free(heap);
    return NULL;
  }
  lua_atpanic(L, tp__lua_panic);
  luaL_openlibs(L);
  luv_set_loop(L, loop);
  luv_set_callback(L, tp_lua_pcall);

  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, tp__open_luv);
  lua_setfield(L, -2, "luv");
  lua_pushcfunction(L, luaopen_cjson);
  lua_setfield(L, -2, "cjson");
  lua_pushcfunction(L, luaopen_tupper_core);
  lua_setfield(L, -2, "tupper.core");
  lua_pushcfunction(L, luaopen_tupper_recipe_jail_core);
  lua_setfield(L, -2, "tupper.recipe.jail_core");
  lua_pushcfunction(L, luaopen_tupper_util_digest);
  lua_setfield(L, -2, "tupper.util.digest");
  lua_pushcfunction(L, luaopen_tupper_wire_pump);
  lua_setfield(L, -2, "tupper.wire.pump");
  lua_pop(L, 1);

  /* embedded modules go right after the preload searcher, unless a
   * development directory is given */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchers");
  if (getenv("TUPPER_LUA_DIR") == NULL) {
    lua_Integer n = (lua_Integer) luaL_len(L, -1);
    for (lua_Integer i = n; i >= 2; i--) {
      lua_rawgeti(L, -1, i);
      lua_rawseti(L, -2, i + 1);
    }
    lua_pushcfunction(L, tp__embedded_searcher);
    lua_rawseti(L, -2, 2);
  } else {
    lua_pushfstring(L, "%s/?.lua", getenv("TUPPER_LUA_DIR"));
    lua_setfield(L, -3, "path");
  }
  lua_pop(L, 2);
  return L;
}

void tp_lua_close(lua_State *L) {
  void *heap = NULL;
  lua_getallocf(L, &heap);
  lua_close(L);
  free(heap);
}

static void tp__close_walk_cb(uv_handle_t *h, void *arg) {
  (void) arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* A closed 0, 1 or 2 would be taken by the next fd we open (the daemon's
 * socket, say): the command's output would go into our own connection, and
 * libuv asserts when it closes a handle at those numbers.  Each closed one
 * gets an O_PATH fd of /dev/null: it holds the number, and a read or a write
 * on it still fails with EBADF, as on the closed fd, so a verb that uses it
 * says so.  Close-on-exec: a child sees it closed, as we were given it. */
static void tp__hold_std_fds(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    int nfd = open("/dev/null", O_PATH | O_CLOEXEC);
    if (nfd < 0)
      continue;
    if (nfd != fd) { /* a lower number was closed too: it is held next */
      if (dup3(nfd, fd, O_CLOEXEC) < 0) {
        close(nfd);
        continue;
      }
      close(nfd);
    }
  }
}

/* Whether the tupper command (runtime/front.c) ran the C client on this
 * command line already and it declined: then not twice.  The variable is
 * dropped at once, so nothing this process starts sees it. */
static int tp__front_declined(void) {
  int declined = getenv("TUPPER_FRONT_DECLINED") != NULL;
  if (declined)
    unsetenv("TUPPER_FRONT_DECLINED");
  return declined;
}

int tp_main(int argc, char **argv) {
  uv_loop_t loop;
  lua_State *L;
  int code = 1;

  /* A peer that goes away must cost its connection an EPIPE, never the
   * whole daemon a SIGPIPE (libuv writes with plain write()).  Children get
   * the default back: the agent resets every signal before it execs. */
  signal(SIGPIPE, SIG_IGN);
  /* exec and run in C, before any Lua state is made, when the command line
   * is one the C client fully understands (runtime/client/fast.h) */
  if (!tp__front_declined() && tp_fast_main(argc, argv, &code))
    return code;
  tp__hold_std_fds();
  if (uv_loop_init(&loop) != 0) {
    fprintf(stderr, "tupper: cannot initialise the event loop\n");
    return 1;
  }
  L = tp_lua_new(&loop);
  if (L == NULL) {
    fprintf(stderr, "tupper: out of memory\n");
    uv_loop_close(&loop);
    return 1;
  }
  lua_getglobal(L, "require");
  lua_pushstring(L, "tupper.main");
  if (tp_lua_pcall(L, 1, 1, 0) == 1) {
    lua_newtable(L);
    for (int i = 0; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i);
    }
    if (tp_lua_pcall(L, 1, 1, 0) == 1) {
      int isnum = 0;
      lua_Integer v = lua_tointegerx(L, -1, &isnum);
      code = isnum ? (int) (v & 0xff) : 0;
      lua_pop(L, 1);
    }
  }
  /* Shutdown order: Lua's main has closed its handles and drained the loop;
   * closing the state collects what is left (a box's __gc kills it), the
   * loop runs the close callbacks and the jobs that queued (a box's
   * removal), the worker threads are joined, then any stray handle is
   * closed. */
  tp_lua_close(L);
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop);
  uv_walk(&loop, tp__close_walk_cb, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop); /* workers made again by a close callback's job */
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    fprintf(stderr, "tupper: event loop still busy at exit\n");
  return code;
}
