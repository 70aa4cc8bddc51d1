/* tp_sconn_t: a data connection of the data plane (stream.h). */
#define _GNU_SOURCE /* splice */
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connection's first read buffer: a 64 KiB frame and its header */
#define TP__SCONN_RBUF_FIRST (64u * 1024u + TP_SF_HDR)

typedef struct tp__swrite_s tp__swrite_t;

/* A DATA frame whose payload goes from a pipe into the socket (tp_sconn_splice). */
typedef struct tp__ssplice_s {
  int pfd;              /* the pipe's read end (a dup: the owner may close its own) */
  size_t left;          /* payload bytes still in the pipe */
  uint8_t hdr[TP_SF_HDR];
  size_t hdone;         /* header bytes written */
  tp_sconn_splice_cb cb;
  void *arg;
} tp__ssplice_t;

typedef struct tp__sstream_s {
  struct tp__sstream_s *next;
  uint32_t sid;
  uint32_t kind;
  void *data;
  uint64_t send_credit; /* bytes this side may still send */
  uint64_t recv_left;   /* bytes the peer may still send */
  uint64_t recv_window; /* most outstanding credit this side grants */
  int sends, peer_sends;
  int sent_end, peer_end;
} tp__sstream_t;

struct tp_sconn_s {
  void *data;
  uv_loop_t *loop;
  uv_pipe_t pipe;
  uv_timer_t timer;
  uv_prepare_t turn; /* ends tp_sconn_hold_turn's cork before the loop waits */
  uv_shutdown_t shut;
  tp_sconn_cbs_t cbs;
  int open_handles;
  int down;     /* no more reading or callbacks */
  int closing;  /* uv_close called */
  int released; /* the owner called tp_sconn_close */
  uint32_t window;
  uint64_t idle_ms;
  uint64_t last_progress;
  tp__sstream_t *streams;
  size_t nstreams;
  size_t queued;
  size_t queued_max; /* past it: no DATA, no reading (stream.h) */
  int held;          /* a writer was told 0 for the cap: on_writable once below it */
  int read_paused;   /* reading stopped for the cap */
  uint32_t recent[TP_SCONN_RECENT];
  unsigned nrecent;
  uint8_t *rbuf;
  size_t rlen;
  size_t rcap;       /* rbuf's size: TP__SCONN_RBUF_FIRST, the largest frame once one needs it */
  int corked;        /* small frames wait in cbuf: tp_sconn_cork's depth */
  int turn_held;     /* one of those corks is tp_sconn_hold_turn's */
  size_t clen;
  uint8_t cbuf[256];
  size_t inuv;        /* of queued: bytes in libuv's write queue */
  tp__ssplice_t *sp;  /* the spliced frame going out */
  tp__swrite_t *hq, **hq_tail; /* behind it, in order: frames (copied) and spliced frames to come */
  uv_poll_t wpoll;    /* sp's wait for room in the socket, on wfd */
  int wfd;            /* a dup of the socket for wpoll (libuv keeps one handle an fd); -1 */
  /* a DATA payload read straight into its owner's room (cbs.data_buf):
   * the socket's reads go to dx_dst + dx_got, never past the frame; once
   * its stream is over, dx_dst is NULL and the rest is read and dropped */
  int dx;
  uint32_t dx_sid;
  uint8_t *dx_dst;
  size_t dx_len, dx_got;
  int hdr_first;      /* after a direct payload: the next read takes a header only, so that
                         the next large payload goes to its room whole, not partly through rbuf */
};

struct tp__swrite_s {
  uv_write_t req;
  tp_sconn_t *c;
  tp__swrite_t *next; /* in hq */
  tp__ssplice_t *sp;  /* in hq: a spliced frame (len 0), not bytes */
  size_t len;
  uint8_t bytes[];
};

void *tp_sconn_data(const tp_sconn_t *c) { return c->data; }
size_t tp_sconn_streams(const tp_sconn_t *c) { return c->nstreams; }
size_t tp_sconn_queued(const tp_sconn_t *c) { return c->queued; }
void tp_sconn_set_queued_max(tp_sconn_t *c, size_t bytes) { c->queued_max = bytes; }

static void tp__sconn_close_cb(uv_handle_t *h) {
  tp_sconn_t *c = h->data;
  if (--c->open_handles > 0)
    return;
  free(c->rbuf);
  free(c);
}

static void tp__sconn_free_streams(tp_sconn_t *c) {
  while (c->streams != NULL) {
    tp__sstream_t *s = c->streams;
    c->streams = s->next;
    free(s);
  }
  c->nstreams = 0;
}

static void tp__sconn_close_handles(tp_sconn_t *c) {
  if (c->closing)
    return;
  c->closing = 1;
  if (c->sp != NULL) {
    close(c->sp->pfd);
    free(c->sp);
    c->sp = NULL;
  }
  while (c->hq != NULL) {
    tp__swrite_t *w = c->hq;
    c->hq = w->next;
    if (w->sp != NULL) {
      close(w->sp->pfd);
      free(w->sp);
    }
    free(w);
  }
  if (c->wfd >= 0) { /* epoll forgets wfd in uv_close: it can be closed now */
    uv_close((uv_handle_t *) &c->wpoll, tp__sconn_close_cb);
    close(c->wfd);
    c->wfd = -1;
  }
  uv_close((uv_handle_t *) &c->pipe, tp__sconn_close_cb);
  uv_close((uv_handle_t *) &c->timer, tp__sconn_close_cb);
  uv_close((uv_handle_t *) &c->turn, tp__sconn_close_cb);
}

