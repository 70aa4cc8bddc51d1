/* tp_netrelay_t: relayed network streams between the agent's NET_* frames
 * and upstream TCP sockets (netrelay.h). */
#include "netrelay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"

typedef struct tp__nrs_s {
  struct tp__nrs_s *next;
  tp_netrelay_t *nr;
  uv_tcp_t tcp;
  uv_write_t wreq;
  uv_shutdown_t sreq;
  uint32_t sid;
  int gone;             /* ended: waits for its handle's close callback */
  int reading;          /* uv_read_start is on */
  int box_eof;          /* the box sent NET_EOF */
  int up_eof;           /* the upstream ended */
  int eof_sent;         /* NET_EOF went to the box */
  int shut;             /* the upstream's write side is shut down */
  uint8_t *pend;        /* box -> upstream: pend[0..plen), of which the first inflight are */
  size_t plen, pcap;    /* being written; pcap never changes once allocated */
  size_t inflight;
  size_t head;          /* the first head bytes of pend are the daemon's: not acknowledged */
  uint8_t *batch;       /* upstream -> box: NET_DATA frames read in place, not yet on */
  size_t blen, bcap;    /* the channel; blen bytes of whole frames */
  size_t asked;         /* the data room the last alloc_cb gave */
  uint8_t *down;        /* handed-over bytes owed to the box: down[doff..dlen) */
  size_t doff, dlen;
  uint32_t in_unacked;  /* the box's bytes received, not acknowledged */
  uint32_t out_unacked; /* bytes sent to the box, not acknowledged */
  uint64_t to_up, to_box;
} tp__nrs_t;

struct tp_netrelay_s {
  tp_dbox_t *b;         /* NULL once the box went down or stopped */
  tp_netrelay_end_cb on_end;
  void *data;
  tp__nrs_t *streams;   /* live */
  int nstreams;
  int closing;          /* streams whose handle's close callback is pending */
  int released;
  uint32_t wdown;       /* bytes for the box unacknowledged: what its agent takes (tp_netrelay_new) */
};

static void tp__nr_maybe_free(tp_netrelay_t *nr) {
  if (!nr->released || nr->closing > 0 || nr->streams != NULL)
    return;
  free(nr);
}

/* ---- frames to the agent --------------------------------------------------- */

static void tp__nr_send(tp_netrelay_t *nr, tp_buf_t *buf) {
  tp_error_t err = {0};
  if (nr->b == NULL || buf->oom) {
    tp_buf_free(buf);
    return;
  }
  tp_dbox_send(nr->b, buf, &err); /* takes buf; a failed channel shows up as the box going down */
}

static void tp__nr_send_sid(tp_netrelay_t *nr, uint8_t type, uint32_t sid, uint16_t tag,
                            int64_t v) {
  tp_buf_t buf;
  tp_buf_init(&buf);
  tp_frame_begin(&buf, type, 0);
  tp_frame_add_int(&buf, TP_TAG_SID, sid);
  if (tag != 0)
    tp_frame_add_int(&buf, tag, v);
  if (tp_frame_end(&buf) < 0) {
    tp_buf_free(&buf);
    return;
  }
  tp__nr_send(nr, &buf);
}

/* n bytes for the box, as NET_DATA frames of at most TP_NET_CHUNK, in one
 * write on the channel. */
static void tp__nrs_send_data(tp__nrs_t *s, const uint8_t *p, size_t n) {
  tp_buf_t buf;
  tp_buf_init(&buf);
  s->out_unacked += (uint32_t) n;
  s->to_box += n;
  while (n > 0) {
    size_t k = n < TP_NET_CHUNK ? n : TP_NET_CHUNK;
    tp_frame_begin(&buf, TP_MSG_NET_DATA, 0);
    tp_frame_add_int(&buf, TP_TAG_SID, s->sid);
    tp_frame_add(&buf, TP_TAG_DATA, p, (uint32_t) k);
    if (tp_frame_end(&buf) < 0) {
      tp_buf_free(&buf);
      return;
    }
    p += k;
    n -= k;
  }
  tp__nr_send(s->nr, &buf);
}

/* ---- streams ----------------------------------------------------------------- */

