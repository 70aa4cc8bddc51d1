/* Drives the real tupper-agent's network relay (agent_net.c) over a
 * socketpair, playing the host, inside a network namespace of its own
 * (root only): the listeners, streams both ways, flow control, EOF,
 * DNS datagrams, NET_CONNECT, the stream limit, and hostile host frames
 * (window overruns, acknowledgements of bytes never sent, malformed and
 * unknown-stream frames); downloads whose payloads the agent splices to
 * the box's socket (frames cut anywhere, a box that reads late, a box gone
 * mid-splice); handing a stream's box socket to the host (NET_GIVE: the
 * bytes waiting for it written first, then named, untouched until
 * NET_TAKEN, which makes the agent forget the stream or relay it again).
 * Every wait is a poll with a deadline. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "tap.h"

#define TIMEOUT_MS 5000

static int chan = -1;
static uint8_t rbuf[TP_FRAME_HDR + TP_FRAME_MAX];
static size_t rlen;
static tp_field_t fields[TP_FIELDS_MAX];

typedef struct frame_s {
  uint8_t type;
  uint32_t id;
  int n;
  int64_t sid, kind, size, err;
  uint8_t data[TP_NET_DNS_MAX > TP_NET_CHUNK ? TP_NET_DNS_MAX : TP_NET_CHUNK];
  size_t dlen;
} frame_t;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t fint(int n, uint16_t tag, int64_t def) {
  int64_t v;
  return tp_field_int(tp_fields_get(fields, n, tag), &v) == 0 ? v : def;
}

/* The next frame from the agent within ms, 1; or 0 on timeout/EOF. */
static int next_frame(frame_t *fr, int ms) {
  long long deadline = now_ms() + ms;
  for (;;) {
    tp_frame_t f;
    long fl = tp_frame_parse_header(rbuf, rlen, &f);
    if (fl > 0) {
      const tp_field_t *d;
      int n = tp_fields_parse(f.payload, f.len, fields, TP_FIELDS_MAX);
      memset(fr, 0, offsetof(frame_t, data));
      fr->type = f.type;
      fr->id = f.id;
      fr->n = n;
      fr->sid = fint(n, TP_TAG_SID, -1);
      fr->kind = fint(n, TP_TAG_KIND, -1);
      fr->size = fint(n, TP_TAG_SIZE, -1);
      fr->err = fint(n, TP_TAG_ERRNO, 0);
      d = n > 0 ? tp_fields_get(fields, n, TP_TAG_DATA) : NULL;
      fr->dlen = d && d->len <= sizeof(fr->data) ? d->len : 0;
      if (fr->dlen)
        memcpy(fr->data, d->val, fr->dlen);
      memmove(rbuf, rbuf + fl, rlen - (size_t) fl);
      rlen -= (size_t) fl;
      return 1;
    }
    if (fl < 0)
      return 0;
    long long left = deadline - now_ms();
    if (left <= 0)
      return 0;
    struct pollfd p = {.fd = chan, .events = POLLIN};
    if (poll(&p, 1, (int) left) <= 0)
      return 0;
    ssize_t r = read(chan, rbuf + rlen, sizeof(rbuf) - rlen);
    if (r <= 0)
      return 0;
    rlen += (size_t) r;
  }
}

/* The next frame of type t (others skipped: ACKs, ...), or 0. */
static int wait_type(frame_t *fr, uint8_t t, int ms) {
  long long deadline = now_ms() + ms;
  while (now_ms() < deadline)
    if (next_frame(fr, (int) (deadline - now_ms())) && fr->type == t)
      return 1;
  return 0;
}

static void send_buf(tp_buf_t *b) {
  size_t off = 0;
  tp_frame_end(b);
  while (off < b->len) {
    ssize_t w = write(chan, b->data + off, b->len - off);
    if (w <= 0)
      break;
    off += (size_t) w;
  }
  tp_buf_free(b);
}

