/* tp_netrelay_t: relayed network streams between the agent's NET_* frames
 * and upstream TCP sockets (netrelay.h). */
#define _GNU_SOURCE /* splice, pipe2, F_SETPIPE_SZ */
#include "netrelay.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "frame.h"

typedef struct tp__nrs_s {
  struct tp__nrs_s *next;
  tp_netrelay_t *nr;
  uv_poll_t poll;       /* on fd: readable while the window has room, writable while
                           the box's bytes wait for the upstream's buffer */
  int fd;               /* the upstream socket (non-blocking), -1 once closed */
  int events;           /* what poll watches */
  uint32_t sid;
  int gone;             /* ended: waits for its handle's close callback */
  int box_eof;          /* the box sent NET_EOF */
  int up_eof;           /* the upstream ended */
  int eof_sent;         /* NET_EOF went to the box */
  int shut;             /* the upstream's write side is shut down */
  uint8_t *pend;        /* box -> upstream: pend[0..plen) not yet taken by the socket; */
  size_t plen, pcap;    /* pcap never changes once allocated */
  size_t head;          /* the first head bytes of pend are the daemon's: not acknowledged */
  uint8_t *batch;       /* upstream -> box: NET_DATA frames read in place, not yet on */
  size_t blen, bcap;    /* the channel; blen bytes of whole frames */
  uint8_t *down;        /* handed-over bytes owed to the box: down[doff..dlen) */
  size_t doff, dlen;
  uint32_t in_unacked;  /* the box's bytes received, not acknowledged */
  uint32_t out_unacked; /* bytes sent to the box, not acknowledged */
  uint64_t to_up, to_box;
  /* The box's socket itself (NET_GIVE, tp__nrs_adopt): */
  int asked;            /* NET_GIVE was sent (once a stream) */
  int giving;           /* NET_GIVE sent, no answer yet: nothing read upstream */
  int direct;           /* bfd is the box's socket: no frames, no windows from here on */
  int bfd;              /* -1 unless direct */
  int bevents;          /* what bpoll watches */
  int bshut;            /* bfd's write side is shut down (the upstream's end passed on) */
  int handles;          /* poll handles whose close callback is pending */
  uv_poll_t bpoll;      /* on bfd: readable while pend has room, writable while down waits */
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
  int pipe[2];          /* splice: upstream bytes pass through it onto the channel as page
                           references; empty between calls; -1 until first used */
  int nosplice;         /* the kernel or the channel refused a splice: reads from now on */
  uint8_t *spare;       /* TP__NR_HEAD + TP_NET_CHUNK bytes: what a splice could not put on
                           the channel goes there, then onto the channel's queue */
  int give;             /* streams' box sockets may be taken (tp_netrelay_give) */
};