static void tp__nrs_close_cb(uv_handle_t *h) {
  tp__nrs_t *s = h->data;
  tp_netrelay_t *nr = s->nr;
  free(s->batch);
  free(s->pend);
  free(s->down);
  free(s);
  nr->closing--;
  tp__nr_maybe_free(nr);
}

/* Ends s: NET_CLOSE to the box if notify, the end callback if report. */
static void tp__nrs_end(tp__nrs_t *s, int err, int notify, int report) {
  tp_netrelay_t *nr = s->nr;
  tp__nrs_t **pp = &nr->streams;
  uint32_t sid = s->sid;
  uint64_t up = s->to_up, down = s->to_box;
  if (s->gone)
    return;
  s->gone = 1;
  while (*pp != s)
    pp = &(*pp)->next;
  *pp = s->next;
  nr->nstreams--;
  nr->closing++;
  uv_close((uv_handle_t *) &s->tcp, tp__nrs_close_cb); /* cancels its write and shutdown */
  if (notify)
    tp__nr_send_sid(nr, TP_MSG_NET_CLOSE, sid, 0, 0);
  if (report && !nr->released && nr->on_end != NULL)
    nr->on_end(nr, sid, up, down, err, nr->data);
}

static tp__nrs_t *tp__nr_find(const tp_netrelay_t *nr, uint32_t sid) {
  for (tp__nrs_t *s = nr->streams; s != NULL; s = s->next)
    if (s->sid == sid)
      return s;
  return NULL;
}

/* A NET_DATA frame's head: the frame header, SID, and DATA's tag and
 * length (frame.c's encoding, little-endian), for n bytes of data. */
#define TP__NR_HEAD (TP_FRAME_HDR + 6 + 8 + 6)
#define TP__NR_BATCH (2 * (TP__NR_HEAD + TP_NET_CHUNK)) /* two chunks per channel write */

static void tp__put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}

static void tp__nrs_head(const tp__nrs_t *s, uint8_t *p, size_t n) {
  tp_buf_t b;
  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_NET_DATA, 0);
  tp_frame_add_int(&b, TP_TAG_SID, s->sid);
  tp_frame_add(&b, TP_TAG_DATA, NULL, 0);
  if (!b.oom && b.len == TP__NR_HEAD) {
    memcpy(p, b.data, TP__NR_HEAD);
    tp__put_u32(p, (uint32_t) (TP__NR_HEAD - TP_FRAME_HDR + n));
    tp__put_u32(p + TP__NR_HEAD - 4, (uint32_t) n);
  }
  tp_buf_free(&b);
}

/* The frames read so far go onto the channel, in one write. */
static void tp__nrs_flush(tp__nrs_t *s) {
  tp_buf_t buf;
  if (s->blen == 0)
    return;
  tp_buf_init(&buf);
  buf.data = s->batch;
  buf.len = s->blen;
  buf.cap = s->bcap;
  s->batch = NULL;
  s->blen = s->bcap = 0;
  tp__nr_send(s->nr, &buf);
}

/* Upstream reads land in place, after a frame head (no copy on the way to
 * the channel).  Reading is on only while the window has room. */
static void tp__nrs_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tp__nrs_t *s = h->data;
  size_t room = s->nr->wdown - s->out_unacked;
  (void) suggested;
  if (s->batch != NULL && s->bcap - s->blen < TP__NR_HEAD + TP_NET_CHUNK)
    tp__nrs_flush(s);
  if (s->batch == NULL) {
    s->batch = malloc(TP__NR_BATCH);
    s->bcap = s->batch ? TP__NR_BATCH : 0;
    s->blen = 0;
  }
  if (s->batch == NULL) { /* read_cb gets UV_ENOBUFS: the stream ends */
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  if (room > TP_NET_CHUNK)
    room = TP_NET_CHUNK;
  s->asked = room;
  buf->base = (char *) s->batch + s->blen + TP__NR_HEAD;
  buf->len = room;
}

static void tp__nrs_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Sends what the window allows of the handed-over bytes, the end once all
 * is sent, and reads upstream exactly while the window has room. */