static void send_net(uint8_t type, uint32_t id, int64_t sid, uint16_t tag, int64_t v, const void *data,
                     size_t dlen) {
  tp_buf_t b;
  tp_buf_init(&b);
  tp_frame_begin(&b, type, id);
  if (sid >= 0)
    tp_frame_add_int(&b, TP_TAG_SID, sid);
  if (tag)
    tp_frame_add_int(&b, tag, v);
  if (data)
    tp_frame_add(&b, TP_TAG_DATA, data, (uint32_t) dlen);
  send_buf(&b);
}

static int frame_of(frame_t *fr, int64_t sid, int ms);

static int listen_req(uint32_t id) {
  frame_t fr;
  send_net(TP_MSG_NET_LISTEN, id, -1, 0, 0, NULL, 0);
  while (next_frame(&fr, TIMEOUT_MS))
    if (fr.id == id)
      return fr.type == TP_MSG_OK;
  return 0;
}

static int tcp_connect(int port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Reads what fd has within ms into buf; returns bytes, 0 on EOF, -1 none. */
static ssize_t read_within(int fd, void *buf, size_t n, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, ms) <= 0)
    return -1;
  return read(fd, buf, n);
}

static int lo_up(void) {
  struct ifreq ifr;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), r = -1;
  memset(&ifr, 0, sizeof(ifr));
  strcpy(ifr.ifr_name, "lo");
  if (fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    r = ioctl(fd, SIOCSIFFLAGS, &ifr);
  }
  if (fd >= 0)
    close(fd);
  return r;
}

static void test_stream(void) {
  frame_t fr;
  char buf[64];
  int c = tcp_connect(TP_NET_HTTP_PORT);
  check(c >= 0, "a box process connects to the proxy port");
  check(wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS) && fr.kind == TP_NET_HTTP && fr.id == 0 &&
            fr.sid > 0 && fr.sid < 0x80000000LL,
        "NET_OPEN with KIND HTTP and an agent-made SID");
  int64_t sid = fr.sid;
  check(write(c, "hello", 5) == 5, "the box writes");
  check(wait_type(&fr, TP_MSG_NET_DATA, TIMEOUT_MS) && fr.sid == sid && fr.dlen == 5 &&
            memcmp(fr.data, "hello", 5) == 0,
        "its bytes come up as NET_DATA");
  send_net(TP_MSG_NET_DATA, 0, sid, 0, 0, "world", 5);
  check(read_within(c, buf, sizeof(buf), TIMEOUT_MS) == 5 && memcmp(buf, "world", 5) == 0,
        "NET_DATA from the host reaches the box");
  check(wait_type(&fr, TP_MSG_NET_ACK, TIMEOUT_MS) && fr.sid == sid && fr.size == 5,
        "and is acknowledged once written");
  send_net(TP_MSG_NET_ACK, 0, sid, TP_TAG_SIZE, 5, NULL, 0);
  /* the box ends its side; the host ends its side; the stream closes */
  shutdown(c, SHUT_WR);
  check(wait_type(&fr, TP_MSG_NET_EOF, TIMEOUT_MS) && fr.sid == sid, "EOF from the box: NET_EOF");
  send_net(TP_MSG_NET_EOF, 0, sid, 0, 0, NULL, 0);
  check(read_within(c, buf, sizeof(buf), TIMEOUT_MS) == 0, "NET_EOF from the host: the box reads EOF");
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == sid && fr.err == 0,
        "both sides done: NET_CLOSE without an error");
  close(c);
}

