/* The C client of the hot verbs: `tupper exec ID -- CMD` and `tupper run
 * -- CMD` without a Lua state (docs/cli.md, "The C client").  The process
 * entry (tp_main) asks it first; it takes a command line only when it
 * does all of what the Lua CLI would do with it, on the same wire
 * (docs/protocol.md: hello, stream.channel and stream.attach, the create,
 * process.start with streams, process.exit, process.signal), with the
 * same output and exit codes.  Everything else is the Lua CLI's: another
 * verb or option (fargv.h), a terminal on stdout or stderr (the escaping
 * filter is Lua's) or on stdin with -i, a closed fd 0, 1 or 2, a policy
 * file for run, a word that is not UTF-8, no daemon answering (the Lua CLI
 * says so, or starts one), a daemon without process streams.
 *
 * The daemon's replies are checked (freply.h: jansson within the client's
 * bounds): a line over TP_FAST_LINE_MAX bytes, a malformed or lying reply is a clear error and
 * exit 125, never a crash or a hang of its own. */
#ifndef TP_FAST_H
#define TP_FAST_H

#include "fargv.h"

#define TP_FAST_LINE_MAX (1024 * 1024) /* bytes of one message of the daemon */
#define TP_FAST_ID_MAX 256             /* bytes of a sandbox id */

/* Whether the C client takes argv, judged before any connection: the
 * words (fargv.h), fds 0, 1 and 2 open, no terminal on 1 or 2 (nor on 0
 * with -i), an exec's id under TP_FAST_ID_MAX bytes, no tupper.lua from
 * here up for run (unless --no-policy), every word sent valid UTF-8, and
 * TUPPER_CLIENT not "lua" (which asks for the Lua CLI).  1 and a filled
 * in, or 0. */
int tp_fast_mine(int argc, char **argv, tp_fargv_t *a);

/* 1: the command ran here, *code is the process's exit code; 0: the Lua
 * CLI takes argv (nothing was printed, no process started, no box kept).
 * TUPPER_CLIENT=c makes a command line the C client does not take an
 * error (125) instead: the tests prove which path ran with it. */
int tp_fast_main(int argc, char **argv, int *code);

#endif
