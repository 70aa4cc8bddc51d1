/* tupper-agent: the network relay (docs/network.md).  The agent only
 * moves bytes: it listens on 127.0.0.1 inside the box (HTTP proxy, SOCKS5,
 * DNS over UDP and TCP), hands each accepted connection to the host as a
 * stream (NET_OPEN) and relays its bytes both ways (NET_DATA, NET_ACK,
 * NET_EOF, NET_CLOSE); DNS datagrams go up whole (NET_DNS) and their
 * answers come back to the sender.  Every decision (what the box asked
 * for, whether it may have it, where to connect) is the daemon's: the agent
 * parses nothing a box process sends, so a parsing bug here cannot be used
 * to reach anything, and the same relay serves any backend whose agent
 * speaks this protocol.
 *
 * Flow control: per stream, at most TP_NET_WINDOW bytes travel
 * unacknowledged towards the host and TP_NET_WINDOW_DOWN towards the box.
 * The agent stops reading a box socket while the host holds a window, and
 * buffers at most TP_NET_WINDOW_DOWN from the host (only what the box's
 * socket did not take at once; the buffer exists only while bytes wait);
 * a host that overruns the window gets the stream closed.  What the box's
 * socket took is acknowledged once per round of the loop.
 *
 * Downloads: while large NET_DATA frames come one after another, their
 * payloads are spliced from the channel through a pipe to the box's socket
 * (agent_net_splice): the agent copies none of those bytes, and a frame
 * that is not such a NET_DATA is read as any other.
 *
 * Handing a stream over (NET_GIVE, linux boxes): the host may ask for an
 * accepted stream's box socket once it relays the stream in C; the agent
 * writes what waits for the socket, stops reading it, and names its
 * descriptor, which the host takes with pidfd_getfd and then moves the
 * bytes between the box's socket and the upstream itself.  NET_TAKEN says
 * whether it did: the agent then forgets the stream, or relays it again.
 *
 * NET_CONNECT (inbound ports, `tupper port`) is the reverse: the host
 * names a port, the agent connects to 127.0.0.1:PORT and the resulting
 * stream works the same way. */
#define _GNU_SOURCE
#include "agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NET_QUERIES_MAX 64 /* DNS queries over UDP waiting for the host's answer */
#define NET_UDP_BURST 16   /* datagrams read per wake-up */
#define NET_HOST_SID 0x80000000u
/* UDP DNS queries sent up at most NET_DNS_RATE a second after a burst of
 * NET_DNS_BURST; the rest are dropped here, so a flood costs the daemon a
 * few frames, not one a query.  Twice the daemon's own bound
 * (lua/tupper/net/relay.lua): the daemon still sees a flood, says it in the
 * box's network log and enforces its bound whatever the agent does. */
#define NET_DNS_RATE 400
#define NET_DNS_BURST 800
/* A NET_DATA frame's head as the host's C relay writes it: the frame
 * header, SID (an 8-byte int) and DATA's tag and length, the payload
 * after it (frame.c's encoding).  Payloads from NET_SPLICE_MIN bytes are
 * spliced, at most NET_SPLICE_FRAMES frames a round of the loop. */
#define NET_HEAD (TP_FRAME_HDR + 6 + 8 + 6)
#define NET_SPLICE_MIN 4096
#define NET_SPLICE_FRAMES 16
#define NET_PIPE (256u * 1024u)

enum { L_HTTP, L_SOCKS, L_DNS_TCP, L_DNS_UDP, L_N };

typedef struct net_stream_s {
  uint32_t sid;
  int fd;                     /* -1: free slot */
  int connecting;             /* NET_CONNECT in progress */
  int rd_eof;                 /* the box side ended (NET_EOF sent) */
  int eof_in;                 /* the host sent NET_EOF */
  int wr_shut;                /* our write side is shut down */
  size_t unacked;             /* bytes sent to the host, not yet acknowledged */
  size_t ack_owed;            /* bytes written to the box's socket, not yet acknowledged to
                                 the host: one NET_ACK per stream per round of the loop */
  size_t out_off, out_len;    /* out[out_off..out_len): from the host, not yet written */
  uint8_t *out;               /* TP_NET_WINDOW_DOWN bytes while bytes wait; NULL when none do */
  int give;                   /* NET_GIVE: 1, asked (answered once out is written), 2: answered
                                 with fd, which waits for NET_TAKEN untouched */
} net_stream_t;

