#define _GNU_SOURCE
/* Unit tests for the data connection (runtime/host/stream.c) over a
 * socketpair: the test plays the client with raw frames on its end, the
 * connection runs on a real loop.  Flow control both ways (a slow reader
 * holds the writer back and loses nothing), and the bad inputs of
 * docs/protocol.md: a wrong length, an unknown stream id, another
 * connection's stream, DATA beyond the credit, a half-written frame and
 * then a disconnect, a client that never reads.  The loop closes with no
 * handle left at the end (nothing leaks). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sframe.h"
#include "stream.h"
#include "tap.h"

typedef struct owner_s {
  size_t got;             /* bytes delivered by on_data */
  uint64_t sum;           /* of their values, to check the order */
  int ends, writable, errors, closed;
  int last_err, close_err;
  uint32_t last_err_sid;
  char close_reason[256];
  int credit_back;        /* on_data grants credit right away */
  uint8_t *room;          /* data_buf's room (cbs_direct), its size, and what it saw */
  size_t room_cap;
  int bufs, in_room;      /* data_buf calls; on_data calls with p in the room */
  size_t last_buf;
} owner_t;

static void on_data(tp_sconn_t *c, uint32_t sid, void *sdata, const uint8_t *p, size_t n) {
  owner_t *o = tp_sconn_data(c);
  (void) sdata;
  for (size_t i = 0; i < n; i++)
    o->sum += p[i];
  o->got += n;
  if (o->room != NULL && p == o->room)
    o->in_room++;
  if (o->credit_back)
    tp_sconn_credit(c, sid, (uint32_t) n, NULL);
}
static void on_end(tp_sconn_t *c, uint32_t sid, void *sdata) {
  (void) sid, (void) sdata;
  ((owner_t *) tp_sconn_data(c))->ends++;
}
static void on_writable(tp_sconn_t *c, uint32_t sid, void *sdata) {
  (void) sid, (void) sdata;
  ((owner_t *) tp_sconn_data(c))->writable++;
}
static void on_stream_error(tp_sconn_t *c, uint32_t sid, void *sdata, int err, const char *msg) {
  owner_t *o = tp_sconn_data(c);
  (void) sdata, (void) msg;
  o->errors++;
  o->last_err = err;
  o->last_err_sid = sid;
}
static void on_close(tp_sconn_t *c, int err, const char *reason) {
  owner_t *o = tp_sconn_data(c);
  o->closed++;
  o->close_err = err;
  snprintf(o->close_reason, sizeof(o->close_reason), "%s", reason);
}
static const tp_sconn_cbs_t cbs = { on_data, on_end, on_writable, on_stream_error, on_close, NULL };
static uint8_t *data_buf(tp_sconn_t *c, uint32_t sid, void *sdata, size_t len) {
  owner_t *o = tp_sconn_data(c);
  (void) sid, (void) sdata;
  o->bufs++;
  o->last_buf = len;
  return len <= o->room_cap ? o->room : NULL;
}
static const tp_sconn_cbs_t cbs_direct = { on_data, on_end, on_writable, on_stream_error, on_close, data_buf };

static uv_loop_t loop;

static void pump(int ms) {
  uint64_t end = uv_now(&loop) + (uint64_t) ms;
  do {
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(1000);
    uv_update_time(&loop);
  } while (uv_now(&loop) < end);
}

/* The client's side: reads one whole frame (up to 2 s), into buf. */
static long peer_frame(int fd, uint8_t *buf, size_t cap, tp_sframe_t *f) {
  size_t n = 0;
  for (int i = 0; i < 2000; i++) {
    long r = tp_sframe_parse(buf, n, f, NULL);
    if (r != 0)
      return r;
    uv_run(&loop, UV_RUN_NOWAIT);
    ssize_t k = read(fd, buf + n, n < TP_SF_HDR ? TP_SF_HDR - n : TP_SF_HDR + f->len - n);
    if (k == 0)
      return -2; /* EOF */
    if (k < 0 && errno != EAGAIN)
      return -3;
    if (k > 0) {
      n += (size_t) k;
      if (n >= TP_SF_HDR) { /* learn the length to read exactly one frame */
        uint32_t len = (uint32_t) buf[0] | (uint32_t) buf[1] << 8 | (uint32_t) buf[2] << 16 |
                       (uint32_t) buf[3] << 24;
        f->len = len > cap - TP_SF_HDR ? (uint32_t) (cap - TP_SF_HDR) : len;
      }
      continue;
    }
    usleep(1000);
  }
  return -4;
}

static void peer_send(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = write(fd, b, n);
    if (k > 0) {
      b += k;
      n -= (size_t) k;
    } else {
      uv_run(&loop, UV_RUN_NOWAIT);
      usleep(500);
    }
  }
  pump(5);
}

