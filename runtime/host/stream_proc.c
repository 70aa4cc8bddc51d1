/* Process relays between a data connection and a box's agent (stream_proc.h). */
#include "stream_proc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream_int.h"

/* output waiting for the client's credit, per stream: the agent's window
 * while the process runs, its exit's drain, which may pass its limit by
 * one read (an OUTPUT frame) */
#define TP__SPROC_PEND_MAX (TP_OUT_WINDOW + TP_OUT_DRAIN_MAX + TP_CHUNK_MAX)
#define TP__SPROC_TAG_MAX 0x3fffu
#define TP__SPROC_ACK_AT (TP_OUT_WINDOW / 4) /* OUTPUT_ACK once this many bytes gathered */
#define TP__SPROC_REC 5u /* a ring record's header: u8 stream, u32 length */
#define TP__SPROC_ID_STDIN 0x8000u /* a STDIN or STDIN_CLOSE request (else an OUTPUT_ACK) */

enum { TP__OUT = 0, TP__ERR = 1, TP__IN = 2 };

typedef struct tp__sproc_s {
  tp__sdc_stream_t hdr;
  struct tp__sproc_s *bnext, *dnext; /* the box's registered processes, the connection's */
  tp_dbox_t *b;
  tp_sdc_t *d;                /* bound: its connection; NULL: unbound */
  int64_t pid;
  uint32_t tag;               /* in its request ids: replies find it */
  uint32_t seq;
  tp_sproc_sids_t sids;
  int live[3];                /* out, err, in: open on d */
  uint8_t *pend[2];           /* output the client had no credit for yet */
  size_t pcap[2], phead[2], plen[2];
  uint64_t sent[2];           /* bytes delivered, END's size */
  uint64_t unacked[2];        /* delivered (or dropped), not yet OUTPUT_ACKed (tp__sproc_ack) */
  uint64_t in_out;            /* stdin sent to the agent, not yet STDIN_ACKed */
  int exited;                 /* its EXIT came: no more output, END once pend is out */
  int kept;                   /* the owner has not taken its ring yet (tp_sproc_ring) */
  int mirror;                 /* the owner sees its OUTPUT too (JSON listeners follow it) */
  /* the last TP_SPROC_RING bytes of its output, as records (process.connect,
   * tupper logs): the owner's ring is not fed for a registered process */
  uint8_t *ring;
  size_t rlen, rcap, rdata;
  uint64_t rdropped;
} tp__sproc_t;

static const tp__sdc_ops_t tp__sproc_ops;

static uint32_t tp__get_u32(const uint8_t *p) {
  return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}
static void tp__put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}

/* Keeps n bytes of stream s (0, 1) in r's ring: the oldest go first. */
static void tp__sproc_ring_add(tp__sproc_t *r, int s, const uint8_t *p, size_t n) {
  size_t last = 0;
  if (n > TP_SPROC_RING) {
    r->rdropped += n - TP_SPROC_RING;
    p += n - TP_SPROC_RING;
    n = TP_SPROC_RING;
  }
  while (r->rdata + n > TP_SPROC_RING && r->rlen > 0) {
    uint32_t l = tp__get_u32(r->ring + 1);
    size_t excess = r->rdata + n - TP_SPROC_RING;
    if (l <= excess) { /* the whole first record goes */
      memmove(r->ring, r->ring + TP__SPROC_REC + l, r->rlen - TP__SPROC_REC - l);
      r->rlen -= TP__SPROC_REC + l;
      r->rdata -= l;
      r->rdropped += l;
    } else { /* its head goes */
      memmove(r->ring + TP__SPROC_REC, r->ring + TP__SPROC_REC + excess, r->rlen - TP__SPROC_REC - excess);
      tp__put_u32(r->ring + 1, l - (uint32_t) excess);
      r->rlen -= excess;
      r->rdata -= excess;
      r->rdropped += excess;
    }
  }
  /* the last record of the same stream grows instead of a new one */
  for (size_t off = 0; off < r->rlen; off += TP__SPROC_REC + tp__get_u32(r->ring + off + 1))
    last = off;
  if (r->rlen > 0 && r->ring[last] == (uint8_t) s) {
    if (r->rlen + n > r->rcap)
      goto grow;
    memcpy(r->ring + r->rlen, p, n);
    tp__put_u32(r->ring + last + 1, tp__get_u32(r->ring + last + 1) + (uint32_t) n);
    r->rlen += n;
    r->rdata += n;
    return;
  }
grow:
  if (r->rlen + TP__SPROC_REC + n > r->rcap) {
    size_t cap = r->rcap ? r->rcap : 16384;
    uint8_t *q;
    while (cap < r->rlen + TP__SPROC_REC + n)
      cap *= 2;
    if ((q = realloc(r->ring, cap)) == NULL) {
      r->rdropped += n; /* out of memory: this chunk is not kept */
      return;
    }
    r->ring = q;
    r->rcap = cap;
  }
  if (r->rlen > 0 && r->ring[last] == (uint8_t) s) { /* grown for the same stream */
    memcpy(r->ring + r->rlen, p, n);
    tp__put_u32(r->ring + last + 1, tp__get_u32(r->ring + last + 1) + (uint32_t) n);
    r->rlen += n;
  } else {
    r->ring[r->rlen] = (uint8_t) s;
    tp__put_u32(r->ring + r->rlen + 1, (uint32_t) n);
    memcpy(r->ring + r->rlen + TP__SPROC_REC, p, n);
    r->rlen += TP__SPROC_REC + n;
  }
  r->rdata += n;
}

