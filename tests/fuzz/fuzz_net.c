/* libFuzzer target: the daemon's parsers of what a box sends through the
 * network relay (lua/tupper/netparse.lua: HTTP proxy heads, SOCKS5, DNS
 * queries and answers, TLS ClientHellos) and the rule and address code
 * that judges it (lua/tupper/netrules.lua), all Lua.
 *
 * Built as fuzz_rpc.c is, from lua_target.h (one Lua state, the modules of
 * TUPPER_ROOT, a line hook feeding libFuzzer's extra counters so it sees
 * inside the Lua code);
 * tests/fuzz/net_harness.lua returns the function that takes each input and
 * checks what the parsers return, beyond "no Lua error".  Any error that
 * escapes is a finding: printed with its traceback, and the target aborts. */
#define FZ_NAME "fuzz_net"
#define FZ_HARNESS "net_harness.lua"
#include "lua_target.h"