static void tp__nrs_pump_box(tp__nrs_t *s) {
  int want;
  if (s->gone)
    return;
  while (s->doff < s->dlen && s->out_unacked < s->nr->wdown) {
    size_t k = s->dlen - s->doff;
    if (k > s->nr->wdown - s->out_unacked)
      k = s->nr->wdown - s->out_unacked;
    tp__nrs_send_data(s, s->down + s->doff, k);
    s->doff += k;
  }
  if (s->doff == s->dlen && s->down != NULL) {
    free(s->down);
    s->down = NULL;
    s->doff = s->dlen = 0;
  }
  if (s->dlen == 0 && s->up_eof && !s->eof_sent) {
    s->eof_sent = 1;
    tp__nr_send_sid(s->nr, TP_MSG_NET_EOF, s->sid, 0, 0);
  }
  want = !s->up_eof && s->dlen == 0 && s->out_unacked < s->nr->wdown;
  if (want && !s->reading) {
    if (uv_read_start((uv_stream_t *) &s->tcp, tp__nrs_alloc_cb, tp__nrs_read_cb) == 0)
      s->reading = 1;
  } else if (!want && s->reading) {
    uv_read_stop((uv_stream_t *) &s->tcp);
    s->reading = 0;
  }
}

static void tp__nrs_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  tp__nrs_t *s = st->data;
  (void) buf;
  if (nread == 0) { /* drained for now */
    tp__nrs_flush(s);
    return;
  }
  if (nread == UV_ENOBUFS) { /* no memory for a frame (reading is on only with room) */
    tp__nrs_end(s, ENOMEM, 1, 1);
    return;
  }
  if (nread == UV_EOF) {
    tp__nrs_flush(s); /* the data before the end */
    s->up_eof = 1;
    tp__nrs_pump_box(s);
    return;
  }
  if (nread < 0) {
    tp__nrs_end(s, (int) -nread, 1, 1);
    return;
  }
  tp__nrs_head(s, s->batch + s->blen, (size_t) nread);
  s->blen += TP__NR_HEAD + (size_t) nread;
  s->out_unacked += (uint32_t) nread;
  s->to_box += (uint64_t) nread;
  /* on once the socket is drained (a short read: libuv reads no more this
   * round), the window is full, or two chunks are read: the agent
   * delivers and acknowledges a batch while the next is read */
  if ((size_t) nread < s->asked || s->out_unacked >= s->nr->wdown ||
      s->bcap - s->blen < TP__NR_HEAD + TP_NET_CHUNK)
    tp__nrs_flush(s);
  tp__nrs_pump_box(s); /* stops reading at a full window */
}

static void tp__nrs_shut_cb(uv_shutdown_t *req, int status) {
  (void) req, (void) status; /* a failed shutdown shows up as a read error, or not at all */
}

/* The box ended its side and everything it sent is written: so does the
 * upstream connection. */
static void tp__nrs_maybe_shut(tp__nrs_t *s) {
  if (s->gone || !s->box_eof || s->plen > 0 || s->shut)
    return;
  s->shut = 1;
  if (uv_shutdown(&s->sreq, (uv_stream_t *) &s->tcp, tp__nrs_shut_cb) < 0)
    tp__nrs_end(s, EPIPE, 1, 1);
}

static void tp__nrs_pump_up(tp__nrs_t *s);

static void tp__nrs_write_cb(uv_write_t *req, int status) {
  tp__nrs_t *s = req->data;
  size_t k, head;
  if (s->gone || status == UV_ECANCELED)
    return; /* the stream is closing */
  if (status < 0) {
    tp__nrs_end(s, -status, 1, 1);
    return;
  }
  k = s->inflight;
  head = k < s->head ? k : s->head;
  s->head -= head;
  memmove(s->pend, s->pend + k, s->plen - k);
  s->plen -= k;
  s->inflight = 0;
  k -= head; /* the box's bytes: acknowledged now they are gone on */
  if (k > 0) {
    s->in_unacked -= (uint32_t) k;
    s->to_up += k;
    tp__nr_send_sid(s->nr, TP_MSG_NET_ACK, s->sid, TP_TAG_SIZE, (int64_t) k);
  }
  tp__nrs_pump_up(s);
  tp__nrs_maybe_shut(s);
}

