/* What the C client's files share (fast.c: the entry and the
 * conversation; fconn.c: the control connection, its requests and
 * replies; fstream.c: the data connection and the loop).  Internal: only
 * runtime/client includes it. */
#ifndef TP_FAST_INT_H
#define TP_FAST_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "error.h"
#include "fargv.h"
#include "fast.h"
#include "fjson.h"
#include "spump.h"

#define TP__FAST_WINDOW (4u * 1024u * 1024u) /* stream.attach's window, the Lua client's */
#define TP__FAST_REQ_MAX (64u * 1024u * 1024u) /* bytes of one request we write */

/* A connection's reader of JSON lines. */
typedef struct tp__fline_s {
  int fd;
  char *buf;
  size_t have, cap;
} tp__fline_t;

typedef struct tp__fast_s {
  const tp_fargv_t *a;
  char socket[sizeof(((struct sockaddr_un *) 0)->sun_path)];
  tp__fline_t ctl;
  size_t used;    /* bytes of ctl's buffer c->msg still points into */
  tp_fjson_t msg; /* the last message read */
  tp_fjson_tok_t *tok;
  /* replies that came before the one waited for (run's create and channel
   * may answer in either order) */
  struct { int64_t id; char *line; size_t len; } stash[4];
  int nstash;
  char *held; /* the stashed line c->msg points into */
  int64_t next_id;
  char id[TP_FAST_ID_MAX]; /* the sandbox */
  /* the process */
  int64_t pid;
  uint32_t sid_out, sid_err, sid_in;
  tp_spump_t *dc;
  int dc_over;
  /* -i from a pipe (or anything but a regular file, which the pump sends
   * itself): read here within the stream's credit */
  int in_here, in_over;
  uint64_t in_credit;
  uint8_t *in_buf;
  /* the loop's state, as run_streamed keeps it */
  int pending, exited, closed, out_done, err_done;
  int exit_code; /* once exited */
  int broken_errno;
  char broken[320], failed[320];
  int has_broken, has_failed;
} tp__fast_t;

/* fconn.c: places, lines, requests, replies */
int tp__fast_connect(const char *path, int *err);
int tp__fast_ctl(tp__fast_t *c);
int tp__fast_policy_near(void);
int tp__fast_send(int fd, const char *b, size_t n, tp_error_t *err);
char *tp__fline_take(tp__fline_t *l, size_t *len, size_t *used);
void tp__fline_drop(tp__fline_t *l, size_t used);
int tp__fline_fill(tp__fline_t *l, tp_error_t *err);
int tp__fast_parse(tp__fast_t *c, const char *line, size_t len, tp_error_t *err);
int64_t tp__fast_begin(tp__fast_t *c, tp_fjson_buf_t *w, const char *method);
void tp__fast_hello(tp__fast_t *c, tp_fjson_buf_t *w);
void tp__fast_channel(tp__fast_t *c, tp_fjson_buf_t *w);
void tp__fast_create(tp__fast_t *c, tp_fjson_buf_t *w);
void tp__fast_start(tp__fast_t *c, tp_fjson_buf_t *w);
int tp__fast_write(tp__fast_t *c, tp_fjson_buf_t *w, tp_error_t *err);
void tp__fast_settle(tp__fast_t *c);
int tp__fast_reply(tp__fast_t *c, int64_t id, int *res, int *eobj, tp_error_t *err);
void tp__fast_errmsg(tp__fast_t *c, int eobj, char *buf, size_t cap);
void tp__fast_note(tp__fast_t *c);

/* fstream.c: the data connection and the loop */
int tp__fast_open(tp__fast_t *c, int64_t channel_id, tp_error_t *err);
int tp__fast_run_in(tp__fast_t *c, int *code, tp_error_t *err);

#endif