static void tp__nr_maybe_free(tp_netrelay_t *nr) {
  if (!nr->released || nr->closing > 0 || nr->streams != NULL)
    return;
  free(nr->spare);
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
  if (--s->handles > 0)
    return;
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
  s->handles = s->direct ? 2 : 1;
  uv_close((uv_handle_t *) &s->poll, tp__nrs_close_cb); /* stops watching fd at once */
  close(s->fd);
  s->fd = -1;
  if (s->direct) { /* the agent forgot the stream when it gave its socket: no NET_CLOSE */
    uv_close((uv_handle_t *) &s->bpoll, tp__nrs_close_cb);
    close(s->bfd);
    s->bfd = -1;
    notify = 0;
  }
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
#define TP__NR_PIPE (256u * 1024u) /* the splice pipe: a chunk in pages of any alignment */
#define TP__NR_READS 16            /* reads per wake-up at most (a window is 12 chunks) */

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

static void tp__nrs_poll_cb(uv_poll_t *h, int status, int events);

static void tp__nrs_bpoll_cb(uv_poll_t *h, int status, int events);

/* Watches the upstream socket for what the stream wants: readable while
 * the window towards the box has room (and no handed-over bytes wait, and
 * no NET_GIVE its answer), writable while the box's bytes wait for the
 * socket's buffer.  A stream with the box's socket: the upstream readable
 * while nothing waits for the box's socket, which is watched readable
 * while pend has room and writable while bytes wait for it. */
static void tp__nrs_watch(tp__nrs_t *s) {
  int ev = 0, r;
  if (s->gone)
    return;
  if (s->direct) {
    int bev = 0;
    if (!s->box_eof && (s->pend == NULL || s->plen < s->pcap))
      bev |= UV_READABLE;
    if (s->dlen > s->doff)
      bev |= UV_WRITABLE;
    if (bev != s->bevents) {
      s->bevents = bev;
      if (bev == 0)
        uv_poll_stop(&s->bpoll);
      else if ((r = uv_poll_start(&s->bpoll, bev, tp__nrs_bpoll_cb)) < 0) {
        tp__nrs_end(s, -r, 1, 1);
        return;
      }
    }
    if (!s->up_eof && s->dlen == 0)
      ev |= UV_READABLE;
  } else if (!s->up_eof && s->dlen == 0 && s->out_unacked < s->nr->wdown && !s->giving) {
    ev |= UV_READABLE;
  }
  if (s->plen > 0)
    ev |= UV_WRITABLE;
  if (ev == s->events)
    return;
  s->events = ev;
  if (ev == 0)
    uv_poll_stop(&s->poll);
  else if ((r = uv_poll_start(&s->poll, ev, tp__nrs_poll_cb)) < 0)
    tp__nrs_end(s, -r, 1, 1);
}

/* Sends what the window allows of the handed-over bytes, the end once all
 * is sent, and reads upstream exactly while the window has room. */
static void tp__nrs_pump_box(tp__nrs_t *s) {
  if (s->gone || s->direct)
    return;
  /* while NET_GIVE waits for its answer nothing more goes to the agent:
   * what is owed then goes straight to the box's socket, or on in frames */
  while (!s->giving && s->doff < s->dlen && s->out_unacked < s->nr->wdown) {
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
  /* a download that filled its window: the box's socket itself is asked
   * for (tp__nrs_adopt), once; nothing is read upstream until the answer.
   * A stream that never fills it (a small or slow one) is never asked, so
   * it pays no round trip for it. */
  if (s->nr->give && !s->asked && s->out_unacked >= s->nr->wdown && !s->box_eof && !s->up_eof &&
      !s->eof_sent) {
    s->asked = s->giving = 1;
    tp__nr_send_sid(s->nr, TP_MSG_NET_GIVE, s->sid, 0, 0);
  }
  if (s->dlen == 0 && s->up_eof && !s->eof_sent) {
    s->eof_sent = 1;
    tp__nr_send_sid(s->nr, TP_MSG_NET_EOF, s->sid, 0, 0);
  }
  tp__nrs_watch(s);
}

/* The relay's pipe, made on first use: 0, or -1 (then the caller reads). */
static int tp__nr_pipe(tp_netrelay_t *nr) {
  if (nr->pipe[0] >= 0)
    return 0;
  if (pipe2(nr->pipe, O_NONBLOCK | O_CLOEXEC) < 0) {
    nr->pipe[0] = nr->pipe[1] = -1;
    return -1; /* out of fds: read, and try again for the next read */
  }
  /* room for a chunk whatever its pages (at least 16 of them, the
   * default); a pipe the user's pipe limits left smaller is not used */
  fcntl(nr->pipe[1], F_SETPIPE_SZ, (int) TP__NR_PIPE);
  if (fcntl(nr->pipe[1], F_GETPIPE_SZ) < (int) TP_NET_CHUNK) {
    close(nr->pipe[0]);
    close(nr->pipe[1]);
    nr->pipe[0] = nr->pipe[1] = -1;
    return -1;
  }
  return 0;
}

/* Whether the next read may be spliced onto the channel: the relay has
 * its pipe and a spare buffer, the channel is up and nothing waits in its
 * write queue (the frame head, written now, must come next on it). */
static int tp__nr_can_splice(tp_netrelay_t *nr) {
  if (nr->nosplice || nr->b == NULL || !tp_dbox_running(nr->b) || tp_dbox_queued(nr->b) > 0)
    return 0;
  if (tp__nr_pipe(nr) < 0)
    return 0;
  if (nr->spare == NULL && (nr->spare = malloc(TP__NR_HEAD + TP_NET_CHUNK)) == NULL)
    return 0;
  return 1;
}

/* Moves what the pipe holds of a frame (n bytes, of which the channel took
 * `put`) and what the channel did not take of its head (head[hput..)) into
 * the spare buffer, which goes onto the channel's write queue: the frame
 * stays whole and first in line.  A pipe that does not give back what it
 * holds cannot happen; if it did, the channel's frames would be cut, so
 * the channel is shut: the box goes down. */
static void tp__nrs_unsplice(tp__nrs_t *s, const uint8_t *head, size_t hput, size_t n,
                             size_t put) {
  tp_netrelay_t *nr = s->nr;
  tp_buf_t buf;
  size_t len = TP__NR_HEAD - hput;
  memcpy(nr->spare, head + hput, len);
  while (put < n) {
    ssize_t r = read(nr->pipe[0], nr->spare + len, n - put);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      uv_os_fd_t cfd;
      if (uv_fileno((uv_handle_t *) &nr->b->chan, &cfd) == 0)
        shutdown(cfd, SHUT_RDWR);
      close(nr->pipe[0]);
      close(nr->pipe[1]);
      nr->pipe[0] = nr->pipe[1] = -1;
      nr->nosplice = 1;
      return;
    }
    len += (size_t) r;
    put += (size_t) r;
  }
  tp_buf_init(&buf);
  buf.data = nr->spare;
  buf.len = len;
  buf.cap = TP__NR_HEAD + TP_NET_CHUNK;
  nr->spare = NULL;
  tp__nr_send(nr, &buf);
}

/* One read of at most room bytes, spliced: from the upstream socket into
 * the pipe, the frame head written to the channel, the bytes from the pipe
 * after it (page references: the daemon copies none of them).  What the
 * channel does not take at once goes through its queue (tp__nrs_unsplice).
 * Returns the bytes read, 0 at the upstream's end, -1 and errno, or -2
 * when splicing is not possible (then the caller reads). */
static ssize_t tp__nrs_splice(tp__nrs_t *s, size_t room) {
  tp_netrelay_t *nr = s->nr;
  uint8_t head[TP__NR_HEAD];
  uv_os_fd_t cfd;
  ssize_t n, w, k = 0;
  size_t put = 0;
  if (uv_fileno((uv_handle_t *) &nr->b->chan, &cfd) < 0)
    return -2;
  n = splice(s->fd, NULL, nr->pipe[1], NULL, room, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
  if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
    nr->nosplice = 1; /* not a socket splice takes from: read from now on */
    return -2;
  }
  if (n <= 0)
    return n;
  tp__nrs_head(s, head, (size_t) n);
  do
    w = send(cfd, head, TP__NR_HEAD, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w == TP__NR_HEAD) {
    while (put < (size_t) n) {
      k = splice(nr->pipe[0], NULL, cfd, NULL, (size_t) n - put, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0)
        break;
      put += (size_t) k;
    }
    if (k < 0 && (errno == EINVAL || errno == ENOSYS))
      nr->nosplice = 1; /* a channel splice cannot write to: the rest goes by the queue */
  }
  if (w < 0)
    w = 0; /* full (or broken: the channel's reader says so) */
  if ((size_t) w < TP__NR_HEAD || put < (size_t) n)
    tp__nrs_unsplice(s, head, (size_t) w, (size_t) n, put);
  return n;
}

/* One read of at most room bytes into the batch, after a frame head. */
static ssize_t tp__nrs_read_one(tp__nrs_t *s, size_t room) {
  ssize_t n;
  if (s->batch != NULL && s->bcap - s->blen < TP__NR_HEAD + TP_NET_CHUNK)
    tp__nrs_flush(s);
  if (s->batch == NULL) {
    if ((s->batch = malloc(TP__NR_BATCH)) == NULL) {
      errno = ENOMEM;
      return -1;
    }
    s->bcap = TP__NR_BATCH;
    s->blen = 0;
  }
  do
    n = read(s->fd, s->batch + s->blen + TP__NR_HEAD, room);
  while (n < 0 && errno == EINTR);
  if (n > 0) {
    tp__nrs_head(s, s->batch + s->blen, (size_t) n);
    s->blen += TP__NR_HEAD + (size_t) n;
  }
  return n;
}

/* Reads upstream while the window towards the box has room, until the
 * socket is drained (a short read) or TP__NR_READS reads: spliced onto the
 * channel while it is free, else framed in place in a batch that goes on
 * in one write per two chunks, or once the socket is drained.  Returns the
 * bytes read (the stream may have ended). */
static size_t tp__nrs_dread(tp__nrs_t *s);

static size_t tp__nrs_read(tp__nrs_t *s) {
  size_t got = 0;
  if (s->direct)
    return tp__nrs_dread(s);
  if (s->giving)
    return 0;
  for (int i = 0; i < TP__NR_READS && !s->gone; i++) {
    size_t room = s->nr->wdown - s->out_unacked;
    ssize_t n = -2;
    if (s->up_eof || s->dlen > 0 || room == 0)
      break;
    if (room > TP_NET_CHUNK)
      room = TP_NET_CHUNK;
    /* a batch being read is finished first: it goes on before any splice */
    if (s->blen == 0 && tp__nr_can_splice(s->nr))
      n = tp__nrs_splice(s, room);
    if (n == -2)
      n = tp__nrs_read_one(s, room);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        tp__nrs_end(s, errno, 1, 1);
      break;
    }
    if (n == 0) {
      tp__nrs_flush(s); /* the data before the end */
      s->up_eof = 1;
      break;
    }
    s->out_unacked += (uint32_t) n;
    s->to_box += (uint64_t) n;
    got += (size_t) n;
    if ((size_t) n < room)
      break; /* drained for now */
  }
  if (s->gone)
    return got; /* its NET_CLOSE is sent: nothing of it goes after */
  tp__nrs_flush(s);
  tp__nrs_pump_box(s); /* the end, if it came; watches for what the window allows */
  return got;
}