static tp__sstream_t *tp__sconn_find(tp_sconn_t *c, uint32_t sid) {
  for (tp__sstream_t *s = c->streams; s != NULL; s = s->next)
    if (s->sid == sid)
      return s;
  return NULL;
}

static void tp__sconn_forget(tp_sconn_t *c, tp__sstream_t *s) {
  tp__sstream_t **pp = &c->streams;
  while (*pp != s)
    pp = &(*pp)->next;
  *pp = s->next;
  c->nstreams--;
  if (c->dx && c->dx_sid == s->sid)
    c->dx_dst = NULL; /* the owner may free its room: the rest of the payload is dropped */
  c->recent[c->nrecent++ % TP_SCONN_RECENT] = s->sid;
  free(s);
}

static int tp__sconn_recent(const tp_sconn_t *c, uint32_t sid) {
  unsigned n = c->nrecent < TP_SCONN_RECENT ? c->nrecent : TP_SCONN_RECENT;
  for (unsigned i = 0; i < n; i++)
    if (c->recent[i] == sid)
      return 1;
  return 0;
}

static void tp__sconn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void tp__sconn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void tp__sconn_parse(tp_sconn_t *c);

/* The queue went below its cap: reading again (once at half of it, so
 * that a peer that reads slowly is not paused at every frame), and the
 * writers told 0 for the cap may write.  Each stream is looked up again
 * after each callback: an owner may end streams, or close c, in it. */
static void tp__sconn_unhold(tp_sconn_t *c) {
  uint32_t sids[TP_SCONN_STREAMS_MAX];
  size_t n = 0;
  if (c->down || c->released || c->closing)
    return;
  if (c->read_paused && c->queued < c->queued_max / 2) {
    c->read_paused = 0;
    tp__sconn_parse(c); /* what was read before the pause first */
    if (c->down || c->released || c->read_paused)
      return;
    uv_read_start((uv_stream_t *) &c->pipe, tp__sconn_alloc_cb, tp__sconn_read_cb);
  }
  if (!c->held || c->queued >= c->queued_max)
    return;
  c->held = 0;
  for (tp__sstream_t *s = c->streams; s != NULL && n < TP_SCONN_STREAMS_MAX; s = s->next)
    if (s->sends && !s->sent_end && s->send_credit > 0)
      sids[n++] = s->sid;
  for (size_t i = 0; i < n && !c->released && !c->down; i++) {
    tp__sstream_t *s = tp__sconn_find(c, sids[i]);
    if (s != NULL && c->cbs.on_writable != NULL)
      c->cbs.on_writable(c, s->sid, s->data);
  }
}

static void tp__sconn_splice_go(tp_sconn_t *c);
static void tp__sconn_hq_flush(tp_sconn_t *c);

static void tp__sconn_write_cb(uv_write_t *req, int status) {
  tp__swrite_t *w = (tp__swrite_t *) req;
  tp_sconn_t *c = w->c;
  c->queued -= w->len;
  c->inuv -= w->len;
  if (status == 0)
    c->last_progress = uv_now(c->loop);
  free(w);
  if (status == 0 && c->sp == NULL && c->hq != NULL && c->inuv == 0 && !c->closing)
    tp__sconn_hq_flush(c); /* what came before a spliced frame is out */
  else if (status == 0 && c->queued < c->queued_max)
    tp__sconn_unhold(c);
}

/* Writes the bytes of b[0..nb) (total in all): what the socket takes at
 * once goes from them (one writev, when nothing is queued before it); only
 * the rest is copied and queued.  The copy's room is taken first, so that a
 * frame is never cut in two by a failed malloc (untouched, it costs no page
 * of memory). */
static int tp__sconn_put(tp_sconn_t *c, const uv_buf_t *b, unsigned nb, size_t total) {
  tp__swrite_t *w;
  uv_buf_t rest;
  size_t done = 0, at = 0;
  int r;
  if ((w = malloc(sizeof(*w) + total)) == NULL)
    return -ENOMEM;
  if (c->sp != NULL || c->hq != NULL) { /* behind a spliced frame: sent once it is out */
    for (unsigned i = 0; i < nb; i++) {
      memcpy(w->bytes + at, b[i].base, b[i].len);
      at += b[i].len;
    }
    w->c = c;
    w->len = total;
    w->sp = NULL;
    w->next = NULL;
    *c->hq_tail = w;
    c->hq_tail = &w->next;
    c->queued += total;
    return 0;
  }
  if (c->queued == 0) {
    r = uv_try_write((uv_stream_t *) &c->pipe, b, nb);
    if (r > 0)
      done = (size_t) r; /* an error other than EAGAIN: uv_write below reports it */
    c->last_progress = uv_now(c->loop); /* the wait for what is left starts now */
    if (done == total) {
      free(w);
      return 0;
    }
  }
  for (unsigned i = 0; i < nb; i++) { /* the bytes past done, in order */
    size_t from = done > at ? done - at : 0;
    if (from < b[i].len) {
      memcpy(w->bytes + (at + from - done), b[i].base + from, b[i].len - from);
    }
    at += b[i].len;
  }
  w->c = c;
  w->len = total - done;
  rest = uv_buf_init((char *) w->bytes, (unsigned) w->len);
  r = uv_write(&w->req, (uv_stream_t *) &c->pipe, &rest, 1, tp__sconn_write_cb);
  if (r < 0) {
    free(w);
    return r;
  }
  c->queued += w->len;
  c->inuv += w->len;
  return 0;
}