static void peer_data(int fd, uint32_t sid, const uint8_t *p, uint32_t n) {
  uint8_t h[TP_SF_HDR];
  tp_sframe_header(h, TP_SF_DATA, sid, n);
  peer_send(fd, h, sizeof(h));
  peer_send(fd, p, n);
}

static tp_sconn_t *pair_cbs(owner_t *o, int *peer, uint32_t window, uint64_t idle_ms,
                            const tp_sconn_cbs_t *cb);
static tp_sconn_t *pair(owner_t *o, int *peer, uint32_t window, uint64_t idle_ms) {
  return pair_cbs(o, peer, window, idle_ms, &cbs);
}

static tp_sconn_t *pair_cbs(owner_t *o, int *peer, uint32_t window, uint64_t idle_ms,
                            const tp_sconn_cbs_t *cb) {
  int sv[2];
  tp_error_t err = { 0 };
  tp_sconn_t *c;
  memset(o, 0, sizeof(*o));
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return NULL;
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  *peer = sv[1];
  c = tp_sconn_new(&loop, sv[0], window, idle_ms, cb, o, &err);
  if (c == NULL)
    diag("tp_sconn_new: %s", err.msg);
  return c;
}

static uint8_t fbuf[TP_SF_HDR + TP_SF_DATA_MAX];

/* 8 MiB through a 64 KiB window, the reader granting credit as it goes. */
static void test_send_flow(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  tp_sframe_t f;
  size_t total = 8u << 20, sent = 0, recvd = 0;
  uint8_t *src = malloc(total);
  uint64_t want = 0, sum = 0;
  int bad = 0, max_queued_ok = 1;
  for (size_t i = 0; i < total; i++)
    want += (src[i] = (uint8_t) (i * 7 + (i >> 13)));
  check(tp_sconn_open(c, 1, TP_SK_STDOUT, 0, 1, NULL, NULL) == 0, "open a sending stream");
  long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_OPEN && f.sid == 1 && f.kind == TP_SK_STDOUT && f.window == 0,
        "the client sees OPEN (kind stdout, window 0)");
  check(tp_sconn_can_write(c, 1) == TP_SCONN_WINDOW_MIN, "credit starts at the window");
  while (recvd < total && !bad) {
    if (sent < total) {
      long k = tp_sconn_write(c, 1, src + sent, total - sent, NULL);
      if (k < 0)
        bad = 1;
      else
        sent += (size_t) k;
    }
    if (tp_sconn_queued(c) > TP_SCONN_WINDOW_MIN + 64 * TP_SF_HDR)
      max_queued_ok = 0;
    r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
    if (r <= 0 || f.type != TP_SF_DATA || f.sid != 1) {
      bad = 1;
      break;
    }
    for (uint32_t i = 0; i < f.len; i++)
      sum += f.payload[i];
    recvd += f.len;
    uint8_t cr[TP_SF_HDR + 4];
    peer_send(peer, cr, tp_sframe_credit(cr, 1, f.len));
  }
  check(!bad && recvd == total && sum == want, "8 MiB arrive exactly through a 64 KiB window");
  check(max_queued_ok, "the write queue never held more than the window");
  check(o.writable > 0, "credit woke the writer (%d times)", o.writable);
  check(tp_sconn_end(c, 1, 0, 0, NULL) == 0 && tp_sconn_streams(c) == 0,
        "END: the sending-only stream is over");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.sid == 1, "the client sees END");
  /* credit beyond the window is refused for that stream */
  tp_sconn_open(c, 2, TP_SK_STDOUT, 0, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  uint8_t cr[TP_SF_HDR + 4];
  peer_send(peer, cr, tp_sframe_credit(cr, 2, 1));
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 2 && f.err == EPROTO && o.last_err == EPROTO &&
            tp_sconn_streams(c) == 0, "CREDIT beyond the window ends that stream with EPROTO");
  tp_sconn_close(c);
  close(peer);
  free(src);
  pump(5);
}