static void tp__nrs_pump_up(tp__nrs_t *s);
static void tp__nrs_dmaybe_done(tp__nrs_t *s);

/* The box ended its side and everything it sent is written: so does the
 * upstream connection. */
static void tp__nrs_maybe_shut(tp__nrs_t *s) {
  if (s->gone || !s->box_eof || s->plen > 0 || s->shut)
    return;
  s->shut = 1;
  if (shutdown(s->fd, SHUT_WR) < 0)
    tp__nrs_end(s, errno, 1, 1);
  else
    tp__nrs_dmaybe_done(s);
}

static void tp__nrs_poll_cb(uv_poll_t *h, int status, int events) {
  tp__nrs_t *s = h->data;
  size_t got = 0;
  if (s->gone)
    return;
  if (status < 0) { /* an error on the socket: libuv stopped watching it */
    s->events = 0;
    events = s->plen > 0 ? UV_WRITABLE : UV_READABLE; /* the call that reports it */
  }
  if (events & UV_WRITABLE)
    tp__nrs_pump_up(s);
  if (!s->gone && (events & UV_READABLE))
    got = tp__nrs_read(s);
  if (!s->gone && status < 0 && got == 0) { /* nothing said it: the error ends the stream */
    int e = 0;
    socklen_t len = sizeof(e);
    if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0 || e == 0)
      e = EIO;
    tp__nrs_end(s, e, 1, 1);
    return;
  }
  tp__nrs_watch(s);
}

