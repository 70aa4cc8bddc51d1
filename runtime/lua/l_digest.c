/* tupper.util.digest: the Lua side's hashes, over runtime/host/crypto.c.
 *
 *     local digest = require("tupper.util.digest")
 *     digest.sha256("a", "b")  --> the hex SHA-256 of "ab"
 *
 * Preloaded in the binary (lstate.c), and also built as a loadable module,
 * build/lua/tupper/util/digest.so, so that the Lua specs (plain lua5.4 +
 * busted, where tupper.core does not exist) hash with the same code.
 * core.sha256 is the same function. */
#include <lauxlib.h>

#include "crypto.h"
#include "tupper.h"

int tp_ldigest_sha256(lua_State *L) {
  tp_sha256_t c = {0};
  tp_error_t err = {0};
  char hex[TP_SHA256_HEX_LEN + 1];
  int n = lua_gettop(L), ok;
  /* every argument checked before the hash is held, and the hash freed
   * before anything raises: lua_error would skip a cleanup (STYLE 12) */
  for (int i = 1; i <= n; i++)
    luaL_checkstring(L, i);
  ok = tp_sha256_init(&c, &err) == 0;
  for (int i = 1; ok && i <= n; i++) {
    size_t len;
    const char *s = lua_tolstring(L, i, &len);
    ok = tp_sha256_update(&c, s, len, &err) == 0;
  }
  ok = ok && tp_sha256_final(&c, hex, &err) == 0;
  tp_sha256_close(&c);
  if (!ok) /* libcrypto missing: an installation's fault, not the caller's */
    return luaL_error(L, "%s", err.msg);
  lua_pushlstring(L, hex, TP_SHA256_HEX_LEN);
  return 1;
}

int luaopen_tupper_util_digest(lua_State *L) {
  static const luaL_Reg funcs[] = {{"sha256", tp_ldigest_sha256}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  return 1;
}
