/* tupper: one data connection of the data plane (docs/protocol.md,
 * "Stream frames"), on the loop, in C.
 *
 * A tp_sconn_t owns a connected stream socket (the fd of a client's data
 * connection once attached) and speaks stream frames on it (sframe.h):
 * it reads into a buffer of one frame at most, keeps the table of live
 * streams, counts credit both ways, answers every broken rule as the
 * protocol says (a connection error closes it after an ERROR on sid 0; a
 * stream error ends that stream; an unknown id gets ENOENT), and drops a
 * peer that leaves a stream without credit, or the write queue without
 * progress, for idle_ms.  What the bytes are is the owner's business: it
 * opens streams, writes what a source gives within the credit, and gets
 * a callback for what the peer sends.
 *
 * Memory: the read buffer is one frame; the write queue holds at most
 * what the peer's credit allowed (a stream's outstanding credit never
 * exceeds the window the connection was made with), plus control frames,
 * and the connection as a whole TP_SCONN_QUEUED_MAX: past it no stream may
 * write (tp_sconn_can_write says 0; on_writable comes once the queue is
 * below it again) and the peer's frames are not read (a peer that sends
 * without reading cannot grow the queue with the ERRORs and CREDITs they
 * call for), past by at most what one read's frames call for.
 *
 * Lifetime (libuv's rules): tp_sconn_close is the owner's last call; no
 * callback runs after it, and the object is freed in its handles' close
 * callbacks.  When the connection goes down on its own (the peer closed
 * it, broke a rule, or was idle) on_stream_error runs for each live
 * stream, then on_close once; after on_close the owner must not touch c
 * (it is being freed). */
#ifndef TP_STREAM_H
#define TP_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "error.h"
#include "sframe.h"

#define TP_SCONN_STREAMS_MAX 256       /* live streams on one connection */
#define TP_SCONN_IDLE_MS 60000         /* default idle time (docs/protocol.md) */
#define TP_SCONN_WINDOW_MIN (64u * 1024u)
#define TP_SCONN_WINDOW_MAX (64u * 1024u * 1024u)
#define TP_SCONN_WINDOW_DEFAULT (4u * 1024u * 1024u)
#define TP_SCONN_RECENT 64              /* ended ids whose late frames are dropped quietly */
#define TP_SCONN_QUEUED_MAX (64u * 1024u * 1024u) /* bytes queued for the peer (above) */

typedef struct tp_sconn_s tp_sconn_t;

typedef struct tp_sconn_cbs_s {
  /* n bytes the peer sent on sid; the owner copies or forwards them now
   * and calls tp_sconn_credit once they are gone on (that is the flow
   * control: without it the peer stops). */
  void (*on_data)(tp_sconn_t *c, uint32_t sid, void *sdata, const uint8_t *p, size_t n);
  /* The peer sends no more on sid. */
  void (*on_end)(tp_sconn_t *c, uint32_t sid, void *sdata);
  /* Credit arrived on sid: tp_sconn_write may take more. */
  void (*on_writable)(tp_sconn_t *c, uint32_t sid, void *sdata);
  /* sid is over (the peer's ERROR, a rule it broke, or the connection's
   * end); err is an errno value; sid is gone once this returns. */
  void (*on_stream_error)(tp_sconn_t *c, uint32_t sid, void *sdata, int err, const char *msg);
  /* The connection went down on its own; c is freed after this returns. */
  void (*on_close)(tp_sconn_t *c, int err, const char *reason);
  /* Optional: room for the payload of a DATA frame of len bytes on sid
   * (TP_SCONN_DIRECT_MIN or more, within the stream's credit) whose
   * header came before the rest of it: the connection reads the payload
   * straight into it, and on_data then gets p = that room.  The owner
   * keeps it until that on_data, or until sid is over (tp_sconn_fail,
   * finish, drop, the connection's end: the rest of the payload is then
   * read and dropped); NULL: the payload goes through the read buffer. */
  uint8_t *(*data_buf)(tp_sconn_t *c, uint32_t sid, void *sdata, size_t len);
} tp_sconn_cbs_t;

/* A DATA payload this long or longer may be read into the owner's room
 * (data_buf above). */
#define TP_SCONN_DIRECT_MIN (64u * 1024u)

/* Takes over fd (a connected socket; closed on failure too).  window: the
 * credit the peer gave for what this side sends on each stream
 * (TP_SCONN_WINDOW_MIN..MAX); idle_ms: 0 for TP_SCONN_IDLE_MS. */
tp_sconn_t *tp_sconn_new(uv_loop_t *loop, int fd, uint32_t window, uint64_t idle_ms,
                         const tp_sconn_cbs_t *cbs, void *data, tp_error_t *err);