typedef struct net_query_s {
  uint32_t qid;               /* 0: free */
  struct sockaddr_in peer;
} net_query_t;

struct agent_net_s {
  int lfd[L_N];
  uint32_t next_sid;
  uint32_t next_qid;
  int nstreams;
  int qnext;
  net_stream_t streams[TP_NET_STREAMS_MAX];
  net_query_t queries[NET_QUERIES_MAX];
  double dns_tokens;          /* the bucket of DNS queries (NET_DNS_RATE) */
  long long dns_at_ms;        /* when it was last filled; 0: never */
  /* Splicing downloads (agent_net_splice): a NET_DATA frame's payload
   * moves from the channel through the pipe to the box's socket as page
   * references.  The pipe is empty between calls. */
  int pipe[2];                /* -1 until first used */
  int nosplice;               /* the kernel refused a splice: frames are read from now on */
  int hint;                   /* the last NET_DATA was large: look at the next frame's head */
  uint32_t sp_sid;            /* the frame whose payload is being moved: its stream, */
  size_t sp_left;             /* and the bytes of it still on the channel */
  uint8_t buf[TP_NET_DNS_MAX > TP_NET_CHUNK ? TP_NET_DNS_MAX : TP_NET_CHUNK];
};

static const struct {
  int port;
  int type;
  int kind;
} net_listeners[L_N] = {
    [L_HTTP] = {TP_NET_HTTP_PORT, SOCK_STREAM, TP_NET_HTTP},
    [L_SOCKS] = {TP_NET_SOCKS_PORT, SOCK_STREAM, TP_NET_SOCKS},
    [L_DNS_TCP] = {TP_NET_DNS_PORT, SOCK_STREAM, TP_NET_DNS_TCP},
    [L_DNS_UDP] = {TP_NET_DNS_PORT, SOCK_DGRAM, 0},
};

/* ---- frames to the host ---------------------------------------------------- */

static void send_sid(agent_t *a, uint8_t type, uint32_t sid, uint16_t tag, int64_t v) {
  agent_event_begin(a, type);
  tp_frame_add_int(&a->out, TP_TAG_SID, sid);
  if (tag != 0)
    tp_frame_add_int(&a->out, tag, v);
  agent_send(a);
}

static void send_data(agent_t *a, uint8_t type, uint32_t sid, const uint8_t *p, size_t n) {
  agent_event_begin(a, type);
  tp_frame_add_int(&a->out, TP_TAG_SID, sid);
  tp_frame_add(&a->out, TP_TAG_DATA, p, (uint32_t) n);
  agent_send(a);
}

/* ---- streams --------------------------------------------------------------- */

static void stream_free(struct agent_net_s *net, net_stream_t *s) {
  if (s->fd < 0)
    return;
  close(s->fd);
  free(s->out);
  *s = (net_stream_t){.fd = -1};
  net->nstreams--;
}

/* Ends a stream and tells the host (errno 0: an orderly end). */
static void stream_close(agent_t *a, net_stream_t *s, int e) {
  uint32_t sid = s->sid;
  stream_free(a->net, s);
  send_sid(a, TP_MSG_NET_CLOSE, sid, e ? TP_TAG_ERRNO : 0, e);
}

static net_stream_t *stream_find(struct agent_net_s *net, uint32_t sid) {
  for (int i = 0; i < TP_NET_STREAMS_MAX; i++)
    if (net->streams[i].fd >= 0 && net->streams[i].sid == sid)
      return &net->streams[i];
  return NULL;
}

/* A free slot for fd (which it then owns), or NULL (fd closed). */
static net_stream_t *stream_new(struct agent_net_s *net, int fd, uint32_t sid) {
  net_stream_t *s = NULL;
  for (int i = 0; i < TP_NET_STREAMS_MAX && s == NULL; i++)
    if (net->streams[i].fd < 0)
      s = &net->streams[i];
  if (s == NULL) {
    close(fd);
    return NULL;
  }
  *s = (net_stream_t){.sid = sid, .fd = fd};
  net->nstreams++;
  return s;
}

