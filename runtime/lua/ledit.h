#ifndef TP_LEDIT_H
#define TP_LEDIT_H

#include <lua.h>

/* Line editing for `tupper repl` (ledit.c), registered in tupper.core. */
int tp_lcore_ledit_open(lua_State *L);
int tp_lcore_ledit_prompt(lua_State *L);
int tp_lcore_ledit_feed(lua_State *L);
int tp_lcore_ledit_clear(lua_State *L);
int tp_lcore_ledit_add_history(lua_State *L);
int tp_lcore_ledit_close(lua_State *L);

#endif
