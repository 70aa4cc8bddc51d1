/* Unit tests for the client's data connection pump (runtime/host/spump.c)
 * over a socketpair, a thread playing the daemon: a sink's bytes reach its
 * fd whole and come back as credit, a source sends a file within its credit
 * and ends it, frames of other streams reach the caller intact, and a bad
 * frame, a sink past its limit, a reader gone (EPIPE) and the daemon's end
 * each come back as one clear event. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spump.h"
#include "tap.h"

#define BIG (3u * 1024u * 1024u + 4099u)

typedef struct evs_s {
  int n, ends, errors, locals, over, zeros;
  uint32_t last_err, last_sid;
  uint64_t end_size;
  char msg[256];
  uint8_t data[64];
  size_t dlen;
} evs_t;

static void on_ev(void *data, const tp_sframe_t *f, int local) {
  evs_t *e = data;
  e->n++;
  e->last_sid = f->sid;
  if (f->type == TP_SF_END) {
    e->ends++;
    e->end_size = f->has_size ? f->size : 0;
  } else if (f->type == TP_SF_ERROR) {
    e->errors++;
    e->locals += local;
    e->last_err = f->err;
    snprintf(e->msg, sizeof(e->msg), "%.*s", (int) f->msg_len, f->msg);
    if (f->sid == 0) {
      e->over = 1;
      e->zeros++;
    }
  } else if (f->type == TP_SF_DATA && f->len <= sizeof(e->data)) {
    memcpy(e->data, f->payload, f->len);
    e->dlen = f->len;
  }
}

static uint8_t pattern(uint64_t i) {
  return (uint8_t) ((i * 131u + (i >> 11)) & 0xff);
}

static int write_all(int fd, const uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    b += w;
    n -= (size_t) w;
  }
  return 0;
}

/* The daemon of the sink test, with a window of 1 MiB as a real one has:
 * OPEN, BIG bytes in DATA frames of uneven sizes (written in uneven
 * pieces, so headers are split too), each sent only within the credit the
 * client gave back, then END with the size. */
#define WINDOW (1u << 20)
typedef struct daemon_s {
  int fd;
  uint64_t credited;
  int bad;
} daemon_t;

static int read_credit(daemon_t *d, uint8_t *rb, size_t *have) {
  tp_sframe_t f;
  long r;
  ssize_t got = read(d->fd, rb + *have, 4096 - *have);
  if (got <= 0)
    return -1;
  *have += (size_t) got;
  while ((r = tp_sframe_parse(rb, *have, &f, NULL)) > 0) {
    if (f.type == TP_SF_CREDIT && f.sid == 5)
      d->credited += f.credit;
    else
      d->bad++;
    memmove(rb, rb + r, *have - (size_t) r);
    *have -= (size_t) r;
  }
  if (r < 0)
    d->bad++;
  return r < 0 ? -1 : 0;
}

static void *sink_daemon(void *arg) {
  daemon_t *d = arg;
  uint8_t *buf = malloc(TP_SF_HDR + TP_SF_DATA_MAX);
  uint8_t rb[4096];
  size_t have = 0;
  uint64_t off = 0;
  size_t n = tp_sframe_open(buf, 5, TP_SK_STDOUT, 0);
  write_all(d->fd, buf, n);
  while (off < BIG) {
    uint32_t len = (uint32_t) (off % 3 == 0 ? 300000 : 65537 + off % 1000);
    if (len > BIG - off)
      len = (uint32_t) (BIG - off);
    while (off + len > d->credited + WINDOW)
      if (read_credit(d, rb, &have) < 0)
        goto out;
    tp_sframe_header(buf, TP_SF_DATA, 5, len);
    for (uint32_t i = 0; i < len; i++)
      buf[TP_SF_HDR + i] = pattern(off + i);
    for (size_t p = 0; p < TP_SF_HDR + len;) {
      size_t k = TP_SF_HDR + len - p < 7001 ? TP_SF_HDR + len - p : 7001;
      write_all(d->fd, buf + p, k);
      p += k;
    }
    off += len;
  }
  n = tp_sframe_end(buf, 5, 1, BIG);
  write_all(d->fd, buf, n);
out:
  free(buf);
  return NULL;
}