static tp__sproc_t *tp__sproc_find(tp_dbox_t *b, int64_t pid) {
  for (tp__sproc_t *r = b->p_data; r != NULL; r = r->bnext)
    if (r->pid == pid && !r->exited)
      return r;
  return NULL;
}

int tp_sproc_known(tp_dbox_t *b, int64_t pid) { return tp__sproc_find(b, pid) != NULL; }

static void tp__sproc_unlink_d(tp__sproc_t *r) {
  tp__sproc_t **pp;
  if (r->d == NULL)
    return;
  for (pp = &r->d->procs; *pp != NULL && *pp != r; pp = &(*pp)->dnext)
    ;
  if (*pp == r) {
    *pp = r->dnext;
    r->d->nprocs--;
  }
  r->d = NULL;
  r->dnext = NULL;
}

static void tp__sproc_free(tp__sproc_t *r) {
  tp__sproc_t **pp;
  tp__sproc_unlink_d(r);
  for (pp = (tp__sproc_t **) &r->b->p_data; *pp != NULL && *pp != r; pp = &(*pp)->bnext)
    ;
  if (*pp == r)
    *pp = r->bnext;
  free(r->pend[0]);
  free(r->pend[1]);
  free(r->ring);
  free(r);
}

/* Sends a request about r's process; 0, or -1 when the channel is gone. */
static int tp__sproc_request(tp__sproc_t *r, unsigned type, int is_stdin, int stream, uint64_t size,
                             const uint8_t *data, size_t len) {
  tp_buf_t buf;
  tp_error_t err = {0};
  uint32_t id = TP_DBOX_PID_MIN | (r->tag << 16) | (is_stdin ? TP__SPROC_ID_STDIN : 0) |
                (r->seq++ & 0x7fffu);
  if (!tp_dbox_running(r->b))
    return -1;
  tp_buf_init(&buf);
  tp_frame_begin(&buf, (uint8_t) type, id);
  tp_frame_add_int(&buf, TP_TAG_PID, r->pid);
  if (type == TP_MSG_OUTPUT_ACK) {
    tp_frame_add_int(&buf, TP_TAG_STREAM, stream);
    tp_frame_add_int(&buf, TP_TAG_SIZE, (int64_t) size);
  } else if (type == TP_MSG_STDIN) {
    tp_frame_add(&buf, TP_TAG_DATA, data, (uint32_t) len);
  }
  if (tp_frame_end(&buf) < 0) {
    tp_buf_free(&buf);
    return -1;
  }
  return tp_dbox_send(r->b, &buf, &err); /* buf is freed */
}

/* Acks n more bytes of stream s to the agent, once TP__SPROC_ACK_AT of
 * them gathered (or `now`): an ack is a frame each way (its OK), and the
 * agent, with at least TP_OUT_WINDOW - TP__SPROC_ACK_AT of credit while
 * fewer wait here, does not stop for want of one. */