/* Both directions done: the stream ends. */
static void stream_maybe_done(agent_t *a, net_stream_t *s) {
  if (s->rd_eof && s->wr_shut)
    stream_close(a, s, 0);
}

static void stream_read(agent_t *a, net_stream_t *s) {
  size_t room = TP_NET_WINDOW - s->unacked;
  ssize_t n;
  if (room > TP_NET_CHUNK)
    room = TP_NET_CHUNK;
  n = read(s->fd, a->net->buf, room);
  if (n < 0) {
    if (errno != EAGAIN && errno != EINTR)
      stream_close(a, s, errno);
    return;
  }
  if (n == 0) {
    s->rd_eof = 1;
    send_sid(a, TP_MSG_NET_EOF, s->sid, 0, 0);
    stream_maybe_done(a, s);
    return;
  }
  s->unacked += (size_t) n;
  send_data(a, TP_MSG_NET_DATA, s->sid, a->net->buf, (size_t) n);
}

/* The answer to NET_GIVE, once nothing waits for s's socket: what the
 * socket took is acknowledged first, then its descriptor is named (kept,
 * not polled, until NET_TAKEN); a stream that has ended a side, or a
 * guest's (whose host cannot take a descriptor), is declined. */
static void give_answer(agent_t *a, net_stream_t *s) {
  if (s->rd_eof || s->eof_in || s->connecting || (s->sid & NET_HOST_SID) || a->chan == a->vm_port) {
    s->give = 0;
    send_sid(a, TP_MSG_NET_GIVE, s->sid, 0, 0);
    return;
  }
  if (s->ack_owed > 0) {
    send_sid(a, TP_MSG_NET_ACK, s->sid, TP_TAG_SIZE, (int64_t) s->ack_owed);
    s->ack_owed = 0;
  }
  s->give = 2;
  send_sid(a, TP_MSG_NET_GIVE, s->sid, TP_TAG_FD, s->fd);
}

static void stream_write(agent_t *a, net_stream_t *s) {
  if (s->connecting) {
    int e = 0;
    socklen_t len = sizeof(e);
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
      e = errno;
    if (e != 0) {
      stream_close(a, s, e);
      return;
    }
    s->connecting = 0;
    send_sid(a, TP_MSG_NET_OPEN, s->sid, TP_TAG_KIND, TP_NET_CONNECTED);
    return;
  }
  if (s->out_len > s->out_off) {
    ssize_t w = write(s->fd, s->out + s->out_off, s->out_len - s->out_off);
    if (w < 0) {
      if (errno != EAGAIN && errno != EINTR)
        stream_close(a, s, errno);
      return;
    }
    s->out_off += (size_t) w;
    if (s->out_off == s->out_len) { /* drained: the buffer goes until bytes wait again */
      free(s->out);
      s->out = NULL;
      s->out_off = s->out_len = 0;
    }
    s->ack_owed += (size_t) w;
  }
  if (s->give == 1 && s->out_len == 0) {
    give_answer(a, s);
    return;
  }
  if (s->eof_in && s->out_len == 0 && !s->wr_shut) {
    shutdown(s->fd, SHUT_WR);
    s->wr_shut = 1;
    stream_maybe_done(a, s);
  }
}

/* ---- listeners --------------------------------------------------------------- */

static int listen_one(int port, int type, tp_error_t *err) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int one = 1, saved;
  int fd = socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return tp_error_errno(err, errno, "net: socket");
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
      (type == SOCK_STREAM && listen(fd, 64) < 0)) {
    saved = errno;
    close(fd);
    return tp_error_errno(err, saved, "net: listen on 127.0.0.1:%d", port);
  }
  return fd;
}

int agent_net_listen(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  if (agent_req_check(r, 0, 0, "net listen", err) < 0)
    return -1;
  return agent_net_listen_now(a, err);
}

