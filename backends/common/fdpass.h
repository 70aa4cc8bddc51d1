/* tupper: file descriptors over unix sockets (SCM_RIGHTS), as the agent
 * hands a box's file to the daemon and the daemon hands it to the CLI
 * (docs/protocol.md, "Files as descriptors"). */
#ifndef TP_FDPASS_H
#define TP_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

#define TP_FDPASS_MAX 4 /* descriptors one tp_fd_recv keeps; more are closed */

/* Sends len (>= 1) bytes of p on the unix socket sock, the descriptor fd
 * attached to the first byte, without waiting: the bytes the socket took
 * (>= 1; the caller sends the rest without fd), or -1 and errno (EAGAIN:
 * none taken). */
ssize_t tp_fd_send(int sock, const void *p, size_t len, int fd);

/* Receives up to len bytes from sock without waiting (flags: more recvmsg
 * flags), and the descriptors that came with them: the first max (at
 * most TP_FDPASS_MAX) go to fds (close-on-exec) and their count to *nfds,
 * any others are closed, and *cut says whether the kernel cut the
 * control data (MSG_CTRUNC: descriptors lost).  The bytes received, 0 at
 * the peer's end, or -1 and errno; descriptors that came with a failed
 * call are none (the kernel delivers them only with bytes). */
ssize_t tp_fd_recv(int sock, void *buf, size_t len, int flags, int *fds, int max, int *nfds, int *cut);

#endif