/* Drives p until cond holds or the connection is over (10 s at most). */
static void drive(tp_spump_t *p, evs_t *e, int (*cond)(const evs_t *)) {
  for (int i = 0; i < 100000 && !cond(e) && !e->over; i++) {
    struct pollfd pf = { .fd = tp_spump_fd(p), .events = POLLIN };
    if (tp_spump_queued(p) > 0)
      pf.events |= POLLOUT;
    if (poll(&pf, 1, 100) < 0)
      break;
    if (pf.revents & (POLLIN | POLLHUP | POLLERR))
      tp_spump_read(p, on_ev, e);
    if (pf.revents & POLLOUT)
      tp_spump_write(p, on_ev, e);
  }
}

static int has_end(const evs_t *e) {
  return e->ends > 0;
}
static int has_error(const evs_t *e) {
  return e->errors > 0;
}
static int has_error_over(const evs_t *e) {
  return e->over;
}
static int has_data(const evs_t *e) {
  return e->dlen > 0;
}

typedef struct reader_s {
  int fd;
  uint8_t *buf;
  size_t got;
} reader_t;

static void *pipe_reader(void *arg) {
  reader_t *r = arg;
  ssize_t n;
  while ((n = read(r->fd, r->buf + r->got, BIG + 1 - r->got)) > 0 && r->got + (size_t) n <= BIG)
    r->got += (size_t) n;
  return NULL;
}

/* to_pipe: the sink is a pipe (its payload spliced), else a file (written) */
static void test_sink(int to_pipe) {
  const char *what = to_pipe ? "sink into a pipe" : "sink into a file";
  int sv[2], pp[2] = { -1, -1 };
  daemon_t d = { 0 };
  reader_t rd = { 0 };
  pthread_t th, rth;
  evs_t e = { 0 };
  tp_error_t err = { 0 };
  char path[] = "/tmp/tupper-spump.XXXXXX";
  int out = -1;
  tp_spump_t *p;
  uint8_t *back = malloc(BIG + 1);
  int same = 1;
  ssize_t got;
  if (to_pipe) {
    if (pipe(pp) == 0)
      out = pp[1];
  } else {
    out = mkstemp(path);
    unlink(path);
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || out < 0) {
    check(0, "%s: socketpair and an fd", what);
    return;
  }
  p = tp_spump_new(sv[0], NULL, 0, &err);
  check(p != NULL && tp_spump_sink(p, 5, out, BIG, &err) == 0, "%s: made (%s)", what, err.msg);
  d.fd = sv[1];
  pthread_create(&th, NULL, sink_daemon, &d);
  if (to_pipe) {
    rd.fd = pp[0];
    rd.buf = back;
    pthread_create(&rth, NULL, pipe_reader, &rd);
  }
  drive(p, &e, has_end);
  pthread_join(th, NULL);
  check(e.ends == 1 && e.end_size == BIG && e.errors == 0, "%s: one END with the size (%d ends, %d errors)",
        what, e.ends, e.errors);
  check(d.credited + WINDOW >= BIG && d.credited <= BIG && d.bad == 0,
        "%s: the bytes came within the credit given back (%llu of %u, %d bad)", what,
        (unsigned long long) d.credited, BIG, d.bad);
  if (to_pipe) {
    close(pp[1]);
    pthread_join(rth, NULL);
    got = (ssize_t) rd.got;
    close(pp[0]);
  } else {
    got = pread(out, back, BIG + 1, 0);
    close(out);
  }
  for (uint64_t i = 0; got == (ssize_t) BIG && i < BIG; i++)
    if (back[i] != pattern(i)) {
      same = 0;
      break;
    }
  check(got == (ssize_t) BIG && same, "%s: the fd got the bytes in order (%zd bytes)", what, got);
  free(back);
  tp_spump_free(p);
  close(sv[1]);
}

/* Frames of a stream with no pump reach the caller; a bad frame ends the
 * connection with EPROTO. */
