/* tupper: process streams of the data plane (docs/protocol.md, "Process
 * streams"): a process's stdout, stderr and stdin, or its terminal, as
 * stream frames on a client's data connection, relayed in C between it and
 * the box's agent.
 *
 * A process started with TP_F_EXEC_CREDIT is flow-controlled by its agent:
 * each output stream has at most TP_OUT_WINDOW bytes sent and not acked
 * (OUTPUT_ACK); the agent stops reading the pipe beyond it, so the
 * process blocks in write.  Such a process is registered here (a
 * tp_sdc_proc right after its EXEC's OK, before the next frame of the
 * channel is read).  While bound to a data connection its output goes to
 * the client as DATA, and the agent is acked as the client's credit takes
 * it (what the credit does not take yet waits here: at most one window per
 * stream, plus the drain at the exit); the client's stdin DATA goes to the
 * agent as STDIN, and the client gets its credit back as the agent's
 * STDIN_ACK says the pipe took it.  Unbound (the client's data connection
 * went, a stream of it failed, or it was never bound), output is acked at
 * once and handed to the box's owner (Lua: the ring and process.output),
 * as for any process whose client left.
 *
 * The streams end with END (stdout and stderr: after the EXIT, once all the
 * output is out, with its size; stdin and the terminal: END and over in
 * both directions), or with ERROR: EIO when the box goes down, the agent's
 * errno for a stdin it refused, and the connection's errors (stream.h). */
#ifndef TP_STREAM_PROC_H
#define TP_STREAM_PROC_H

#include <stdint.h>

#include "dbox.h"
#include "stream_fs.h"

/* The stream ids a process gets on a connection (0: none). */
typedef struct tp_sproc_sids_s {
  uint32_t out, err, in; /* a terminal's one stream is `out`, both ways */
  int pty;
} tp_sproc_sids_t;

#define TP_SPROC_IN_WINDOW (1024u * 1024u) /* stdin a client may send ahead */

/* Registers process pid of box b (started with TP_F_EXEC_CREDIT) and binds
 * its streams to d (d NULL: only registers it).  EBUSY when it is bound
 * to a live connection already, EINVAL for bad ids, stream.h's errors.  A
 * process stays registered (unbound) when the binding fails. */
int tp_sdc_proc(tp_sdc_t *d, tp_dbox_t *b, int64_t pid, const tp_sproc_sids_t *sids,
                tp_error_t *err);
/* 1 when pid of b is registered (a credit process that has not exited). */
int tp_sproc_known(tp_dbox_t *b, int64_t pid);

/* From now on the owner sees pid's OUTPUT too, bound or not (connections
 * that follow it as process.output).  -1 when pid is not registered. */
int tp_sproc_mirror(tp_dbox_t *b, int64_t pid);

#define TP_SPROC_RING 65536u /* output kept per process (process.connect's backlog) */

/* Hands the kept output of pid (the last TP_SPROC_RING bytes, stdout and
 * stderr as they came: stream 0 or 1) to cb in order, *dropped the bytes
 * before it; take (at its exit): the entry is let go of.  -1 when pid is
 * not registered. */
typedef void (*tp_sproc_ring_cb)(void *data, int stream, const uint8_t *p, size_t n);
int tp_sproc_ring(tp_dbox_t *b, int64_t pid, int take, tp_sproc_ring_cb cb, void *data,
                  uint64_t *dropped);

#endif
