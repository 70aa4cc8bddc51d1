/* The client's end of a data connection (docs/protocol.md, "Stream
 * frames"): reads the daemon's frames with the shared codec (sframe.h) and
 * moves the bytes of chosen streams between the connection and a file
 * descriptor without handing them to Lua.
 *
 *   sink:   DATA of a stream written to an fd (stdout, a file), CREDIT
 *           given back once written: a slow fd slows the box's writer.
 *   source: a regular file's bytes sent as DATA within the daemon's
 *           credit, then END.
 *
 * Every other frame (and the END or ERROR that finishes a sink or a
 * source) is handed to the caller's callback, as are local failures (a
 * write to the sink fd failed, the source could not be read), after the
 * pump told the daemon with an ERROR on that stream.  No loop of its own:
 * the caller polls the connection and calls tp_spump_read when it is
 * readable and tp_spump_write when it is writable (or after a send).
 *
 * The daemon is trusted more than a box but its bytes are still checked:
 * every frame goes through tp_sframe_parse, a sink takes at most its limit,
 * and what is queued is bounded (the windows bound what comes in). */
#ifndef TP_SPUMP_H
#define TP_SPUMP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "sframe.h"

#define TP_SPUMP_STREAMS 16              /* sinks and sources at once */
#define TP_SPUMP_QUEUE (1024u * 1024u)   /* a source fills the send queue up to this */

typedef struct tp_spump_s tp_spump_t;

/* A frame for the caller (f: its header and payload as tp_sframe_parse
 * gives them), or a local failure (local 1: f->type is TP_SF_ERROR, f->err
 * the errno, f->msg what failed; the daemon was told already).  sid 0 with
 * TP_SF_ERROR: the connection is over (the daemon's ERROR, its end, a bad
 * frame); nothing more comes. */
typedef void (*tp_spump_cb)(void *data, const tp_sframe_t *f, int local);

/* Takes fd (a connected stream socket, made non-blocking here; closed by
 * tp_spump_free) and the pre bytes already read from it after the attach
 * reply. */
tp_spump_t *tp_spump_new(int fd, const uint8_t *pre, size_t plen, tp_error_t *err);
void tp_spump_free(tp_spump_t *p);

/* DATA of sid from now on goes to fd (not owned; written with blocking
 * semantics: a full pipe waits), at most limit bytes (more is a local
 * EFBIG failure). */
int tp_spump_sink(tp_spump_t *p, uint32_t sid, int fd, uint64_t limit, tp_error_t *err);

/* fd (a regular file, not owned, read from its offset) is sent on sid:
 * at most length bytes, credit bytes allowed now (the stream's OPEN window
 * if the caller saw it; an OPEN or CREDIT seen later adds to it), then
 * END.  EINVAL for an fd that is not a regular file. */
int tp_spump_source(tp_spump_t *p, uint32_t sid, int fd, uint64_t credit, uint64_t length,
                    tp_error_t *err);

/* Forgets sid's sink or source (the caller gave up on it); frames that
 * still come for it are dropped. */
void tp_spump_drop(tp_spump_t *p, uint32_t sid);

/* Queues whole frames built by the caller. */
int tp_spump_send(tp_spump_t *p, const void *bytes, size_t n, tp_error_t *err);

/* Reads what the connection has (a bounded number of reads) and handles
 * it: 0, or -1 once the connection is over (cb has had its sid 0 ERROR). */
int tp_spump_read(tp_spump_t *p, tp_spump_cb cb, void *data);

/* Fills the send queue from the sources and writes what the socket takes:
 * 0, or -1 once the connection is over. */
int tp_spump_write(tp_spump_t *p, tp_spump_cb cb, void *data);

/* Bytes queued that the socket has not taken (poll for writing while > 0). */
size_t tp_spump_queued(const tp_spump_t *p);
int tp_spump_fd(const tp_spump_t *p);

#endif