/* The client sends: within the credit it gets, beyond it is refused. */
static void test_recv_flow(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sframe_t f;
  uint8_t *chunk = malloc(65536);
  memset(chunk, 3, 65536);
  o.credit_back = 1;
  check(tp_sconn_open(c, 5, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL) == 0, "open a receiving stream");
  long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_OPEN && f.window == 65536, "OPEN gives the client 64 KiB");
  int credits = 1;
  for (int i = 0; i < 32; i++) { /* 2 MiB, each chunk after the credit for the last */
    peer_data(peer, 5, chunk, 65536);
    r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
    if (r <= 0 || f.type != TP_SF_CREDIT || f.credit != 65536)
      credits = 0;
  }
  check(credits && o.got == 32 * 65536 && o.sum == 3ull * 32 * 65536,
        "2 MiB in, credit back for each chunk");
  uint8_t e[TP_SF_HDR + 8];
  peer_send(peer, e, tp_sframe_end(e, 5, 0, 0));
  check(o.ends == 1 && tp_sconn_streams(c) == 1, "the client's END: the owner hears it, the stream waits for ours");
  check(tp_sconn_end(c, 5, 1, 32 * 65536, NULL) == 0 && tp_sconn_streams(c) == 0, "our END with the size closes it");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.has_size && f.size == 32 * 65536, "the client gets END with the size");

  /* beyond the credit */
  o.credit_back = 0;
  tp_sconn_open(c, 6, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  peer_data(peer, 6, chunk, 65536);
  peer_data(peer, 6, chunk, 1);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 6 && f.err == EPROTO && o.last_err_sid == 6,
        "DATA beyond the credit: ERROR EPROTO for that stream");
  peer_data(peer, 6, chunk, 10); /* crossed the ERROR: dropped quietly */
  /* DATA on a stream the client does not send on */
  tp_sconn_open(c, 7, TP_SK_STDOUT, 0, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  peer_data(peer, 7, chunk, 10);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 7 && f.err == EPROTO,
        "DATA on a receive-only stream: EPROTO (nothing about stream 6 came first)");
  /* a client's OPEN */
  uint8_t op[TP_SF_HDR + 8];
  peer_send(peer, op, tp_sframe_open(op, TP_SF_CLIENT_SID + 1, TP_SK_FILE_WRITE, 100));
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == TP_SF_CLIENT_SID + 1 && f.err == EOPNOTSUPP,
        "a client's OPEN: EOPNOTSUPP in version 1");
  check(o.closed == 0, "the connection lives through every stream error");
  tp_sconn_close(c);
  close(peer);
  free(chunk);
  pump(5);
}

