/* The network relay's C data path (runtime/host/netrelay.c) on a real loop:
 * a box object whose agent channel is a socketpair this test speaks on (the
 * agent's side of the NET_* frames), and a real loopback TCP connection as
 * the upstream.  Checked: a hand-over writes the daemon's head and the box's
 * bytes upstream and acknowledges only the box's; upstream bytes reach the
 * agent in frames of at most TP_NET_CHUNK, never more than the relay's window
 * unacknowledged, byte-exact; frames of streams it does not own go to the
 * owner; a broken acknowledgement ends the stream (NET_CLOSE, EPROTO,
 * upstream closed); the agent's NET_CLOSE ends it with the end callback;
 * a channel that takes 4 KiB at a time (the splice meets partial writes)
 * and an upstream that resets mid-download keep the frames whole; the box
 * going down, also while the relay splices, ends every stream quietly; the
 * box's read buffer and fields are gone once a small read leaves nothing
 * behind, after a frame that grew them too (dbox.c, what an idle box
 * holds).  No PID 1: a fake backend whose destroy only closes. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "dbox.h"
#include "job.h"
#include "dbox_int.h"
#include "frame.h"
#include "netrelay.h"

#include "tap.h"

static int fake_destroy(tp_box_t *box, const char *dir, tp_error_t *err) {
  (void) dir, (void) err;
  if (box->pidfd >= 0)
    close(box->pidfd);
  box->pidfd = -1;
  return 0;
}
static const tp_backend_t fake_be = {.name = "fake", .destroy = fake_destroy};

/* What the agent's side saw. */
static struct {
  int fd;
  uint8_t buf[TP_FRAME_HDR + TP_FRAME_MAX];
  size_t len;
  uint8_t *data; /* NET_DATA bytes of sid 1 */
  size_t ndata, unacked, max_unacked, max_frame;
  int64_t acked; /* NET_ACK sizes */
  int eofs, closes;
  int gives, takens;    /* NET_GIVE and NET_TAKEN frames */
  int64_t taken_v;      /* the last NET_TAKEN's SIZE */
} ag;
static int owner_frames, ends, end_err, downs;
static uint64_t end_up, end_down;

static void agent_read(void) {
  ssize_t n;
  if (ag.fd < 0)
    return;
  while ((n = read(ag.fd, ag.buf + ag.len, sizeof(ag.buf) - ag.len)) > 0) {
    size_t off = 0;
    ag.len += (size_t) n;
    for (;;) {
      tp_frame_t f;
      tp_field_t fs[8];
      const tp_field_t *d;
      int64_t v = 0;
      long fl = tp_frame_parse_header(ag.buf + off, ag.len - off, &f);
      if (fl <= 0)
        break;
      int m = tp_fields_parse(f.payload, f.len, fs, 8);
      off += (size_t) fl;
      if (m < 0)
        continue;
      if (f.type == TP_MSG_NET_DATA && (d = tp_fields_get(fs, m, TP_TAG_DATA)) != NULL) {
        memcpy(ag.data + ag.ndata, d->val, d->len);
        ag.ndata += d->len;
        ag.unacked += d->len;
        if (ag.unacked > ag.max_unacked)
          ag.max_unacked = ag.unacked;
        if (d->len > ag.max_frame)
          ag.max_frame = d->len;
      } else if (f.type == TP_MSG_NET_ACK && tp_field_int(tp_fields_get(fs, m, TP_TAG_SIZE), &v) == 0) {
        ag.acked += v;
      } else if (f.type == TP_MSG_NET_EOF) {
        ag.eofs++;
      } else if (f.type == TP_MSG_NET_CLOSE) {
        ag.closes++;
      } else if (f.type == TP_MSG_NET_GIVE) {
        ag.gives++;
      } else if (f.type == TP_MSG_NET_TAKEN && tp_field_int(tp_fields_get(fs, m, TP_TAG_SIZE), &v) == 0) {
        ag.takens++;
        ag.taken_v = v;
      }
    }
    memmove(ag.buf, ag.buf + off, ag.len - off);
    ag.len -= off;
  }
}