int agent_net_listen_now(agent_t *a, tp_error_t *err) {
  struct agent_net_s *net;
  if (a->net != NULL) /* a re-attached daemon asks again */
    return 0;
  net = calloc(1, sizeof(*net));
  if (net == NULL)
    return tp_error_set(err, ENOMEM, "net: out of memory");
  for (int i = 0; i < TP_NET_STREAMS_MAX; i++)
    net->streams[i].fd = -1;
  for (int i = 0; i < L_N; i++)
    net->lfd[i] = -1;
  net->pipe[0] = net->pipe[1] = -1;
  for (int i = 0; i < L_N; i++) {
    net->lfd[i] = listen_one(net_listeners[i].port, net_listeners[i].type, err);
    if (net->lfd[i] < 0) {
      for (int j = 0; j < i; j++)
        close(net->lfd[j]);
      free(net);
      return -1;
    }
  }
  net->next_sid = 1;
  net->next_qid = 1;
  a->net = net;
  return 0;
}

static void accept_one(agent_t *a, int l) {
  struct agent_net_s *net = a->net;
  net_stream_t *s;
  uint32_t sid;
  int fd = accept4(net->lfd[l], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0)
    return; /* EAGAIN, a connection gone meanwhile, or out of fds: the box's problem */
  if (a->chan < 0 || a->dead) { /* no daemon: nowhere to go */
    close(fd);
    return;
  }
  sid = net->next_sid;
  net->next_sid = net->next_sid + 1 >= NET_HOST_SID ? 1 : net->next_sid + 1;
  s = stream_new(net, fd, sid);
  if (s == NULL)
    return;
  send_sid(a, TP_MSG_NET_OPEN, sid, TP_TAG_KIND, net_listeners[l].kind);
}

/* Whether one more DNS query fits the bucket. */
static int dns_allowed(struct agent_net_s *net) {
  struct timespec ts;
  long long now;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  now = (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  if (net->dns_at_ms == 0)
    net->dns_tokens = NET_DNS_BURST;
  else
    net->dns_tokens += (double) (now - net->dns_at_ms) * NET_DNS_RATE / 1000.0;
  if (net->dns_tokens > NET_DNS_BURST)
    net->dns_tokens = NET_DNS_BURST;
  net->dns_at_ms = now;
  if (net->dns_tokens < 1)
    return 0;
  net->dns_tokens -= 1;
  return 1;
}

static void dns_read(agent_t *a) {
  struct agent_net_s *net = a->net;
  for (int i = 0; i < NET_UDP_BURST; i++) {
    struct sockaddr_in peer;
    socklen_t plen = sizeof(peer);
    net_query_t *q;
    ssize_t n = recvfrom(net->lfd[L_DNS_UDP], net->buf, TP_NET_DNS_MAX, MSG_TRUNC,
                         (struct sockaddr *) &peer, &plen);
    if (n < 0)
      return;
    if (n < 12 || n > TP_NET_DNS_MAX || plen != sizeof(peer) || a->chan < 0)
      continue; /* not a DNS message, or truncated: dropped */
    if (!dns_allowed(net))
      continue; /* over the rate: dropped */
    /* the oldest pending query makes room: a box that floods loses its own answers */
    q = &net->queries[net->qnext];
    net->qnext = (net->qnext + 1) % NET_QUERIES_MAX;
    q->qid = net->next_qid;
    net->next_qid = net->next_qid + 1 == 0 ? 1 : net->next_qid + 1;
    q->peer = peer;
    send_data(a, TP_MSG_NET_DNS, q->qid, net->buf, (size_t) n);
  }
}

/* ---- poll ------------------------------------------------------------------- */

/* The acknowledgements a round of the loop owes, one frame per stream:
 * the frames of one channel read (a batch of a window's NET_DATA) cost
 * the host one wake-up, not one per frame. */
static void acks_flush(agent_t *a) {
  struct agent_net_s *net = a->net;
  for (int i = 0; i < TP_NET_STREAMS_MAX && a->chan >= 0 && !a->dead; i++) {
    net_stream_t *s = &net->streams[i];
    if (s->fd < 0 || s->ack_owed == 0)
      continue;
    send_sid(a, TP_MSG_NET_ACK, s->sid, TP_TAG_SIZE, (int64_t) s->ack_owed);
    s->ack_owed = 0;
  }
}

int agent_net_poll_fill(agent_t *a, int first) {
  struct agent_net_s *net = a->net;
  int n = first;
  if (net == NULL)
    return n;
  acks_flush(a);
  for (int l = 0; l < L_N; l++) {
    a->pfds[n] = (struct pollfd){.fd = net->lfd[l], .events = POLLIN};
    a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) (-1 - l)};
  }
  for (int i = 0; i < TP_NET_STREAMS_MAX; i++) {
    net_stream_t *s = &net->streams[i];
    short ev = 0;
    if (s->fd < 0)
      continue;
    if (s->connecting || s->out_len > s->out_off || (s->eof_in && !s->wr_shut))
      ev |= POLLOUT;
    if (!s->connecting && !s->rd_eof && s->unacked < TP_NET_WINDOW && s->give == 0)
      ev |= POLLIN;
    if (s->give == 2)
      ev = 0; /* the host's to take: untouched */
    /* nothing wanted: left out, so a hung-up socket cannot spin the loop */
    a->pfds[n] = (struct pollfd){.fd = ev ? s->fd : -1, .events = ev};
    a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i};
  }
  return n;
}