static void test_flow_control(void) {
  frame_t fr;
  static uint8_t big[1024 * 1024]; /* more than TP_NET_WINDOW_DOWN */
  size_t got = 0;
  int c = tcp_connect(TP_NET_SOCKS_PORT);
  check(wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS) && fr.kind == TP_NET_SOCKS, "SOCKS port: KIND SOCKS");
  int64_t sid = fr.sid;
  fcntl(c, F_SETFL, O_NONBLOCK);
  memset(big, 'x', sizeof(big));
  ssize_t w = write(c, big, sizeof(big)); /* as much as the socket takes */
  (void) w;
  /* a whole window, then silence: bounded waits, not timing */
  while (got < TP_NET_WINDOW && next_frame(&fr, TIMEOUT_MS))
    if (fr.type == TP_MSG_NET_DATA && fr.sid == sid)
      got += fr.dlen;
  while (next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_DATA && fr.sid == sid)
      got += fr.dlen;
  check(got == TP_NET_WINDOW, "without acknowledgements the agent sends exactly one window (%zu)", got);
  send_net(TP_MSG_NET_ACK, 0, sid, TP_TAG_SIZE, TP_NET_WINDOW, NULL, 0);
  got = 0;
  while (got == 0 && next_frame(&fr, TIMEOUT_MS))
    if (fr.type == TP_MSG_NET_DATA && fr.sid == sid)
      got += fr.dlen;
  while (next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_DATA && fr.sid == sid)
      got += fr.dlen;
  check(got > 0 && got <= TP_NET_WINDOW, "an acknowledgement lets the next window come (%zu)", got);
  /* hostile: an acknowledgement of bytes never sent */
  send_net(TP_MSG_NET_ACK, 0, sid, TP_TAG_SIZE, 10 * (int64_t) TP_NET_WINDOW, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == sid && fr.err == EPROTO,
        "an ACK beyond what was sent closes the stream (EPROTO)");
  close(c);

  /* hostile: more than the host's window at once */
  c = tcp_connect(TP_NET_HTTP_PORT);
  check(wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS), "another stream");
  sid = fr.sid;
  send_net(TP_MSG_NET_DATA, 0, sid, 0, 0, big, TP_NET_WINDOW_DOWN + 1);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == sid && fr.err == EPROTO,
        "NET_DATA beyond the window closes the stream (EPROTO)");
  char b;
  check(read_within(c, &b, 1, TIMEOUT_MS) <= 0, "and the box's connection with it");
  close(c);
}

/* Sends a NET_DATA frame's bytes [from, to) only: a frame cut anywhere. */
static void send_part(const tp_buf_t *b, size_t from, size_t to) {
  while (from < to) {
    ssize_t w = write(chan, b->data + from, to - from);
    if (w <= 0)
      break;
    from += (size_t) w;
  }
}

static void data_frame(tp_buf_t *b, int64_t sid, const uint8_t *p, size_t n) {
  tp_buf_init(b);
  tp_frame_begin(b, TP_MSG_NET_DATA, 0);
  tp_frame_add_int(b, TP_TAG_SID, sid);
  tp_frame_add(b, TP_TAG_DATA, p, (uint32_t) n);
  tp_frame_end(b);
}

/* Reads c until n bytes came or ms passed, acknowledging what the agent
 * acknowledges on the way; the bytes go to out. */
static size_t drain_box(int c, uint8_t *out, size_t n, int ms, int64_t *acked) {
  long long deadline = now_ms() + ms;
  size_t got = 0;
  frame_t fr;
  while (got < n && now_ms() < deadline) {
    ssize_t r = read_within(c, out + got, n - got, 50);
    if (r > 0)
      got += (size_t) r;
    if (r == 0)
      break;
    while (next_frame(&fr, 0))
      if (fr.type == TP_MSG_NET_ACK && acked != NULL)
        *acked += fr.size;
  }
  return got;
}

static char wmem[64]; /* the namespace's tcp_wmem as it was */

static int sysctl_set(const char *path, const char *v) {
  int fd = open(path, O_WRONLY | O_CLOEXEC), r = -1;
  if (fd >= 0) {
    r = write(fd, v, strlen(v)) == (ssize_t) strlen(v) ? 0 : -1;
    close(fd);
  }
  return r;
}

/* Downloads in large NET_DATA frames, whose payloads the agent splices from
 * the channel to the box's socket: byte-exact whatever the channel's reads
 * cut (a frame sent in pieces), with what the box's socket did not take
 * queued (a box that reads late), and a box that closes mid-download loses
 * its stream only: the channel's frames stay whole. */