void *tp_sconn_data(const tp_sconn_t *c);
/* Queues raw bytes before any frame (the attach's JSON reply line). */
int tp_sconn_preface(tp_sconn_t *c, const void *p, size_t n, tp_error_t *err);

/* Opens stream sid (1..2^31-1, never used before on c) of kind and tells
 * the peer (OPEN).  recv_window > 0: the peer may send that much before a
 * CREDIT; sends: this side sends on it (it ends with tp_sconn_end).
 * EEXIST for a used id, EMFILE past TP_SCONN_STREAMS_MAX, EINVAL. */
int tp_sconn_open(tp_sconn_t *c, uint32_t sid, uint32_t kind, uint32_t recv_window, int sends,
                  void *sdata, tp_error_t *err);
/* Bytes this side may send on sid now: its credit, 0 while the queue is
 * full (0: wait for on_writable). */
uint64_t tp_sconn_can_write(const tp_sconn_t *c, uint32_t sid);
/* Sends up to n bytes of p as DATA; returns how many it took (at most the
 * credit; 0 when there is none), or -1 and err (ENOENT, EPIPE). */
long tp_sconn_write(tp_sconn_t *c, uint32_t sid, const void *p, size_t n, tp_error_t *err);
/* The pipe's bytes are out (err 0); not called once the connection went
 * down (the streams' on_stream_error tell it), nor after
 * tp_sconn_splice_forget. */
typedef void (*tp_sconn_splice_cb)(void *arg, int err);
/* Sends the len bytes that wait in the pipe pfd as one DATA frame of sid
 * (len <= TP_SF_DATA_MAX and the credit; the pipe must hold them all),
 * spliced from the pipe into the socket without a copy, after what is
 * queued; frames made meanwhile (and other streams' spliced frames) are
 * held behind it, in order.  pfd is dup'ed: the caller may close its own,
 * but must not read it, nor write it, before cb. */
int tp_sconn_splice(tp_sconn_t *c, uint32_t sid, int pfd, size_t len, tp_sconn_splice_cb cb, void *arg,
                    tp_error_t *err);
/* The owner of arg goes: its splice's cb will not run (the frame still goes out whole). */
void tp_sconn_splice_forget(tp_sconn_t *c, void *arg);
/* This side sends no more on sid (END, with a size when has_size). */
int tp_sconn_end(tp_sconn_t *c, uint32_t sid, int has_size, uint64_t size, tp_error_t *err);
/* The owner took n bytes of what the peer sent on sid: CREDIT. */
int tp_sconn_credit(tp_sconn_t *c, uint32_t sid, uint32_t n, tp_error_t *err);
/* Ends sid with an ERROR to the peer; no callback for it. */
int tp_sconn_fail(tp_sconn_t *c, uint32_t sid, int errnum, const char *msg);
/* END on sid (with a size when has_size), and sid is over in both
 * directions: what the peer still sends on it is dropped (a process's
 * stdin or terminal once it exited).  No callback for it. */
int tp_sconn_finish(tp_sconn_t *c, uint32_t sid, int has_size, uint64_t size, tp_error_t *err);
/* Forgets sid without a frame and without a callback (works while the
 * connection goes down: its on_stream_error for sid will not come). */
void tp_sconn_drop(tp_sconn_t *c, uint32_t sid);
/* Between these two, small frames (OPEN, END, CREDIT, ERROR) wait in the
 * connection and go out together in one write at tp_sconn_uncork: a
 * process's two or three OPENs, its ENDs, wake the peer once.  A frame too
 * big to wait sends what waits before it. */
void tp_sconn_cork(tp_sconn_t *c); /* corks nest: the last uncork sends */
void tp_sconn_uncork(tp_sconn_t *c);
/* A cork that holds until tp_sconn_flush, or at the latest until the loop
 * is about to wait (a uv_prepare): a process's OPENs wait for its start's
 * reply, its ENDs for its exit, and the daemon writes the frames right
 * before the control connection's line, so that the client finds both
 * readable in one poll (docs/protocol.md, Process streams). */
void tp_sconn_hold_turn(tp_sconn_t *c);
/* Sends what the corks hold now (they keep holding what comes next). */
void tp_sconn_flush(tp_sconn_t *c);
/* Live streams, and bytes queued for the peer. */
size_t tp_sconn_streams(const tp_sconn_t *c);
size_t tp_sconn_queued(const tp_sconn_t *c);
/* The queue's cap (TP_SCONN_QUEUED_MAX unless set; tests set less). */
void tp_sconn_set_queued_max(tp_sconn_t *c, size_t bytes);
/* The owner lets go: streams are dropped without callbacks, the socket
 * closed; c is freed once its handles are. */
void tp_sconn_close(tp_sconn_t *c);

#endif