void agent_net_poll_handle(agent_t *a, int first, int n) {
  struct agent_net_s *net = a->net;
  if (net == NULL)
    return;
  for (int i = first; i < n && a->chan >= 0 && !a->dead; i++) {
    short rev = a->pfds[i].revents;
    int slot = a->prefs[i].slot;
    net_stream_t *s;
    if (rev == 0)
      continue;
    if (slot < 0) {
      int l = -1 - slot;
      if (l == L_DNS_UDP)
        dns_read(a);
      else
        accept_one(a, l);
      continue;
    }
    s = &net->streams[slot];
    if (s->fd < 0 || s->fd != a->pfds[i].fd)
      continue;
    if (rev & (POLLOUT | POLLERR | POLLHUP))
      stream_write(a, s);
    if (s->fd >= 0 && s->fd == a->pfds[i].fd && (rev & (POLLIN | POLLERR | POLLHUP)) &&
        !s->rd_eof && !s->connecting && s->unacked < TP_NET_WINDOW && s->give == 0)
      stream_read(a, s);
    if (s->fd >= 0 && (rev & POLLNVAL))
      stream_close(a, s, EBADF);
  }
}

/* ---- splicing a download ---------------------------------------------------- */

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

static void splice_pipe_close(struct agent_net_s *net) {
  if (net->pipe[0] < 0)
    return;
  close(net->pipe[0]);
  close(net->pipe[1]);
  net->pipe[0] = net->pipe[1] = -1;
}

/* The pipe, made on first use: room for a chunk in pages of any alignment. */
static int splice_pipe(struct agent_net_s *net) {
  if (net->pipe[0] >= 0)
    return 0;
  if (pipe2(net->pipe, O_NONBLOCK | O_CLOEXEC) < 0) {
    net->pipe[0] = net->pipe[1] = -1;
    return -1;
  }
  fcntl(net->pipe[1], F_SETPIPE_SZ, (int) NET_PIPE);
  if (fcntl(net->pipe[1], F_GETPIPE_SZ) < (int) TP_NET_CHUNK) { /* the user's pipe limits */
    splice_pipe_close(net);
    net->nosplice = 1;
    return -1;
  }
  return 0;
}

/* The next frame on the channel, if it is a NET_DATA in the C relay's
 * encoding of NET_SPLICE_MIN..TP_NET_CHUNK bytes for a stream that takes
 * it now (connected, not ended, nothing queued for its socket, within the
 * window): its head is consumed and its payload becomes sp_*.  1 then; 0
 * for any other frame, or bytes that are not a whole head yet (the
 * ordinary read takes them); -1 when the channel has nothing. */