/* Writes what is pending upstream, as much as the socket takes now; the
 * box's bytes are acknowledged once the socket took them. */
static void tp__nrs_pump_up(tp__nrs_t *s) {
  ssize_t w;
  size_t k, head;
  if (s->gone || s->plen == 0)
    return;
  do
    w = send(s->fd, s->pend, s->plen, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      tp__nrs_end(s, errno, 1, 1);
    else
      tp__nrs_watch(s);
    return;
  }
  k = (size_t) w;
  head = k < s->head ? k : s->head;
  s->head -= head;
  memmove(s->pend, s->pend + k, s->plen - k);
  s->plen -= k;
  k -= head; /* the box's bytes: acknowledged now they are gone on */
  if (k > 0 && s->direct) { /* read from the box's socket: nothing to acknowledge */
    s->in_unacked = 0;
    s->to_up += k;
  } else if (k > 0) {
    s->in_unacked -= (uint32_t) k;
    s->to_up += k;
    tp__nr_send_sid(s->nr, TP_MSG_NET_ACK, s->sid, TP_TAG_SIZE, (int64_t) k);
  }
  tp__nrs_maybe_shut(s);
  tp__nrs_watch(s);
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

/* ---- the box's socket itself (NET_GIVE) ----------------------------------------
 *
 * Once the agent gave a stream's box socket (a linux box: the agent is the
 * box's PID 1 and the daemon takes the descriptor from it by its pidfd),
 * the bytes move between the two sockets here: the upstream's spliced
 * through the relay's pipe into the box's socket (what that does not take
 * at once read back out of the pipe into down, which is written first),
 * the box's read into pend and written upstream.  No frames, no windows:
 * each direction is bounded by what waits (one pipe's worth towards the
 * box, pend towards the upstream) and nothing is read while it waits. */

/* Both directions ended: the stream is done. */
static void tp__nrs_dmaybe_done(tp__nrs_t *s) {
  if (s->gone || !s->direct)
    return;
  if (s->up_eof && s->dlen == 0 && !s->bshut) {
    s->bshut = 1;
    s->eof_sent = 1;
    if (shutdown(s->bfd, SHUT_WR) < 0) {
      tp__nrs_end(s, 0, 0, 1); /* the box's end is gone */
      return;
    }
  }
  if (s->bshut && s->box_eof && s->shut)
    tp__nrs_end(s, 0, 0, 1);
}

/* Keeps what the pipe holds (n bytes) in down, to be written to the box's
 * socket before anything more is read; a pipe that does not give back what
 * it holds is closed (splicing stops: the relay reads from then on). */
static void tp__nrs_dkeep(tp__nrs_t *s, size_t n) {
  tp_netrelay_t *nr = s->nr;
  size_t got = 0;
  if ((s->down = malloc(n)) == NULL) { /* the bytes go with the pipe; the next use makes one */
    close(nr->pipe[0]);
    close(nr->pipe[1]);
    nr->pipe[0] = nr->pipe[1] = -1;
    tp__nrs_end(s, ENOMEM, 0, 1);
    return;
  }
  while (got < n) {
    ssize_t r = read(nr->pipe[0], s->down + got, n - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      close(nr->pipe[0]);
      close(nr->pipe[1]);
      nr->pipe[0] = nr->pipe[1] = -1;
      nr->nosplice = 1;
      if (!s->gone)
        tp__nrs_end(s, EIO, 0, 1);
      return;
    }
    got += (size_t) r;
  }
  s->doff = 0;
  s->dlen = n;
}

/* Writes what waits in down to the box's socket. */
static void tp__nrs_dwrite(tp__nrs_t *s) {
  while (s->doff < s->dlen) {
    ssize_t w = send(s->bfd, s->down + s->doff, s->dlen - s->doff, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (w < 0) {
      tp__nrs_end(s, 0, 0, 1); /* the box's end is gone, as the agent's NET_CLOSE would say */
      return;
    }
    s->doff += (size_t) w;
    s->to_box += (uint64_t) w;
  }
  free(s->down);
  s->down = NULL;
  s->doff = s->dlen = 0;
  tp__nrs_dmaybe_done(s);
}

/* Moves what the upstream has to the box's socket: spliced through the
 * pipe, or (where the kernel refuses) read into the spare buffer. */
static size_t tp__nrs_dread(tp__nrs_t *s) {
  tp_netrelay_t *nr = s->nr;
  size_t got = 0;
  for (int i = 0; i < TP__NR_READS && !s->gone && s->dlen == 0 && !s->up_eof; i++) {
    ssize_t n = -2, k = 0;
    size_t put = 0;
    int viapipe = 0;
    if (!nr->nosplice && tp__nr_pipe(nr) == 0) {
      n = splice(s->fd, NULL, nr->pipe[1], NULL, TP__NR_PIPE, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n < 0 && (errno == EINVAL || errno == ENOSYS)) {
        nr->nosplice = 1;
        n = -2;
      }
      viapipe = n > 0;
    }
    if (n == -2) {
      if (nr->spare == NULL && (nr->spare = malloc(TP__NR_HEAD + TP_NET_CHUNK)) == NULL) {
        tp__nrs_end(s, ENOMEM, 0, 1);
        break;
      }
      do
        n = read(s->fd, nr->spare, TP_NET_CHUNK);
      while (n < 0 && errno == EINTR);
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        tp__nrs_end(s, errno, 0, 1);
      break;
    }
    if (n == 0) {
      s->up_eof = 1;
      break;
    }
    got += (size_t) n;
    while (put < (size_t) n) {
      if (viapipe)
        k = splice(nr->pipe[0], NULL, s->bfd, NULL, (size_t) n - put,
                   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      else
        k = send(s->bfd, nr->spare + put, (size_t) n - put, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0)
        break;
      put += (size_t) k;
    }
    s->to_box += put; /* what waits in down counts once written */
    if (put < (size_t) n && k < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
        errno != EINVAL && errno != ENOSYS) {
      if (viapipe)
        tp__nrs_dkeep(s, (size_t) n - put); /* empties the pipe */
      if (!s->gone)
        tp__nrs_end(s, 0, 0, 1); /* the box's end is gone */
      break;
    }
    if (put < (size_t) n) { /* the box's socket is full: the rest waits in down */
      if (viapipe) {
        tp__nrs_dkeep(s, (size_t) n - put);
      } else if ((s->down = malloc((size_t) n - put)) == NULL) {
        tp__nrs_end(s, ENOMEM, 0, 1);
      } else {
        memcpy(s->down, nr->spare + put, (size_t) n - put);
        s->doff = 0;
        s->dlen = (size_t) n - put;
      }
      break;
    }
  }
  tp__nrs_dmaybe_done(s);
  return got;
}

/* Reads what the box sent into pend and writes it upstream. */
static void tp__nrs_bread(tp__nrs_t *s) {
  ssize_t n;
  if (s->pend == NULL) {
    s->pcap = TP_NET_WINDOW + s->head;
    if ((s->pend = malloc(s->pcap)) == NULL) {
      tp__nrs_end(s, ENOMEM, 0, 1);
      return;
    }
  }
  if (s->plen >= s->pcap)
    return;
  do
    n = read(s->bfd, s->pend + s->plen, s->pcap - s->plen);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      tp__nrs_end(s, 0, 0, 1); /* the box's end is gone */
    return;
  }
  if (n == 0) {
    s->box_eof = 1;
    tp__nrs_maybe_shut(s);
    tp__nrs_dmaybe_done(s);
    return;
  }
  s->plen += (size_t) n;
  tp__nrs_pump_up(s);
}

static void tp__nrs_bpoll_cb(uv_poll_t *h, int status, int events) {
  tp__nrs_t *s = h->data;
  if (s->gone)
    return;
  if (status < 0) { /* an error on the box's socket: libuv stopped watching it */
    tp__nrs_end(s, 0, 0, 1);
    return;
  }
  if (events & UV_WRITABLE)
    tp__nrs_dwrite(s);
  if (!s->gone && (events & UV_READABLE))
    tp__nrs_bread(s);
  tp__nrs_watch(s);
}

/* Whether fd is what the agent may give: a connected TCP socket of the
 * box's network namespace on the agent's proxy or SOCKS5 port.  Anything
 * else the agent names (it may lie) is refused. */
static int tp__nr_box_sock_ok(const tp_netrelay_t *nr, int fd) {
  struct sockaddr_in sa;
  socklen_t len = sizeof(sa);
  struct stat st, ns;
  int v = 0, nsfd, ok;
  char path[64];
  socklen_t vl = sizeof(v);
  if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
    return 0;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &vl) < 0 || v != AF_INET)
    return 0;
  vl = sizeof(v);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &vl) < 0 || v != SOCK_STREAM)
    return 0;
  vl = sizeof(v);
  if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &vl) < 0 || v != IPPROTO_TCP)
    return 0;
  vl = sizeof(v);
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) < 0 || v != 0)
    return 0;
  if (getsockname(fd, (struct sockaddr *) &sa, &len) < 0 || len != sizeof(sa) ||
      sa.sin_addr.s_addr != htonl(INADDR_LOOPBACK) ||
      (ntohs(sa.sin_port) != TP_NET_HTTP_PORT && ntohs(sa.sin_port) != TP_NET_SOCKS_PORT))
    return 0;
  len = sizeof(sa);
  if (getpeername(fd, (struct sockaddr *) &sa, &len) < 0)
    return 0;
  if ((nsfd = ioctl(fd, SIOCGSKNS)) < 0)
    return 0;
  snprintf(path, sizeof(path), "/proc/%d/ns/net", (int) nr->b->box.pid);
  ok = fstat(nsfd, &st) == 0 && stat(path, &ns) == 0 && st.st_dev == ns.st_dev &&
       st.st_ino == ns.st_ino;
  close(nsfd);
  return ok;
}