static void test_splice(void) {
  enum { CH = 48 * 1024, TOTAL = 24 * CH }; /* more than the window: acknowledged as it goes */
  static uint8_t src[TOTAL], dst[TOTAL];
  int wfd = open("/proc/sys/net/ipv4/tcp_wmem", O_RDONLY | O_CLOEXEC);
  ssize_t wn = wfd >= 0 ? read(wfd, wmem, sizeof(wmem) - 1) : -1;
  if (wfd >= 0)
    close(wfd);
  wmem[wn > 0 ? wn : 0] = 0;
  frame_t fr;
  tp_buf_t b;
  int64_t acked = 0, sent = 0;
  size_t got = 0;
  int c = tcp_connect(TP_NET_HTTP_PORT);
  for (size_t i = 0; i < TOTAL; i++)
    src[i] = (uint8_t) (i * 13 + (i >> 11));
  check(wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS), "a download stream");
  int64_t sid = fr.sid;
  fcntl(c, F_SETFL, O_NONBLOCK);
  /* frames whole and in pieces: head alone, head and part of the payload,
   * the payload's rest; the box reads as they come */
  for (size_t off = 0; off < TOTAL; off += CH) {
    long long until = now_ms() + TIMEOUT_MS;
    while (sent - acked + CH > (int64_t) TP_NET_WINDOW_DOWN && now_ms() < until) {
      got += drain_box(c, dst + got, TOTAL - got, 50, &acked);
      while (next_frame(&fr, 10))
        if (fr.type == TP_MSG_NET_ACK)
          acked += fr.size;
    }
    data_frame(&b, sid, src + off, CH);
    switch ((off / CH) % 3) {
    case 0:
      send_part(&b, 0, b.len);
      break;
    case 1:
      send_part(&b, 0, TP_FRAME_HDR + 20);
      usleep(20000);
      send_part(&b, TP_FRAME_HDR + 20, b.len);
      break;
    default:
      send_part(&b, 0, TP_FRAME_HDR + 20 + CH / 3);
      usleep(20000);
      send_part(&b, TP_FRAME_HDR + 20 + CH / 3, b.len);
    }
    tp_buf_free(&b);
    sent += CH;
    got += drain_box(c, dst + got, TOTAL - got, 0, &acked);
  }
  got += drain_box(c, dst + got, TOTAL - got, TIMEOUT_MS, &acked);
  check(got == TOTAL && memcmp(src, dst, TOTAL) == 0, "%d KiB in frames cut anywhere reach the box byte-exact (%zu)",
        TOTAL / 1024, got);
  while (acked < TOTAL && next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_ACK)
      acked += fr.size;
  check(acked == TOTAL, "and are acknowledged, all of them (%lld)", (long long) acked);
  close(c);
  send_net(TP_MSG_NET_CLOSE, 0, sid, 0, 0, NULL, 0); /* the host ends it: the slot is free */

  /* a box that does not read, with small socket buffers (the test's own
   * network namespace's TCP send buffers, and its receive buffer): of a
   * window's frames its socket takes part, the rest waits in the agent, and
   * all of it comes once the box reads */
  {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(TP_NET_HTTP_PORT),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int small = 4096;
    check(sysctl_set("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 65536") == 0,
          "TCP send buffers of at most 64 KiB in the test's namespace");
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(c, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    check(connect(c, (struct sockaddr *) &sa, sizeof(sa)) == 0 && wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS),
          "a stream whose box reads late");
  }
  sid = fr.sid;
  fcntl(c, F_SETFL, O_NONBLOCK);
  acked = 0;
  data_frame(&b, sid, src, CH); /* one frame read whole: the next ones are spliced */
  send_part(&b, 0, b.len);
  tp_buf_free(&b);
  usleep(20000);
  for (size_t off = CH; off + CH <= TP_NET_WINDOW_DOWN; off += CH) {
    data_frame(&b, sid, src + off, CH);
    send_part(&b, 0, b.len);
    tp_buf_free(&b);
  }
  while (next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_ACK)
      acked += fr.size;
  check(acked < (int64_t) (TP_NET_WINDOW_DOWN / CH * CH),
        "its socket did not take the window (%lld acknowledged)", (long long) acked);
  got = drain_box(c, dst, TOTAL, TIMEOUT_MS, &acked);
  check(got == TP_NET_WINDOW_DOWN / CH * CH && memcmp(src, dst, got) == 0,
        "a box that reads late gets the window's frames byte-exact (%zu)", got);
  while (acked < (int64_t) got && next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_ACK)
      acked += fr.size;
  check(acked == (int64_t) got, "and they are acknowledged once its socket took them");
  sysctl_set("/proc/sys/net/ipv4/tcp_wmem", wmem);

  /* the box closes (a reset) while the agent does not watch its socket (a
   * window of its bytes unacknowledged), and a frame comes for it in two
   * pieces: the splice to its socket fails, the stream ends, the rest of
   * the frame and the next ones are dropped, the channel's frames stay whole */
  {
    static uint8_t up[TP_NET_WINDOW];
    size_t upgot = 0;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    memset(up, 'u', sizeof(up));
    for (long long until = now_ms() + TIMEOUT_MS; upgot < TP_NET_WINDOW && now_ms() < until;) {
      ssize_t w = write(c, up, sizeof(up) - upgot);
      (void) w;
      if (next_frame(&fr, 10) && fr.type == TP_MSG_NET_DATA && fr.sid == sid)
        upgot += fr.dlen;
    }
    check(upgot == TP_NET_WINDOW, "the box sent a window up (%zu): its socket is not watched", upgot);
    setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(c);
    usleep(50000);
  }
  data_frame(&b, sid, src, CH);
  send_part(&b, 0, TP_FRAME_HDR + 20 + 100);
  usleep(50000);
  send_part(&b, TP_FRAME_HDR + 20 + 100, b.len);
  tp_buf_free(&b);
  data_frame(&b, sid, src, CH);
  send_part(&b, 0, b.len);
  tp_buf_free(&b);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == sid && fr.err != 0,
        "the box gone mid-splice: NET_CLOSE for its stream with an error (%lld)", (long long) fr.err);
  check(listen_req(78), "the frames after it are whole: the agent answers the next request");
}