static int splice_head(agent_t *a) {
  struct agent_net_s *net = a->net;
  uint8_t h[NET_HEAD];
  net_stream_t *s;
  uint64_t sid = 0;
  uint32_t dlen;
  ssize_t n = recv(a->chan, h, NET_HEAD, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return -1;
  if (n < 0 && errno == ENOTSOCK)
    net->nosplice = 1; /* a channel that is no socket: frames are read */
  if (n < (ssize_t) NET_HEAD)
    return 0; /* an error or the end: the ordinary read says it */
  for (int i = 0; i < 8; i++)
    sid |= (uint64_t) h[TP_FRAME_HDR + 6 + i] << (8 * i);
  dlen = get_u32(h + NET_HEAD - 4);
  if (h[4] != TP_PROTO_VERSION || h[5] != TP_MSG_NET_DATA ||
      get_u32(h) != NET_HEAD - TP_FRAME_HDR + (uint64_t) dlen ||
      (h[TP_FRAME_HDR] | h[TP_FRAME_HDR + 1] << 8) != TP_TAG_SID || get_u32(h + TP_FRAME_HDR + 2) != 8 ||
      (h[NET_HEAD - 6] | h[NET_HEAD - 5] << 8) != TP_TAG_DATA || sid == 0 || sid > UINT32_MAX ||
      dlen < NET_SPLICE_MIN || dlen > TP_NET_CHUNK)
    return 0;
  s = stream_find(net, (uint32_t) sid);
  if (s == NULL || s->connecting || s->eof_in || s->give != 0 || s->out_len > s->out_off ||
      (uint64_t) dlen + s->ack_owed > TP_NET_WINDOW_DOWN || splice_pipe(net) < 0)
    return 0; /* the ordinary path (which closes a stream that overran its window) */
  n = recv(a->chan, h, NET_HEAD, MSG_DONTWAIT);
  if (n != (ssize_t) NET_HEAD) { /* the bytes just seen are gone: the channel cannot be trusted */
    agent_log("channel read: a frame head vanished");
    a->dead = 1;
    return -1;
  }
  a->rpos += NET_HEAD;
  net->sp_sid = (uint32_t) sid;
  net->sp_left = dlen;
  return 1;
}

static int splice_drop(agent_t *a, int from, size_t k);

/* A read from the pipe, or from the channel (a blocking socket) without waiting. */
static ssize_t splice_read(agent_t *a, int from, void *p, size_t k) {
  return from == a->chan ? recv(from, p, k, MSG_DONTWAIT) : read(from, p, k);
}

/* Of the frame being moved, k bytes that are in the pipe (from: its read
 * end), or at most k on the channel (from: a->chan), go to s's queue,
 * written when its socket takes more; -1 if they could not be read. */
static int splice_queue(agent_t *a, net_stream_t *s, int from, size_t k) {
  if (s->out == NULL && (s->out = malloc(TP_NET_WINDOW_DOWN)) == NULL) {
    stream_close(a, s, ENOMEM);
    return splice_drop(a, from, k); /* and the rest of the frame after it */
  }
  if (s->out_off > 0) {
    memmove(s->out, s->out + s->out_off, s->out_len - s->out_off);
    s->out_len -= s->out_off;
    s->out_off = 0;
  }
  while (k > 0) { /* within the window checked at the head: it fits */
    ssize_t r = splice_read(a, from, s->out + s->out_len, k);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && from == a->chan)
      return 0; /* the rest of the frame is not here yet */
    if (r <= 0)
      return -1;
    s->out_len += (size_t) r;
    k -= (size_t) r;
    if (from == a->chan) {
      a->rpos += (size_t) r;
      a->net->sp_left -= (size_t) r;
    }
  }
  return 0;
}

/* Drops k bytes from the pipe, or (pipe 0) at most k from the channel; -1
 * if they could not be read. */
