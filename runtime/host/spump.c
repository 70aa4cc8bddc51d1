/* The client's end of a data connection (spump.h). */
#define _GNU_SOURCE /* splice */
#include "spump.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define TP__SPUMP_BUF (2u * 1024u * 1024u)  /* read buffer: a whole frame fits twice */
#define TP__SPUMP_READS 16                  /* reads per tp_spump_read, then back to the loop */
#define TP__SPUMP_CREDIT_AT (256u * 1024u)  /* credit owed that goes out before a batch ends */
#define TP__SPUMP_STOPPED 125               /* ECANCELED: what the daemon is told on a local failure */

enum { TP__SP_FREE = 0, TP__SP_SINK, TP__SP_SOURCE, TP__SP_DEAD };

typedef struct tp__spump_st_s {
  int mode;
  uint32_t sid;
  int fd;
  uint64_t limit;  /* sink: bytes it may still take; source: bytes it may still send */
  uint64_t credit; /* source: bytes the daemon lets it send */
  uint64_t owed;   /* sink: credit not given back yet */
  int ended;       /* source: its END is queued */
  int splice;      /* sink: fd is a blocking pipe, the payload is spliced into it */
} tp__spump_st_t;

struct tp_spump_s {
  int fd;
  int over;
  uint8_t *in; /* TP__SPUMP_BUF */
  size_t have;
  uint32_t cur_sid;  /* a sink's DATA frame whose payload is written as it comes */
  uint32_t cur_left; /* its bytes not read yet */
  uint8_t *out;
  size_t head, tail, cap;
  unsigned reuse; /* the next dead slot to take when none is free */
  tp__spump_st_t st[TP_SPUMP_STREAMS];
};

static uint32_t tp__get_u32(const uint8_t *b) {
  return (uint32_t) b[0] | ((uint32_t) b[1] << 8) | ((uint32_t) b[2] << 16) | ((uint32_t) b[3] << 24);
}

static tp__spump_st_t *tp__find(tp_spump_t *p, uint32_t sid) {
  if (sid == 0)
    return NULL;
  for (int i = 0; i < TP_SPUMP_STREAMS; i++)
    if (p->st[i].mode != TP__SP_FREE && p->st[i].sid == sid)
      return &p->st[i];
  return NULL;
}

static tp__spump_st_t *tp__slot(tp_spump_t *p, uint32_t sid, tp_error_t *err) {
  tp__spump_st_t *s = tp__find(p, sid);
  if (s != NULL && s->mode != TP__SP_DEAD) {
    tp_error_set(err, EBUSY, "stream %u has a pump already", sid);
    return NULL;
  }
  for (int i = 0; s == NULL && i < TP_SPUMP_STREAMS; i++)
    if (p->st[i].mode == TP__SP_FREE)
      s = &p->st[i];
  for (int i = 0; s == NULL && i < TP_SPUMP_STREAMS; i++) {
    unsigned k = (p->reuse + (unsigned) i) % TP_SPUMP_STREAMS;
    if (p->st[k].mode == TP__SP_DEAD) {
      s = &p->st[k];
      p->reuse = k + 1;
    }
  }
  if (s == NULL) {
    tp_error_set(err, EMFILE, "more than %d pumped streams", TP_SPUMP_STREAMS);
    return NULL;
  }
  memset(s, 0, sizeof(*s));
  s->sid = sid;
  s->fd = -1;
  return s;
}

/* Room for n more bytes at the queue's tail. */
static int tp__room(tp_spump_t *p, size_t n) {
  size_t ncap;
  uint8_t *nb;
  if (p->cap - p->tail >= n)
    return 0;
  if (p->head > 0) {
    memmove(p->out, p->out + p->head, p->tail - p->head);
    p->tail -= p->head;
    p->head = 0;
    if (p->cap - p->tail >= n)
      return 0;
  }
  ncap = p->cap ? p->cap : 65536;
  while (ncap - p->tail < n)
    ncap *= 2;
  nb = realloc(p->out, ncap);
  if (nb == NULL)
    return -1;
  p->out = nb;
  p->cap = ncap;
  return 0;
}

/* The connection is over: the caller hears it once, as an ERROR on sid 0. */
static void tp__over(tp_spump_t *p, tp_spump_cb cb, void *data, int e, const char *msg) {
  tp_sframe_t f;
  if (p->over)
    return;
  p->over = 1;
  memset(&f, 0, sizeof(f));
  f.type = TP_SF_ERROR;
  f.err = (uint32_t) e;
  f.msg = msg;
  f.msg_len = (uint32_t) strlen(msg);
  cb(data, &f, 1);
}

