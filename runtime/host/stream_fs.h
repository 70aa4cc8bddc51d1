/* tupper: a client's data connection with its file relays (the data
 * plane's first byte paths: docs/protocol.md, "Stream frames").
 *
 * A tp_sdc_t wraps a tp_sconn_t and relays file bytes between it and a
 * box's agent channel in C: a read stream keeps a few FS_READ requests of
 * TP_CHUNK_MAX in flight, never more than the client's credit allows, and
 * writes each reply's bytes as DATA; a write stream sends each large DATA
 * frame of the client on as one FS_WRITE (smaller ones gathered into
 * chunks first) and gives the credit back as the agent confirms them.
 * Bytes go from the read buffer they arrived in to the next socket (one
 * writev); only what that socket does not take at once is copied.  Lua decides which sandbox, path and account, and opens
 * the stream; no byte of the file goes through it.
 *
 * A relay ends with END (a write's END carries the bytes written), or
 * with ERROR: the agent's errno and message, EIO when the box goes down,
 * and the connection's errors (stream.h). */
#ifndef TP_STREAM_FS_H
#define TP_STREAM_FS_H

#include <stdint.h>

#include "dbox.h"
#include "stream.h"

typedef struct tp_sdc_s tp_sdc_t;

/* The connection went down on its own (the client left, broke a rule, was
 * idle); d stays until tp_sdc_close. */
typedef void (*tp_sdc_close_cb)(tp_sdc_t *d, int err, const char *reason);

/* A file stream's request, as Lua checked it.  Strings are copied. */
typedef struct tp_sfs_spec_s {
  const char *path;   /* absolute, inside the box */
  uint64_t offset;
  uint64_t length;    /* read: most bytes (UINT64_MAX: to the end) */
  uint32_t flags;     /* write: TP_F_WRITE_* for the first request */
  uint32_t mode;      /* write: a new file's permission bits */
  int has_account;    /* uid, gid and groups below are sent */
  int64_t uid, gid;
  const uint8_t *groups; /* u32 each, glen bytes (0: none sent) */
  uint32_t glen;
} tp_sfs_spec_t;

/* Takes over fd (closed on failure too).  preface (plen bytes) is written
 * before any frame: the attach's JSON reply. */
tp_sdc_t *tp_sdc_new(uv_loop_t *loop, int fd, uint32_t window, uint64_t idle_ms,
                     const void *preface, size_t plen, tp_sdc_close_cb on_close, void *data,
                     tp_error_t *err);
void *tp_sdc_data(const tp_sdc_t *d);
/* 1 while the connection is up. */
int tp_sdc_alive(const tp_sdc_t *d);
/* Opens stream sid and starts reading (or, write = 1, writing) a file of
 * box b.  EPIPE when the box or the connection is gone; stream.h's errors. */
int tp_sdc_file(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int write, const tp_sfs_spec_t *spec,
                tp_error_t *err);
/* Opens write stream sid whose bytes go into fd, the box's file itself
 * (opened by its agent: FS_OPEN), written from the thread pool at offset
 * on (append: at its end), one batch at a time, the credit given back as
 * each is written.  fd is dup'ed (the caller keeps its own).  A failed
 * write ends the stream with ERROR, its errno and "write 'path': ...". */
int tp_sdc_file_fd(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int fd, const char *path, uint64_t offset,
                   int append, tp_error_t *err);
/* Opens read stream sid of fd, the box's file itself (FS_OPEN), read
 * from the thread pool from offset on, at most length bytes and not past
 * its size when opened, one job at a time within the client's credit
 * (each job's bytes go out as DATA from the loop); END with the bytes
 * sent.  fd is dup'ed. */
int tp_sdc_file_fd_read(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int fd, const char *path, uint64_t offset,
                        uint64_t length, tp_error_t *err);
/* Streams live on d. */
size_t tp_sdc_streams(const tp_sdc_t *d);
/* Sends the frames its connection holds for the loop turn (a process's
 * OPENs, its ENDs: tp_sconn_hold_turn) now: right before the control
 * connection's reply or notification that goes with them. */
void tp_sdc_flush(tp_sdc_t *d);
/* The owner lets go: relays stop (their streams get ERROR ECONNRESET when
 * the connection is still up), the connection closes, d is freed. */
void tp_sdc_close(tp_sdc_t *d);

#endif