static void tp__sproc_ack_at(tp__sproc_t *r, int s, uint64_t n, int now) {
  r->unacked[s] += n;
  if (r->unacked[s] == 0 || (!now && r->unacked[s] < TP__SPROC_ACK_AT))
    return;
  if (!r->exited)
    tp__sproc_request(r, TP_MSG_OUTPUT_ACK, 0, s + 1, r->unacked[s], NULL, 0);
  r->unacked[s] = 0;
}

static void tp__sproc_ack(tp__sproc_t *r, int s, uint64_t n) { tp__sproc_ack_at(r, s, n, 0); }

/* The streams of r end (errnum: ERROR; its message msg), r is unbound:
 * output waiting for the client is dropped (and acked), later output goes
 * to the owner.  An exited r is freed. */
static void tp__sproc_unbind(tp__sproc_t *r, int errnum, const char *msg) {
  tp_sconn_t *c = r->d != NULL ? r->d->c : NULL;
  uint32_t ids[3] = {r->sids.out, r->sids.err, r->sids.in};
  for (int i = 0; i < 3; i++) {
    if (!r->live[i])
      continue;
    r->live[i] = 0;
    if (c != NULL && tp_sconn_fail(c, ids[i], errnum, msg) < 0)
      tp_sconn_drop(c, ids[i]);
  }
  for (int s = 0; s < 2; s++) {
    tp__sproc_ack_at(r, s, r->plen[s], 1);
    r->phead[s] = r->plen[s] = 0;
  }
  r->in_out = 0;
  tp__sproc_unlink_d(r);
  if (r->exited && !r->kept)
    tp__sproc_free(r);
}

/* After the exit: each output stream ends once its bytes are out, stdin
 * at once; r goes with its last stream.  Returns 1 when r was freed. */
static int tp__sproc_maybe_end(tp__sproc_t *r) {
  tp_sconn_t *c;
  if (!r->exited)
    return 0;
  if (r->d == NULL || (c = r->d->c) == NULL) {
    tp__sproc_unlink_d(r);
    if (r->kept)
      return 0; /* the owner takes its ring, then it goes */
    tp__sproc_free(r);
    return 1;
  }
  tp_sconn_hold_turn(c); /* the ENDs wait for the exit's notification (tp_sdc_flush) */
  tp_sconn_cork(c);      /* the ENDs in one write */
  for (int s = 0; s < 2; s++) {
    uint32_t sid = s == TP__OUT ? r->sids.out : r->sids.err;
    if (!r->live[s] || r->plen[s] > 0)
      continue;
    r->live[s] = 0;
    if (r->sids.pty) /* the terminal's one stream: over both ways */
      tp_sconn_finish(c, sid, 1, r->sent[s], NULL);
    else
      tp_sconn_end(c, sid, 1, r->sent[s], NULL);
  }
  if (r->live[TP__IN]) {
    r->live[TP__IN] = 0;
    tp_sconn_finish(c, r->sids.in, 0, 0, NULL);
  }
  tp_sconn_uncork(c);
  if (!r->live[TP__OUT] && !r->live[TP__ERR]) {
    tp__sproc_unlink_d(r);
    if (r->kept)
      return 0;
    tp__sproc_free(r);
    return 1;
  }
  return 0;
}

/* Writes what waits for stream s within the client's credit, acks it. */
static void tp__sproc_pump(tp__sproc_t *r, int s) {
  uint32_t sid = s == TP__OUT ? r->sids.out : r->sids.err;
  uint64_t took = 0;
  while (r->plen[s] > 0 && r->d != NULL && r->d->c != NULL && r->live[s]) {
    /* within the credit, and nothing while the connection's queue is full */
    uint64_t room = tp_sconn_can_write(r->d->c, sid);
    long k = tp_sconn_write(r->d->c, sid, r->pend[s] + r->phead[s],
                            room < r->plen[s] ? (size_t) room : r->plen[s], NULL);
    if (k <= 0)
      break;
    r->phead[s] += (size_t) k;
    r->plen[s] -= (size_t) k;
    r->sent[s] += (uint64_t) k;
    took += (uint64_t) k;
  }
  if (r->plen[s] == 0)
    r->phead[s] = 0;
  tp__sproc_ack(r, s, took);
  tp__sproc_maybe_end(r);
}

/* OUTPUT of a bound r on stream s: to the client as far as its credit
 * goes, the rest waits.  -1: the agent sent beyond its window. */