/* Writes everything pending upstream, one write at a time. */
static void tp__nrs_pump_up(tp__nrs_t *s) {
  uv_buf_t ub;
  int r;
  if (s->gone || s->inflight > 0 || s->plen == 0)
    return;
  ub = uv_buf_init((char *) s->pend, (unsigned) s->plen);
  s->wreq.data = s;
  if ((r = uv_write(&s->wreq, (uv_stream_t *) &s->tcp, &ub, 1, tp__nrs_write_cb)) < 0) {
    tp__nrs_end(s, -r, 1, 1);
    return;
  }
  s->inflight = s->plen;
}

/* Bytes of the box for the upstream: the window bounds them. */
static int tp__nrs_append(tp__nrs_t *s, const uint8_t *p, size_t n) {
  if (s->pend == NULL) {
    s->pcap = TP_NET_WINDOW + s->head;
    if ((s->pend = malloc(s->pcap)) == NULL)
      return -1;
  }
  if (n > s->pcap - s->plen)
    return -1; /* cannot happen within the window */
  memcpy(s->pend + s->plen, p, n);
  s->plen += n;
  return 0;
}

/* ---- frames from the agent ----------------------------------------------------- */

static int tp__nr_frame(tp_dbox_t *b, unsigned type, const tp_field_t *fs, int n) {
  tp_netrelay_t *nr = b->n_data;
  const tp_field_t *data;
  int64_t sid, v;
  tp__nrs_t *s;
  if (type == TP_MSG_NET_DNS || type == TP_MSG_NET_CONNECT)
    return 0; /* query ids, and the host's own frame: the owner's */
  if (tp_field_int(tp_fields_get(fs, n, TP_TAG_SID), &sid) < 0 || sid <= 0 || sid > UINT32_MAX)
    return 0;
  s = tp__nr_find(nr, (uint32_t) sid);
  if (s == NULL)
    return 0;
  switch (type) {
  case TP_MSG_NET_DATA:
    data = tp_fields_get(fs, n, TP_TAG_DATA);
    if (data == NULL || s->box_eof || data->len > TP_NET_WINDOW - s->in_unacked) {
      tp__nrs_end(s, EPROTO, 1, 1); /* the box overran its window */
      return 1;
    }
    if (tp__nrs_append(s, data->val, data->len) < 0) {
      tp__nrs_end(s, ENOMEM, 1, 1);
      return 1;
    }
    s->in_unacked += data->len;
    tp__nrs_pump_up(s);
    return 1;
  case TP_MSG_NET_ACK:
    if (tp_field_int(tp_fields_get(fs, n, TP_TAG_SIZE), &v) < 0 || v < 0 ||
        (uint64_t) v > s->out_unacked) {
      tp__nrs_end(s, EPROTO, 1, 1);
      return 1;
    }
    s->out_unacked -= (uint32_t) v;
    tp__nrs_pump_box(s);
    return 1;
  case TP_MSG_NET_EOF:
    s->box_eof = 1;
    tp__nrs_maybe_shut(s);
    return 1;
  case TP_MSG_NET_CLOSE:
    tp__nrs_end(s, 0, 0, 1);
    return 1;
  default: /* NET_OPEN of a live stream's id: the agent reused it */
    tp__nrs_end(s, EPROTO, 1, 1);
    return 1;
  }
}

/* Every stream ends quietly; the relay lets go of the box. */
static void tp__nr_detach(tp_netrelay_t *nr) {
  tp_dbox_t *b = nr->b;
  while (nr->streams != NULL)
    tp__nrs_end(nr->streams, 0, 0, 0);
  if (b != NULL && b->n_data == nr) {
    b->n_frame = NULL;
    b->n_down = NULL;
    b->n_data = NULL;
  }
  nr->b = NULL;
}

static void tp__nr_down(tp_dbox_t *b, const char *reason) {
  (void) reason;
  tp__nr_detach(b->n_data);
}

/* ---- the owner's calls ------------------------------------------------------- */