static void test_dns(void) {
  frame_t fr;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(TP_NET_DNS_PORT),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  const char q[] = "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x01\x00\x01";
  char buf[64];
  int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  connect(u, (struct sockaddr *) &sa, sizeof(sa));
  check(send(u, "short", 5, 0) == 5, "a datagram too short for DNS");
  check(send(u, q, sizeof(q) - 1, 0) == (ssize_t) sizeof(q) - 1, "a DNS query to 127.0.0.1:53");
  check(wait_type(&fr, TP_MSG_NET_DNS, TIMEOUT_MS) && fr.dlen == sizeof(q) - 1 &&
            memcmp(fr.data, q, fr.dlen) == 0,
        "only the query comes up, whole, as NET_DNS");
  send_net(TP_MSG_NET_DNS, 0, fr.sid + 1000, 0, 0, "bogus-answer", 12);
  send_net(TP_MSG_NET_DNS, 0, fr.sid, 0, 0, "the-answer", 10);
  check(read_within(u, buf, sizeof(buf), TIMEOUT_MS) == 10 && memcmp(buf, "the-answer", 10) == 0,
        "the answer goes back to the sender; one for an unknown query goes nowhere");
  send_net(TP_MSG_NET_DNS, 0, fr.sid, 0, 0, "again", 5);
  check(read_within(u, buf, sizeof(buf), 300) < 0, "a query is answered once");
  close(u);
}

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A flood of UDP queries: the agent sends up its burst and its rate, drops
 * the rest, and passes queries again once the bucket has refilled. */
