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

/* luaopen function of the `tupper.core` module (lcore.c). */
int luaopen_tupper_core(lua_State *L);

#endif
