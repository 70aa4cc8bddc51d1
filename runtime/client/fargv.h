/* Which command lines the C client (fast.c) runs itself: `tupper exec`
 * and `tupper run` with the options it fully understands, parsed exactly
 * as the Lua CLI parses them (lua/tupper/client/cli.lua, cli_args.lua).
 * Anything else (another verb, an option it does not know, --help, a
 * missing command, -t, a recipe, a policy file) is "not mine":
 * the Lua CLI runs it unchanged, with its own messages.
 *
 * The words stay the caller's (argv): nothing is copied or allocated. */
#ifndef TP_FARGV_H
#define TP_FARGV_H

#include <stddef.h>

#define TP_FARGV_ENV_MAX 64 /* -e options the C client takes; more: the Lua CLI */

typedef enum tp_fargv_verb_e { TP_FV_NONE = 0, TP_FV_EXEC, TP_FV_RUN } tp_fargv_verb_t;

typedef struct tp_fargv_s {
  tp_fargv_verb_t verb;
  const char *socket;        /* --socket, or NULL */
  const char *id;            /* exec: the sandbox */
  char *const *cmd;          /* the command's words, ncmd of them */
  int ncmd;
  const char *env[TP_FARGV_ENV_MAX]; /* -e K=V as given, a key's last one wins */
  int nenv;
  const char *workdir;       /* -w, or NULL */
  const char *image;         /* run --image, or NULL */
  /* run's limits as given (each checked here as the Lua parser would take
   * it; a spelling it is not sure of is the Lua CLI's), or NULL */
  const char *memory, *disk, *cpus, *pids, *timeout;
  int interactive;           /* -i */
  int no_policy;             /* run --no-policy */
} tp_fargv_t;

/* Parses argv (argv[0] the program); returns 1 when the C client takes
 * the command line (a filled in), 0 when the Lua CLI must. */
int tp_fargv_parse(int argc, char *const *argv, tp_fargv_t *a);

/* The length of an -e word's key (up to its first '='). */
size_t tp_fargv_key_len(const char *kv);

#endif
