/* tupper.core: the C functions the Lua side calls, assembled from one
 * binding file per area (l_core.h); this one holds the module's constants
 * and the daemon each Lua state has (runtime/host/daemon.h).
 *
 * A box is a running sandbox of any backend seen from Lua (l_box.c): start
 * it (l_backend.c), receive its agent's frames as Lua tables, send
 * requests, destroy it.  The frame bytes never reach Lua. */
#include <lauxlib.h>

#include "embed.h"
#include "l_core.h"
#include "proto.h"
#include "tupper.h"
#include "utils.h"

#define TP_L_DAEMON_KEY "tupper.core.daemon"

int tp_l_push_err(lua_State *L, const tp_error_t *err) {
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushinteger(L, err->code);
  return 3;
}

tp_daemon_t *tp_l_daemon(lua_State *L) {
  tp_daemon_t *d;
  lua_getfield(L, LUA_REGISTRYINDEX, TP_L_DAEMON_KEY);
  d = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return d;
}

static int tp__daemon_gc(lua_State *L) {
  tp_daemon_close(lua_touserdata(L, 1));
  return 0;
}

void tp_l_daemon_open(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, TP_L_DAEMON_KEY) == LUA_TNIL) {
    tp_daemon_t *d = lua_newuserdatauv(L, sizeof(*d), 0);
    tp_daemon_init(d, tp_blob_agent_start, TP_BLOB_SIZE(agent));
    lua_newtable(L);
    lua_pushcfunction(L, tp__daemon_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, TP_L_DAEMON_KEY);
  }
  lua_pop(L, 1);
}

int luaopen_tupper_core(lua_State *L) {
  static const luaL_Reg funcs[] = {{"jail_run", tp_lvm_run},
                                   {"embedded_source", tp_lua_embedded_source},
                                   {NULL, NULL}};
  static const struct { const char *name; int v; } msgs[] = {
      {"READY", TP_MSG_READY}, {"OUTPUT", TP_MSG_OUTPUT}, {"EXIT", TP_MSG_EXIT},
      {"OK", TP_MSG_OK}, {"ERR", TP_MSG_ERR}, {"EXEC", TP_MSG_EXEC}, {"STDIN", TP_MSG_STDIN},
      {"STDIN_CLOSE", TP_MSG_STDIN_CLOSE}, {"SIGNAL", TP_MSG_SIGNAL},
      {"RELEASE", TP_MSG_RELEASE}, {"PS", TP_MSG_PS},
      {"FS_READ", TP_MSG_FS_READ}, {"FS_WRITE", TP_MSG_FS_WRITE}, {"FS_STAT", TP_MSG_FS_STAT},
      {"FS_LIST", TP_MSG_FS_LIST}, {"FS_MKDIR", TP_MSG_FS_MKDIR},
      {"FS_REMOVE", TP_MSG_FS_REMOVE}, {"FS_RENAME", TP_MSG_FS_RENAME},
      {"FS_SETATTR", TP_MSG_FS_SETATTR}, {"FS_SYMLINK", TP_MSG_FS_SYMLINK},
      {"FS_OPEN", TP_MSG_FS_OPEN},
      {"NET_LISTEN", TP_MSG_NET_LISTEN}, {"NET_OPEN", TP_MSG_NET_OPEN},
      {"NET_DATA", TP_MSG_NET_DATA}, {"NET_ACK", TP_MSG_NET_ACK}, {"NET_EOF", TP_MSG_NET_EOF},
      {"NET_CLOSE", TP_MSG_NET_CLOSE}, {"NET_DNS", TP_MSG_NET_DNS},
      {"NET_CONNECT", TP_MSG_NET_CONNECT},
      {"PTY_RESIZE", TP_MSG_PTY_RESIZE}, {"WATCH_ADD", TP_MSG_WATCH_ADD},
      {"WATCH_REMOVE", TP_MSG_WATCH_REMOVE}, {"WATCH_EVENT", TP_MSG_WATCH_EVENT},
      {"VM_INIT", TP_MSG_VM_INIT}, {"VM_ATTACH", TP_MSG_VM_ATTACH},
      {"VM_LIMITS", TP_MSG_VM_LIMITS}};


  tp_l_box_register(L);
  tp_l_daemon_open(L);
  luaL_newlib(L, funcs);
  tp_l_backend_register(L);
  tp_l_cgroup_register(L);
  tp_l_util_register(L);
  tp_l_microvm_register(L);
  tp_l_edit_register(L);
  tp_l_http_register(L);
  tp_l_image_register(L); /* the image store's functions (l_image.c) */
  tp_l_pool_register(L);  /* the btrfs pool of box upper dirs (l_pool.c) */
  tp_l_service_register(L); /* the activated socket, sd_notify (l_service.c) */
  tp_l_stream_register(L);  /* the data plane's connections (l_stream.c) */
  tp_l_netrelay_register(L); /* relayed network streams (l_netrelay.c) */
  tp_l_fsfd_register(L);     /* open files of a box as fds (l_fsfd.c) */
  lua_newtable(L);
  for (size_t i = 0; i < TP_ARRAY_SIZE(msgs); i++) {
    lua_pushinteger(L, msgs[i].v);
    lua_setfield(L, -2, msgs[i].name);
  }
  lua_setfield(L, -2, "MSG");
  lua_pushinteger(L, TP_PROTO_VERSION);
  lua_setfield(L, -2, "AGENT_PROTO");
  lua_pushinteger(L, TP_CHUNK_MAX);
  lua_setfield(L, -2, "CHUNK_MAX");
  {
    static const struct { const char *name; lua_Integer v; } net[] = {
        {"WINDOW", TP_NET_WINDOW},     {"WINDOW_DOWN", TP_NET_WINDOW_DOWN}, {"CHUNK", TP_NET_CHUNK},
        {"STREAMS_MAX", TP_NET_STREAMS_MAX}, {"DNS_MAX", TP_NET_DNS_MAX},
        {"HTTP_PORT", TP_NET_HTTP_PORT}, {"SOCKS_PORT", TP_NET_SOCKS_PORT},
        {"DNS_PORT", TP_NET_DNS_PORT}, {"HTTP", TP_NET_HTTP},
        {"SOCKS", TP_NET_SOCKS},       {"DNS_TCP", TP_NET_DNS_TCP},
        {"CONNECTED", TP_NET_CONNECTED}, {"READY_DOWN", TP_F_READY_NET_DOWN}, {"READY_FD", TP_F_READY_NET_FD},
        {"READY_EXEC_USER", TP_F_READY_EXEC_USER}, {"READY_FS_FD", TP_F_READY_FS_FD},
        {"READY_LISTEN", TP_F_READY_NET_LISTEN}};
    lua_newtable(L);
    for (size_t i = 0; i < TP_ARRAY_SIZE(net); i++) {
      lua_pushinteger(L, net[i].v);
      lua_setfield(L, -2, net[i].name);
    }
    lua_setfield(L, -2, "NET"); /* the network relay's constants (proto.h) */
  }
  lua_pushstring(L, "0.1.0");
  lua_setfield(L, -2, "version");
  return 1;
}
