/* Line editing for `tupper repl`: libedit through its readline interface,
 * in callback mode so that the libuv loop never blocks on the terminal.
 *
 * Lua polls stdin with uv_poll and calls ledit_feed() when it is readable;
 * libedit reads what it needs and, once a line is complete, hands it over.
 * Tab completion calls back into a Lua function.  readline's interface is
 * process-wide (one terminal), so this file keeps the little state it needs
 * in statics; the lua_State is only borrowed during a feed.
 *
 * libedit is opened with dlopen at the REPL's first prompt, not linked:
 * linked, it and the libraries it pulls in (libtinfo, libbsd, libmd) cost
 * every tupper process about 0.6 ms of CPU at start-up, `tupper exec`'s
 * C client included (docs/benchmarks.md, "Startup").  The header gives the
 * types; every symbol is reached through the table below. */
#include <dlfcn.h>
#include <errno.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <editline/readline.h>

#include "l_core.h"

#define TP_LEDIT_COMPLETER "tupper.ledit.completer"
#define TP_LEDIT_HISTORY_MAX 1000

enum { TP_LEDIT_NONE, TP_LEDIT_LINE, TP_LEDIT_EOF };

/* libedit's soname: the package's Depends names it (runtime/dist/mkdeb.sh) */
#define TP_LEDIT_LIB "libedit.so.2"

/* What this file uses of libedit, by name, as the header declares it. */
#define TP__LEDIT_SYMS(X)                                                                    \
  X(rl_readline_name) X(rl_line_buffer) X(rl_basic_word_break_characters)                   \
  X(rl_attempted_completion_function) X(rl_attempted_completion_over)                       \
  X(rl_completion_append_character) X(rl_catch_signals) X(rl_catch_sigwinch)                \
  X(rl_callback_handler_install) X(rl_callback_handler_remove) X(rl_callback_read_char)     \
  X(rl_replace_line) X(using_history) X(stifle_history) X(read_history) X(add_history)      \
  X(write_history)

static struct {
  void *lib;
#define TP__LEDIT_FIELD(name) __typeof__(&name) name;
  TP__LEDIT_SYMS(TP__LEDIT_FIELD)
#undef TP__LEDIT_FIELD
} tp__el;