/* The frames held by a cork, out in one write. */
static int tp__sconn_flush(tp_sconn_t *c) {
  uv_buf_t b;
  size_t n = c->clen;
  if (n == 0)
    return 0;
  c->clen = 0;
  if (c->closing)
    return -EPIPE;
  b = uv_buf_init((char *) c->cbuf, (unsigned) n);
  return tp__sconn_put(c, &b, 1, n);
}

void tp_sconn_cork(tp_sconn_t *c) { c->corked++; }

void tp_sconn_uncork(tp_sconn_t *c) {
  if (c->corked > 0 && --c->corked > 0)
    return; /* an outer cork still holds them */
  (void) tp__sconn_flush(c); /* a failed write ends the connection (its callback, its reader) */
}

void tp_sconn_flush(tp_sconn_t *c) { (void) tp__sconn_flush(c); }

static void tp__sconn_turn_cb(uv_prepare_t *h) {
  tp_sconn_t *c = h->data;
  uv_prepare_stop(h);
  if (c->turn_held) {
    c->turn_held = 0;
    tp_sconn_uncork(c);
  }
}

void tp_sconn_hold_turn(tp_sconn_t *c) {
  if (c->turn_held || c->closing)
    return;
  c->turn_held = 1;
  c->corked++;
  uv_prepare_start(&c->turn, tp__sconn_turn_cb); /* cannot fail on an initialized handle */
}

/* Sends one frame: header for a payload of len bytes, then p.  Corked, a
 * small frame waits with the others for tp_sconn_uncork. */
static int tp__sconn_send(tp_sconn_t *c, uint8_t type, uint32_t sid, const void *p, size_t len) {
  uint8_t hdr[TP_SF_HDR];
  uv_buf_t b[2];
  int r;
  if (c->closing)
    return -EPIPE;
  tp_sframe_header(hdr, type, sid, (uint32_t) len);
  if (c->corked) {
    if (c->clen + TP_SF_HDR + len <= sizeof(c->cbuf)) {
      memcpy(c->cbuf + c->clen, hdr, TP_SF_HDR);
      if (len)
        memcpy(c->cbuf + c->clen + TP_SF_HDR, p, len);
      c->clen += TP_SF_HDR + len;
      return 0;
    }
    if ((r = tp__sconn_flush(c)) < 0) /* in order: what the cork holds first */
      return r;
  }
  b[0] = uv_buf_init((char *) hdr, TP_SF_HDR);
  b[1] = uv_buf_init((char *) p, (unsigned) len);
  return tp__sconn_put(c, b, len ? 2 : 1, TP_SF_HDR + len);
}

static void tp__sconn_send_error(tp_sconn_t *c, uint32_t sid, int errnum, const char *msg) {
  uint8_t f[TP_SF_HDR + 4 + TP_SF_MSG_MAX];
  size_t n = tp_sframe_error(f, sid, (uint32_t) errnum, msg);
  tp__sconn_send(c, TP_SF_ERROR, sid, f + TP_SF_HDR, n - TP_SF_HDR);
}

/* A stream error found here: the peer is told, the owner too. */
static void tp__sconn_stream_error(tp_sconn_t *c, tp__sstream_t *s, int errnum, const char *msg) {
  uint32_t sid = s->sid;
  void *sdata = s->data;
  tp__sconn_send_error(c, sid, errnum, msg);
  tp__sconn_forget(c, s);
  if (!c->released && c->cbs.on_stream_error != NULL)
    c->cbs.on_stream_error(c, sid, sdata, errnum, msg);
}

static void tp__sconn_shutdown_cb(uv_shutdown_t *req, int status) {
  tp_sconn_t *c = req->data;
  (void) status;
  tp__sconn_close_handles(c);
}

/* The connection goes down on its own: streams end, the owner hears it,
 * the socket closes (after an ERROR on sid 0 when errnum says so). */
static void tp__sconn_down(tp_sconn_t *c, int errnum, const char *reason, int tell_peer) {
  char msg[256];
  if (c->down)
    return;
  c->down = 1;
  uv_read_stop((uv_stream_t *) &c->pipe);
  snprintf(msg, sizeof(msg), "data connection closed: %s", reason);
  while (c->streams != NULL) {
    tp__sstream_t *s = c->streams;
    uint32_t sid = s->sid;
    void *sdata = s->data;
    tp__sconn_forget(c, s);
    if (!c->released && c->cbs.on_stream_error != NULL)
      c->cbs.on_stream_error(c, sid, sdata, errnum ? errnum : ECONNRESET, msg);
  }
  if (!c->released && c->cbs.on_close != NULL)
    c->cbs.on_close(c, errnum, reason);
  c->released = 1; /* no callback after on_close */
  if (tell_peer && errnum) {
    tp__sconn_send_error(c, 0, errnum, reason);
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *) &c->pipe, tp__sconn_shutdown_cb) == 0)
      return; /* closed once the ERROR is out, or by the idle timer */
  }
  tp__sconn_close_handles(c);
}