/* An unknown id, and another connection's stream. */
static void test_unknown(void) {
  owner_t oa, ob;
  int pa, pb;
  tp_sconn_t *a = pair(&oa, &pa, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sconn_t *b = pair(&ob, &pb, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sframe_t f;
  uint8_t x[4] = { 1, 2, 3, 4 };
  tp_sconn_open(a, 1, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  peer_frame(pa, fbuf, sizeof(fbuf), &f);
  peer_data(pb, 1, x, 4); /* b's client writes on a's stream */
  long r = peer_frame(pb, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 1 && f.err == ENOENT &&
            memmem(f.msg, f.msg_len, "no such stream", 14) != NULL,
        "a stream of another connection: ENOENT 'no such stream'");
  check(oa.got == 0 && oa.errors == 0 && tp_sconn_streams(a) == 1, "the owner's connection is unaffected");
  peer_data(pa, 1, x, 4);
  check(oa.got == 4, "and still gets its own bytes");
  peer_data(pb, 99, x, 4);
  r = peer_frame(pb, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 99 && f.err == ENOENT && ob.closed == 0,
        "an id never opened: ENOENT, the connection goes on");
  tp_sconn_close(a);
  tp_sconn_close(b);
  close(pa);
  close(pb);
  pump(5);
}

/* A wrong length: ERROR on sid 0, then the close; streams end. */
static void test_bad_length(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sframe_t f;
  uint8_t h[TP_SF_HDR];
  tp_sconn_open(c, 1, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  tp_sframe_header(h, TP_SF_DATA, 1, TP_SF_DATA_MAX + 1);
  peer_send(peer, h, sizeof(h));
  long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 0 && f.err == EPROTO &&
            memmem(f.msg, f.msg_len, "over 1048576", 12) != NULL,
        "a DATA announcing 1 MiB + 1: ERROR EPROTO on sid 0, saying why");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r == -2, "then the connection is closed");
  check(o.closed == 1 && o.close_err == EPROTO && o.errors == 1 && o.last_err == EPROTO,
        "the owner heard: the stream ended, then the connection (%s)", o.close_reason);
  close(peer); /* c frees itself after on_close */
  pump(5);
}

/* The read buffer starts small and grows for a frame larger than it:
 * small frames, a frame of the largest size, small frames again, all whole
 * and in order. */
static void test_large_frame(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sframe_t f;
  uint8_t *big = malloc(TP_SF_DATA_MAX);
  uint8_t small[10];
  uint64_t want = 0;
  for (uint32_t i = 0; i < TP_SF_DATA_MAX; i++)
    want += (big[i] = (uint8_t) (i * 13 + (i >> 11)));
  memset(small, 5, sizeof(small));
  want += 2 * 5 * sizeof(small);
  check(tp_sconn_open(c, 9, TP_SK_FILE_WRITE, 2 * TP_SF_DATA_MAX, 1, NULL, NULL) == 0,
        "open a receiving stream of 2 MiB");
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  peer_data(peer, 9, small, sizeof(small));
  peer_data(peer, 9, big, TP_SF_DATA_MAX);
  peer_data(peer, 9, small, sizeof(small));
  pump(20);
  check(o.got == TP_SF_DATA_MAX + 2 * sizeof(small) && o.sum == want && o.errors == 0 && o.closed == 0,
        "10 bytes, 1 MiB and 10 bytes arrive whole (%zu bytes)", (size_t) o.got);
  tp_sconn_close(c);
  close(peer);
  free(big);
  pump(5);
}

/* A half-written frame, then the client goes. */
static void test_half_frame(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0);
  tp_sframe_t f;
  uint8_t h[TP_SF_HDR + 100];
  tp_sconn_open(c, 3, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  tp_sconn_open(c, 4, TP_SK_STDOUT, 0, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  tp_sframe_header(h, TP_SF_DATA, 3, 1000);
  memset(h + TP_SF_HDR, 9, 100);
  peer_send(peer, h, sizeof(h));
  close(peer);
  pump(20);
  check(o.got == 0, "nothing of the partial frame was delivered");
  check(o.closed == 1 && strstr(o.close_reason, "middle of a frame") != NULL && o.errors == 2 &&
            o.last_err == ECONNRESET,
        "both streams ended (ECONNRESET), then the connection: %s", o.close_reason);
  pump(5);
}

/* A client that never reads: dropped after the idle time, nothing more queued than its window. */
static void test_never_reads(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 200);
  uint8_t *src = calloc(1, 1u << 20);
  long total = 0, k;
  tp_sconn_open(c, 1, TP_SK_STDOUT, 0, 1, NULL, NULL);
  while ((k = tp_sconn_write(c, 1, src, 1u << 20, NULL)) > 0)
    total += k;
  check(total == TP_SCONN_WINDOW_MIN && tp_sconn_queued(c) <= TP_SCONN_WINDOW_MIN + 64,
        "the writer gets no further than the window (%ld bytes)", total);
  pump(150);
  check(o.closed == 0, "not dropped before the idle time");
  pump(300);
  check(o.closed == 1 && o.close_err == ETIMEDOUT && o.last_err == ETIMEDOUT,
        "dropped with ETIMEDOUT after it (%s)", o.closed ? o.close_reason : "-");
  pump(400); /* the ERROR on sid 0 it never reads: closed by the timer */
  close(peer);
  free(src);
  pump(5);
}

/* A connection that is only waiting on the client's bytes is not idle. */
static void test_waiting_is_not_idle(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 100);
  tp_sconn_open(c, 1, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  pump(350);
  check(o.closed == 0, "a stream waiting for the client's DATA is not dropped");
  tp_error_t err = { 0 };
  check(tp_sconn_open(c, 1, TP_SK_STDOUT, 0, 1, NULL, &err) < 0 && err.code == EEXIST,
        "an id in use is EEXIST");
  check(tp_sconn_open(c, TP_SF_CLIENT_SID, TP_SK_STDOUT, 0, 1, NULL, &err) < 0 && err.code == EINVAL,
        "a client-range id is EINVAL");
  {
    int opened = 1; /* stream 1 above */
    for (uint32_t sid = 2; sid <= TP_SCONN_STREAMS_MAX + 10; sid++)
      if (tp_sconn_open(c, sid, TP_SK_FILE_READ, 0, 1, NULL, &err) == 0)
        opened++;
    check(opened == TP_SCONN_STREAMS_MAX && err.code == EMFILE &&
              tp_sconn_streams(c) == TP_SCONN_STREAMS_MAX,
          "streams past %d on one connection: EMFILE ('%s')", TP_SCONN_STREAMS_MAX, err.msg);
  }
  tp_sconn_close(c);
  close(peer);
  pump(5);
}

/* The connection's queue as a whole: many streams whose credit together
 * is far over the cap stop at it (the writers are told 0, as owners ask
 * tp_sconn_can_write), and go on once the client reads. */
static void test_queue_cap_streams(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  static uint8_t src[TP_SCONN_WINDOW_MIN];
  size_t cap = 256u * 1024u, total = 0, drained = 0;
  int writable0, more = 0;
  tp_sconn_set_queued_max(c, cap);
  for (uint32_t sid = 1; sid <= 16; sid++) /* 16 x 64 KiB of credit: 1 MiB */
    tp_sconn_open(c, sid, TP_SK_STDOUT, 0, 1, NULL, NULL);
  for (uint32_t sid = 1; sid <= 16; sid++) {
    uint64_t room;
    while ((room = tp_sconn_can_write(c, sid)) > 0) {
      long k = tp_sconn_write(c, sid, src, room < sizeof(src) ? (size_t) room : sizeof(src), NULL);
      if (k <= 0)
        break;
      total += (size_t) k;
    }
  }
  check(tp_sconn_queued(c) <= cap + 16 * TP_SF_HDR,
        "16 streams with 1 MiB of credit queue no more than the connection's cap (%zu of %zu, %zu "
        "written)", tp_sconn_queued(c), cap, total);
  check(total < 16u * TP_SCONN_WINDOW_MIN && tp_sconn_can_write(c, 16) == 0,
        "the writers are told 0 at the cap");
  writable0 = o.writable;
  for (int i = 0; i < 2000 && tp_sconn_queued(c) > 0; i++) { /* the client reads */
    ssize_t k = read(peer, fbuf, sizeof(fbuf));
    if (k > 0)
      drained += (size_t) k;
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  for (uint32_t sid = 1; sid <= 16; sid++)
    more += tp_sconn_can_write(c, sid) > 0;
  check(o.writable > writable0 && more > 0,
        "once the client read (%zu bytes), the held writers heard on_writable (%d) and may write",
        drained, o.writable - writable0);
  tp_sconn_close(c);
  close(peer);
  pump(5);
}

/* A client that sends frames calling for answers (here, unknown ids: an
 * ERROR each) and reads none: the daemon reads no more of them once the
 * answers queued reach the cap, and answers the rest once it reads. */
static void test_queue_cap_reading(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  size_t cap = 64u * 1024u, most = 0;
  enum { N = 100000 };
  uint8_t *frames = malloc((size_t) N * (TP_SF_HDR + 1));
  size_t len = (size_t) N * (TP_SF_HDR + 1), sent = 0;
  long answers = 0;
  tp_sframe_t f;
  tp_sconn_set_queued_max(c, cap);
  for (int i = 0; i < N; i++) {
    tp_sframe_header(frames + (size_t) i * (TP_SF_HDR + 1), TP_SF_DATA, 1000 + (uint32_t) i, 1);
    frames[(size_t) i * (TP_SF_HDR + 1) + TP_SF_HDR] = 0;
  }
  for (int i = 0; i < 500 && sent < len; i++) { /* as much as the socket takes, reading nothing */
    ssize_t k = write(peer, frames + sent, len - sent);
    if (k > 0)
      sent += (size_t) k;
    uv_run(&loop, UV_RUN_NOWAIT);
    if (tp_sconn_queued(c) > most)
      most = tp_sconn_queued(c);
    if (k <= 0)
      usleep(1000);
  }
  check(most <= cap + 256 && o.closed == 0,
        "a client that sends %zu bytes of frames calling for ERRORs and reads none: at most %zu "
        "bytes queued (cap %zu)", sent, most, cap);
  check(sent < len, "and its writes wait: the daemon stopped reading (%zu of %zu taken)", sent, len);
  for (int i = 0; i < 4 * N && answers < N; i++) { /* now it reads, and sends the rest */
    if (sent < len) {
      ssize_t k = write(peer, frames + sent, len - sent);
      if (k > 0)
        sent += (size_t) k;
    }
    long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
    if (r <= 0)
      break;
    answers += f.type == TP_SF_ERROR && f.err == ENOENT;
  }
  check(answers == N && o.closed == 0, "once it reads, every frame is answered (%ld of %d)",
        answers, N);
  tp_sconn_close(c);
  close(peer);
  free(frames);
  pump(5);
}


static int spliced_calls, spliced_err = -1;
static void on_spliced(void *arg, int err) {
  (void) arg;
  spliced_calls++;
  spliced_err = err;
}

static int nfds_self(void) {
  int n = 0;
  for (int fd = 0; fd < 1024; fd++)
    if (fcntl(fd, F_GETFD) >= 0)
      n++;
  return n;
}

/* Fills the connection's socket until libuv queues (streams 2.. get DATA). */
static int fill(tp_sconn_t *c, const uint8_t *p, uint32_t *sid) {
  for (*sid = 2; *sid < 40 && tp_sconn_queued(c) == 0; (*sid)++) {
    if (tp_sconn_open(c, *sid, TP_SK_STDOUT, 0, 1, NULL, NULL) < 0 ||
        tp_sconn_write(c, *sid, p, TP_SCONN_WINDOW_MIN, NULL) != (long) TP_SCONN_WINDOW_MIN)
      return -1;
  }
  return tp_sconn_queued(c) > 0 ? 0 : -1;
}

/* A DATA frame spliced from a pipe goes out whole, after what was queued
 * before it and before what was made after it; a closed connection calls
 * nobody back and leaves no fd. */
static void test_splice(void) {
  owner_t o;
  int peer, pp[2], pq[2], fds0 = nfds_self();
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  tp_error_t err = { 0 };
  tp_sframe_t f;
  static uint8_t pat[TP_SCONN_WINDOW_MIN], zeros[TP_SCONN_WINDOW_MIN];
  uint32_t last = 0, seen_max = 1;
  int order_ok = 1, got_splice = 0, got_second = 0, got_end = 0, exact = 0;
  for (size_t i = 0; i < sizeof(pat); i++)
    pat[i] = (uint8_t) (i * 13 + 5);
  check(pipe2(pp, O_CLOEXEC | O_NONBLOCK) == 0 && write(pp[1], pat, sizeof(pat)) == (ssize_t) sizeof(pat),
        "a pipe with 64 KiB");
  check(tp_sconn_open(c, 1, TP_SK_FILE_READ, 0, 1, NULL, NULL) == 0, "open the spliced stream");
  check(tp_sconn_splice(c, 1, pp[0], sizeof(pat) + 1, on_spliced, NULL, &err) < 0 && err.code == EINVAL,
        "more than the credit (or the pipe) is refused: EINVAL");
  {
    int full = fill(c, zeros, &last);
    check(full == 0, "the socket is full (%u streams of 64 KiB), libuv queues", last - 2);
  }
  memset(&err, 0, sizeof(err));
  check(tp_sconn_splice(c, 1, pp[0], sizeof(pat), on_spliced, NULL, &err) == 0, "splice queued: %s", err.msg);
  close(pp[0]); /* the connection keeps its own */
  check(pipe2(pq, O_CLOEXEC | O_NONBLOCK) == 0 && write(pq[1], pat + 1, 1000) == 1000, "a second pipe");
  check(tp_sconn_open(c, 90, TP_SK_FILE_READ, 0, 1, NULL, NULL) == 0 &&
            tp_sconn_splice(c, 90, pq[0], 1000, on_spliced, NULL, &err) == 0,
        "a second stream's spliced frame queues behind the first");
  close(pq[0]);
  check(tp_sconn_end(c, 2, 0, 0, NULL) == 0, "END of stream 2 is made behind them");
  check(spliced_calls == 0, "not out yet: the socket is full");
  for (int i = 0; i < 100 && !got_end; i++) {
    long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
    if (r <= 0)
      break;
    if (f.type == TP_SF_OPEN)
      continue;
    if (f.type == TP_SF_DATA && f.sid == 90) {
      got_second = got_splice && f.len == 1000 && memcmp(f.payload, pat + 1, 1000) == 0;
    } else if (f.type == TP_SF_DATA && f.sid != 1) {
      if (got_splice)
        order_ok = 0; /* queued before the splice: must come before it */
      if (f.sid > seen_max)
        seen_max = f.sid;
    } else if (f.type == TP_SF_DATA && f.sid == 1) {
      got_splice = 1;
      exact = f.len == sizeof(pat) && memcmp(f.payload, pat, sizeof(pat)) == 0;
    } else if (f.type == TP_SF_END && f.sid == 2) {
      got_end = 1;
      if (!got_splice || !got_second)
        order_ok = 0;
    }
  }
  pump(5);
  check(got_splice && exact, "the spliced frame arrives whole, byte for byte");
  check(got_second, "the second stream's spliced frame came after it, whole");
  check(order_ok && got_end, "what was queued came before it, what was made after it came after");
  check(spliced_calls == 2 && spliced_err == 0, "the owners heard once each that theirs is out");
  tp_sconn_close(c);
  close(peer);
  close(pp[1]);
  close(pq[1]);
  pump(5);

  /* a connection closed while its spliced frame waits for room */
  spliced_calls = 0;
  c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  check(pipe2(pp, O_CLOEXEC | O_NONBLOCK) == 0 && write(pp[1], pat, sizeof(pat)) == (ssize_t) sizeof(pat),
        "another pipe");
  tp_sconn_open(c, 1, TP_SK_FILE_READ, 0, 1, NULL, NULL);
  check(fill(c, zeros, &last) == 0, "the socket is full again");
  check(tp_sconn_splice(c, 1, pp[0], sizeof(pat), on_spliced, NULL, &err) == 0, "splice queued");
  pump(5);
  tp_sconn_close(c);
  close(pp[0]);
  close(pp[1]);
  close(peer);
  pump(10);
  check(spliced_calls == 0, "no callback after the owner closed it");
  check(nfds_self() == fds0, "no fd left (%d, was %d)", nfds_self(), fds0);
}

/* A cork: OPENs and ENDs wait until the uncork, then arrive in order; a
 * frame too big to wait sends what waits before it; nothing is lost. */
static void test_cork(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  tp_sframe_t f;
  uint8_t one[1];
  static uint8_t big[4096];
  long r;
  int order_ok = 1;
  tp_sconn_cork(c);
  check(tp_sconn_open(c, 1, TP_SK_STDOUT, 0, 1, NULL, NULL) == 0 &&
            tp_sconn_open(c, 2, TP_SK_STDERR, 0, 1, NULL, NULL) == 0,
        "corked: two OPENs taken");
  check(read(peer, one, 1) < 0 && errno == EAGAIN, "corked: nothing on the socket yet");
  tp_sconn_uncork(c);
  for (uint32_t sid = 1; sid <= 2; sid++) {
    r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
    if (r <= 0 || f.type != TP_SF_OPEN || f.sid != sid)
      order_ok = 0;
  }
  check(order_ok, "uncorked: both OPENs arrive, in order");
  tp_sconn_cork(c);
  check(tp_sconn_end(c, 1, 1, 0, NULL) == 0, "corked: END of stream 1 taken");
  check(tp_sconn_write(c, 2, big, sizeof(big), NULL) == (long) sizeof(big),
        "corked: a DATA frame too big to wait is taken");
  check(tp_sconn_end(c, 2, 1, sizeof(big), NULL) == 0, "corked: END of stream 2 taken");
  tp_sconn_uncork(c);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.sid == 1, "the END that waited comes first");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_DATA && f.sid == 2 && f.len == sizeof(big), "then the DATA, whole");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.sid == 2 && tp_sconn_streams(c) == 0,
        "then the last END: no stream is left");
  check(read(peer, one, 1) < 0 && errno == EAGAIN, "and nothing more");
  tp_sconn_close(c);
  close(peer);
  pump(5);
}