tp_netrelay_t *tp_netrelay_new(tp_dbox_t *b, uint32_t window_down, tp_netrelay_end_cb on_end,
                               void *data, tp_error_t *err) {
  tp_netrelay_t *nr;
  if (window_down < TP_NET_CHUNK || window_down > TP_NET_WINDOW_DOWN) {
    tp_error_set(err, EINVAL, "network relay: a window of %u bytes", window_down);
    return NULL;
  }
  if (b->n_data != NULL) {
    tp_error_set(err, EBUSY, "network relay: the box has one");
    return NULL;
  }
  if (!tp_dbox_running(b)) {
    tp_error_set(err, EPIPE, "network relay: box is not running");
    return NULL;
  }
  nr = calloc(1, sizeof(*nr));
  if (nr == NULL) {
    tp_error_set(err, ENOMEM, "network relay: out of memory");
    return NULL;
  }
  nr->b = b;
  nr->wdown = window_down;
  nr->on_end = on_end;
  nr->data = data;
  b->n_frame = tp__nr_frame;
  b->n_down = tp__nr_down;
  b->n_data = nr;
  return nr;
}

int tp_netrelay_take(tp_netrelay_t *nr, const tp_netrelay_take_t *t, tp_error_t *err) {
  tp__nrs_t *s;
  int r;
  if (nr->b == NULL || nr->released || !tp_dbox_running(nr->b)) {
    close(t->fd);
    return tp_error_set(err, EPIPE, "network relay: box is not running");
  }
  if (t->sid == 0 || t->sid >= 0x80000000u || t->up_head > t->up_len ||
      t->up_len - t->up_head > TP_NET_WINDOW || t->up_head > TP_NET_WINDOW ||
      t->out_unacked > nr->wdown || t->down_len > nr->wdown + TP_NET_CHUNK ||
      (t->eof_sent && (!t->up_eof || t->down_len > 0))) {
    close(t->fd);
    return tp_error_set(err, EINVAL, "network relay: bad hand-over of stream %u", t->sid);
  }
  if (tp__nr_find(nr, t->sid) != NULL) {
    close(t->fd);
    return tp_error_set(err, EEXIST, "network relay: stream %u is relayed already", t->sid);
  }
  s = calloc(1, sizeof(*s));
  if (s == NULL || (t->down_len > 0 && (s->down = malloc(t->down_len)) == NULL)) {
    free(s);
    close(t->fd);
    return tp_error_set(err, ENOMEM, "network relay: out of memory");
  }
  if ((r = uv_tcp_init(nr->b->loop, &s->tcp)) < 0) {
    free(s->down);
    free(s);
    close(t->fd);
    return tp_error_set(err, -r, "network relay: %s", uv_strerror(r));
  }
  s->tcp.data = s;
  s->nr = nr;
  s->sid = t->sid;
  s->next = nr->streams;
  nr->streams = s;
  nr->nstreams++;
  /* from here s is in the list: tp__nrs_end undoes everything */
  if ((r = uv_tcp_open(&s->tcp, t->fd)) < 0) {
    close(t->fd);
    tp__nrs_end(s, -r, 0, 0);
    return tp_error_set(err, -r, "network relay: %s", uv_strerror(r));
  }
  s->head = t->up_head;
  s->in_unacked = (uint32_t) (t->up_len - t->up_head);
  s->out_unacked = t->out_unacked;
  s->box_eof = t->box_eof;
  s->up_eof = t->up_eof;
  s->eof_sent = t->eof_sent;
  if (t->down_len > 0)
    memcpy(s->down, t->down, t->down_len);
  s->dlen = t->down_len;
  if (t->up_len > 0 && tp__nrs_append(s, t->up, t->up_len) < 0) {
    tp__nrs_end(s, ENOMEM, 0, 0);
    return tp_error_set(err, ENOMEM, "network relay: out of memory");
  }
  tp__nrs_pump_up(s);
  tp__nrs_maybe_shut(s);
  tp__nrs_pump_box(s);
  return 0;
}

int tp_netrelay_has(const tp_netrelay_t *nr, uint32_t sid) { return tp__nr_find(nr, sid) != NULL; }

int tp_netrelay_count(const tp_netrelay_t *nr) { return nr->nstreams; }

int tp_netrelay_drop(tp_netrelay_t *nr, uint32_t sid, int notify) {
  tp__nrs_t *s = tp__nr_find(nr, sid);
  if (s == NULL)
    return -1;
  tp__nrs_end(s, 0, notify, 0);
  return 0;
}

void tp_netrelay_release(tp_netrelay_t *nr) {
  nr->released = 1;
  tp__nr_detach(nr);
  tp__nr_maybe_free(nr);
}