static void tp__sconn_timer_cb(uv_timer_t *t) {
  tp_sconn_t *c = t->data;
  uint64_t now = uv_now(c->loop);
  int waiting = c->queued > 0 || c->sp != NULL || c->hq != NULL;
  for (tp__sstream_t *s = c->streams; s != NULL && !waiting; s = s->next)
    if (s->sends && !s->sent_end && s->send_credit == 0)
      waiting = 1;
  if (!waiting) {
    c->last_progress = now;
    return;
  }
  if (now - c->last_progress < c->idle_ms)
    return;
  if (c->down) { /* an ERROR on sid 0 the peer never read */
    tp__sconn_close_handles(c);
    return;
  }
  tp__sconn_down(c, ETIMEDOUT, "the client took nothing for the idle time", 1);
}

/* A full read buffer holds a part of one frame (whole ones are parsed after
 * each read): it grows to the largest frame's size, once.  Past that a
 * full buffer cannot happen; a failed growth is libuv's UV_ENOBUFS, which
 * ends the connection. */
static void tp__sconn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tp_sconn_t *c = h->data;
  (void) suggested;
  if (c->dx) { /* the payload's rest, and not a byte past it */
    size_t left = c->dx_len - c->dx_got;
    if (c->dx_dst != NULL) {
      buf->base = (char *) c->dx_dst + c->dx_got;
      buf->len = left;
    } else { /* dropped: rbuf is empty meanwhile */
      buf->base = (char *) c->rbuf;
      buf->len = left < c->rcap ? left : c->rcap;
    }
    return;
  }
  if (c->rlen == c->rcap && c->rcap < TP_SF_HDR + TP_SF_DATA_MAX) {
    uint8_t *b = realloc(c->rbuf, TP_SF_HDR + TP_SF_DATA_MAX);
    if (b != NULL) {
      c->rbuf = b;
      c->rcap = TP_SF_HDR + TP_SF_DATA_MAX;
    }
  }
  buf->base = (char *) c->rbuf + c->rlen;
  buf->len = c->rcap - c->rlen;
  if (c->hdr_first && c->rlen < TP_SF_HDR)
    buf->len = TP_SF_HDR - c->rlen;
}

/* One whole, valid frame from the peer. */
static void tp__sconn_frame(tp_sconn_t *c, const tp_sframe_t *f) {
  tp__sstream_t *s;
  char msg[128];
  if (f->type == TP_SF_ERROR && f->sid == 0) {
    char reason[TP_SF_MSG_MAX + 32];
    snprintf(reason, sizeof(reason), "the client ended it: %.*s", (int) f->msg_len, f->msg);
    tp__sconn_down(c, 0, reason, 0);
    return;
  }
  if (f->type == TP_SF_OPEN) {
    snprintf(msg, sizeof(msg), "stream %u: a client cannot open streams in version 1", f->sid);
    tp__sconn_send_error(c, f->sid, EOPNOTSUPP, msg);
    return;
  }
  s = tp__sconn_find(c, f->sid);
  if (s == NULL) {
    if (!tp__sconn_recent(c, f->sid) && f->type != TP_SF_ERROR) {
      snprintf(msg, sizeof(msg), "stream %u: no such stream on this connection", f->sid);
      tp__sconn_send_error(c, f->sid, ENOENT, msg);
    }
    return;
  }
  c->last_progress = uv_now(c->loop);
  switch (f->type) {
  case TP_SF_DATA:
    if (!s->peer_sends || s->peer_end) {
      snprintf(msg, sizeof(msg), "stream %u: DATA %s", s->sid,
               s->peer_end ? "after END" : "on a stream the client does not send on");
      tp__sconn_stream_error(c, s, EPROTO, msg);
    } else if (f->len > s->recv_left) {
      snprintf(msg, sizeof(msg), "stream %u: DATA beyond the credit given (%llu bytes left)", s->sid,
               (unsigned long long) s->recv_left);
      tp__sconn_stream_error(c, s, EPROTO, msg);
    } else {
      s->recv_left -= f->len;
      if (c->cbs.on_data != NULL && !c->released)
        c->cbs.on_data(c, s->sid, s->data, f->payload, f->len);
    }
    break;
  case TP_SF_END:
    if (!s->peer_sends || s->peer_end) {
      snprintf(msg, sizeof(msg), "stream %u: END %s", s->sid,
               s->peer_end ? "twice" : "on a stream the client does not send on");
      tp__sconn_stream_error(c, s, EPROTO, msg);
      break;
    }
    s->peer_end = 1;
    {
      uint32_t sid = s->sid;
      void *sdata = s->data;
      if (!s->sends || s->sent_end)
        tp__sconn_forget(c, s);
      if (c->cbs.on_end != NULL && !c->released)
        c->cbs.on_end(c, sid, sdata);
    }
    break;
  case TP_SF_ERROR: {
    char m[TP_SF_MSG_MAX + 1];
    uint32_t sid = s->sid;
    void *sdata = s->data;
    memcpy(m, f->msg, f->msg_len);
    m[f->msg_len] = '\0';
    tp__sconn_forget(c, s);
    if (c->cbs.on_stream_error != NULL && !c->released)
      c->cbs.on_stream_error(c, sid, sdata, f->err ? (int) f->err : ECANCELED, m);
    break;
  }
  case TP_SF_CREDIT:
    if (!s->sends || s->sent_end)
      break; /* credit for a direction that is done: harmless */
    if (s->send_credit + f->credit > c->window) {
      snprintf(msg, sizeof(msg), "stream %u: CREDIT beyond the window of %u bytes", s->sid, c->window);
      tp__sconn_stream_error(c, s, EPROTO, msg);
      break;
    }
    s->send_credit += f->credit;
    if (c->cbs.on_writable != NULL && !c->released)
      c->cbs.on_writable(c, s->sid, s->data);
    break;
  default:
    break;
  }
}

