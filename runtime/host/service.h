/* tupper: the daemon as a service of the init system (docs/install.md).
 *
 * Two small pieces of the systemd protocols, written here rather than
 * linked from libsystemd: the socket an activating manager passed in
 * (sd_listen_fds(3): fds from 3 on, named by LISTEN_FDS; which of them the
 * daemon takes is decided in Lua, lua/tupper/daemon/activation.lua) and a
 * state datagram to the manager's NOTIFY_SOCKET (sd_notify(3)).
 *
 * Trust: the fd and NOTIFY_SOCKET come from whoever started the daemon,
 * which already runs it with its privileges; they are checked for shape
 * (an fd that is not a listening unix stream socket is refused), not for
 * intent. */
#ifndef TP_SERVICE_H
#define TP_SERVICE_H

#include <stddef.h>

#include "error.h"

/* Checks that fd is an AF_UNIX SOCK_STREAM socket in the listening state
 * and sets FD_CLOEXEC on it (the boxes' helpers must not inherit it).  The
 * path it is bound to goes to path (size bytes, "" for an unnamed or
 * abstract socket). */
int tp_service_listen_fd(int fd, char *path, size_t size, tp_error_t *err);

/* Sends state (e.g. "READY=1") as one datagram to the unix socket addr, a
 * path or, with a leading '@', an abstract name: NOTIFY_SOCKET's forms. */
int tp_service_notify(const char *addr, const char *state, tp_error_t *err);

#endif