/* The agent's answer to NET_GIVE: fdnum, its socket's number in the agent,
 * or -1 (declined).  The socket is taken, checked and watched (NET_TAKEN
 * 1), or the stream goes on in frames (NET_TAKEN 0 where the agent named
 * one). */
static void tp__nrs_adopt(tp__nrs_t *s, int64_t fdnum) {
  tp_netrelay_t *nr = s->nr;
  int fd = -1, r;
  s->giving = 0;
  if (fdnum < 0) {
    tp__nrs_pump_box(s); /* frames again, from what is owed */
    return;
  }
  if (fdnum <= INT32_MAX && nr->b->box.pidfd >= 0) {
    fd = (int) syscall(SYS_pidfd_getfd, nr->b->box.pidfd, (int) fdnum, 0);
    if (fd < 0 && (errno == EPERM || errno == ENOSYS))
      nr->give = 0; /* a daemon without CAP_SYS_PTRACE, an old kernel: not asked again */
  }
  if (fd >= 0 && !tp__nr_box_sock_ok(nr, fd)) {
    close(fd);
    fd = -1;
  }
  if (fd >= 0 && (r = uv_poll_init(nr->b->loop, &s->bpoll, fd)) < 0) {
    close(fd);
    fd = -1;
  }
  tp__nr_send_sid(nr, TP_MSG_NET_TAKEN, s->sid, TP_TAG_SIZE, fd >= 0);
  if (fd < 0) {
    tp__nrs_pump_box(s);
    return;
  }
  s->bpoll.data = s;
  s->bfd = fd;
  s->direct = 1;
  tp__nrs_maybe_shut(s);
  tp__nrs_dmaybe_done(s);
  tp__nrs_watch(s);
}