/* rbuf starts with a frame's valid header and part of its payload: a
 * DATA frame of a stream whose owner has room for it (cbs.data_buf) has
 * the rest read straight into that room (the part here copied there).
 * Checked as tp__sconn_frame would once it is whole; any other frame
 * waits in rbuf as before. */
static void tp__sconn_direct(tp_sconn_t *c) {
  uint32_t len, sid;
  tp__sstream_t *s;
  uint8_t *dst;
  if (c->dx || c->rlen < TP_SF_HDR || c->rbuf[5] != TP_SF_DATA || c->cbs.data_buf == NULL ||
      c->released || c->down)
    return;
  len = (uint32_t) c->rbuf[0] | (uint32_t) c->rbuf[1] << 8 | (uint32_t) c->rbuf[2] << 16 |
        (uint32_t) c->rbuf[3] << 24;
  sid = (uint32_t) c->rbuf[8] | (uint32_t) c->rbuf[9] << 8 | (uint32_t) c->rbuf[10] << 16 |
        (uint32_t) c->rbuf[11] << 24;
  if (len < TP_SCONN_DIRECT_MIN || len > TP_SF_DATA_MAX || c->rlen - TP_SF_HDR >= len)
    return;
  s = tp__sconn_find(c, sid);
  if (s == NULL || !s->peer_sends || s->peer_end || len > s->recv_left)
    return; /* its error once it is whole */
  if ((dst = c->cbs.data_buf(c, sid, s->data, len)) == NULL)
    return;
  memcpy(dst, c->rbuf + TP_SF_HDR, c->rlen - TP_SF_HDR);
  c->dx = 1;
  c->dx_sid = sid;
  c->dx_dst = dst;
  c->dx_len = len;
  c->dx_got = c->rlen - TP_SF_HDR;
  c->rlen = 0;
  s->recv_left -= len;
  c->last_progress = uv_now(c->loop);
}

/* nread more bytes of the direct payload (tp__sconn_direct); once it is
 * all there, the owner gets it. */
static void tp__sconn_direct_read(tp_sconn_t *c, size_t nread) {
  tp__sstream_t *s;
  c->dx_got += nread;
  if (nread > 0)
    c->last_progress = uv_now(c->loop);
  if (c->dx_got < c->dx_len)
    return;
  c->dx = 0;
  c->hdr_first = 1;
  if (c->dx_dst == NULL || (s = tp__sconn_find(c, c->dx_sid)) == NULL)
    return; /* its stream ended meanwhile: dropped, as a late frame of it */
  if (c->cbs.on_data != NULL && !c->released)
    c->cbs.on_data(c, s->sid, s->data, c->dx_dst, c->dx_len);
}

/* The whole frames read so far, one by one, while the queue is under its
 * cap: a frame's answer (an ERROR, a CREDIT) is queued before the next
 * is looked at, so the cap is passed by one frame's answer at most.  At
 * the cap reading stops, the rest waits in rbuf and in the socket, and
 * tp__sconn_unhold comes back here once the queue is down. */
static void tp__sconn_parse(tp_sconn_t *c) {
  size_t off = 0;
  int partial = 0;
  while (!c->down && c->queued < c->queued_max) {
    tp_sframe_t f;
    const char *why = "malformed frame";
    long n = tp_sframe_parse(c->rbuf + off, c->rlen - off, &f, &why);
    if (n == 0) {
      partial = 1;
      break;
    }
    if (n < 0) {
      tp__sconn_down(c, EPROTO, why, 1);
      return;
    }
    off += (size_t) n;
    tp__sconn_frame(c, &f);
  }
  if (c->down)
    return;
  if (off > 0) {
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
  }
  if (partial)
    tp__sconn_direct(c);
  if (c->queued >= c->queued_max && !c->read_paused) {
    /* the peer does not read what is queued: nothing more is read from it
     * (what it sends waits in its socket) until the queue is down again;
     * if it never reads, the idle timer drops it */
    c->read_paused = 1;
    uv_read_stop((uv_stream_t *) &c->pipe);
  }
}

static void tp__sconn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  tp_sconn_t *c = st->data;
  (void) buf;
  if (nread < 0) {
    int mid = c->rlen > 0 || c->dx;
    c->dx = 0;
    tp__sconn_down(c, nread == UV_EOF ? 0 : -(int) nread,
                   nread == UV_EOF ? (mid ? "the client left in the middle of a frame"
                                          : "the client closed it")
                                   : uv_strerror((int) nread), 0);
    return;
  }
  if (c->dx) {
    tp__sconn_direct_read(c, (size_t) nread);
    if (!c->dx && !c->down)
      tp__sconn_parse(c); /* the cap's pause, as after any frame */
    return;
  }
  c->rlen += (size_t) nread;
  if (c->rlen >= TP_SF_HDR)
    c->hdr_first = 0; /* a header is in: as large a read as rbuf takes, or a direct payload */
  tp__sconn_parse(c);
}

