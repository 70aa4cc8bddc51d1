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
#include "freply.h"
#include "spump.h"

#define TP__FAST_WINDOW (4u * 1024u * 1024u) /* stream.attach's window, the Lua client's */
#define TP__FAST_REQ_MAX (64u * 1024u * 1024u) /* bytes of one request we write */

/* A connection's reader of JSON lines: buf is first the connection's
 * 64 KiB in .bss (tp__fline_init), then, for a longer line, the heap
 * (owned: the heap's). */
#define TP__FLINE_FIRST 65536
typedef struct tp__fline_s {
  int fd;
  char *buf;
  size_t have, cap;
  int owned;
} tp__fline_t;

typedef struct tp__fast_s {
  const tp_fargv_t *a;
  char socket[sizeof(((struct sockaddr_un *) 0)->sun_path)];
  tp__fline_t ctl;
  json_t *msg; /* the last message read (ours until the next) */
  /* replies that came before the one waited for (run's create and channel
   * may answer in either order) */
  struct { int64_t id; json_t *msg; } stash[4];
  int nstash;
  int64_t next_id;
  char id[TP_FAST_ID_MAX]; /* the sandbox */
  /* the process */
  int64_t pid;
  uint32_t sid_out, sid_err, sid_in;
  tp_spump_t *dc;
  int dc_over;
  /* the data connection from its attach's request to its reply (then the
   * pump's); the process.start once written (before that reply), else 0 */
  tp__fline_t att;
  int64_t start_id;
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
void tp__fline_init(tp__fline_t *l, int fd, char *first);
void tp__fline_free(tp__fline_t *l);
int tp__fline_fill(tp__fline_t *l, tp_error_t *err);
int tp__fast_parse(tp__fast_t *c, const char *line, size_t len, tp_error_t *err);
/* Requests, one compact JSON line each, gathered to be written at once:
 * in 8 KiB of .bss while they fit and no other request holds it (a
 * start's lines are a few hundred bytes), else on the heap. */
typedef struct tp__fout_s {
  char *b;
  size_t len;
  int failed; /* latched: out of memory, a string jansson refused, past TP__FAST_REQ_MAX */
  int in_bss; /* b is the .bss buffer */
} tp__fout_t;
void tp__fout_add(tp__fout_t *o, json_t *msg);
void tp__fout_free(tp__fout_t *o);
int64_t tp__fast_call(tp__fast_t *c, tp__fout_t *o, const char *method, json_t *params);
void tp__fast_hello(tp__fast_t *c, tp__fout_t *o);
void tp__fast_channel(tp__fast_t *c, tp__fout_t *o, const char *token);
void tp__fast_create(tp__fast_t *c, tp__fout_t *o);
void tp__fast_start(tp__fast_t *c, tp__fout_t *o);
int tp__fast_write(int fd, tp__fout_t *o, tp_error_t *err);
void tp__fast_settle(tp__fast_t *c);
int tp__fast_reply(tp__fast_t *c, int64_t id, json_t **res, json_t **eobj, tp_error_t *err);
void tp__fast_errmsg(json_t *eobj, char *buf, size_t cap);
void tp__fast_note(tp__fast_t *c);

/* fstream.c: the data connection and the loop */
int tp__fast_attach(tp__fast_t *c, const char *token, tp_error_t *err);
int tp__fast_attached(tp__fast_t *c, tp_error_t *err);
void tp__fast_att_free(tp__fast_t *c);
int tp__fast_run_in(tp__fast_t *c, int *code, tp_error_t *err);

#endif