static void test_passthrough_and_bad(void) {
  int sv[2];
  evs_t e = { 0 };
  tp_error_t err = { 0 };
  uint8_t buf[64];
  tp_spump_t *p;
  size_t n;
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  /* the first frame's tail came with the attach reply */
  tp_sframe_header(buf, TP_SF_DATA, 9, 5);
  memcpy(buf + TP_SF_HDR, "hello", 5);
  p = tp_spump_new(sv[0], buf, 8, &err);
  write_all(sv[1], buf + 8, TP_SF_HDR + 5 - 8);
  drive(p, &e, has_data);
  check(e.dlen == 5 && memcmp(e.data, "hello", 5) == 0 && e.last_sid == 9,
        "a stream without a pump: its DATA reaches the caller whole");
  n = tp_sframe_credit(buf, 9, 1);
  buf[5] = 77; /* an unknown type */
  write_all(sv[1], buf, n);
  drive(p, &e, has_error);
  check(e.over && e.last_err == EPROTO && strstr(e.msg, "unknown frame type") != NULL,
        "a bad frame: the connection is over, EPROTO (%s)", e.msg);
  check(tp_spump_read(p, on_ev, &e) == -1 && e.errors == 1, "and it says so once");
  tp_spump_free(p);
  close(sv[1]);
}

/* The first pump at a time lives in .bss, the others on the heap: two at
 * once each get their own bytes (the pre bytes and a frame each), and
 * once the first is freed the next takes its place. */
static void test_two_at_once(void) {
  int sa[2], sb[2];
  evs_t ea = { 0 }, eb = { 0 };
  tp_error_t err = { 0 };
  uint8_t fa[64], fb[64];
  tp_spump_t *pa, *pb, *pc;
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sa);
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sb);
  tp_sframe_header(fa, TP_SF_DATA, 3, 5);
  memcpy(fa + TP_SF_HDR, "first", 5);
  tp_sframe_header(fb, TP_SF_DATA, 4, 6);
  memcpy(fb + TP_SF_HDR, "second", 6);
  pa = tp_spump_new(sa[0], fa, 6, &err);
  pb = tp_spump_new(sb[0], fb, 7, &err);
  check(pa != NULL && pb != NULL && pa != pb, "two pumps at once");
  write_all(sb[1], fb + 7, TP_SF_HDR + 6 - 7);
  write_all(sa[1], fa + 6, TP_SF_HDR + 5 - 6);
  drive(pb, &eb, has_data);
  drive(pa, &ea, has_data);
  check(ea.dlen == 5 && memcmp(ea.data, "first", 5) == 0 && ea.last_sid == 3 && eb.dlen == 6 &&
            memcmp(eb.data, "second", 6) == 0 && eb.last_sid == 4,
        "each reads its own frame after its own pre bytes");
  tp_spump_free(pa);
  pc = tp_spump_new(sa[1], NULL, 0, &err);
  check(pc == pa, "the first's place is the next pump's once it is freed");
  tp_spump_free(pc);
  tp_spump_free(pb);
  close(sb[1]);
}

/* A sink past its limit, and a sink whose reader went: one local event
 * each, and an ERROR to the daemon. */
