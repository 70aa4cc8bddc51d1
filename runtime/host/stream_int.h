/* tupper: what stream_fs.c and stream_proc.c share about a data
 * connection (stream_fs.h's tp_sdc_t): the object, and the per-stream
 * callbacks each kind of relay gives.  Internal to runtime/host. */
#ifndef TP_STREAM_INT_H
#define TP_STREAM_INT_H

#include "stream_fs.h"

/* A relay's callbacks for the streams it opened (stream.h's, for the
 * relay in sdata). */
typedef struct tp__sdc_ops_s {
  void (*on_data)(void *r, uint32_t sid, const uint8_t *p, size_t n);
  void (*on_end)(void *r, uint32_t sid);
  void (*on_writable)(void *r, uint32_t sid);
  void (*on_error)(void *r, uint32_t sid, int err, const char *msg);
  /* optional: room for a DATA payload of n bytes (stream.h's data_buf) */
  uint8_t *(*data_buf)(void *r, uint32_t sid, size_t n);
} tp__sdc_ops_t;

/* Every relay's sdata starts with this. */
typedef struct tp__sdc_stream_s {
  const tp__sdc_ops_t *ops;
} tp__sdc_stream_t;

struct tp__srelay_s;
struct tp__sproc_s;

struct tp_sdc_s {
  void *data;
  tp_sconn_t *c;                /* NULL once it went down */
  struct tp__srelay_s *relays;  /* file relays */
  size_t nrelays;
  struct tp__sproc_s *procs;    /* process relays bound here */
  size_t nprocs;
  uint64_t write_windows;       /* the windows of its live file write streams (stream_fs.c) */
  tp_sdc_close_cb on_close;
};

/* stream_proc.c: unbinds every process relay of d (the connection goes). */
void tp__sdc_procs_close(tp_sdc_t *d);

#endif
