/* tupper.core's binding files (one per area, registered by l_core.c) and
 * the helpers they share.  A binding checks its arguments, converts and
 * calls the mechanism below it (runtime/host, the backends); it decides
 * nothing (STYLE 12, 16). */
#ifndef TP_L_CORE_H
#define TP_L_CORE_H

#include <lua.h>

#include "cgroup.h"
#include "daemon.h"
#include "dbox.h"
#include "error.h"

#define TP_L_BOX_MT "tupper.box"

/* The daemon of this Lua state (its cgroup root, the backends' states). */
tp_daemon_t *tp_l_daemon(lua_State *L);
/* Makes the daemon of L if it has none (luaopen_tupper_core). */
void tp_l_daemon_open(lua_State *L);

/* Pushes nil, err->msg, err->code; returns 3. */
int tp_l_push_err(lua_State *L, const tp_error_t *err);

/* The one limits parser: table t { memory=, pids=, cpu_quota=, cpu_period=,
 * disk= } into *lim and (disk != NULL) *disk; absent fields are 0.  Raises
 * on a value that is not an integer. */
void tp_l_limits(lua_State *L, int t, tp_cgroup_limits_t *lim, int64_t *disk);

/* l_frame.c: agent frames <-> Lua tables.  Pushes a table of fs[0..n);
 * -1 (nothing pushed) for a payload the daemon rejects. */
int tp_l_push_fields(lua_State *L, const tp_field_t *fs, int n, int nested, tp_field_t *scratch,
                     int scratch_max);
/* Checks the fields table at idx (raises on a wrong type), then encodes a
 * frame of type and id with it into buf: -1 if it is too large. */
void tp_l_check_fields(lua_State *L, int idx);
int tp_l_encode_fields(lua_State *L, int idx, unsigned type, uint32_t id, tp_buf_t *buf);

/* l_box.c: pushes a box userdata owning b (NULL: an empty one, set later
 * with tp_l_box_set). */
void tp_l_box_push(lua_State *L, tp_dbox_t *b);
void tp_l_box_set(lua_State *L, int idx, tp_dbox_t *b);
/* The box of the box userdata at idx (raises if it is not one, or gone). */
tp_dbox_t *tp_l_box_check(lua_State *L, int idx);

/* Each adds its functions to the table on the stack top. */
void tp_l_box_register(lua_State *L);
void tp_l_backend_register(lua_State *L);
void tp_l_cgroup_register(lua_State *L);
void tp_l_util_register(lua_State *L);
void tp_l_microvm_register(lua_State *L);
void tp_l_edit_register(lua_State *L);
void tp_l_http_register(lua_State *L);  /* http_get: the registry client's transport */
void tp_l_image_register(lua_State *L); /* the image store */
void tp_l_pool_register(lua_State *L);  /* the btrfs pool (l_pool.c) */
void tp_l_service_register(lua_State *L); /* listen_fd, sd_notify: the daemon as a service */
void tp_l_stream_register(lua_State *L);  /* stream_attach: the data plane (l_stream.c) */
void tp_l_netrelay_register(lua_State *L); /* netrelay: relayed network streams */
void tp_l_fsfd_register(lua_State *L);     /* open files of a box as fds (l_fsfd.c) */

/* l_fsfd.c: the agent's end of the fd pair at idx (-2: idx is not a
 * pair, -1: already sent); after the send, tp_l_fdpair_sent closes it. */
int tp_l_fdpair_far(lua_State *L, int idx);
void tp_l_fdpair_sent(lua_State *L, int idx);
/* The descriptor of the open file (core.file) at idx (raises if closed). */
int tp_l_file_fd(lua_State *L, int idx);

#endif