/* Opens libedit once: 0, or -1 with *why set. */
static int tp__ledit_load(const char **why) {
  void *lib;
  if (tp__el.lib != NULL)
    return 0;
  lib = dlopen(TP_LEDIT_LIB, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    *why = dlerror();
    return -1;
  }
#define TP__LEDIT_SYM(name)                                                                  \
  if ((tp__el.name = (__typeof__(tp__el.name)) dlsym(lib, #name)) == NULL) {                  \
    *why = "libedit lacks " #name;                                                           \
    dlclose(lib);                                                                            \
    return -1;                                                                               \
  }
  TP__LEDIT_SYMS(TP__LEDIT_SYM)
#undef TP__LEDIT_SYM
  tp__el.lib = lib;
  return 0;
}

static struct {
  lua_State *L; /* set only while rl_callback_read_char runs */
  int got;      /* TP_LEDIT_*: what the line handler received */
  char *line;   /* malloc'ed by libedit */
  int installed;
} tp__ledit;

static void tp__ledit_on_line(char *line) {
  free(tp__ledit.line);
  tp__ledit.line = line;
  tp__ledit.got = line ? TP_LEDIT_LINE : TP_LEDIT_EOF;
  /* the prompt is done: hand the terminal back in its normal mode */
  tp__el.rl_callback_handler_remove();
  tp__ledit.installed = 0;
}

/* Runs under lua_pcall: calls the completer and leaves a table of strings. */
static int tp__ledit_complete_protected(lua_State *L) {
  const char *text = lua_touserdata(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, TP_LEDIT_COMPLETER);
  lua_pushstring(L, text);
  lua_pushstring(L, *tp__el.rl_line_buffer ? *tp__el.rl_line_buffer : "");
  lua_call(L, 2, 1);
  if (!lua_istable(L, -1))
    return 0;
  for (lua_Integer i = 1, n = (lua_Integer) lua_rawlen(L, -1); i <= n; i++) {
    lua_rawgeti(L, -1, i);
    if (lua_type(L, -1) != LUA_TSTRING)
      return 0;
    lua_pop(L, 1);
  }
  return 1;
}

static void tp__free_matches(char **m, size_t n) {
  for (size_t i = 0; i <= n; i++)
    free(m[i]);
  free(m);
}

/* readline's contract: NULL, or [0] the text to put in place of `text`
 * (the longest common prefix), [1..n] the candidates, NULL-terminated; a
 * single candidate is [0] alone.  libedit frees it. */
static char **tp__ledit_complete(const char *text, int start, int end) {
  lua_State *L = tp__ledit.L;
  char **m = NULL;
  size_t n, lcp;
  (void) start;
  (void) end;
  *tp__el.rl_attempted_completion_over = 1; /* no fallback to file names */
  if (L == NULL)
    return NULL;
  lua_pushcfunction(L, tp__ledit_complete_protected);
  lua_pushlightuserdata(L, (void *) text);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  n = (size_t) lua_rawlen(L, -1);
  if (n > 0)
    m = calloc(n + 2, sizeof(*m));
  for (size_t i = 1; m != NULL && i <= n; i++) {
    lua_rawgeti(L, -1, (lua_Integer) i);
    m[i] = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (m[i] == NULL) {
      tp__free_matches(m, n);
      m = NULL;
    }
  }
  lua_pop(L, 1);
  if (m == NULL)
    return NULL;
  if (n == 1) {
    m[0] = m[1];
    m[1] = NULL;
    return m;
  }
  lcp = strlen(m[1]);
  for (size_t i = 2; i <= n; i++) {
    size_t k = 0;
    while (k < lcp && m[i][k] == m[1][k])
      k++;
    lcp = k;
  }
  m[0] = strndup(m[1], lcp);
  if (m[0] == NULL) {
    tp__free_matches(m, n);
    return NULL;
  }
  return m;
}

/* core.ledit_open(history_path|nil, completer): sets libedit up and loads
 * the history (at most 1000 lines).  completer(text, line) returns the
 * candidates that replace text, the word before the cursor. */
static int tp_lcore_ledit_open(lua_State *L) {
  const char *hist = luaL_optstring(L, 1, NULL);
  const char *why = NULL;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (tp__ledit_load(&why) < 0)
    return luaL_error(L, "line editing needs libedit (%s): %s", TP_LEDIT_LIB, why ? why : "?");
  lua_pushvalue(L, 2);
  lua_setfield(L, LUA_REGISTRYINDEX, TP_LEDIT_COMPLETER);
  *tp__el.rl_readline_name = "tupper";
  *tp__el.rl_catch_signals = 0; /* ^C belongs to the loop's signal handler */
  *tp__el.rl_catch_sigwinch = 0;
  *tp__el.rl_attempted_completion_function = tp__ledit_complete;
  *tp__el.rl_completion_append_character = '\0';
  /* '.' and ':' are not breaks: `box.files:re` completes as a whole */
  *tp__el.rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]";
  tp__el.using_history();
  tp__el.stifle_history(TP_LEDIT_HISTORY_MAX);
  if (hist != NULL)
    tp__el.read_history(hist); /* a missing file is no error */
  lua_pushboolean(L, 1);
  return 1;
}

/* core.ledit_prompt(prompt): shows prompt and starts reading a line. */
static int tp_lcore_ledit_prompt(lua_State *L) {
  const char *prompt = luaL_checkstring(L, 1);
  if (tp__el.lib == NULL)
    return luaL_error(L, "ledit_open first");
  free(tp__ledit.line);
  tp__ledit.line = NULL;
  tp__ledit.got = TP_LEDIT_NONE;
  tp__el.rl_callback_handler_install(prompt, tp__ledit_on_line);
  tp__ledit.installed = 1;
  return 0;
}

/* core.ledit_feed(): reads what stdin has.  Returns the line once complete,
 * false at end of input (^D), nil while the line is being edited. */
static int tp_lcore_ledit_feed(lua_State *L) {
  if (tp__el.lib == NULL)
    return luaL_error(L, "ledit_open first");
  if (!tp__ledit.installed)
    return luaL_error(L, "ledit_feed: no prompt");
  tp__ledit.L = L;
  tp__el.rl_callback_read_char();
  tp__ledit.L = NULL;
  switch (tp__ledit.got) {
  case TP_LEDIT_LINE:
    lua_pushstring(L, tp__ledit.line);
    free(tp__ledit.line);
    tp__ledit.line = NULL;
    break;
  case TP_LEDIT_EOF:
    lua_pushboolean(L, 0);
    break;
  default:
    lua_pushnil(L);
  }
  tp__ledit.got = TP_LEDIT_NONE;
  return 1;
}

/* core.ledit_clear(): drops the line being edited (^C at the prompt) and
 * ends the prompt; call ledit_prompt for a fresh one. */
static int tp_lcore_ledit_clear(lua_State *L) {
  (void) L;
  if (tp__ledit.installed && tp__el.lib != NULL) {
    tp__el.rl_replace_line("", 0);
    tp__el.rl_callback_handler_remove();
    tp__ledit.installed = 0;
  }
  return 0;
}

/* core.ledit_add_history(line, path|nil): remembers line and rewrites the
 * history file (mode 0600: it may hold secrets).  Returns true, or nil, msg. */
static int tp_lcore_ledit_add_history(lua_State *L) {
  const char *line = luaL_checkstring(L, 1);
  const char *path = luaL_optstring(L, 2, NULL);
  int ret;
  if (tp__el.lib == NULL)
    return luaL_error(L, "ledit_open first");
  tp__el.add_history(line);
  if (path == NULL)
    return lua_pushboolean(L, 1), 1;
  ret = tp__el.write_history(path);
  if (ret != 0) {
    lua_pushnil(L);
    lua_pushfstring(L, "write history '%s': %s", path, strerror(ret > 0 ? ret : errno));
    return 2;
  }
  chmod(path, 0600);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.ledit_close(): leaves the terminal as it found it. */
static int tp_lcore_ledit_close(lua_State *L) {
  tp_lcore_ledit_clear(L);
  free(tp__ledit.line);
  tp__ledit.line = NULL;
  lua_pushnil(L);
  lua_setfield(L, LUA_REGISTRYINDEX, TP_LEDIT_COMPLETER);
  return 0;
}

void tp_l_edit_register(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"ledit_open", tp_lcore_ledit_open},   {"ledit_prompt", tp_lcore_ledit_prompt},
      {"ledit_feed", tp_lcore_ledit_feed},   {"ledit_clear", tp_lcore_ledit_clear},
      {"ledit_add_history", tp_lcore_ledit_add_history}, {"ledit_close", tp_lcore_ledit_close},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