tp_sconn_t *tp_sconn_new(uv_loop_t *loop, int fd, uint32_t window, uint64_t idle_ms,
                         const tp_sconn_cbs_t *cbs, void *data, tp_error_t *err) {
  tp_sconn_t *c;
  int r;
  if (window < TP_SCONN_WINDOW_MIN || window > TP_SCONN_WINDOW_MAX) {
    close(fd);
    tp_error_set(err, EINVAL, "data connection: window %u is not %u to %u bytes", window,
                 TP_SCONN_WINDOW_MIN, TP_SCONN_WINDOW_MAX);
    return NULL;
  }
  c = calloc(1, sizeof(*c));
  /* a small buffer first (from the heap: a buffer of the largest frame's
   * size was a mmap, a page fault and a munmap every connection, and
   * `tupper exec` makes one a start); it grows when a frame needs it */
  if (c == NULL || (c->rbuf = malloc(c->rcap = TP__SCONN_RBUF_FIRST)) == NULL) {
    free(c);
    close(fd);
    tp_error_set(err, ENOMEM, "data connection: out of memory");
    return NULL;
  }
  /* room in the kernel for what the daemon may send ahead (the window, at
   * most the default's: kernel memory is not swapped), so that DATA goes out
   * whole from the source's buffer instead of copied into the write queue;
   * as root past net.core.wmem_max, else up to it */
  {
    int want = (int) (window < TP_SCONN_WINDOW_DEFAULT ? window : TP_SCONN_WINDOW_DEFAULT);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) < 0)
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  }
  c->data = data;
  c->loop = loop;
  c->wfd = -1;
  c->hq_tail = &c->hq;
  c->cbs = *cbs;
  c->window = window;
  c->queued_max = TP_SCONN_QUEUED_MAX;
  c->idle_ms = idle_ms ? idle_ms : TP_SCONN_IDLE_MS;
  if ((r = uv_pipe_init(loop, &c->pipe, 0)) < 0) {
    free(c->rbuf);
    free(c);
    close(fd);
    tp_error_set(err, -r, "data connection: %s", uv_strerror(r));
    return NULL;
  }
  c->pipe.data = c;
  c->open_handles = 1;
  uv_timer_init(loop, &c->timer); /* cannot fail */
  c->timer.data = c;
  uv_prepare_init(loop, &c->turn); /* cannot fail */
  c->turn.data = c;
  c->open_handles = 3;
  if ((r = uv_pipe_open(&c->pipe, fd)) < 0 ||
      (r = uv_read_start((uv_stream_t *) &c->pipe, tp__sconn_alloc_cb, tp__sconn_read_cb)) < 0) {
    close(fd);
    c->released = c->down = 1;
    tp__sconn_close_handles(c);
    tp_error_set(err, -r, "data connection: %s", uv_strerror(r));
    return NULL;
  }
  c->last_progress = uv_now(loop);
  {
    uint64_t tick = c->idle_ms / 4 ? c->idle_ms / 4 : 1;
    uv_timer_start(&c->timer, tp__sconn_timer_cb, tick, tick);
  }
  return c;
}

int tp_sconn_preface(tp_sconn_t *c, const void *p, size_t n, tp_error_t *err) {
  tp__swrite_t *w;
  uv_buf_t b;
  int r;
  if (c->down)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if ((w = malloc(sizeof(*w) + n)) == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  memcpy(w->bytes, p, n);
  w->c = c;
  w->len = n;
  b = uv_buf_init((char *) w->bytes, (unsigned) n);
  if ((r = uv_write(&w->req, (uv_stream_t *) &c->pipe, &b, 1, tp__sconn_write_cb)) < 0) {
    free(w);
    return tp_error_set(err, -r, "data connection: %s", uv_strerror(r));
  }
  c->queued += n;
  c->inuv += n;
  return 0;
}

int tp_sconn_open(tp_sconn_t *c, uint32_t sid, uint32_t kind, uint32_t recv_window, int sends,
                  void *sdata, tp_error_t *err) {
  uint8_t f[TP_SF_HDR + 8];
  tp__sstream_t *s;
  int r;
  if (c->down)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if (sid == 0 || sid >= TP_SF_CLIENT_SID || kind == 0 || kind > TP_SK_MAX_ ||
      recv_window > TP_SCONN_WINDOW_MAX || (!sends && recv_window == 0))
    return tp_error_set(err, EINVAL, "stream %u: bad id, kind or window", sid);
  if (tp__sconn_find(c, sid) != NULL || tp__sconn_recent(c, sid))
    return tp_error_set(err, EEXIST, "stream %u: the id is taken", sid);
  if (c->nstreams >= TP_SCONN_STREAMS_MAX)
    return tp_error_set(err, EMFILE, "too many streams on one data connection (%d)",
                        TP_SCONN_STREAMS_MAX);
  if ((s = calloc(1, sizeof(*s))) == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  tp_sframe_open(f, sid, kind, recv_window);
  if ((r = tp__sconn_send(c, TP_SF_OPEN, sid, f + TP_SF_HDR, 8)) < 0) {
    free(s);
    return tp_error_set(err, -r, "stream %u: %s", sid, strerror(-r));
  }
  s->sid = sid;
  s->kind = kind;
  s->data = sdata;
  s->sends = sends ? 1 : 0;
  s->send_credit = sends ? c->window : 0;
  s->peer_sends = recv_window > 0;
  s->recv_left = s->recv_window = recv_window;
  s->next = c->streams;
  c->streams = s;
  c->nstreams++;
  return 0;
}

uint64_t tp_sconn_can_write(const tp_sconn_t *c, uint32_t sid) {
  tp__sstream_t *s = tp__sconn_find((tp_sconn_t *) c, sid);
  if (s == NULL || !s->sends || s->sent_end || c->down || s->send_credit == 0)
    return 0;
  if (c->queued >= c->queued_max) {
    ((tp_sconn_t *) c)->held = 1; /* on_writable once the queue is down */
    return 0;
  }
  return s->send_credit < c->queued_max - c->queued ? s->send_credit : c->queued_max - c->queued;
}

long tp_sconn_write(tp_sconn_t *c, uint32_t sid, const void *p, size_t n, tp_error_t *err) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  const uint8_t *b = p;
  size_t done = 0;
  if (c->down)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if (s == NULL || !s->sends)
    return tp_error_set(err, ENOENT, "stream %u: not a stream this side sends on", sid);
  if (s->sent_end)
    return tp_error_set(err, EPIPE, "stream %u: already ended", sid);
  while (done < n && s->send_credit > 0) {
    size_t k = n - done;
    int r;
    if (k > TP_SF_DATA_MAX)
      k = TP_SF_DATA_MAX;
    if (k > s->send_credit)
      k = (size_t) s->send_credit;
    if ((r = tp__sconn_send(c, TP_SF_DATA, sid, b + done, k)) < 0) {
      if (done > 0)
        break;
      return tp_error_set(err, -r, "stream %u: %s", sid, uv_strerror(r));
    }
    s->send_credit -= k;
    done += k;
  }
  return (long) done;
}

int tp_sconn_end(tp_sconn_t *c, uint32_t sid, int has_size, uint64_t size, tp_error_t *err) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  uint8_t f[TP_SF_HDR + 8];
  size_t n;
  int r;
  if (c->down)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if (s == NULL || !s->sends || s->sent_end)
    return tp_error_set(err, ENOENT, "stream %u: not a stream this side sends on", sid);
  n = tp_sframe_end(f, sid, has_size, size);
  if ((r = tp__sconn_send(c, TP_SF_END, sid, f + TP_SF_HDR, n - TP_SF_HDR)) < 0)
    return tp_error_set(err, -r, "stream %u: %s", sid, uv_strerror(r));
  s->sent_end = 1;
  if (!s->peer_sends || s->peer_end)
    tp__sconn_forget(c, s);
  return 0;
}