static int tp__sproc_output(tp__sproc_t *r, int s, const uint8_t *p, size_t n) {
  uint32_t sid = s == TP__OUT ? r->sids.out : r->sids.err;
  if (r->plen[s] == 0) {
    uint64_t room = tp_sconn_can_write(r->d->c, sid);
    long k = tp_sconn_write(r->d->c, sid, p, room < n ? (size_t) room : n, NULL);
    if (k > 0) {
      r->sent[s] += (uint64_t) k;
      tp__sproc_ack(r, s, (uint64_t) k);
      p += k;
      n -= (size_t) k;
    }
  }
  if (n == 0)
    return 0;
  if (r->plen[s] + n > TP__SPROC_PEND_MAX)
    return -1;
  if (r->phead[s] + r->plen[s] + n > r->pcap[s]) {
    if (r->phead[s] > 0) {
      memmove(r->pend[s], r->pend[s] + r->phead[s], r->plen[s]);
      r->phead[s] = 0;
    }
    if (r->plen[s] + n > r->pcap[s]) {
      size_t cap = r->pcap[s] ? r->pcap[s] : 256u * 1024u;
      uint8_t *q;
      while (cap < r->plen[s] + n)
        cap *= 2;
      if (cap > TP__SPROC_PEND_MAX)
        cap = TP__SPROC_PEND_MAX;
      if ((q = realloc(r->pend[s], cap)) == NULL) {
        tp__sproc_unbind(r, ENOMEM, "out of memory for the process's output");
        return 0;
      }
      r->pend[s] = q;
      r->pcap[s] = cap;
    }
  }
  memcpy(r->pend[s] + r->phead[s] + r->plen[s], p, n);
  r->plen[s] += n;
  return 0;
}

static void tp__sproc_stdin_failed(tp__sproc_t *r, int errnum, const char *msg) {
  char m[TP_SF_MSG_MAX + 1];
  snprintf(m, sizeof(m), "stdin of process %lld: %s", (long long) r->pid, msg);
  if (r->sids.pty || r->d == NULL || r->d->c == NULL) {
    tp__sproc_unbind(r, errnum, m);
    return;
  }
  if (r->live[TP__IN]) {
    r->live[TP__IN] = 0;
    tp_sconn_fail(r->d->c, r->sids.in, errnum, m);
  }
  r->in_out = 0;
}

/* The channel's frames for registered processes (dbox.h's p_frame). */
static int tp__sproc_frame(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fs, int n,
                           tp_field_t *scratch, int scratch_max) {
  int64_t pid = 0, v = 0;
  tp__sproc_t *r;
  (void) scratch, (void) scratch_max;
  if (type == TP_MSG_OK || type == TP_MSG_ERR) {
    uint32_t tag = (id >> 16) & TP__SPROC_TAG_MAX;
    if (type == TP_MSG_OK || !(id & TP__SPROC_ID_STDIN))
      return 1; /* an ack's ERR: the process is gone (its EXIT is on the way) */
    for (r = b->p_data; r != NULL; r = r->bnext)
      if (r->tag == tag && !r->exited)
        break;
    if (r != NULL && r->d != NULL) {
      const tp_field_t *m = tp_fields_get(fs, n, TP_TAG_MSG);
      char msg[256] = "the agent refused it";
      int64_t e = EIO;
      tp_field_int(tp_fields_get(fs, n, TP_TAG_ERRNO), &e);
      if (m != NULL)
        snprintf(msg, sizeof(msg), "%.*s", (int) (m->len < 200 ? m->len : 200), (const char *) m->val);
      tp__sproc_stdin_failed(r, e > 0 && e < 4096 ? (int) e : EIO, msg);
    }
    return 1;
  }
  if (tp_field_int(tp_fields_get(fs, n, TP_TAG_PID), &pid) < 0 || (r = tp__sproc_find(b, pid)) == NULL)
    return type == TP_MSG_STDIN_ACK ? 1 : 0; /* not a registered process: the owner's */
  if (type == TP_MSG_EXIT) {
    r->exited = 1;
    tp__sproc_maybe_end(r);
    return 0; /* the owner reports the exit (and takes the ring: tp_sproc_take) */
  }
  if (type == TP_MSG_STDIN_ACK) {
    if (tp_field_int(tp_fields_get(fs, n, TP_TAG_SIZE), &v) < 0 || v < 1)
      return -1;
    if (r->d != NULL && r->d->c != NULL && r->live[TP__IN] && r->in_out > 0) {
      /* process.stdin from JSON may have fed the same pipe: only what we sent is ours */
      uint64_t k = (uint64_t) v < r->in_out ? (uint64_t) v : r->in_out;
      r->in_out -= k;
      if (tp_sconn_credit(r->d->c, r->sids.pty ? r->sids.out : r->sids.in, (uint32_t) k, NULL) < 0)
        tp__sproc_unbind(r, EPROTO, "stdin credit beyond the window");
    }
    return 1;
  }
  /* OUTPUT */
  const tp_field_t *data = tp_fields_get(fs, n, TP_TAG_DATA);
  if (tp_field_int(tp_fields_get(fs, n, TP_TAG_STREAM), &v) < 0 || (v != 1 && v != 2) ||
      data == NULL || data->len == 0 || (r->sids.pty && v == 2))
    return -1;
  int s = (int) v - 1;
  tp__sproc_ring_add(r, s, data->val, data->len);
  if (r->d == NULL || r->d->c == NULL || !r->live[s]) {
    tp__sproc_ack(r, s, data->len); /* nobody reads it here: the owner keeps what it keeps */
    return 0;
  }
  if (tp__sproc_output(r, s, data->val, data->len) < 0)
    return -1;
  return r->mirror ? 0 : 1; /* a copy for the owner's listeners: the slow path, on request */
}