static int splice_drop(agent_t *a, int from, size_t k) {
  while (k > 0) {
    ssize_t r = splice_read(a, from, a->net->buf, k < sizeof(a->net->buf) ? k : sizeof(a->net->buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && from == a->chan)
      return 0;
    if (r <= 0)
      return -1;
    k -= (size_t) r;
    if (from == a->chan) {
      a->rpos += (size_t) r;
      a->net->sp_left -= (size_t) r;
    }
  }
  return 0;
}

/* Moves what the channel has of the frame's payload on: spliced into the
 * pipe and from there to the box's socket while nothing is queued for it;
 * what the socket does not take goes to its queue (a copy, as an ordinary
 * frame's would); the bytes of a stream closed meanwhile are dropped. */
static void splice_payload(agent_t *a) {
  struct agent_net_s *net = a->net;
  net_stream_t *s = stream_find(net, net->sp_sid);
  ssize_t n, k = 0;
  size_t put = 0;
  int r = 0;
  if (s == NULL) {
    r = splice_drop(a, a->chan, net->sp_left);
  } else if (s->out_len > s->out_off || net->nosplice) {
    r = splice_queue(a, s, a->chan, net->sp_left);
  } else {
    n = splice(a->chan, NULL, net->pipe[1], NULL, net->sp_left, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return;
    if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
      net->nosplice = 1;
      r = splice_queue(a, s, a->chan, net->sp_left);
    } else if (n <= 0) {
      if (n < 0)
        agent_log("channel read: %s", strerror(errno));
      a->dead = 1;
      return;
    } else {
      a->rpos += (size_t) n;
      net->sp_left -= (size_t) n;
      while (put < (size_t) n) {
        k = splice(net->pipe[0], NULL, s->fd, NULL, (size_t) n - put, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (k < 0 && errno == EINTR)
          continue;
        if (k <= 0)
          break;
        put += (size_t) k;
      }
      s->ack_owed += put;
      if (put < (size_t) n && k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        if (errno == EINVAL || errno == ENOSYS) {
          net->nosplice = 1;
          r = splice_queue(a, s, net->pipe[0], (size_t) n - put);
        } else {
          stream_close(a, s, errno); /* the box's end is gone */
          r = splice_drop(a, net->pipe[0], (size_t) n - put);
        }
      } else if (put < (size_t) n) {
        r = splice_queue(a, s, net->pipe[0], (size_t) n - put); /* the socket is full */
      }
    }
  }
  if (r < 0) { /* the pipe kept bytes, or the channel failed: nothing can be trusted */
    agent_log("network: a spliced frame could not be moved");
    splice_pipe_close(net); /* a next channel gets a new, empty one */
    a->dead = 1;
  }
}

int agent_net_splice(agent_t *a) {
  struct agent_net_s *net = a->net;
  if (net == NULL || a->chan < 0 || a->dead)
    return 0;
  if (net->sp_left == 0 &&
      (net->nosplice || !net->hint || net->nstreams == 0 || a->rlen > 0 || a->chan == a->vm_port))
    return 0;
  for (int i = 0; i < NET_SPLICE_FRAMES && !a->dead; i++) {
    if (net->sp_left == 0) {
      int h = splice_head(a);
      if (h < 0)
        return 1; /* nothing on the channel */
      if (h == 0) {
        net->hint = 0;
        return 0; /* another frame: the ordinary read */
      }
    }
    splice_payload(a);
    if (net->sp_left > 0)
      return 1; /* the rest is not here yet */
  }
  return 1;
}

/* ---- frames from the host ---------------------------------------------------- */

static void net_connect(agent_t *a, uint32_t sid, int64_t port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  net_stream_t *s;
  int fd;
  if (!(sid & NET_HOST_SID) || port < 1 || port > 65535 || stream_find(a->net, sid) != NULL) {
    send_sid(a, TP_MSG_NET_CLOSE, sid, TP_TAG_ERRNO, EINVAL);
    return;
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    send_sid(a, TP_MSG_NET_CLOSE, sid, TP_TAG_ERRNO, errno);
    return;
  }
  s = stream_new(a->net, fd, sid);
  if (s == NULL) {
    send_sid(a, TP_MSG_NET_CLOSE, sid, TP_TAG_ERRNO, EAGAIN);
    return;
  }
  sa.sin_port = htons((uint16_t) port);
  if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0) {
    send_sid(a, TP_MSG_NET_OPEN, sid, TP_TAG_KIND, TP_NET_CONNECTED);
  } else if (errno == EINPROGRESS) {
    s->connecting = 1;
  } else {
    stream_close(a, s, errno);
  }
}

static void net_dns_answer(agent_t *a, uint32_t qid, const tp_field_t *data) {
  struct agent_net_s *net = a->net;
  if (data == NULL || data->len > TP_NET_DNS_MAX || qid == 0)
    return;
  for (int i = 0; i < NET_QUERIES_MAX; i++) {
    net_query_t *q = &net->queries[i];
    if (q->qid != qid)
      continue;
    sendto(net->lfd[L_DNS_UDP], data->val, data->len, MSG_DONTWAIT, (struct sockaddr *) &q->peer,
           sizeof(q->peer));
    q->qid = 0;
    return;
  }
}

void agent_net_frame(agent_t *a, const tp_frame_t *f) {
  int64_t sid64, v;
  uint32_t sid;
  net_stream_t *s;
  const tp_field_t *data;
  size_t data_off = 0; /* of a NET_DATA's bytes, those written at once */
  int n = tp_fields_parse(f->payload, f->len, a->fields, TP_FIELDS_MAX);

  if (n < 0 || a->net == NULL || tp_field_int(tp_fields_get(a->fields, n, TP_TAG_SID), &sid64) < 0 ||
      sid64 <= 0 || sid64 > UINT32_MAX) {
    agent_log("ignoring a malformed network frame (type %u)", f->type);
    return;
  }
  sid = (uint32_t) sid64;
  data = tp_fields_get(a->fields, n, TP_TAG_DATA);
  if (f->type == TP_MSG_NET_DNS) {
    net_dns_answer(a, sid, data);
    return;
  }
  if (f->type == TP_MSG_NET_CONNECT) {
    if (tp_field_int(tp_fields_get(a->fields, n, TP_TAG_PORT), &v) < 0)
      v = 0;
    net_connect(a, sid, v);
    return;
  }
  s = stream_find(a->net, sid);
  if (s == NULL) /* closed here meanwhile: its late frames are dropped */
    return;
  switch (f->type) {
  case TP_MSG_NET_GIVE:
    if (s->give != 0) {
      stream_close(a, s, EPROTO); /* asked twice */
      return;
    }
    s->give = 1;
    if (s->out_len == s->out_off)
      give_answer(a, s); /* else once the socket took what waits (stream_write) */
    break;
  case TP_MSG_NET_TAKEN:
    if (s->give != 2 || tp_field_int(tp_fields_get(a->fields, n, TP_TAG_SIZE), &v) < 0) {
      stream_close(a, s, EPROTO);
      return;
    }
    if (v == 1)
      stream_free(a->net, s); /* the host's now: no NET_CLOSE */
    else
      s->give = 0;
    break;
  case TP_MSG_NET_DATA:
    /* what the host may still have unacknowledged: at least what waits here
     * and what the box's socket took that is not acknowledged yet */
    if (data == NULL || s->eof_in || s->give != 0 ||
        data->len > TP_NET_WINDOW_DOWN - (s->out_len - s->out_off) - s->ack_owed) {
      stream_close(a, s, EPROTO); /* the host overran the window */
      return;
    }
    a->net->hint = data->len >= NET_SPLICE_MIN;
    if (s->out_len == s->out_off && !s->connecting && data->len > 0) {
      /* nothing queued: straight to the box's socket, what it takes acknowledged now */
      ssize_t w = write(s->fd, data->val, data->len);
      if (w > 0) {
        s->ack_owed += (size_t) w;
        data_off = (size_t) w;
      }
    }
    if (data_off == data->len)
      break; /* all of it is in the box's socket */
    if (s->out == NULL && (s->out = malloc(TP_NET_WINDOW_DOWN)) == NULL) {
      stream_close(a, s, ENOMEM);
      return;
    }
    if (s->out_off > 0) {
      memmove(s->out, s->out + s->out_off, s->out_len - s->out_off);
      s->out_len -= s->out_off;
      s->out_off = 0;
    }
    memcpy(s->out + s->out_len, data->val + data_off, data->len - data_off);
    s->out_len += data->len - data_off;
    break;
  case TP_MSG_NET_ACK:
    if (tp_field_int(tp_fields_get(a->fields, n, TP_TAG_SIZE), &v) < 0 || v < 0 ||
        (uint64_t) v > s->unacked) {
      stream_close(a, s, EPROTO);
      return;
    }
    s->unacked -= (size_t) v;
    break;
  case TP_MSG_NET_EOF:
    s->eof_in = 1;
    break;
  case TP_MSG_NET_CLOSE:
    stream_free(a->net, s);
    break;
  default: /* NET_OPEN comes from us only */
    stream_close(a, s, EPROTO);
    break;
  }
}

void agent_net_detach(agent_t *a) {
  if (a->net == NULL)
    return;
  a->net->sp_left = 0; /* the rest of a frame went with the channel */
  a->net->hint = 0;
  splice_pipe_close(a->net);
  for (int i = 0; i < TP_NET_STREAMS_MAX; i++)
    stream_free(a->net, &a->net->streams[i]);
  memset(a->net->queries, 0, sizeof(a->net->queries));
}
