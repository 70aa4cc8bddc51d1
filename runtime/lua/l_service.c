/* tupper.core's service functions: the activated socket's check and the
 * init system's notification (runtime/host/service.h). */
#include <lauxlib.h>
#include <sys/un.h>

#include "l_core.h"
#include "service.h"

/* core.listen_fd(fd) -> the path it is bound to ("" if none), or nil, msg:
 * fd must be a listening unix stream socket; it is made close-on-exec. */
static int tp_lcore_listen_fd(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  char path[sizeof(((struct sockaddr_un *) 0)->sun_path) + 1];
  tp_error_t err = {0};
  luaL_argcheck(L, fd >= 0 && fd <= 0x7fffffff, 1, "not an fd");
  if (tp_service_listen_fd((int) fd, path, sizeof(path), &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushstring(L, path);
  return 1;
}

/* core.sd_notify(addr, state) -> true, or nil, msg */
static int tp_lcore_sd_notify(lua_State *L) {
  const char *addr = luaL_checkstring(L, 1);
  const char *state = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  if (tp_service_notify(addr, state, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

void tp_l_service_register(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"listen_fd", tp_lcore_listen_fd}, {"sd_notify", tp_lcore_sd_notify}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