int tp_sconn_credit(tp_sconn_t *c, uint32_t sid, uint32_t n, tp_error_t *err) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  uint8_t f[TP_SF_HDR + 4];
  int r;
  if (c->down)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if (s == NULL || s->peer_end)
    return 0; /* the stream is over: nothing to grant */
  if (n == 0 || s->recv_left + n > s->recv_window)
    return tp_error_set(err, EINVAL, "stream %u: credit of %u beyond the window", sid, n);
  tp_sframe_credit(f, sid, n);
  if ((r = tp__sconn_send(c, TP_SF_CREDIT, sid, f + TP_SF_HDR, 4)) < 0)
    return tp_error_set(err, -r, "stream %u: %s", sid, uv_strerror(r));
  s->recv_left += n;
  return 0;
}

int tp_sconn_fail(tp_sconn_t *c, uint32_t sid, int errnum, const char *msg) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  if (s == NULL || c->down)
    return -1;
  tp__sconn_send_error(c, sid, errnum, msg);
  tp__sconn_forget(c, s);
  return 0;
}

int tp_sconn_finish(tp_sconn_t *c, uint32_t sid, int has_size, uint64_t size, tp_error_t *err) {
  tp__sstream_t *s;
  if (tp_sconn_end(c, sid, has_size, size, err) < 0)
    return -1;
  if ((s = tp__sconn_find(c, sid)) != NULL)
    tp__sconn_forget(c, s);
  return 0;
}

void tp_sconn_drop(tp_sconn_t *c, uint32_t sid) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  if (s != NULL)
    tp__sconn_forget(c, s);
}

void tp_sconn_close(tp_sconn_t *c) {
  c->released = 1;
  c->down = 1;
  tp__sconn_free_streams(c);
  tp__sconn_close_handles(c);
}

/* ---- a DATA frame spliced from a pipe (tp_sconn_splice) ---------------------------- */

static void tp__sconn_wpoll_cb(uv_poll_t *h, int status, int events) {
  tp_sconn_t *c = h->data;
  (void) events;
  if (c->sp == NULL || c->closing)
    return;
  if (status < 0) {
    tp__sconn_down(c, -status, uv_strerror(status), 0);
    return;
  }
  tp__sconn_splice_go(c);
}

/* The spliced frame's header and payload, as far as the socket takes them
 * now; then what was held behind it goes to libuv's queue, and the owner
 * hears that the pipe is drained.  A failure is the connection's: a frame
 * cut in two cannot be mended. */