static void agent_send(uint8_t type, uint32_t sid, uint16_t tag, int64_t v, const void *p, size_t n) {
  tp_buf_t b;
  tp_buf_init(&b);
  tp_frame_begin(&b, type, 0);
  tp_frame_add_int(&b, TP_TAG_SID, sid);
  if (tag == TP_TAG_DATA)
    tp_frame_add(&b, TP_TAG_DATA, p, (uint32_t) n);
  else if (tag != 0)
    tp_frame_add_int(&b, tag, v);
  tp_frame_end(&b);
  for (size_t off = 0; off < b.len;) {
    ssize_t w = write(ag.fd, b.data + off, b.len - off);
    if (w > 0)
      off += (size_t) w;
  }
  tp_buf_free(&b);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs the loop and reads the agent's side until done() or ms passed. */
static int spin(uv_loop_t *loop, int ms, int (*done)(void)) {
  long long end = now_ms() + ms;
  while (now_ms() < end) {
    uv_run(loop, UV_RUN_NOWAIT);
    agent_read();
    if (done())
      return 1;
    struct pollfd p = {.fd = ag.fd, .events = POLLIN};
    poll(&p, 1, 1);
  }
  return 0;
}

static int want_owner;
static int owner_got(void) { return owner_frames >= want_owner; }

static int on_frame(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fs, int n,
                    tp_field_t *scratch, int smax) {
  (void) b, (void) type, (void) id, (void) fs, (void) n, (void) scratch, (void) smax;
  owner_frames++;
  return 0;
}
static void on_down(tp_dbox_t *b, const char *reason) {
  (void) b, (void) reason;
  downs++;
}
static void on_end(tp_netrelay_t *nr, uint32_t sid, uint64_t up, uint64_t down, int err, void *data) {
  (void) nr, (void) sid, (void) data;
  ends++;
  end_err = err;
  end_up = up;
  end_down = down;
}

/* A connected loopback TCP pair: *ours (the daemon's) and the upstream's. */
static int tcp_pair(int *ours, int *theirs) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sa);
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0 || bind(l, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(l, 1) < 0 ||
      getsockname(l, (struct sockaddr *) &sa, &len) < 0)
    return -1;
  *ours = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*ours < 0 || connect(*ours, (struct sockaddr *) &sa, sizeof(sa)) < 0)
    return -1;
  *theirs = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  close(l);
  return *theirs < 0 ? -1 : 0;
}

static size_t want_data;
static int got_data(void) { return ag.ndata >= want_data; }
static int got_ack4(void) { return ag.acked >= 4; }
static int got_close(void) { return ag.closes > 0; }
static int got_end(void) { return ends > 0; }
static int up_fd;
static uint8_t upbuf[64];
static size_t uplen;
static int up_got_8(void) {
  ssize_t n = read(up_fd, upbuf + uplen, sizeof(upbuf) - uplen);
  if (n > 0)
    uplen += (size_t) n;
  return uplen >= 8;
}
static int up_eof(void) {
  char c[4096];
  ssize_t n;
  while ((n = read(up_fd, c, sizeof(c))) > 0) {
  }
  return n == 0;
}

static int got_give(void) { return ag.gives > 0; }
static int got_taken(void) { return ag.takens > 0; }

/* The box's socket itself (NET_GIVE): a box object of a backend named
 * linux whose "agent" is this process (its pidfd), in a network namespace
 * of its own where it listens on the proxy port.  Checked: the relay asks
 * for the socket once a download fills its window, not before, and reads
 * nothing upstream until answered; a named
 * descriptor that is not such a socket (the channel) is refused with
 * NET_TAKEN 0 and the stream goes on in frames; a stream whose socket is
 * taken moves 1 MiB each way byte-exact with no frame, passes each end on
 * and ends with its callback. */