static void tp__sproc_down(tp_dbox_t *b, const char *reason) {
  char msg[256];
  snprintf(msg, sizeof(msg), "sandbox went down: %s", reason);
  while (b->p_data != NULL) {
    tp__sproc_t *r = b->p_data;
    r->exited = 1; /* nothing more comes: unbind frees it, bound or not */
    r->kept = 0;
    tp__sproc_unbind(r, EIO, msg);
  }
}

/* The connection's callbacks for r's streams. */
static void tp__sproc_on_data(void *sdata, uint32_t sid, const uint8_t *p, size_t n) {
  tp__sproc_t *r = sdata;
  (void) sid; /* only stdin (or the terminal) takes DATA: stream.c checks the direction */
  if (r->exited)
    return;
  if (tp__sproc_request(r, TP_MSG_STDIN, 1, 0, 0, p, n) < 0) {
    tp__sproc_stdin_failed(r, EPIPE, "the sandbox's channel is gone");
    return;
  }
  r->in_out += n;
}

static void tp__sproc_on_end(void *sdata, uint32_t sid) {
  tp__sproc_t *r = sdata;
  (void) sid;
  if (!r->exited)
    tp__sproc_request(r, TP_MSG_STDIN_CLOSE, 1, 0, 0, NULL, 0);
}

static void tp__sproc_on_writable(void *sdata, uint32_t sid) {
  tp__sproc_t *r = sdata;
  tp__sproc_pump(r, sid == r->sids.out ? TP__OUT : TP__ERR);
}

static void tp__sproc_on_error(void *sdata, uint32_t sid, int err, const char *msg) {
  tp__sproc_t *r = sdata;
  char m[TP_SF_MSG_MAX + 64];
  for (int i = 0; i < 3; i++) /* sid is gone already */
    if ((i == 0 ? r->sids.out : i == 1 ? r->sids.err : r->sids.in) == sid)
      r->live[i] = 0;
  snprintf(m, sizeof(m), "stream %u of process %lld ended: %s", sid, (long long) r->pid,
           msg != NULL ? msg : "error");
  tp__sproc_unbind(r, err ? err : ECANCELED, m);
}

static const tp__sdc_ops_t tp__sproc_ops = {
  tp__sproc_on_data, tp__sproc_on_end, tp__sproc_on_writable, tp__sproc_on_error, NULL,
};

static uint32_t tp__sproc_new_tag(tp_dbox_t *b) {
  for (unsigned tries = 0; tries <= TP__SPROC_TAG_MAX; tries++) {
    uint32_t t = b->p_next = (b->p_next % TP__SPROC_TAG_MAX) + 1;
    tp__sproc_t *r;
    for (r = b->p_data; r != NULL && r->tag != t; r = r->bnext)
      ;
    if (r == NULL)
      return t;
  }
  return 0;
}