static void tp__sconn_splice_go(tp_sconn_t *c) {
  tp__ssplice_t *sp = c->sp;
  uv_os_fd_t fd;
  int e = 0;
  if (uv_fileno((uv_handle_t *) &c->pipe, &fd) < 0) {
    tp__sconn_down(c, EBADF, "the data connection has no socket", 0);
    return;
  }
  while (sp->hdone < TP_SF_HDR) {
    ssize_t w = send(fd, sp->hdr + sp->hdone, TP_SF_HDR - sp->hdone, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      goto wait;
    if (w <= 0) {
      e = w < 0 ? errno : EPIPE;
      goto fail;
    }
    sp->hdone += (size_t) w;
  }
  while (sp->left > 0) {
    /* the pipe holds all of left (checked when queued): EAGAIN is the socket's */
    ssize_t n = splice(sp->pfd, NULL, fd, NULL, sp->left, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      goto wait;
    if (n <= 0) {
      e = n < 0 ? errno : EPIPE;
      goto fail;
    }
    sp->left -= (size_t) n;
    c->last_progress = uv_now(c->loop);
  }
  if (c->wfd >= 0)
    uv_poll_stop(&c->wpoll);
  c->sp = NULL;
  close(sp->pfd);
  if (sp->cb != NULL)
    sp->cb(sp->arg, 0); /* what it makes goes behind what is held */
  free(sp);
  if (!c->closing)
    tp__sconn_hq_flush(c);
  return;
wait:
  if (c->wfd < 0) {
    int r;
    if ((c->wfd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
      e = errno;
      goto fail;
    }
    if ((r = uv_poll_init(c->loop, &c->wpoll, c->wfd)) < 0) {
      close(c->wfd);
      c->wfd = -1;
      e = -r;
      goto fail;
    }
    c->wpoll.data = c;
    c->open_handles++;
  }
  if (uv_poll_start(&c->wpoll, UV_WRITABLE, tp__sconn_wpoll_cb) == 0)
    return;
  e = EIO;
fail:
  {
    char why[128];
    snprintf(why, sizeof(why), "a spliced frame: %s", strerror(e));
    tp__sconn_down(c, e, why, 0);
  }
}

/* What is held goes out in order: frames to libuv's queue, up to the next
 * spliced frame, which starts once that queue is out (tp__sconn_write_cb
 * comes back here) and, the socket full, goes on from the poll. */
static void tp__sconn_hq_flush(tp_sconn_t *c) {
  while (c->sp == NULL && c->hq != NULL && !c->closing) {
    tp__swrite_t *w = c->hq;
    if (w->sp != NULL) {
      if (c->inuv > 0)
        return;
      c->hq = w->next;
      if (c->hq == NULL)
        c->hq_tail = &c->hq;
      c->sp = w->sp;
      free(w);
      tp__sconn_splice_go(c); /* may call back, and flush on */
      return;
    }
    uv_buf_t b = uv_buf_init((char *) w->bytes, (unsigned) w->len);
    int r;
    c->hq = w->next;
    if (c->hq == NULL)
      c->hq_tail = &c->hq;
    if ((r = uv_write(&w->req, (uv_stream_t *) &c->pipe, &b, 1, tp__sconn_write_cb)) < 0) {
      c->queued -= w->len;
      free(w);
      tp__sconn_down(c, -r, uv_strerror(r), 0);
      return;
    }
    c->inuv += w->len;
  }
  if (c->sp == NULL && c->hq == NULL && !c->closing && c->queued < c->queued_max)
    tp__sconn_unhold(c);
}

int tp_sconn_splice(tp_sconn_t *c, uint32_t sid, int pfd, size_t len, tp_sconn_splice_cb cb, void *arg,
                    tp_error_t *err) {
  tp__sstream_t *s = tp__sconn_find(c, sid);
  tp__ssplice_t *sp;
  tp__swrite_t *w;
  int inpipe = 0, r;
  if (c->down || c->closing)
    return tp_error_set(err, EPIPE, "data connection is closed");
  if (s == NULL || !s->sends || s->sent_end)
    return tp_error_set(err, ENOENT, "stream %u: not a stream this side sends on", sid);
  if (len == 0 || len > TP_SF_DATA_MAX || len > s->send_credit)
    return tp_error_set(err, EINVAL, "stream %u: %zu bytes are not within one frame and the credit", sid, len);
  if (ioctl(pfd, FIONREAD, &inpipe) < 0 || inpipe < 0 || (size_t) inpipe < len)
    return tp_error_set(err, EINVAL, "stream %u: the pipe holds %d of %zu bytes", sid, inpipe, len);
  if (c->clen > 0 && (r = tp__sconn_flush(c)) < 0) /* what a cork holds goes before it */
    return tp_error_set(err, -r, "stream %u: %s", sid, uv_strerror(r));
  if ((sp = calloc(1, sizeof(*sp))) == NULL || (w = calloc(1, sizeof(*w))) == NULL) {
    free(sp);
    return tp_error_set(err, ENOMEM, "out of memory");
  }
  if ((sp->pfd = fcntl(pfd, F_DUPFD_CLOEXEC, 3)) < 0) {
    int e = errno;
    free(sp);
    free(w);
    return tp_error_errno(err, e, "stream %u: dup", sid);
  }
  tp_sframe_header(sp->hdr, TP_SF_DATA, sid, (uint32_t) len);
  sp->left = len;
  sp->cb = cb;
  sp->arg = arg;
  s->send_credit -= len;
  w->c = c;
  w->sp = sp;
  *c->hq_tail = w; /* behind what is held already */
  c->hq_tail = &w->next;
  if (c->sp == NULL)
    tp__sconn_hq_flush(c); /* now, or once libuv's queue is out */
  return 0;
}

void tp_sconn_splice_forget(tp_sconn_t *c, void *arg) {
  if (c->sp != NULL && c->sp->arg == arg)
    c->sp->cb = NULL;
  for (tp__swrite_t *w = c->hq; w != NULL; w = w->next)
    if (w->sp != NULL && w->sp->arg == arg)
      w->sp->cb = NULL;
}