/* ---- frames from the agent ----------------------------------------------------- */

static int tp__nr_frame(tp_dbox_t *b, unsigned type, const tp_field_t *fs, int n) {
  tp_netrelay_t *nr = b->n_data;
  const tp_field_t *data;
  int64_t sid, v;
  tp__nrs_t *s;
  int own = type == TP_MSG_NET_GIVE || type == TP_MSG_NET_TAKEN; /* only C asks: never Lua's */
  if (type == TP_MSG_NET_DNS || type == TP_MSG_NET_CONNECT)
    return 0; /* query ids, and the host's own frame: the owner's */
  if (tp_field_int(tp_fields_get(fs, n, TP_TAG_SID), &sid) < 0 || sid <= 0 || sid > UINT32_MAX)
    return own;
  s = tp__nr_find(nr, (uint32_t) sid);
  if (s == NULL)
    return own; /* a late answer of a stream ended since: its NET_CLOSE told the agent */
  if (s->direct && type != TP_MSG_NET_ACK && type != TP_MSG_NET_CLOSE) {
    tp__nrs_end(s, EPROTO, 1, 1); /* the agent gave the stream away: it sends nothing of it */
    return 1;
  }
  switch (type) {
  case TP_MSG_NET_GIVE:
    if (!s->giving) {
      tp__nrs_end(s, EPROTO, 1, 1);
      return 1;
    }
    if (tp_field_int(tp_fields_get(fs, n, TP_TAG_FD), &v) < 0)
      v = -1; /* declined */
    tp__nrs_adopt(s, v < 0 ? -1 : v);
    return 1;
  case TP_MSG_NET_ACK:
    if (s->direct)
      return 1; /* what the agent owed before it gave the socket: nothing to send on */
    break;
  default:
    break;
  }
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
  if (nr->pipe[0] >= 0) {
    close(nr->pipe[0]);
    close(nr->pipe[1]);
    nr->pipe[0] = nr->pipe[1] = -1;
  }
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
  nr->pipe[0] = nr->pipe[1] = -1;
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
  /* the poll handle is in the loop only once its init succeeded (it makes fd non-blocking) */
  if ((r = uv_poll_init(nr->b->loop, &s->poll, t->fd)) < 0) {
    free(s->down);
    free(s);
    close(t->fd);
    return tp_error_set(err, -r, "network relay: %s", uv_strerror(r));
  }
  s->poll.data = s;
  s->fd = t->fd;
  s->nr = nr;
  s->sid = t->sid;
  s->next = nr->streams;
  nr->streams = s;
  nr->nstreams++;
  /* from here s is in the list: tp__nrs_end undoes everything */
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
  s->bfd = -1;
  tp__nrs_pump_up(s);
  tp__nrs_maybe_shut(s);
  tp__nrs_pump_box(s);
  return 0;
}

void tp_netrelay_give(tp_netrelay_t *nr, int on) {
  nr->give = on && nr->b != NULL && nr->b->be != NULL && strcmp(nr->b->be->name, "linux") == 0 &&
             nr->b->box.pidfd >= 0;
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