/* Corks nest (the last uncork sends); a hold for the loop turn keeps
 * small frames until tp_sconn_flush, which sends them and holds what comes
 * after, or until the loop is about to wait, which sends the rest. */
static void test_hold_turn(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair(&o, &peer, TP_SCONN_WINDOW_MIN, 0);
  tp_sframe_t f;
  uint8_t one[1];
  long r;
  tp_sconn_cork(c);
  tp_sconn_cork(c);
  check(tp_sconn_open(c, 1, TP_SK_STDOUT, 0, 1, NULL, NULL) == 0, "nested corks: an OPEN taken");
  tp_sconn_uncork(c);
  check(read(peer, one, 1) < 0 && errno == EAGAIN, "the inner uncork sends nothing");
  tp_sconn_uncork(c);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_OPEN && f.sid == 1, "the outer uncork sends it");

  tp_sconn_hold_turn(c);
  tp_sconn_hold_turn(c); /* once a turn: one cork */
  tp_sconn_cork(c);
  check(tp_sconn_open(c, 2, TP_SK_STDERR, 0, 1, NULL, NULL) == 0, "held: an OPEN taken");
  tp_sconn_uncork(c);
  check(read(peer, one, 1) < 0 && errno == EAGAIN, "held: the inner uncork sends nothing");
  tp_sconn_flush(c);
  /* read without running the loop (peer_frame does: its turn ends the hold) */
  r = read(peer, fbuf, sizeof(fbuf));
  check(r == TP_SF_HDR + 8 && tp_sframe_parse(fbuf, (size_t) r, &f, NULL) == r && f.type == TP_SF_OPEN &&
            f.sid == 2,
        "the flush sends what the hold kept, at once");
  check(tp_sconn_end(c, 1, 1, 0, NULL) == 0, "held still: an END taken");
  check(read(peer, one, 1) < 0 && errno == EAGAIN, "after a flush the hold keeps holding");
  uv_run(&loop, UV_RUN_NOWAIT); /* the loop about to wait: the hold ends */
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.sid == 1, "the loop's turn sends the rest");
  check(tp_sconn_end(c, 2, 1, 0, NULL) == 0, "an END after the turn");
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_END && f.sid == 2, "goes at once: the hold is over");

  tp_sconn_hold_turn(c); /* closed while held: nothing left behind */
  check(tp_sconn_open(c, 3, TP_SK_STDOUT, 0, 1, NULL, NULL) == 0, "held again: an OPEN taken");
  tp_sconn_close(c);
  close(peer);
  pump(5);
}