static void test_give(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(TP_NET_HTTP_PORT),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct ifreq ifr = {0};
  char dir[] = "/tmp/tupper-netrelay.XXXXXX";
  enum { MIB = 1 << 20 };
  uint8_t *big = malloc(MIB), *got = malloc(MIB);
  int sv[2], l, ifs, mine, box = -1, client, one = 1;
  uv_loop_t loop;
  tp_error_t err = {0};
  tp_dbox_t *b;
  tp_netrelay_t *nr;
  static const tp_backend_t linux_be = {.name = "linux", .destroy = fake_destroy};
  if (unshare(CLONE_NEWNET) < 0 || (ifs = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
    printf("# no network namespace of its own (%s): the hand-over of box sockets is not tested\n",
           strerror(errno));
    free(big), free(got);
    return;
  }
  strcpy(ifr.ifr_name, "lo");
  ifr.ifr_flags = IFF_UP;
  check(ioctl(ifs, SIOCSIFFLAGS, &ifr) == 0, "a network namespace with its loopback up");
  close(ifs);
  l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  check(l >= 0 && bind(l, (struct sockaddr *) &sa, sizeof(sa)) == 0 && listen(l, 4) == 0,
        "listening on the proxy port");
  for (size_t i = 0; i < MIB; i++)
    big[i] = (uint8_t) (i * 13 + (i >> 11));
  if (mkdtemp(dir) == NULL || uv_loop_init(&loop) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return;
  memset(&ag, 0, sizeof(ag));
  downs = 0;
  ag.data = malloc(2 * MIB);
  ag.fd = sv[1];
  fcntl(ag.fd, F_SETFL, O_NONBLOCK);
  b = tp__dbox_new(&linux_be, &loop, dir);
  b->box.chan_fd = sv[0];
  b->box.pid = getpid();
  b->box.pidfd = (int) syscall(SYS_pidfd_open, getpid(), 0);
  check(b->box.pidfd >= 0 && tp_dbox_on(b, on_frame, on_down, &err) == 0, "a linux box on the loop");
  nr = tp_netrelay_new(b, TP_NET_WINDOW_DOWN, on_end, NULL, &err);
  tp_netrelay_give(nr, 1);

  /* a stream that never fills its window is not asked */
  tcp_pair(&mine, &up_fd);
  tp_netrelay_take_t t = {.sid = 1, .fd = mine};
  check(tp_netrelay_take(nr, &t, &err) == 0, "the relay takes stream 1");
  {
    ssize_t w = write(up_fd, big, 1000);
    (void) w;
  }
  want_data = 1000;
  check(spin(&loop, 2000, got_data) && !spin(&loop, 100, got_give), "a small download is not asked for the socket");
  agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, 1000, NULL, 0);
  /* a full window: asked, nothing read upstream until the answer; the
   * agent names its channel: refused, the stream goes on in frames */
  for (size_t at = 0; at < TP_NET_WINDOW_DOWN + 1000;) {
    ssize_t w = write(up_fd, big + at, TP_NET_WINDOW_DOWN + 1000 - at);
    if (w > 0)
      at += (size_t) w;
    spin(&loop, 2, got_give);
  }
  check(spin(&loop, 2000, got_give), "a download that fills its window: the box's socket is asked for");
  agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, TP_NET_WINDOW_DOWN, NULL, 0);
  want_data = 1000 + TP_NET_WINDOW_DOWN + 1;
  check(!spin(&loop, 200, got_data) && ag.ndata == 1000 + TP_NET_WINDOW_DOWN,
        "nothing more is read upstream until the answer");
  agent_send(TP_MSG_NET_GIVE, 1, TP_TAG_FD, ag.fd, NULL, 0);
  check(spin(&loop, 2000, got_taken) && ag.taken_v == 0, "a descriptor that is no box socket: NET_TAKEN 0");
  want_data = 2000 + TP_NET_WINDOW_DOWN;
  check(spin(&loop, 2000, got_data) && memcmp(ag.data + 1000, big, TP_NET_WINDOW_DOWN + 1000) == 0 &&
            downs == 0,
        "the stream goes on in frames");
  ends = 0;
  tp_netrelay_drop(nr, 1, 1);
  close(up_fd);

  /* the agent names the box's socket: taken, the bytes move without frames */
  client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  check(connect(client, (struct sockaddr *) &sa, sizeof(sa)) == 0 &&
            (box = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0,
        "a box client on the proxy port");
  tcp_pair(&mine, &up_fd);
  /* owed to the box at the hand-over: more than the window, so part waits */
  t = (tp_netrelay_take_t){.sid = 2, .fd = mine, .up = (const uint8_t *) "HEAD", .up_len = 4, .up_head = 4,
                           .down = big, .down_len = TP_NET_WINDOW_DOWN + 1000};
  ag.gives = ag.takens = 0;
  ag.ndata = ag.unacked = 0;
  check(tp_netrelay_take(nr, &t, &err) == 0 && spin(&loop, 2000, got_give), "stream 2: asked again");
  want_data = TP_NET_WINDOW_DOWN;
  spin(&loop, 2000, got_data);
  check(ag.ndata == TP_NET_WINDOW_DOWN, "a window of what is owed in frames (%zu)", ag.ndata);
  agent_send(TP_MSG_NET_ACK, 2, TP_TAG_SIZE, TP_NET_WINDOW_DOWN, NULL, 0);
  want_data = TP_NET_WINDOW_DOWN + 1;
  check(!spin(&loop, 200, got_data), "the rest not in frames while the answer is awaited");
  agent_send(TP_MSG_NET_GIVE, 2, TP_TAG_FD, box, NULL, 0);
  check(spin(&loop, 2000, got_taken) && ag.taken_v == 1, "the box's socket: NET_TAKEN 1");
  close(box); /* as the agent does on NET_TAKEN */
  fcntl(up_fd, F_SETFL, O_NONBLOCK);
  fcntl(client, F_SETFL, O_NONBLOCK);
  {
    size_t sent = 0, recvd = 0, usent = 0, urecvd = 0, tail = 0;
    uint8_t *ubuf = malloc(MIB + 4), owed[1000];
    for (long long until = now_ms() + 5000; tail < 1000 && now_ms() < until;) {
      ssize_t k = read(client, owed + tail, 1000 - tail);
      if (k > 0)
        tail += (size_t) k;
      uv_run(&loop, UV_RUN_NOWAIT);
    }
    check(tail == 1000 && memcmp(owed, big + TP_NET_WINDOW_DOWN, 1000) == 0,
          "the rest of what was owed reaches the box's socket first");
    for (long long until = now_ms() + 10000; (recvd < MIB || urecvd < MIB + 4) && now_ms() < until;) {
      ssize_t k;
      if (sent < MIB && (k = write(up_fd, big + sent, MIB - sent)) > 0)
        sent += (size_t) k;
      if (usent < MIB && (k = write(client, big + usent, MIB - usent)) > 0)
        usent += (size_t) k;
      if (recvd < MIB && (k = read(client, got + recvd, MIB - recvd)) > 0)
        recvd += (size_t) k;
      if (urecvd < MIB + 4 && (k = read(up_fd, ubuf + urecvd, MIB + 4 - urecvd)) > 0)
        urecvd += (size_t) k;
      uv_run(&loop, UV_RUN_NOWAIT);
      agent_read();
    }
    check(recvd == MIB && memcmp(got, big, MIB) == 0, "1 MiB from the upstream reaches the box's socket");
    check(urecvd == MIB + 4 && memcmp(ubuf, "HEAD", 4) == 0 && memcmp(ubuf + 4, big, MIB) == 0,
          "the head, then 1 MiB from the box's socket reach the upstream");
    check(ag.ndata == TP_NET_WINDOW_DOWN && ag.acked == 0, "and no frame carried them");
    free(ubuf);
  }
  ends = 0;
  shutdown(client, SHUT_WR);
  shutdown(up_fd, SHUT_WR);
  check(spin(&loop, 2000, got_end) && end_err == 0 && end_up == MIB &&
            end_down == TP_NET_WINDOW_DOWN + 1000 + MIB &&
            tp_netrelay_count(nr) == 0,
        "both ends passed on: the stream ends with its byte counts");
  {
    char c;
    check(read(client, &c, 1) == 0 && read(up_fd, &c, 1) == 0, "each side saw the other's end");
  }
  close(client);
  close(up_fd);

  /* an answer nobody asked for ends the stream */
  tcp_pair(&mine, &up_fd);
  t = (tp_netrelay_take_t){.sid = 3, .fd = mine, .box_eof = 1, .down = big, .down_len = TP_NET_WINDOW_DOWN};
  ends = 0;
  ag.gives = 0;
  check(tp_netrelay_take(nr, &t, &err) == 0 && !spin(&loop, 100, got_give),
        "a stream whose box side ended is not asked for");
  agent_send(TP_MSG_NET_GIVE, 3, TP_TAG_FD, 0, NULL, 0);
  check(spin(&loop, 2000, got_end) && end_err == EPROTO, "an unasked NET_GIVE: EPROTO");
  close(up_fd);

  tp_netrelay_release(nr);
  close(ag.fd);
  tp_dbox_release(b);
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "the loop closes: every handle is gone");
  close(l);
  rmdir(dir);
  free(ag.data);
  free(big);
  free(got);
}