/* A sink or source failed here: the daemon gets an ERROR for the stream,
 * the caller the reason; what still comes for it is dropped. */
static void tp__local(tp_spump_t *p, tp__spump_st_t *s, tp_spump_cb cb, void *data, int e,
                      const char *what) {
  char msg[256], tell[300];
  tp_sframe_t f;
  snprintf(msg, sizeof(msg), "%s: %s", what, strerror(e));
  snprintf(tell, sizeof(tell), "the client stopped: %s", msg);
  s->mode = TP__SP_DEAD;
  s->owed = 0;
  if (tp__room(p, TP_SF_HDR + 4 + strlen(tell)) == 0)
    p->tail += tp_sframe_error(p->out + p->tail, s->sid, TP__SPUMP_STOPPED, tell);
  memset(&f, 0, sizeof(f));
  f.type = TP_SF_ERROR;
  f.sid = s->sid;
  f.err = (uint32_t) e;
  f.msg = msg;
  f.msg_len = (uint32_t) strlen(msg);
  cb(data, &f, 1);
}

/* Writes all of b to fd as a blocking write would, also when fd is
 * non-blocking (a pipe a parent made so): a full pipe waits here, which is
 * the flow control (no credit goes back meanwhile). */
static int tp__write_all(int fd, const uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd pf = { .fd = fd, .events = POLLOUT };
        if (poll(&pf, 1, -1) < 0 && errno != EINTR)
          return -errno;
        continue;
      }
      return -errno;
    }
    b += w;
    n -= (size_t) w;
  }
  return 0;
}

static void tp__sink_bytes(tp_spump_t *p, tp__spump_st_t *s, const uint8_t *b, size_t n,
                           tp_spump_cb cb, void *data) {
  int r;
  if (s->mode != TP__SP_SINK)
    return; /* dead: dropped */
  if (n > s->limit) {
    tp__local(p, s, cb, data, EFBIG, "more bytes than asked for");
    return;
  }
  r = tp__write_all(s->fd, b, n);
  if (r < 0) {
    tp__local(p, s, cb, data, -r, "write");
    return;
  }
  s->limit -= n;
  s->owed += n;
}

/* CREDIT for what the sinks wrote, once at least `at` bytes are owed. */
static void tp__credits(tp_spump_t *p, uint64_t at) {
  for (int i = 0; i < TP_SPUMP_STREAMS; i++) {
    tp__spump_st_t *s = &p->st[i];
    while (s->mode == TP__SP_SINK && s->owed > 0 && s->owed >= at) {
      uint32_t n = s->owed > TP_SF_CREDIT_MAX ? TP_SF_CREDIT_MAX : (uint32_t) s->owed;
      if (tp__room(p, TP_SF_HDR + 4) < 0)
        return; /* tried again after the next read */
      p->tail += tp_sframe_credit(p->out + p->tail, s->sid, n);
      s->owed -= n;
    }
  }
}

static void tp__frame(tp_spump_t *p, const tp_sframe_t *f, tp_spump_cb cb, void *data) {
  tp__spump_st_t *s;
  if (f->sid == 0) { /* only ERROR may use it: the daemon ends the connection */
    p->over = 1;
    cb(data, f, 0);
    return;
  }
  s = tp__find(p, f->sid);
  if (s == NULL) {
    cb(data, f, 0);
    return;
  }
  if (s->mode == TP__SP_DEAD) { /* crossed our ERROR on the wire */
    if (f->type == TP_SF_END || f->type == TP_SF_ERROR)
      s->mode = TP__SP_FREE;
    return;
  }
  switch (f->type) {
  case TP_SF_DATA:
    if (s->mode == TP__SP_SINK)
      tp__sink_bytes(p, s, f->payload, f->len, cb, data);
    break; /* DATA towards a source: not a direction the stream has */
  case TP_SF_OPEN:
    if (s->mode == TP__SP_SOURCE)
      s->credit += f->window;
    break;
  case TP_SF_CREDIT:
    if (s->mode == TP__SP_SOURCE)
      s->credit += f->credit;
    break;
  case TP_SF_END:
  case TP_SF_ERROR:
    s->mode = TP__SP_FREE;
    cb(data, f, 0);
    break;
  default:
    break;
  }
}