/* Large DATA payloads read straight into the owner's room (data_buf):
 * exact bytes, the next frame read apart from it, a stream that ends in
 * the middle (the rest dropped, the room untouched), a payload longer than
 * its header said, DATA beyond the credit, a client gone mid-payload. */
static void test_direct(void) {
  owner_t o;
  int peer;
  tp_sconn_t *c = pair_cbs(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0, &cbs_direct);
  tp_sframe_t f;
  size_t big = 300 * 1024, ok = 1;
  uint8_t *src = malloc(big + 64), *room = malloc(TP_SF_DATA_MAX);
  uint64_t want = 0;
  for (size_t i = 0; i < big; i++)
    want += (src[i] = (uint8_t) (i * 13 + (i >> 11)));
  o.room = room;
  o.room_cap = TP_SF_DATA_MAX;
  tp_sconn_open(c, 8, TP_SK_FILE_WRITE, TP_SF_DATA_MAX, 1, NULL, NULL);
  tp_sconn_open(c, 9, TP_SK_FILE_WRITE, TP_SF_DATA_MAX, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  /* the header and 10 bytes, then the rest with a small frame behind it in one write */
  tp_sframe_header(fbuf, TP_SF_DATA, 8, (uint32_t) big);
  memcpy(fbuf + TP_SF_HDR, src, 10);
  peer_send(peer, fbuf, TP_SF_HDR + 10);
  check(o.bufs == 1 && o.last_buf == big && o.got == 0, "a 300 KiB DATA's header: the owner is asked for room");
  memcpy(fbuf, src + 10, big - 10);
  tp_sframe_header(fbuf + big - 10, TP_SF_DATA, 8, 5);
  memcpy(fbuf + big - 10 + TP_SF_HDR, "hello", 5);
  peer_send(peer, fbuf, big - 10 + TP_SF_HDR + 5);
  check(o.in_room == 1 && memcmp(room, src, big) == 0, "the payload is in the room, byte for byte");
  check(o.got == big + 5 && o.sum == want + 'h' + 'e' + 'l' + 'l' + 'o' && o.bufs == 1,
        "and the small frame behind it came apart (through the read buffer)");

  /* the stream ends while its payload is read into the room */
  o.got = 0;
  tp_sframe_header(fbuf, TP_SF_DATA, 9, 200 * 1024);
  memset(fbuf + TP_SF_HDR, 1, 1000);
  peer_send(peer, fbuf, TP_SF_HDR + 1000);
  check(o.bufs == 2 && tp_sconn_fail(c, 9, EIO, "the owner's write failed") == 0, "the owner fails stream 9 mid-payload");
  memset(room, 0xee, TP_SF_DATA_MAX);
  memset(fbuf, 1, 200 * 1024 - 1000);
  tp_sframe_header(fbuf + 200 * 1024 - 1000, TP_SF_DATA, 8, 7);
  memcpy(fbuf + 200 * 1024 - 1000 + TP_SF_HDR, "goodbye", 7);
  peer_send(peer, fbuf, 200 * 1024 - 1000 + TP_SF_HDR + 7);
  for (size_t i = 0; i < TP_SF_DATA_MAX && ok; i++)
    ok = room[i] == 0xee;
  check(ok, "the rest of its payload was dropped: the room is untouched after the failure");
  long r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 9 && f.err == EIO, "the client hears stream 9's error");
  check(o.got == 7 && o.in_room == 1 && o.closed == 0, "the next frame, of stream 8, came whole: the connection lives");

  /* beyond the credit: not read into the room, the error once it is whole */
  tp_sconn_open(c, 10, TP_SK_FILE_WRITE, 65536, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  memset(fbuf, 2, 128 * 1024);
  peer_data(peer, 10, fbuf, 128 * 1024);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(o.bufs == 2 && r > 0 && f.type == TP_SF_ERROR && f.sid == 10 && f.err == EPROTO,
        "DATA beyond the credit: no room asked for, EPROTO for that stream");

  /* a payload longer than its header said: the bytes past it are the next header */
  o.got = 0;
  tp_sframe_header(fbuf, TP_SF_DATA, 8, TP_SCONN_DIRECT_MIN);
  memset(fbuf + TP_SF_HDR, 4, TP_SCONN_DIRECT_MIN + 16);
  peer_send(peer, fbuf, TP_SF_HDR + 8);
  peer_send(peer, fbuf + TP_SF_HDR + 8, TP_SCONN_DIRECT_MIN + 8);
  r = peer_frame(peer, fbuf, sizeof(fbuf), &f);
  check(o.got == TP_SCONN_DIRECT_MIN && o.in_room == 2, "the announced 64 KiB went to the room, no byte more");
  check(r > 0 && f.type == TP_SF_ERROR && f.sid == 0 && f.err == EPROTO && o.closed == 1 &&
            o.close_err == EPROTO, "the 16 bytes past it: a malformed frame, the connection's error (%s)",
        o.close_reason);
  close(peer);
  pump(5);

  /* the client goes in the middle of a payload read into the room */
  c = pair_cbs(&o, &peer, TP_SCONN_WINDOW_DEFAULT, 0, &cbs_direct);
  o.room = room;
  o.room_cap = TP_SF_DATA_MAX;
  tp_sconn_open(c, 3, TP_SK_FILE_WRITE, TP_SF_DATA_MAX, 1, NULL, NULL);
  peer_frame(peer, fbuf, sizeof(fbuf), &f);
  tp_sframe_header(fbuf, TP_SF_DATA, 3, 512 * 1024);
  memset(fbuf + TP_SF_HDR, 5, 100 * 1024);
  peer_send(peer, fbuf, TP_SF_HDR + 100 * 1024);
  close(peer);
  pump(20);
  check(o.bufs == 1 && o.got == 0, "nothing of the cut payload was delivered");
  check(o.closed == 1 && strstr(o.close_reason, "middle of a frame") != NULL && o.errors == 1 &&
            o.last_err == ECONNRESET, "the stream ended (ECONNRESET), then the connection: %s", o.close_reason);
  pump(5);
  free(src);
  free(room);
}

int main(void) {
  uv_loop_init(&loop);
  test_send_flow();
  test_recv_flow();
  test_unknown();
  test_bad_length();
  test_half_frame();
  test_large_frame();
  test_never_reads();
  test_waiting_is_not_idle();
  test_queue_cap_streams();
  test_queue_cap_reading();
  test_splice();
  test_cork();
  test_hold_turn();
  test_direct();
  pump(10);
  check(uv_loop_close(&loop) == 0, "the loop closes: every handle was freed");
  return tap_done();
}
