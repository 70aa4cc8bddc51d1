/* tupper.core's microVM helpers for lua/tupper/microvm.lua: guest memory
 * files and sparse disk copies for snapshots, QEMU's start time for
 * adoption, and an fd passed to QMP. */
#include <errno.h>
#include <lauxlib.h>
#include <string.h>
#include <sys/socket.h>

#include "l_core.h"
#include "microvm.h"

/* core.proc_start_time(pid) -> clock ticks since boot | nil, msg */
static int tp_lcore_proc_start_time(lua_State *L) {
  lua_Integer pid = luaL_checkinteger(L, 1);
  unsigned long long t;
  tp_error_t err = {0};
  if (pid < 1 || pid > 0x7fffffff)
    return luaL_error(L, "proc_start_time: bad pid");
  if (tp_microvm_start_time((pid_t) pid, &t, &err) < 0)
    return tp_l_push_err(L, &err);
  lua_pushinteger(L, (lua_Integer) t);
  return 1;
}

/* core.vm_ram_memfd(path, size) -> fd | nil, msg: a microVM snapshot's
 * guest memory file as a sealed memfd (tp_microvm_ram_memfd), which the
 * caller passes to QEMU and closes with uv.fs_close. */
static int tp_lcore_vm_ram_memfd(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer size = luaL_checkinteger(L, 2);
  tp_error_t err = {0};
  int fd;
  if (size <= 0)
    return luaL_error(L, "vm_ram_memfd: bad size");
  fd = tp_microvm_ram_memfd(path, (uint64_t) size, &err);
  if (fd < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* core.vm_ram_new(size) -> fd | nil, msg (tp_microvm_ram_new) */
static int tp_lcore_vm_ram_new(lua_State *L) {
  lua_Integer size = luaL_checkinteger(L, 1);
  tp_error_t err = {0};
  int fd;
  if (size <= 0)
    return luaL_error(L, "vm_ram_new: bad size");
  fd = tp_microvm_ram_new((uint64_t) size, &err);
  if (fd < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushinteger(L, fd);
  return 1;
}

/* core.vm_ram_save(fd, path) -> true | nil, msg (tp_microvm_ram_save) */
static int tp_lcore_vm_ram_save(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  const char *path = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  if (fd < 0 || fd > 0x7fffffff)
    return luaL_error(L, "vm_ram_save: bad fd");
  if (tp_microvm_ram_save((int) fd, path, &err) < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.vm_copy_sparse(src, dst) -> true | nil, msg (tp_microvm_copy_sparse) */
static int tp_lcore_vm_copy_sparse(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  const char *dst = luaL_checkstring(L, 2);
  tp_error_t err = {0};
  if (tp_microvm_copy_sparse(src, dst, &err) < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.send_with_fd(sock, data, fd) -> true | nil, msg: writes data on the
 * unix socket sock with fd attached (SCM_RIGHTS), in one sendmsg: how QMP's
 * getfd receives a file (the microVM snapshot). */
static int tp_lcore_send_with_fd(lua_State *L) {
  lua_Integer sock = luaL_checkinteger(L, 1);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  lua_Integer fd = luaL_checkinteger(L, 3);
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = (void *) data, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *c;
  int f = (int) fd;
  ssize_t n;
  if (sock < 0 || sock > 0x7fffffff || fd < 0 || fd > 0x7fffffff || len == 0 || len > 65536)
    return luaL_error(L, "send_with_fd: bad arguments");
  memset(cbuf, 0, sizeof(cbuf));
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &f, sizeof(int));
  do
    n = sendmsg((int) sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t) len) {
    lua_pushnil(L);
    lua_pushfstring(L, "sendmsg: %s", n < 0 ? strerror(errno) : "short write");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

void tp_l_microvm_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"proc_start_time", tp_lcore_proc_start_time},
                                   {"send_with_fd", tp_lcore_send_with_fd},
                                   {"vm_ram_memfd", tp_lcore_vm_ram_memfd},
                                   {"vm_ram_new", tp_lcore_vm_ram_new},
                                   {"vm_ram_save", tp_lcore_vm_ram_save},
                                   {"vm_copy_sparse", tp_lcore_vm_copy_sparse},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
