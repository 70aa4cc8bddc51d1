/* libFuzzer target: the daemon's JSON-RPC reader, which is Lua.
 *
 * One Lua state loads lua/tupper/{rpc,json,schema}.lua from TUPPER_ROOT (or
 * the source tree this was built from) and tests/fuzz/rpc_harness.lua, which
 * returns a function taking the fuzz input.  The harness drives rpc.wrap's
 * line splitter through a fake stream, checks every decoded message the way
 * the daemon does (lua/tupper/daemon.lua), validates it against every method
 * of the schema and checks what it writes back.  Any Lua error that escapes
 * the harness is a finding: it is printed with its traceback and the target
 * aborts, so libFuzzer saves the input.
 *
 * The Lua state, the coverage hook and the entry points: lua_target.h. */
#define FZ_NAME "fuzz_rpc"
#define FZ_HARNESS "rpc_harness.lua"
#include "lua_target.h"