static void test_sink_failures(void) {
  int sv[2], pp[2];
  evs_t e = { 0 };
  tp_error_t err = { 0 };
  uint8_t buf[TP_SF_HDR + 100];
  uint8_t rb[512];
  tp_sframe_t f;
  tp_spump_t *p;
  ssize_t got;
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  if (pipe(pp) < 0)
    return;
  p = tp_spump_new(sv[0], NULL, 0, &err);
  tp_spump_sink(p, 3, pp[1], 10, &err);
  tp_sframe_header(buf, TP_SF_DATA, 3, 100);
  memset(buf + TP_SF_HDR, 'x', 100);
  write_all(sv[1], buf, sizeof(buf));
  drive(p, &e, has_error);
  check(e.locals == 1 && e.last_err == EFBIG && e.last_sid == 3 && !e.over,
        "a sink past its limit: a local EFBIG (%s)", e.msg);
  got = read(sv[1], rb, sizeof(rb));
  check(got > 0 && tp_sframe_parse(rb, (size_t) got, &f, NULL) > 0 && f.type == TP_SF_ERROR &&
            f.sid == 3, "and the daemon gets an ERROR for the stream");
  /* more DATA for it crosses the ERROR: dropped */
  write_all(sv[1], buf, sizeof(buf));
  tp_sframe_header(buf, TP_SF_DATA, 4, 100);
  close(pp[0]);
  tp_spump_sink(p, 4, pp[1], 1000, &err);
  write_all(sv[1], buf, sizeof(buf));
  memset(&e, 0, sizeof(e));
  drive(p, &e, has_error);
  check(e.n == 1 && e.locals == 1 && e.last_err == EPIPE && e.last_sid == 4,
        "a sink whose reader went: a local EPIPE, the crossed DATA dropped (%d events: %s)", e.n, e.msg);
  close(sv[1]);
  memset(&e, 0, sizeof(e));
  drive(p, &e, has_error);
  check(e.over && e.last_err == ECONNRESET, "the daemon's end: the connection is over (%s)", e.msg);
  tp_spump_free(p);
  close(pp[1]);
}

/* A source: a file of BIG bytes sent within 1 MiB of credit at a time,
 * then END; the daemon's END reaches the caller. */
static void test_source(void) {
  int sv[2];
  evs_t e = { 0 };
  tp_error_t err = { 0 };
  char path[] = "/tmp/tupper-spump.XXXXXX";
  int in = mkstemp(path);
  uint8_t *file = malloc(BIG), *rb = malloc(4u << 20);
  size_t have = 0;
  uint64_t got = 0, outstanding = 0, max_out = 0;
  int ended = 0, same = 1, bad = 0, nonreg;
  tp_spump_t *p;
  unlink(path);
  for (uint64_t i = 0; i < BIG; i++)
    file[i] = pattern(i * 7);
  write_all(in, file, BIG);
  lseek(in, 0, SEEK_SET);
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  p = tp_spump_new(sv[0], NULL, 0, &err);
  nonreg = tp_spump_source(p, 6, sv[1], 1, 1, &err);
  check(nonreg < 0 && err.code == EINVAL, "a source that is not a regular file: EINVAL");
  check(tp_spump_source(p, 6, in, 0, UINT64_MAX, &err) == 0, "source: made");
  {
    uint8_t open[TP_SF_HDR + 8];
    write_all(sv[1], open, tp_sframe_open(open, 6, TP_SK_FILE_WRITE, 1u << 20));
    outstanding = 1u << 20;
  }
  while (!ended && !bad) {
    tp_sframe_t f;
    long r;
    ssize_t n;
    tp_spump_read(p, on_ev, &e);
    tp_spump_write(p, on_ev, &e);
    n = recv(sv[1], rb + have, (4u << 20) - have, MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) {
      struct pollfd pf = { .fd = sv[1], .events = POLLIN };
      poll(&pf, 1, 10);
      continue;
    }
    if (n <= 0)
      break;
    have += (size_t) n;
    while ((r = tp_sframe_parse(rb, have, &f, NULL)) > 0) {
      if (f.type == TP_SF_DATA && f.sid == 6) {
        if (got + f.len > BIG || memcmp(f.payload, file + got, f.len) != 0)
          same = 0;
        got += f.len;
        if (f.len > outstanding)
          bad = 1;
        outstanding -= f.len;
        if (outstanding == 0) { /* the window used up: grant the next */
          uint8_t c[TP_SF_HDR + 4];
          write_all(sv[1], c, tp_sframe_credit(c, 6, 1u << 20));
          outstanding = 1u << 20;
        }
        if (outstanding > max_out)
          max_out = outstanding;
      } else if (f.type == TP_SF_END && f.sid == 6) {
        ended = 1;
      } else {
        bad = 1;
      }
      memmove(rb, rb + r, have - (size_t) r);
      have -= (size_t) r;
    }
  }
  check(ended && !bad && same && got == BIG, "source: the file's bytes within the credit, then END (%llu)",
        (unsigned long long) got);
  {
    uint8_t end[TP_SF_HDR + 8];
    write_all(sv[1], end, tp_sframe_end(end, 6, 1, BIG));
  }
  drive(p, &e, has_end);
  check(e.ends == 1 && e.end_size == BIG, "source: the daemon's END reaches the caller");
  tp_spump_free(p);
  close(sv[1]);
  close(in);
  free(file);
  free(rb);
}