static void test_dns_rate(void) {
  frame_t fr;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(TP_NET_DNS_PORT),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  const char q[] = "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01x\x00\x00\x01\x00\x01";
  int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), up = 0, sent = 0;
  long long t0, secs_ms;
  connect(u, (struct sockaddr *) &sa, sizeof(sa));
  usleep(2100 * 1000); /* test_dns's query spent a token: a full bucket (800) */
  t0 = mono_ms();
  /* 3000 in rounds of 50, each drained, so that the kernel's socket buffer
   * drops none: without the bucket every one would come up */
  for (int r = 0; r < 60; r++) {
    for (int i = 0; i < 50; i++)
      sent += send(u, q, sizeof(q) - 1, 0) == (ssize_t) sizeof(q) - 1;
    while (next_frame(&fr, 10))
      up += fr.type == TP_MSG_NET_DNS;
  }
  while (next_frame(&fr, 50))
    up += fr.type == TP_MSG_NET_DNS;
  secs_ms = mono_ms() - t0;
  check(sent == 3000 && up >= 800 && up <= 800 + 400 * secs_ms / 1000 + 16,
        "3000 queries in %lld ms: %d sent up (the burst of 800 and 400/s)", secs_ms, up);
  usleep(100 * 1000);
  check(send(u, q, sizeof(q) - 1, 0) == (ssize_t) sizeof(q) - 1 && wait_type(&fr, TP_MSG_NET_DNS, TIMEOUT_MS),
        "a query after a pause comes up again");
  close(u);
}

static void test_connect(void) {
  frame_t fr;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  char buf[16];
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bind(l, (struct sockaddr *) &sa, sizeof(sa));
  listen(l, 4);
  getsockname(l, (struct sockaddr *) &sa, &len);
  int port = ntohs(sa.sin_port);
  send_net(TP_MSG_NET_CONNECT, 0, 0x80000001LL, TP_TAG_PORT, port, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS) && fr.sid == 0x80000001LL && fr.kind == TP_NET_CONNECTED,
        "NET_CONNECT to a listening port: NET_OPEN CONNECTED");
  int a = accept(l, NULL, NULL);
  send_net(TP_MSG_NET_DATA, 0, 0x80000001LL, 0, 0, "in", 2);
  check(read_within(a, buf, sizeof(buf), TIMEOUT_MS) == 2, "the host's bytes reach the box's server");
  close(a);
  close(l);
  check(wait_type(&fr, TP_MSG_NET_EOF, TIMEOUT_MS) && fr.sid == 0x80000001LL,
        "the box's server closing: NET_EOF");
  send_net(TP_MSG_NET_CLOSE, 0, 0x80000001LL, 0, 0, NULL, 0); /* the host ends it: the slot is free */
  send_net(TP_MSG_NET_CONNECT, 0, 0x80000002LL, TP_TAG_PORT, port, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == 0x80000002LL && fr.err == ECONNREFUSED,
        "NET_CONNECT to a closed port: NET_CLOSE ECONNREFUSED");
  send_net(TP_MSG_NET_CONNECT, 0, 7, TP_TAG_PORT, port, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == 7 && fr.err == EINVAL,
        "NET_CONNECT with an agent-range SID: EINVAL");
  send_net(TP_MSG_NET_CONNECT, 0, 0x80000003LL, TP_TAG_PORT, 70000, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.err == EINVAL, "NET_CONNECT to port 70000: EINVAL");
}