/* Handles the frames in the read buffer; keeps a partial one. */
static int tp__parse(tp_spump_t *p, tp_spump_cb cb, void *data) {
  size_t pos = 0;
  while (pos < p->have && !p->over) {
    tp_sframe_t f;
    const char *why = "bad frame";
    long r;
    if (p->cur_left > 0) {
      size_t n = p->have - pos < p->cur_left ? p->have - pos : p->cur_left;
      tp__spump_st_t *s = tp__find(p, p->cur_sid);
      if (s != NULL)
        tp__sink_bytes(p, s, p->in + pos, n, cb, data);
      pos += n;
      p->cur_left -= (uint32_t) n;
      continue;
    }
    r = tp_sframe_parse(p->in + pos, p->have - pos, &f, &why);
    if (r < 0) {
      char msg[128];
      snprintf(msg, sizeof(msg), "the daemon sent a bad frame (%s)", why);
      tp__over(p, cb, data, EPROTO, msg);
      return -1;
    }
    if (r == 0) {
      /* a sink's DATA whose header is whole (and was judged good): its
       * payload is written as it comes, not gathered first */
      if (p->have - pos >= TP_SF_HDR && p->in[pos + 5] == TP_SF_DATA) {
        tp__spump_st_t *s = tp__find(p, tp__get_u32(p->in + pos + 8));
        if (s != NULL && (s->mode == TP__SP_SINK || s->mode == TP__SP_DEAD)) {
          p->cur_sid = s->sid;
          p->cur_left = tp__get_u32(p->in + pos);
          pos += TP_SF_HDR;
          continue;
        }
      }
      break;
    }
    tp__frame(p, &f, cb, data);
    pos += (size_t) r;
  }
  if (pos > 0) {
    memmove(p->in, p->in + pos, p->have - pos);
    p->have -= pos;
  }
  return p->over ? -1 : 0;
}

static int tp__flush(tp_spump_t *p, tp_spump_cb cb, void *data) {
  while (p->head < p->tail) {
    ssize_t w = send(p->fd, p->out + p->head, p->tail - p->head, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      char msg[128];
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      snprintf(msg, sizeof(msg), "data connection: write: %s", strerror(errno));
      tp__over(p, cb, data, errno, msg);
      return -1;
    }
    p->head += (size_t) w;
  }
  if (p->head == p->tail)
    p->head = p->tail = 0;
  return 0;
}

/* DATA from the sources while they have credit and the queue has room. */
static void tp__fill(tp_spump_t *p, tp_spump_cb cb, void *data) {
  for (int i = 0; i < TP_SPUMP_STREAMS; i++) {
    tp__spump_st_t *s = &p->st[i];
    while (s->mode == TP__SP_SOURCE && !s->ended && p->tail - p->head < TP_SPUMP_QUEUE) {
      size_t n;
      ssize_t r;
      if (s->limit == 0) {
        r = 0;
      } else {
        if (s->credit == 0)
          break;
        n = TP_SF_DATA_MAX;
        if (s->credit < n)
          n = (size_t) s->credit;
        if (s->limit < n)
          n = (size_t) s->limit;
        if (tp__room(p, TP_SF_HDR + n) < 0) {
          tp__local(p, s, cb, data, ENOMEM, "send queue");
          break;
        }
        r = read(s->fd, p->out + p->tail + TP_SF_HDR, n);
        if (r < 0) {
          if (errno == EINTR)
            continue;
          tp__local(p, s, cb, data, errno, "read");
          break;
        }
      }
      if (r == 0) {
        if (tp__room(p, TP_SF_HDR) < 0) {
          tp__local(p, s, cb, data, ENOMEM, "send queue");
          break;
        }
        p->tail += tp_sframe_end(p->out + p->tail, s->sid, 0, 0);
        s->ended = 1;
        break;
      }
      tp_sframe_header(p->out + p->tail, TP_SF_DATA, s->sid, (uint32_t) r);
      p->tail += TP_SF_HDR + (size_t) r;
      s->credit -= (uint64_t) r;
      s->limit -= (uint64_t) r;
    }
  }
}