static void *discard(void *arg) {
  int fd = *(int *) arg;
  char b[65536];
  while (read(fd, b, sizeof(b)) > 0)
    ;
  return NULL;
}

static uint32_t rnd_state = 12345;
static uint32_t rnd(void) {
  rnd_state ^= rnd_state << 13;
  rnd_state ^= rnd_state >> 17;
  rnd_state ^= rnd_state << 5;
  return rnd_state;
}

/* Hostile input: runs of frames (good ones for a file sink, a pipe sink, a
 * stream without a pump; bad lengths, types, versions; flipped bytes), cut
 * into random pieces, then the end.  Each connection must end with exactly
 * one sid 0 event, never a crash or a hang. */
static void test_hostile(void) {
  int pp[2], devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  pthread_t th;
  int bad_ends = 0, rounds = 300;
  if (devnull < 0 || pipe(pp) < 0) {
    check(0, "hostile: /dev/null and a pipe");
    return;
  }
  pthread_create(&th, NULL, discard, &pp[0]);
  for (int round = 0; round < rounds; round++) {
    int sv[2];
    evs_t e = { 0 };
    tp_error_t err = { 0 };
    uint8_t buf[65536];
    size_t n = 0;
    tp_spump_t *p;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
      break;
    p = tp_spump_new(sv[0], NULL, 0, &err);
    tp_spump_sink(p, 5, devnull, rnd() % 2 ? UINT64_MAX : 5000, &err);
    tp_spump_sink(p, 6, pp[1], UINT64_MAX, &err);
    while (n < sizeof(buf) - 2048) {
      uint32_t sid = 4 + rnd() % 4, len = rnd() % 1500, k = rnd() % 8;
      size_t at = n;
      if (k < 4) {
        tp_sframe_header(buf + n, TP_SF_DATA, sid, len ? len : 1);
        n += TP_SF_HDR + (len ? len : 1);
        memset(buf + at + TP_SF_HDR, 'd', len ? len : 1);
      } else if (k == 4) {
        n += tp_sframe_credit(buf + n, sid, 1 + len);
      } else if (k == 5) {
        n += tp_sframe_end(buf + n, sid, (int) (len & 1), len);
      } else if (k == 6) {
        n += tp_sframe_error(buf + n, rnd() % 3 ? sid : 0, EIO, "gone");
      } else {
        for (uint32_t i = 0; i < 16; i++)
          buf[n++] = (uint8_t) rnd();
      }
      if (rnd() % 16 == 0) /* a flipped byte somewhere in that frame */
        buf[at + rnd() % (n - at)] ^= (uint8_t) (1u << (rnd() % 8));
    }
    for (size_t off = 0; off < n;) {
      size_t piece = 1 + rnd() % 3000;
      if (piece > n - off)
        piece = n - off;
      if (write_all(sv[1], buf + off, piece) < 0)
        break; /* the pump closed its end after a bad frame */
      off += piece;
      if (rnd() % 4 == 0)
        tp_spump_read(p, on_ev, &e);
    }
    shutdown(sv[1], SHUT_WR);
    drive(p, &e, has_error_over);
    if (!e.over || tp_spump_read(p, on_ev, &e) != -1 || e.zeros != 1)
      bad_ends++;
    tp_spump_free(p);
    close(sv[1]);
  }
  check(bad_ends == 0, "hostile: %d connections of random frames each ended once, cleanly (%d did not)",
        rounds, bad_ends);
  close(pp[1]);
  pthread_join(th, NULL);
  close(pp[0]);
  close(devnull);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_sink(0);
  test_sink(1);
  test_passthrough_and_bad();
  test_two_at_once();
  test_sink_failures();
  test_source();
  test_hostile();
  return tap_done();
}