int main(void) {
  enum { BIG = 1 << 20 };
  char dir[] = "/tmp/tupper-netrelay.XXXXXX";
  int sv[2], mine, r;
  uv_loop_t loop;
  tp_error_t err = {0};
  tp_dbox_t *b;
  tp_netrelay_t *nr;
  uint8_t *big = malloc(BIG);

  ag.data = malloc(6 * BIG); /* every stream's bytes: at most 5 MiB */
  signal(SIGPIPE, SIG_IGN); /* as the daemon (lstate.c): a splice onto a closed channel */
  if (mkdtemp(dir) == NULL || uv_loop_init(&loop) != 0 || big == NULL || ag.data == NULL ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    printf("1..0 # SKIP no temp dir, loop or socketpair\n");
    return 77;
  }
  for (size_t i = 0; i < BIG; i++)
    big[i] = (uint8_t) (i * 7 + (i >> 9));
  ag.fd = sv[1];
  fcntl(ag.fd, F_SETFL, O_NONBLOCK);
  b = tp__dbox_new(&fake_be, &loop, dir);
  b->box.chan_fd = sv[0];
  b->box.pidfd = eventfd(0, EFD_CLOEXEC); /* never readable: PID 1 never exits */
  check(tp_dbox_on(b, on_frame, on_down, &err) == 0, "the box's channel is on the loop");
  check(tp_netrelay_new(b, TP_NET_WINDOW_DOWN + 1, on_end, NULL, &err) == NULL && err.code == EINVAL,
        "a window past the agent's refused");
  /* the window of an agent that does not say TP_F_READY_NET_DOWN (an older
   * build's, re-adopted): the relay keeps to the window it was given */
  nr = tp_netrelay_new(b, TP_NET_WINDOW, on_end, NULL, &err);
  check(nr != NULL, "a relay on the box");
  check(tp_netrelay_new(b, TP_NET_WINDOW_DOWN, on_end, NULL, &err) == NULL && err.code == EBUSY, "one relay a box");

  /* a hand-over: the head is the daemon's, the rest the box's */
  r = tcp_pair(&mine, &up_fd);
  check(r == 0, "a loopback upstream");
  tp_netrelay_take_t t = {.sid = 1, .fd = mine, .up = (const uint8_t *) "HEADbody", .up_len = 8,
                          .up_head = 4, .down = (const uint8_t *) "hi", .down_len = 2};
  check(tp_netrelay_take(nr, &t, &err) == 0 && tp_netrelay_has(nr, 1) && tp_netrelay_count(nr) == 1,
        "the relay takes stream 1");
  int fd2, up2;
  tcp_pair(&fd2, &up2);
  t.fd = fd2;
  check(tp_netrelay_take(nr, &t, &err) < 0 && err.code == EEXIST, "a sid taken twice is refused");
  close(up2);
  check(spin(&loop, 2000, up_got_8) && memcmp(upbuf, "HEADbody", 8) == 0,
        "the upstream gets the head, then the box's bytes");
  check(spin(&loop, 2000, got_ack4) && ag.acked == 4, "only the box's 4 bytes are acknowledged");
  want_data = 2;
  check(spin(&loop, 2000, got_data) && memcmp(ag.data, "hi", 2) == 0,
        "bytes read upstream before the hand-over reach the box");

  /* 1 MiB from the upstream: within the window, in chunks, byte-exact */
  size_t sent = 0;
  while (sent < BIG) {
    ssize_t w = write(up_fd, big + sent, BIG - sent);
    if (w > 0)
      sent += (size_t) w;
    uv_run(&loop, UV_RUN_NOWAIT);
    agent_read();
    if (ag.unacked > 0) { /* the agent delivers and acknowledges all it holds */
      agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, (int64_t) ag.unacked, NULL, 0);
      ag.unacked = 0;
    }
  }
  want_data = 2 + BIG;
  for (int i = 0; i < 200 && ag.ndata < want_data; i++) {
    spin(&loop, 10, got_data);
    if (ag.unacked > 0) {
      agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, (int64_t) ag.unacked, NULL, 0);
      ag.unacked = 0;
    }
  }
  check(ag.ndata == 2 + BIG && memcmp(ag.data + 2, big, BIG) == 0, "1 MiB reaches the box byte-exact");
  check(ag.max_unacked <= TP_NET_WINDOW && ag.max_frame <= TP_NET_CHUNK,
        "never more than the window unacknowledged (%zu), frames of at most a chunk (%zu)",
        ag.max_unacked, ag.max_frame);

  /* a window's worth unacknowledged: the relay stops reading upstream */
  size_t before = ag.ndata;
  for (int i = 0; i < 2; i++) { /* 2 MiB offered (up_fd takes what its buffer holds) */
    ssize_t w = write(up_fd, big, BIG);
    (void) w;
    spin(&loop, 50, got_end);
  }
  want_data = SIZE_MAX;
  spin(&loop, 300, got_data);
  check(ag.ndata - before <= TP_NET_WINDOW, "without acknowledgements at most the window comes (%zu)",
        ag.ndata - before);
  if (ag.unacked > 0) { /* the rest of what the upstream was offered: read out and dropped */
    agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, (int64_t) ag.unacked, NULL, 0);
    ag.unacked = 0;
  }
  for (size_t last = SIZE_MAX; last != ag.ndata;) { /* until 100 ms bring nothing */
    last = ag.ndata;
    for (int i = 0; i < 20; i++) {
      spin(&loop, 5, got_end);
      if (ag.unacked > 0) {
        agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, (int64_t) ag.unacked, NULL, 0);
        ag.unacked = 0;
      }
    }
  }

  /* a channel that takes little at a time (its send buffer shrunk): the
   * splice meets partial writes, the rest goes through the queue, reads
   * framed in place go on while bytes are queued; the frames stay whole */
  {
    int small = 4096;
    size_t start = ag.ndata, at = 0;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    for (size_t k = 0; k < BIG; k++)
      big[k] = (uint8_t) (k * 11 + (k >> 10));
    for (long long until = now_ms() + 10000; ag.ndata < start + BIG && now_ms() < until;) {
      if (at < BIG) {
        ssize_t w = write(up_fd, big + at, BIG - at);
        if (w > 0)
          at += (size_t) w;
      }
      spin(&loop, 2, got_end);
      if (ag.unacked > 0) {
        agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, (int64_t) ag.unacked, NULL, 0);
        ag.unacked = 0;
      }
    }
    check(ag.ndata == start + BIG && memcmp(ag.data + start, big, BIG) == 0 && downs == 0,
          "through a channel that takes 4 KiB at a time 1 MiB reaches the box byte-exact");
    small = (int) TP_DBOX_CHAN_SNDBUF;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  }

  /* frames of a stream it does not own are the owner's */
  owner_frames = 0;
  agent_send(TP_MSG_NET_EOF, 7, 0, 0, NULL, 0);
  spin(&loop, 100, got_end);
  check(owner_frames == 1 && downs == 0, "a frame of another stream goes to the owner");
  check(b->rbuf == NULL && b->fields == NULL,
        "a small read that leaves no byte behind drops the read buffer and the fields (idle)");
  /* a frame larger than the first buffer: grown for it, dropped after */
  {
    tp_buf_t f;
    tp_buf_init(&f);
    tp_frame_begin(&f, TP_MSG_NET_DATA, 0);
    tp_frame_add_int(&f, TP_TAG_SID, 7);
    tp_frame_add(&f, TP_TAG_DATA, big, 300 * 1024);
    tp_frame_end(&f);
    for (size_t off = 0; off < f.len;) { /* more than the socket holds: the loop reads meanwhile */
      ssize_t w = write(ag.fd, f.data + off, f.len - off);
      if (w > 0)
        off += (size_t) w;
      uv_run(&loop, UV_RUN_NOWAIT);
    }
    tp_buf_free(&f);
  }
  want_owner = 2;
  check(spin(&loop, 2000, owner_got) && downs == 0, "a 300 KiB frame is read whole (grown buffer)");
  agent_send(TP_MSG_NET_EOF, 7, 0, 0, NULL, 0);
  want_owner = 3;
  check(spin(&loop, 2000, owner_got) && b->rbuf == NULL && b->rcap == 0 && b->fields == NULL,
        "the next small read drops the grown buffer");

  /* an acknowledgement of more than was sent: the stream ends */
  agent_send(TP_MSG_NET_ACK, 1, TP_TAG_SIZE, 10 * TP_NET_WINDOW, NULL, 0);
  check(spin(&loop, 2000, got_close) && ends == 1 && end_err == EPROTO && !tp_netrelay_has(nr, 1),
        "a broken acknowledgement: NET_CLOSE to the box, the end with EPROTO");
  check(end_up == 4 && end_down >= 2 + BIG, "the end reports the bytes each way");
  check(spin(&loop, 2000, up_eof), "the upstream connection is closed");
  close(up_fd);

  /* the agent's NET_CLOSE ends a stream, with its callback */
  tcp_pair(&mine, &up_fd);
  t = (tp_netrelay_take_t){.sid = 2, .fd = mine};
  ends = 0;
  check(tp_netrelay_take(nr, &t, &err) == 0, "the relay takes stream 2");
  agent_send(TP_MSG_NET_CLOSE, 2, 0, 0, NULL, 0);
  check(spin(&loop, 2000, got_end) && end_err == 0 && tp_netrelay_count(nr) == 0,
        "the agent's NET_CLOSE ends it");
  check(spin(&loop, 2000, up_eof), "and closes its upstream");
  close(up_fd);

  /* the upstream resets mid-download: what came before it reaches the box,
   * then NET_CLOSE; the channel's frames stay whole */
  tcp_pair(&mine, &up_fd);
  t = (tp_netrelay_take_t){.sid = 5, .fd = mine};
  ends = 0;
  ag.closes = 0;
  check(tp_netrelay_take(nr, &t, &err) == 0, "the relay takes stream 5");
  {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    ssize_t w = write(up_fd, big, 100000);
    (void) w;
    usleep(20000);
    setsockopt(up_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(up_fd);
  }
  check(spin(&loop, 2000, got_close) && ends == 1 && tp_netrelay_count(nr) == 0,
        "the upstream's reset ends the stream: NET_CLOSE to the box (%s)", strerror(end_err));
  owner_frames = 0;
  want_owner = 1;
  agent_send(TP_MSG_NET_EOF, 7, 0, 0, NULL, 0);
  check(spin(&loop, 2000, owner_got) && downs == 0, "the frames after it are whole");

  /* the box goes down while the relay splices: its upstream floods, the
   * channel closes under it */
  tcp_pair(&mine, &up_fd);
  t = (tp_netrelay_take_t){.sid = 6, .fd = mine};
  ends = 0;
  check(tp_netrelay_take(nr, &t, &err) == 0, "the relay takes stream 6");
  fcntl(up_fd, F_SETFL, O_NONBLOCK);
  for (int i = 0; i < 20; i++) {
    ssize_t w = write(up_fd, big, BIG);
    (void) w;
    uv_run(&loop, UV_RUN_NOWAIT);
    if (i == 10) {
      close(ag.fd);
      ag.fd = -1;
    }
  }
  check(spin(&loop, 2000, up_eof) && downs == 1 && ends == 0 && tp_netrelay_count(nr) == 0 &&
            b->n_data == NULL,
        "the channel closed mid-splice: the box down, the stream's upstream closed, no end "
        "callback, the box let go");
  close(up_fd);

  tcp_pair(&mine, &up_fd);
  t = (tp_netrelay_take_t){.sid = 4, .fd = mine};
  check(tp_netrelay_take(nr, &t, &err) < 0 && err.code == EPIPE, "no hand-over after the box is gone");
  close(up_fd);

  tp_netrelay_release(nr);
  tp_dbox_release(b);
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "the loop closes: every handle is gone");
  rmdir(dir);
  free(big);
  free(ag.data);
  test_give();
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}