/* The process's first pump at a time lives in .bss: a `tupper exec` makes
 * one, and from malloc its 2 MiB buffer was a mapping made and unmapped
 * each command (page-table work a virtualised host pays dearly for); in
 * .bss only the pages a command's frames touch are ever mapped.  Pumps are
 * made and freed on one thread (the C client's, the Lua CLI's). */
static struct tp_spump_s tp__spump_first;
static uint8_t tp__spump_first_in[TP__SPUMP_BUF];
static int tp__spump_first_taken;

tp_spump_t *tp_spump_new(int fd, const uint8_t *pre, size_t plen, tp_error_t *err) {
  tp_spump_t *p;
  int fl;
  if (plen > TP__SPUMP_BUF) {
    tp_error_set(err, EINVAL, "data connection: %zu bytes before the pump", plen);
    return NULL;
  }
  fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    tp_error_errno(err, errno, "data connection: fcntl");
    return NULL;
  }
  if (!tp__spump_first_taken) {
    tp__spump_first_taken = 1;
    p = &tp__spump_first;
    memset(p, 0, sizeof(*p));
    p->in = tp__spump_first_in;
  } else if ((p = calloc(1, sizeof(*p))) == NULL || (p->in = malloc(TP__SPUMP_BUF)) == NULL) {
    free(p);
    tp_error_set(err, ENOMEM, "data connection: out of memory");
    return NULL;
  }
  if (plen > 0)
    memcpy(p->in, pre, plen);
  p->have = plen;
  p->fd = fd;
  return p;
}

void tp_spump_free(tp_spump_t *p) {
  if (p == NULL)
    return;
  if (p->fd >= 0)
    close(p->fd);
  free(p->out);
  if (p == &tp__spump_first) {
    tp__spump_first_taken = 0;
    return;
  }
  free(p->in);
  free(p);
}

int tp_spump_sink(tp_spump_t *p, uint32_t sid, int fd, uint64_t limit, tp_error_t *err) {
  tp__spump_st_t *s;
  if (sid == 0 || fd < 0)
    return tp_error_set(err, EINVAL, "bad stream id or fd");
  s = tp__slot(p, sid, err);
  if (s == NULL)
    return -1;
  s->mode = TP__SP_SINK;
  s->fd = fd;
  s->limit = limit;
  {
    struct stat sb;
    int fl = fcntl(fd, F_GETFL);
    /* a non-blocking pipe would make splice's EAGAIN ambiguous: written instead */
    s->splice = fstat(fd, &sb) == 0 && S_ISFIFO(sb.st_mode) && fl >= 0 && !(fl & O_NONBLOCK);
    /* a pipe that holds a frame: one wakeup of its reader a frame instead
     * of sixteen (best effort: the kernel's pipe-max-size bounds it) */
    if (s->splice && fcntl(fd, F_GETPIPE_SZ) < (int) TP_SF_DATA_MAX)
      (void) fcntl(fd, F_SETPIPE_SZ, (int) TP_SF_DATA_MAX);
  }
  return 0;
}

int tp_spump_source(tp_spump_t *p, uint32_t sid, int fd, uint64_t credit, uint64_t length,
                    tp_error_t *err) {
  tp__spump_st_t *s;
  struct stat sb;
  if (sid == 0 || fd < 0)
    return tp_error_set(err, EINVAL, "bad stream id or fd");
  if (fstat(fd, &sb) < 0)
    return tp_error_errno(err, errno, "fstat");
  if (!S_ISREG(sb.st_mode))
    return tp_error_set(err, EINVAL, "a pump reads regular files only");
  s = tp__slot(p, sid, err);
  if (s == NULL)
    return -1;
  s->mode = TP__SP_SOURCE;
  s->fd = fd;
  s->credit = credit;
  s->limit = length;
  return 0;
}

void tp_spump_drop(tp_spump_t *p, uint32_t sid) {
  tp__spump_st_t *s = tp__find(p, sid);
  if (s != NULL) {
    s->mode = TP__SP_DEAD;
    s->owed = 0;
  }
}

int tp_spump_send(tp_spump_t *p, const void *bytes, size_t n, tp_error_t *err) {
  if (p->over)
    return tp_error_set(err, ECONNRESET, "data connection closed");
  if (tp__room(p, n) < 0)
    return tp_error_set(err, ENOMEM, "data connection: out of memory");
  memcpy(p->out + p->tail, bytes, n);
  p->tail += n;
  return 0;
}