static void test_limits_and_hostile(void) {
  frame_t fr;
  int fds[TP_NET_STREAMS_MAX + 1], opened = 0;
  char b;
  /* malformed and stray frames are ignored; the agent still answers */
  send_net(TP_MSG_NET_DATA, 0, -1, 0, 0, "x", 1);                 /* no SID */
  send_net(TP_MSG_NET_DATA, 0, 0x7ffffff0LL, 0, 0, "x", 1);      /* unknown stream */
  send_net(TP_MSG_NET_ACK, 0, 0, TP_TAG_SIZE, 1, NULL, 0);        /* SID 0 */
  send_net(TP_MSG_NET_OPEN, 0, 0x7ffffff1LL, TP_TAG_KIND, 1, NULL, 0);
  check(listen_req(77), "after malformed network frames the agent still answers (NET_LISTEN again: OK)");
  /* the stream limit */
  for (int i = 0; i < TP_NET_STREAMS_MAX + 1; i++)
    fds[i] = tcp_connect(TP_NET_HTTP_PORT);
  while (opened < TP_NET_STREAMS_MAX && next_frame(&fr, TIMEOUT_MS))
    if (fr.type == TP_MSG_NET_OPEN)
      opened++;
  while (next_frame(&fr, 300))
    if (fr.type == TP_MSG_NET_OPEN)
      opened++;
  check(opened == TP_NET_STREAMS_MAX, "at most %d streams: %d opened", TP_NET_STREAMS_MAX, opened);
  int closed = 0;
  for (int i = 0; i < TP_NET_STREAMS_MAX + 1; i++)
    if (read_within(fds[i], &b, 1, i == TP_NET_STREAMS_MAX ? TIMEOUT_MS : 0) == 0)
      closed++;
  check(closed == 1, "the connection past the limit is closed at once (%d)", closed);
  for (int i = 0; i < TP_NET_STREAMS_MAX + 1; i++)
    close(fds[i]);
  int eofs = 0;
  while (eofs < TP_NET_STREAMS_MAX && next_frame(&fr, TIMEOUT_MS))
    if (fr.type == TP_MSG_NET_EOF)
      eofs++;
  check(eofs == TP_NET_STREAMS_MAX, "their ends come up as NET_EOF (%d)", eofs);
}

static pid_t agent_pid;

/* The next frame of stream sid within ms, 1; or 0. */
static int frame_of(frame_t *fr, int64_t sid, int ms) {
  long long deadline = now_ms() + ms;
  while (now_ms() < deadline)
    if (next_frame(fr, (int) (deadline - now_ms())) && fr->sid == sid)
      return 1;
  return 0;
}

static void test_give(void) {
  frame_t fr;
  char buf[64];
  struct sockaddr_in a1, a2;
  socklen_t l1 = sizeof(a1), l2 = sizeof(a2);
  int pidfd = (int) syscall(SYS_pidfd_open, agent_pid, 0), fd;
  int c = tcp_connect(TP_NET_HTTP_PORT);
  int64_t sid, num = -1;
  check(c >= 0 && wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS), "a stream to give");
  sid = fr.sid;
  send_net(TP_MSG_NET_DATA, 0, sid, 0, 0, "abc", 3);
  send_net(TP_MSG_NET_GIVE, 0, sid, 0, 0, NULL, 0);
  check(read_within(c, buf, sizeof(buf), TIMEOUT_MS) == 3, "what came before NET_GIVE reaches the box");
  check(wait_type(&fr, TP_MSG_NET_ACK, TIMEOUT_MS) && fr.sid == sid && fr.size == 3,
        "and is acknowledged before the answer");
  check(next_frame(&fr, TIMEOUT_MS) && fr.type == TP_MSG_NET_GIVE && fr.sid == sid &&
            (num = fint(fr.n, TP_TAG_FD, -1)) >= 0,
        "NET_GIVE is answered with the socket's descriptor");
  check(write(c, "late", 4) == 4 && !frame_of(&fr, sid, 200), "the box's bytes are not read meanwhile");
  fd = pidfd >= 0 ? (int) syscall(SYS_pidfd_getfd, pidfd, (int) num, 0) : -1;
  check(fd >= 0 && getpeername(fd, (struct sockaddr *) &a1, &l1) == 0 &&
            getsockname(c, (struct sockaddr *) &a2, &l2) == 0 && a1.sin_port == a2.sin_port,
        "the descriptor is the box's socket (%s)", strerror(errno));
  send_net(TP_MSG_NET_TAKEN, 0, sid, TP_TAG_SIZE, 0, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_DATA, TIMEOUT_MS) && fr.sid == sid && fr.dlen == 4 &&
            memcmp(fr.data, "late", 4) == 0,
        "NET_TAKEN 0: the agent relays the stream again");
  send_net(TP_MSG_NET_ACK, 0, sid, TP_TAG_SIZE, 4, NULL, 0);
  send_net(TP_MSG_NET_GIVE, 0, sid, 0, 0, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_GIVE, TIMEOUT_MS) && fint(fr.n, TP_TAG_FD, -1) == num, "given again");
  send_net(TP_MSG_NET_TAKEN, 0, sid, TP_TAG_SIZE, 1, NULL, 0);
  check(fd >= 0 && write(fd, "host", 4) == 4 && read_within(c, buf, sizeof(buf), TIMEOUT_MS) == 4 &&
            memcmp(buf, "host", 4) == 0,
        "NET_TAKEN 1: the host writes to the box's socket itself");
  shutdown(c, SHUT_WR);
  check(!frame_of(&fr, sid, 300), "and the agent forgot the stream: no frame of it, no NET_CLOSE");
  send_net(TP_MSG_NET_TAKEN, 0, sid, TP_TAG_SIZE, 1, NULL, 0);
  check(!frame_of(&fr, sid, 100), "a late frame of it is dropped");
  if (fd >= 0)
    close(fd);
  close(c);
  /* a NET_TAKEN of a stream not given ends it */
  c = tcp_connect(TP_NET_SOCKS_PORT);
  check(c >= 0 && wait_type(&fr, TP_MSG_NET_OPEN, TIMEOUT_MS), "another stream");
  sid = fr.sid;
  send_net(TP_MSG_NET_TAKEN, 0, sid, TP_TAG_SIZE, 1, NULL, 0);
  check(wait_type(&fr, TP_MSG_NET_CLOSE, TIMEOUT_MS) && fr.sid == sid && fr.err == EPROTO,
        "NET_TAKEN of a stream not given: NET_CLOSE EPROTO");
  close(c);
  if (pidfd >= 0)
    close(pidfd);
}