int tp_sdc_proc(tp_sdc_t *d, tp_dbox_t *b, int64_t pid, const tp_sproc_sids_t *sids,
                tp_error_t *err) {
  tp__sproc_t *r = tp__sproc_find(b, pid);
  uint32_t ids[3];
  int opened = 0;
  if (!tp_dbox_running(b))
    return tp_error_set(err, EPIPE, "sandbox is not running");
  if (r == NULL) {
    uint32_t tag = tp__sproc_new_tag(b);
    if (tag == 0)
      return tp_error_set(err, EMFILE, "too many streamed processes in one sandbox");
    if ((r = calloc(1, sizeof(*r))) == NULL)
      return tp_error_set(err, ENOMEM, "out of memory");
    r->hdr.ops = &tp__sproc_ops;
    r->b = b;
    r->pid = pid;
    r->kept = 1;
    r->tag = tag;
    r->bnext = b->p_data;
    b->p_data = r;
    b->p_frame = tp__sproc_frame;
    b->p_down = tp__sproc_down;
  }
  if (d == NULL)
    return 0;
  if (r->d != NULL)
    return tp_error_set(err, EBUSY, "process %lld: its streams are bound to another data connection",
                        (long long) pid);
  if (d->c == NULL)
    return tp_error_set(err, EPIPE, "the data connection is closed");
  if (sids->out == 0 || (!sids->pty && sids->err == 0) || (sids->pty && (sids->err || sids->in)))
    return tp_error_set(err, EINVAL, "process streams: bad stream ids");
  ids[0] = sids->out;
  ids[1] = sids->err;
  ids[2] = sids->in;
  tp_sconn_hold_turn(d->c); /* the OPENs wait for the start's reply (tp_sdc_flush) */
  tp_sconn_cork(d->c);      /* the OPENs in one write */
  for (int i = 0; i < 3; i++) {
    uint32_t kind = sids->pty ? TP_SK_PTY : i == 0 ? TP_SK_STDOUT : i == 1 ? TP_SK_STDERR : TP_SK_STDIN;
    uint32_t win = (sids->pty || i == TP__IN) ? TP_SPROC_IN_WINDOW : 0;
    if (ids[i] == 0)
      continue;
    if (tp_sconn_open(d->c, ids[i], kind, win, 1, r, err) < 0) {
      for (int j = 0; j < i; j++)
        if (opened & (1 << j))
          tp_sconn_fail(d->c, ids[j], ECANCELED, "the process's other streams could not be opened");
      tp_sconn_uncork(d->c);
      return -1;
    }
    opened |= 1 << i;
  }
  tp_sconn_uncork(d->c);
  r->sids = *sids;
  for (int i = 0; i < 3; i++)
    r->live[i] = (opened >> i) & 1;
  r->sent[0] = r->sent[1] = 0;
  r->in_out = 0;
  r->d = d;
  r->dnext = d->procs;
  d->procs = r;
  d->nprocs++;
  return 0;
}

void tp__sdc_procs_close(tp_sdc_t *d) {
  while (d->procs != NULL)
    tp__sproc_unbind(d->procs, ECONNRESET, "the data connection's client is gone");
}

/* The last registered entry of pid (exited ones too: its exit is being
 * reported). */
static tp__sproc_t *tp__sproc_find_any(tp_dbox_t *b, int64_t pid) {
  for (tp__sproc_t *r = b->p_data; r != NULL; r = r->bnext)
    if (r->pid == pid && (!r->exited || r->kept))
      return r;
  return NULL;
}

int tp_sproc_ring(tp_dbox_t *b, int64_t pid, int take, tp_sproc_ring_cb cb, void *data,
                  uint64_t *dropped) {
  tp__sproc_t *r = tp__sproc_find_any(b, pid);
  if (r == NULL)
    return -1;
  for (size_t off = 0; off < r->rlen;) {
    uint32_t l = tp__get_u32(r->ring + off + 1);
    cb(data, r->ring[off], r->ring + off + TP__SPROC_REC, l);
    off += TP__SPROC_REC + l;
  }
  *dropped = r->rdropped;
  if (take && r->exited) {
    r->kept = 0;
    if (r->d == NULL)
      tp__sproc_free(r); /* else it goes with its last stream */
  }
  return 0;
}

int tp_sproc_mirror(tp_dbox_t *b, int64_t pid) {
  tp__sproc_t *r = tp__sproc_find(b, pid);
  if (r == NULL)
    return -1;
  r->mirror = 1;
  return 0;
}