static int tp__splicing(const tp_spump_t *p) {
  for (int i = 0; i < TP_SPUMP_STREAMS; i++)
    if (p->st[i].mode == TP__SP_SINK && p->st[i].splice)
      return 1;
  return 0;
}

/* The payload of the current sink DATA frame from the socket into its pipe
 * without a copy through here.  1: progress, 2: the socket has no more now,
 * 0: not a spliced sink (read it), -1: the connection is over. */
/* A read of the connection that failed (r < 0, errno) or found its end
 * (r == 0): the connection is over.  Returns -1. */
static int tp__lost(tp_spump_t *p, tp_spump_cb cb, void *data, ssize_t r) {
  char msg[128];
  int e = errno;
  if (r == 0) {
    tp__over(p, cb, data, ECONNRESET, "the daemon closed the data connection");
    return -1;
  }
  snprintf(msg, sizeof(msg), "data connection: read: %s", strerror(e));
  tp__over(p, cb, data, e, msg);
  return -1;
}

static int tp__splice(tp_spump_t *p, tp_spump_cb cb, void *data) {
  tp__spump_st_t *s = tp__find(p, p->cur_sid);
  ssize_t r;
  if (s == NULL || s->mode != TP__SP_SINK || !s->splice)
    return 0;
  if (p->cur_left > s->limit) {
    tp__local(p, s, cb, data, EFBIG, "more bytes than asked for");
    return 0; /* the rest is read and dropped */
  }
  r = splice(p->fd, NULL, s->fd, NULL, p->cur_left, SPLICE_F_MOVE);
  if (r < 0) {
    if (errno == EINTR)
      return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return 2;
    if (errno == EPIPE || errno == EBADF || errno == EINVAL || errno == ENOSPC || errno == EIO) {
      tp__local(p, s, cb, data, errno, "write");
      return 0;
    }
    return tp__lost(p, cb, data, r);
  }
  if (r == 0)
    return tp__lost(p, cb, data, r);
  p->cur_left -= (uint32_t) r;
  s->limit -= (uint64_t) r;
  s->owed += (uint64_t) r;
  tp__credits(p, TP__SPUMP_CREDIT_AT);
  if (p->tail - p->head >= TP_SF_HDR + 4 && tp__flush(p, cb, data) < 0)
    return -1;
  return 1;
}

int tp_spump_read(tp_spump_t *p, tp_spump_cb cb, void *data) {
  if (p->over)
    return -1;
  if (p->have > 0 && tp__parse(p, cb, data) < 0) /* bytes from before the pump */
    return -1;
  for (int i = 0; i < TP__SPUMP_READS; i++) {
    size_t space = TP__SPUMP_BUF - p->have;
    ssize_t r;
    if (p->cur_left > 0 && p->have == 0) {
      int sr = tp__splice(p, cb, data);
      if (sr < 0)
        return -1;
      if (sr == 1)
        continue;
      if (sr == 2)
        break;
    }
    /* with a pipe to splice into, a frame's header is read alone, so that
     * a sink's payload stays in the socket for splice */
    if (tp__splicing(p) && p->cur_left == 0 && p->have < TP_SF_HDR)
      space = TP_SF_HDR - p->have;
    r = read(p->fd, p->in + p->have, space);
    if (r < 0) {
      if (errno == EINTR) {
        i--;
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
    }
    if (r <= 0)
      return tp__lost(p, cb, data, r);
    p->have += (size_t) r;
    if (tp__parse(p, cb, data) < 0)
      return -1;
    tp__credits(p, TP__SPUMP_CREDIT_AT);
    if (p->tail - p->head >= TP_SF_HDR + 4 && tp__flush(p, cb, data) < 0)
      return -1;
    if ((size_t) r < space)
      break; /* the socket had no more (most likely): save the read that says so */
  }
  tp__credits(p, 1);
  return tp_spump_write(p, cb, data);
}

int tp_spump_write(tp_spump_t *p, tp_spump_cb cb, void *data) {
  if (p->over)
    return -1;
  for (int round = 0; round < 2; round++) {
    tp__fill(p, cb, data);
    if (tp__flush(p, cb, data) < 0)
      return -1;
    if (p->tail > p->head)
      break; /* the socket is full: wait for it */
  }
  return p->over ? -1 : 0;
}

size_t tp_spump_queued(const tp_spump_t *p) {
  return p->tail - p->head;
}

int tp_spump_fd(const tp_spump_t *p) {
  return p->fd;
}