int main(void) {
  const char *agent = getenv("TUPPER_AGENT");
  int sv[2], status;
  frame_t fr;
  pid_t pid;

  if (geteuid() != 0 || agent == NULL) {
    printf("1..0 # SKIP needs root and TUPPER_AGENT\n");
    return 77;
  }
  if (unshare(CLONE_NEWNET) < 0 || lo_up() < 0) {
    printf("1..0 # SKIP no network namespace: %s\n", strerror(errno));
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return 1;
  pid = fork();
  if (pid == 0) {
    dup2(sv[1], 3);
    execl(agent, "tupper-agent", "--fd", "3", (char *) NULL);
    _exit(127);
  }
  close(sv[1]);
  chan = sv[0];
  agent_pid = pid;
  check(next_frame(&fr, TIMEOUT_MS) && fr.type == TP_MSG_READY &&
            (fint(fr.n, TP_TAG_FLAGS, 0) & TP_F_READY_NET_FD) != 0,
        "the agent says READY, and that it answers NET_GIVE");
  check((fint(fr.n, TP_TAG_FLAGS, 0) & TP_F_READY_NET_LISTEN) != 0,
        "READY says the agent listens on its network ports already");
  {
    int early = tcp_connect(TP_NET_HTTP_PORT);
    check(early >= 0, "its proxy port takes a connection before any NET_LISTEN");
    if (early >= 0) {
      frame_t of, x;
      check(wait_type(&of, TP_MSG_NET_OPEN, TIMEOUT_MS), "and the agent opens a stream for it");
      close(early);
      send_net(TP_MSG_NET_CLOSE, 0, of.sid, 0, 0, NULL, 0);
      while (frame_of(&x, of.sid, 300)) /* its end's frames */
        ;
    }
  }
  check(listen_req(1), "NET_LISTEN (an older daemon's) is still answered OK");
  check(listen_req(2), "NET_LISTEN again (a re-attached daemon) is fine");
  test_stream();
  test_flow_control();
  test_splice();
  test_dns();
  test_dns_rate();
  test_connect();
  test_give();
  test_limits_and_hostile();
  close(chan);
  check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the channel's EOF ends the agent cleanly");
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}
