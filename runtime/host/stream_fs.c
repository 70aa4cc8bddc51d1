/* File relays between a data connection and a box's agent (stream_fs.h). */
#define _GNU_SOURCE /* splice, F_SETPIPE_SZ */
#include "stream_fs.h"
#include "stream_int.h"
#include "job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A write stream's DATA frame of at least this many bytes goes to the agent
 * as one FS_WRITE straight from the connection's read buffer; smaller ones
 * are gathered into whole chunks first. */
#define TP__SFS_DIRECT_MIN (256u * 1024u)
/* What a client may send ahead on a write stream before its CREDIT: less
 * than the kernel holds of the daemon's end of the channel (it doubles the
 * SO_SNDBUF asked for, and charges each skb's overhead to it too: a window
 * of the whole buffer left each FS_WRITE of a lagging agent partly sent and
 * its rest copied into the daemon's queue, 65 MiB of 100 MiB into the
 * btrfs pool), so that a stream alone on the channel is never copied into
 * the daemon, and one whose agent lags holds at most this. */
#define TP__SFS_WRITE_WINDOW (3u * TP_DBOX_CHAN_SNDBUF / 2u)
/* What the write streams of one data connection may hold in the daemon in
 * all: a new write stream's window is what is left of it, at least
 * TP_SCONN_WINDOW_MIN (so 256 streams hold at most this plus 256 times
 * that minimum, not 256 full windows). */
#define TP__SFS_WRITE_BUDGET (64u * 1024u * 1024u)
/* Read streams that splice through a pipe of their own, daemon-wide; the
 * others read through a buffer.  A pipe of TP_SF_DATA_MAX counts against
 * its owner's pipe pages (fs.pipe-user-pages-soft, 64 MiB on most hosts):
 * past that soft limit the kernel gives every new pipe of the same user
 * (the daemon's root: any root process on the host) one page, so the
 * daemon keeps well under it. */
#define TP__SFD_PIPES_MAX 16
/* agent requests in flight per relay: a read stream asks for at most the
 * client's window (TP_SCONN_WINDOW_MAX) in chunks; a write stream has at
 * most its window in flight, in pieces of TP__SFS_DIRECT_MIN or more, plus
 * the last piece */
#define TP__SFS_INFLIGHT ((int) (TP_SCONN_WINDOW_MAX / TP_CHUNK_MAX) + 2)
_Static_assert(TP__SFS_WRITE_WINDOW / TP__SFS_DIRECT_MIN + 2 <= TP__SFS_INFLIGHT,
               "a write stream's requests in flight must fit TP__SFS_INFLIGHT");

static int tp__sfd_pipes; /* read streams' pipes open (TP__SFD_PIPES_MAX) */

/* Closes a read stream's pipe p (if open) and gives back its place. */
static void tp__sfd_pipe_close(int p[2]) {
  if (p[0] < 0)
    return;
  close(p[0]);
  close(p[1]);
  p[0] = p[1] = -1;
  tp__sfd_pipes--;
}

typedef struct tp__srelay_s {
  tp__sdc_stream_t hdr;               /* the connection's callbacks reach it through this */
  struct tp__srelay_s *bnext, *dnext; /* the box's relays, the connection's */
  tp_sdc_t *d;
  tp_dbox_t *b;
  uint32_t sid;
  int write;
  char *path;
  tp_sfs_spec_t spec;   /* path and groups point into this relay */
  uint8_t groups[4 * 64];
  uint64_t next_off;    /* read: the next offset to ask for; write: to write at */
  uint64_t end;         /* read: stop here */
  uint64_t done;        /* bytes delivered (read) or confirmed (write) */
  int eof;              /* read: a short reply came, ask for nothing more */
  int first;            /* write: the next request is the first (TRUNC) */
  int peer_end;         /* write: the client's END came */
  uint32_t ids[TP__SFS_INFLIGHT]; /* requests in flight, oldest first */
  uint32_t lens[TP__SFS_INFLIGHT]; /* bytes each asked for (read) or carried (write) */
  int inflight;
  uint64_t inflight_bytes;
  uint8_t *wbuf;        /* write: DATA gathered for the next FS_WRITE (TP_CHUNK_MAX, made
                           when first needed) */
  size_t wlen;
  /* A write into the box's file itself (tp_sdc_file_fd): fd >= 0.  The
   * client's bytes gather in pend while one job writes the last batch in
   * the thread pool; its credit goes back once written. */
  int fd;
  int append;
  int fdw;              /* a write into the box's file: counted in tp__sfd_live */
  struct tp__sfsjob_s *job; /* the write in the pool, or NULL */
  uint8_t *pend, *spare;
  size_t plen, pcap, spcap;
  size_t jcap;          /* read: the size of the job's buffer (it becomes spare) */
  int pipe[2];          /* read: the job splices the file into it, the connection out of it; -1 */
  size_t pipecap;       /* its capacity */
  int spl;              /* read: a frame of the pipe is going out */
  size_t splen;         /* its bytes */
  uint32_t win;         /* write: the window its OPEN gave (counted in d->write_windows) */
  int dxres;            /* write: the connection reads a payload into pend + plen (data_buf) */
} tp__srelay_t;

/* The window of a new write stream of d (TP__SFS_WRITE_BUDGET). */
static uint32_t tp__sfs_write_window(const tp_sdc_t *d) {
  uint64_t left = d->write_windows < TP__SFS_WRITE_BUDGET ? TP__SFS_WRITE_BUDGET - d->write_windows : 0;
  if (left > TP__SFS_WRITE_WINDOW)
    left = TP__SFS_WRITE_WINDOW;
  if (left < TP_SCONN_WINDOW_MIN)
    left = TP_SCONN_WINDOW_MIN;
  return (uint32_t) left;
}

/* One batch of a write stream's bytes, written by a pool thread. */
typedef struct tp__sfsjob_s {
  tp__srelay_t *r;      /* NULL once the relay is gone: the job then owns fd (and pipe) */
  int fd;
  int pipe[2];          /* read: splice into pipe[1] (-1: pread into buf) */
  int eof;              /* read: the file ended */
  int nosplice;         /* read: the file cannot be spliced; buf has its bytes */
  int append;
  uint8_t *buf;
  size_t len, cap;
  uint64_t off;
  int err;              /* errno of a failed write, 0 */
} tp__sfsjob_t;

void *tp_sdc_data(const tp_sdc_t *d) { return d->data; }
int tp_sdc_alive(const tp_sdc_t *d) { return d->c != NULL; }
size_t tp_sdc_streams(const tp_sdc_t *d) { return d->nrelays + d->nprocs; }
void tp_sdc_flush(tp_sdc_t *d) {
  if (d->c != NULL)
    tp_sconn_flush(d->c);
}

static void tp__sfd_gone(void);

/* Unlinks r from its box and connection and frees it. */
static void tp__srelay_free(tp__srelay_t *r) {
  tp__srelay_t **pp = (tp__srelay_t **) &r->b->c_data;
  while (*pp != NULL && *pp != r)
    pp = &(*pp)->bnext;
  if (*pp == r)
    *pp = r->bnext;
  pp = &r->d->relays;
  while (*pp != NULL && *pp != r)
    pp = &(*pp)->dnext;
  if (*pp == r) {
    *pp = r->dnext;
    r->d->nrelays--;
    r->d->write_windows -= r->win;
  }
  if (r->spl && r->d->c != NULL)
    tp_sconn_splice_forget(r->d->c, r); /* the frame still goes out whole */
  if (r->job != NULL) { /* the pool still works: the job closes the fd (and pipe) when done */
    r->job->r = NULL;
    r->job->pipe[0] = r->pipe[0];
    r->job->pipe[1] = r->pipe[1];
  } else {
    if (r->fd >= 0)
      close(r->fd);
    tp__sfd_pipe_close(r->pipe);
  }
  free(r->pend);
  free(r->spare);
  free(r->wbuf);
  free(r->path);
  if (r->fdw)
    tp__sfd_gone();
  free(r);
}

static void tp__srelay_fail(tp__srelay_t *r, int errnum, const char *msg) {
  if (r->d->c != NULL)
    tp_sconn_fail(r->d->c, r->sid, errnum, msg);
  tp__srelay_free(r);
}

/* Queues one agent request of r: FS_READ of len bytes at off, or FS_WRITE
 * of p[0..len) (written from p itself as far as the channel takes it). */
static int tp__srelay_request(tp__srelay_t *r, uint64_t off, const uint8_t *p, uint32_t len,
                              uint32_t flags) {
  tp_buf_t buf;
  tp_error_t err = { 0 };
  int rc;
  uint32_t id = r->b->c_next < TP_DBOX_CID_MIN || r->b->c_next >= TP_DBOX_PID_MIN ? TP_DBOX_CID_MIN
                                                                                : r->b->c_next;
  if (r->inflight >= TP__SFS_INFLIGHT)
    return -EAGAIN; /* the windows keep it below: a bug if reached */
  r->b->c_next = id + 1; /* TP_DBOX_PID_MIN and up are the process relays' */
  tp_buf_init(&buf);
  tp_frame_begin(&buf, r->write ? TP_MSG_FS_WRITE : TP_MSG_FS_READ, id);
  tp_frame_add_str(&buf, TP_TAG_PATH, r->path);
  tp_frame_add_int(&buf, TP_TAG_OFFSET, (int64_t) off);
  if (r->write) {
    tp_frame_add_int(&buf, TP_TAG_FLAGS, flags);
    tp_frame_add_int(&buf, TP_TAG_MODE, r->spec.mode);
  } else {
    tp_frame_add_int(&buf, TP_TAG_LENGTH, len);
  }
  if (r->spec.has_account) {
    tp_frame_add_int(&buf, TP_TAG_UID, r->spec.uid);
    tp_frame_add_int(&buf, TP_TAG_GID, r->spec.gid);
    if (r->spec.glen > 0)
      tp_frame_add(&buf, TP_TAG_GROUPS, r->groups, r->spec.glen);
  }
  if (r->write)
    tp_frame_add_head(&buf, TP_TAG_DATA, len); /* the last field: its bytes follow buf */
  if (tp_frame_end_tail(&buf, r->write ? len : 0) < 0) {
    tp_buf_free(&buf);
    return -ENOMEM;
  }
  rc = r->write ? tp_dbox_send_tail(r->b, &buf, p, len, &err) /* buf is freed */
                : tp_dbox_send(r->b, &buf, &err);
  if (rc < 0)
    return -(err.code ? err.code : EPIPE);
  r->ids[r->inflight] = id;
  r->lens[r->inflight] = len;
  r->inflight++;
  r->inflight_bytes += len;
  return 0;
}

/* Read: ask for as much as the client's credit has room for. */
static void tp__srelay_pump_read(tp__srelay_t *r) {
  while (!r->eof && r->inflight < TP__SFS_INFLIGHT && r->next_off < r->end && r->d->c != NULL) {
    uint64_t want = r->end - r->next_off, credit = tp_sconn_can_write(r->d->c, r->sid);
    int e;
    if (want > TP_CHUNK_MAX)
      want = TP_CHUNK_MAX;
    if (credit <= r->inflight_bytes)
      break; /* on_writable comes back here */
    if (want > credit - r->inflight_bytes)
      want = credit - r->inflight_bytes; /* a window under a chunk: smaller reads */
    if ((e = tp__srelay_request(r, r->next_off, NULL, (uint32_t) want, 0)) < 0) {
      tp__srelay_fail(r, -e, "sandbox channel: cannot send the read");
      return;
    }
    r->next_off += want;
  }
  if (r->inflight == 0 && (r->eof || r->next_off >= r->end) && r->d->c != NULL) {
    tp_sconn_end(r->d->c, r->sid, 1, r->done, NULL);
    tp__srelay_free(r);
  }
}

/* Write: one FS_WRITE of p[0..len) at the next offset. */
static int tp__srelay_write(tp__srelay_t *r, const uint8_t *p, size_t len) {
  uint32_t flags = r->spec.flags & (TP_F_WRITE_APPEND | TP_F_WRITE_PARENTS);
  int e;
  if (r->first)
    flags = r->spec.flags;
  if ((e = tp__srelay_request(r, r->next_off, p, (uint32_t) len, flags)) < 0) {
    tp__srelay_fail(r, -e, "sandbox channel: cannot send the write");
    return -1;
  }
  r->first = 0;
  r->next_off += len;
  return 0;
}

/* Write: send what is gathered (flush: even less than a chunk). */
static int tp__srelay_flush(tp__srelay_t *r) {
  size_t n = r->wlen;
  r->wlen = 0;
  return tp__srelay_write(r, r->wbuf, n);
}

static void tp__srelay_maybe_done(tp__srelay_t *r) {
  if (!r->peer_end || r->inflight > 0 || r->d->c == NULL)
    return;
  if (r->first || r->wlen > 0) { /* an empty file, or the last piece */
    tp__srelay_flush(r);
    return;
  }
  tp_sconn_end(r->d->c, r->sid, 1, r->done, NULL);
  tp__srelay_free(r);
}

/* The box's replies to C ids. */
static int tp__sfs_frame(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fs, int n,
                         tp_field_t *scratch, int scratch_max) {
  tp__srelay_t *r;
  (void) scratch, (void) scratch_max;
  for (r = b->c_data; r != NULL; r = r->bnext)
    if (r->inflight > 0 && r->ids[0] == id)
      break;
  if (r == NULL)
    return 0; /* a relay that ended: its late replies are dropped */
  uint32_t len = r->lens[0];
  memmove(r->ids, r->ids + 1, sizeof(r->ids[0]) * (size_t) (r->inflight - 1));
  memmove(r->lens, r->lens + 1, sizeof(r->lens[0]) * (size_t) (r->inflight - 1));
  r->inflight--;
  r->inflight_bytes -= len;
  if (type == TP_MSG_ERR) {
    int64_t e = EIO;
    const tp_field_t *m = tp_fields_get(fs, n, TP_TAG_MSG);
    char msg[TP_SF_MSG_MAX + 1] = "file error";
    tp_field_int(tp_fields_get(fs, n, TP_TAG_ERRNO), &e);
    if (m != NULL) {
      size_t k = m->len < TP_SF_MSG_MAX ? m->len : TP_SF_MSG_MAX;
      memcpy(msg, m->val, k);
      msg[k] = '\0';
    }
    tp__srelay_fail(r, e > 0 && e < 4096 ? (int) e : EIO, msg);
    return 0;
  }
  if (r->write) {
    r->done += len;
    if (r->d->c != NULL && len > 0 && tp_sconn_credit(r->d->c, r->sid, len, NULL) < 0) {
      tp__srelay_fail(r, EPROTO, "credit");
      return 0;
    }
    tp__srelay_maybe_done(r);
    return 0;
  }
  const tp_field_t *data = tp_fields_get(fs, n, TP_TAG_DATA);
  int64_t size = -1;
  tp_field_int(tp_fields_get(fs, n, TP_TAG_SIZE), &size);
  if (data == NULL || data->len > len)
    return -1; /* the agent answered more than was asked: a protocol error */
  if (data->len > 0 && r->d->c != NULL) {
    long k = tp_sconn_write(r->d->c, r->sid, data->val, data->len, NULL);
    if (k != (long) data->len) { /* the credit was reserved: cannot happen unless the stream is gone */
      tp__srelay_fail(r, EPROTO, "the data connection took less than its credit");
      return 0;
    }
  }
  r->done += data->len;
  if (data->len < len)
    r->eof = 1;
  if (size >= 0 && (uint64_t) size < r->end)
    r->end = (uint64_t) size; /* the size the agent saw: nothing is asked for past it */
  tp__srelay_pump_read(r);
  return 0;
}

static void tp__sfs_down(tp_dbox_t *b, const char *reason) {
  char msg[256];
  snprintf(msg, sizeof(msg), "sandbox went down: %s", reason);
  while (b->c_data != NULL)
    tp__srelay_fail(b->c_data, EIO, msg);
}

/* A file relay's stream callbacks. */
static void tp__sfs_on_data(void *sdata, uint32_t sid, const uint8_t *p, size_t n) {
  tp__srelay_t *r = sdata;
  (void) sid;
  while (n > 0) {
    size_t k = n < TP_CHUNK_MAX ? n : TP_CHUNK_MAX;
    if (r->wlen == 0 && k >= TP__SFS_DIRECT_MIN) { /* a large frame: as it is, no copy here */
      if (tp__srelay_write(r, p, k) < 0)
        return;
    } else {
      if (r->wbuf == NULL && (r->wbuf = malloc(TP_CHUNK_MAX)) == NULL) {
        tp__srelay_fail(r, ENOMEM, "out of memory");
        return;
      }
      if (k > TP_CHUNK_MAX - r->wlen)
        k = TP_CHUNK_MAX - r->wlen;
      memcpy(r->wbuf + r->wlen, p, k);
      r->wlen += k;
      if (r->wlen == TP_CHUNK_MAX && tp__srelay_flush(r) < 0)
        return;
    }
    p += k;
    n -= k;
  }
}

static void tp__sfs_on_end(void *sdata, uint32_t sid) {
  (void) sid;
  tp__srelay_t *r = sdata;
  r->peer_end = 1;
  tp__srelay_maybe_done(r);
}

static void tp__sfs_on_writable(void *sdata, uint32_t sid) {
  (void) sid;
  tp__srelay_pump_read(sdata);
}

static void tp__sfs_on_error(void *sdata, uint32_t sid, int err, const char *msg) {
  (void) sid, (void) err, (void) msg;
  tp__srelay_free(sdata); /* the stream is gone: nothing to tell the client */
}

static const tp__sdc_ops_t tp__sfs_ops = {
  tp__sfs_on_data, tp__sfs_on_end, tp__sfs_on_writable, tp__sfs_on_error, NULL,
};

/* The data connection's callbacks: to the relay in sdata. */
static void tp__sdc_on_data(tp_sconn_t *c, uint32_t sid, void *sdata, const uint8_t *p, size_t n) {
  (void) c;
  ((tp__sdc_stream_t *) sdata)->ops->on_data(sdata, sid, p, n);
}

static void tp__sdc_on_end(tp_sconn_t *c, uint32_t sid, void *sdata) {
  (void) c;
  ((tp__sdc_stream_t *) sdata)->ops->on_end(sdata, sid);
}

static void tp__sdc_on_writable(tp_sconn_t *c, uint32_t sid, void *sdata) {
  (void) c;
  ((tp__sdc_stream_t *) sdata)->ops->on_writable(sdata, sid);
}

static void tp__sdc_on_stream_error(tp_sconn_t *c, uint32_t sid, void *sdata, int err,
                                    const char *msg) {
  (void) c;
  ((tp__sdc_stream_t *) sdata)->ops->on_error(sdata, sid, err, msg);
}

static void tp__sdc_on_close(tp_sconn_t *c, int err, const char *reason) {
  tp_sdc_t *d = tp_sconn_data(c);
  d->c = NULL; /* freed by stream.c after this returns */
  if (d->on_close != NULL)
    d->on_close(d, err, reason);
}

static uint8_t *tp__sdc_data_buf(tp_sconn_t *c, uint32_t sid, void *sdata, size_t len) {
  const tp__sdc_ops_t *ops = ((tp__sdc_stream_t *) sdata)->ops;
  (void) c;
  return ops->data_buf != NULL ? ops->data_buf(sdata, sid, len) : NULL;
}

static const tp_sconn_cbs_t tp__sdc_cbs = {
  tp__sdc_on_data, tp__sdc_on_end, tp__sdc_on_writable, tp__sdc_on_stream_error, tp__sdc_on_close,
  tp__sdc_data_buf,
};

tp_sdc_t *tp_sdc_new(uv_loop_t *loop, int fd, uint32_t window, uint64_t idle_ms,
                     const void *preface, size_t plen, tp_sdc_close_cb on_close, void *data,
                     tp_error_t *err) {
  tp_sdc_t *d = calloc(1, sizeof(*d));
  if (d == NULL) {
    close(fd);
    tp_error_set(err, ENOMEM, "out of memory");
    return NULL;
  }
  d->data = data;
  d->on_close = on_close;
  d->c = tp_sconn_new(loop, fd, window, idle_ms, &tp__sdc_cbs, d, err);
  if (d->c == NULL) {
    free(d);
    return NULL;
  }
  if (plen > 0 && tp_sconn_preface(d->c, preface, plen, err) < 0) {
    tp_sconn_close(d->c);
    free(d);
    return NULL;
  }
  return d;
}

int tp_sdc_file(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int write, const tp_sfs_spec_t *spec,
                tp_error_t *err) {
  tp__srelay_t *r;
  if (d->c == NULL)
    return tp_error_set(err, EPIPE, "the data connection is closed");
  if (!tp_dbox_running(b))
    return tp_error_set(err, EPIPE, "sandbox is not running");
  if (spec->glen > sizeof(r->groups) || spec->glen % 4 != 0)
    return tp_error_set(err, EINVAL, "stream %u: bad groups", sid);
  if ((r = calloc(1, sizeof(*r))) == NULL || (r->path = strdup(spec->path)) == NULL) {
    if (r != NULL)
      free(r->path);
    free(r);
    return tp_error_set(err, ENOMEM, "out of memory");
  }
  r->hdr.ops = &tp__sfs_ops;
  r->fd = -1;
  r->pipe[0] = r->pipe[1] = -1;
  r->spec = *spec;
  r->spec.path = r->path;
  if (spec->glen)
    memcpy(r->groups, spec->groups, spec->glen);
  r->d = d;
  r->b = b;
  r->sid = sid;
  r->write = write;
  r->next_off = spec->offset;
  r->end = write || spec->length > UINT64_MAX - spec->offset ? UINT64_MAX : spec->offset + spec->length;
  r->first = 1;
  r->win = write ? tp__sfs_write_window(d) : 0;
  if (tp_sconn_open(d->c, sid, write ? TP_SK_FILE_WRITE : TP_SK_FILE_READ, r->win, 1, r, err) < 0) {
    free(r->path);
    free(r);
    return -1;
  }
  r->bnext = b->c_data;
  b->c_data = r;
  b->c_frame = tp__sfs_frame;
  b->c_down = tp__sfs_down;
  r->dnext = d->relays;
  d->relays = r;
  d->nrelays++;
  d->write_windows += r->win;
  if (!write)
    tp__srelay_pump_read(r);
  return 0;
}

/* ---- a write into the box's file itself (tp_sdc_file_fd) ------------------------- */

static void tp__sfd_start(tp__srelay_t *r);

/* Buffers of written batches kept for the next ones, of any write stream
 * into a box's file: a fresh buffer's pages fault in again (a fifth of the
 * daemon's CPU in a 100 MiB write).  At most TP__SFD_KEEP of them, and
 * none once no such stream is live, so an idle daemon keeps nothing and a
 * stream waiting for its client holds no buffer it does not need. */
#define TP__SFD_KEEP 2
static struct {
  uint8_t *buf;
  size_t cap;
} tp__sfd_kept[TP__SFD_KEEP];
static int tp__sfd_nkept, tp__sfd_live; /* live: write streams into a box's file */

static void tp__sfd_put(uint8_t *buf, size_t cap) {
  if (buf != NULL && tp__sfd_live > 0 && tp__sfd_nkept < TP__SFD_KEEP) {
    tp__sfd_kept[tp__sfd_nkept].buf = buf;
    tp__sfd_kept[tp__sfd_nkept++].cap = cap;
  } else {
    free(buf);
  }
}

static uint8_t *tp__sfd_get(size_t *cap) {
  if (tp__sfd_nkept == 0) {
    *cap = 0;
    return NULL;
  }
  tp__sfd_nkept--;
  *cap = tp__sfd_kept[tp__sfd_nkept].cap;
  return tp__sfd_kept[tp__sfd_nkept].buf;
}

/* A write stream into a box's file ends: the last one frees what is kept. */
static void tp__sfd_gone(void) {
  if (--tp__sfd_live > 0)
    return;
  while (tp__sfd_nkept > 0)
    free(tp__sfd_kept[--tp__sfd_nkept].buf);
}

static void tp__sfd_work(void *data) {
  tp__sfsjob_t *j = data;
  size_t done = 0;
  while (done < j->len) {
    ssize_t n = j->append ? write(j->fd, j->buf + done, j->len - done)
                          : pwrite(j->fd, j->buf + done, j->len - done, (off_t) (j->off + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      j->err = n < 0 ? errno : EIO;
      return;
    }
    done += (size_t) n;
  }
}

static void tp__sfd_maybe_done(tp__srelay_t *r) {
  if (!r->peer_end || r->job != NULL || r->plen > 0 || r->d->c == NULL)
    return;
  tp_sconn_end(r->d->c, r->sid, 1, r->done, NULL);
  tp__srelay_free(r);
}

static void tp__sfd_after(void *data, int status) {
  tp__sfsjob_t *j = data;
  tp__srelay_t *r = j->r;
  if (r == NULL) { /* the relay went while this ran */
    close(j->fd);
    free(j->buf);
    free(j);
    return;
  }
  r->job = NULL;
  if (status != 0 || j->err != 0) {
    char msg[TP_SF_MSG_MAX + 1];
    int e = status != 0 ? ECANCELED : j->err;
    snprintf(msg, sizeof(msg), "write '%s': %s", r->path, strerror(e));
    free(j->buf);
    free(j);
    tp__srelay_fail(r, e, msg);
    return;
  }
  r->done += j->len;
  r->next_off += j->len;
  tp__sfd_put(j->buf, j->cap); /* for the next batch: a fresh buffer's pages fault in again */
  if (r->d->c != NULL && tp_sconn_credit(r->d->c, r->sid, (uint32_t) j->len, NULL) < 0) {
    free(j);
    tp__srelay_fail(r, EPROTO, "credit");
    return;
  }
  free(j);
  if (r->dxres)
    return; /* pend is being read into: its on_data starts the next batch */
  if (r->plen > 0)
    tp__sfd_start(r);
  else
    tp__sfd_maybe_done(r);
}

/* The pending bytes go to a pool thread (one job at a time: the order of
 * an appending stream's writes is kept).  As a long job (job.h): a box's
 * disk may be slow, and however many streams wait on theirs, half of the
 * pool stays for every client's box work. */
static void tp__sfd_start(tp__srelay_t *r) {
  tp__sfsjob_t *j = calloc(1, sizeof(*j));
  int rc;
  if (j == NULL) {
    tp__srelay_fail(r, ENOMEM, "out of memory");
    return;
  }
  j->r = r;
  j->fd = r->fd;
  j->pipe[0] = j->pipe[1] = -1;
  j->append = r->append;
  j->buf = r->pend;
  j->cap = r->pcap;
  j->len = r->plen;
  j->off = r->next_off;
  r->pend = NULL; /* the next bytes take a kept buffer (tp__sfd_on_data) */
  r->pcap = 0;
  r->plen = 0;
  r->job = j;
  if ((rc = tp_job_queue_long(r->b->loop, tp__sfd_work, tp__sfd_after, j)) < 0) {
    r->job = NULL;
    free(j->buf);
    free(j);
    tp__srelay_fail(r, -rc, "cannot queue the write");
  }
}

/* Room in pend for n more bytes; -1: out of memory. */
static int tp__sfd_room(tp__srelay_t *r, size_t n) {
  if (r->pend == NULL)
    r->pend = tp__sfd_get(&r->pcap);
  if (r->plen + n > r->pcap) {
    size_t cap = r->pcap ? r->pcap : TP_CHUNK_MAX;
    uint8_t *nb;
    while (cap < r->plen + n)
      cap *= 2;
    if (cap > TP__SFS_WRITE_WINDOW)
      cap = TP__SFS_WRITE_WINDOW;
    if ((nb = realloc(r->pend, cap)) == NULL)
      return -1;
    r->pend = nb;
    r->pcap = cap;
  }
  return 0;
}

/* The connection reads a large DATA payload straight into the next batch
 * (no copy on the loop); pend is neither moved nor handed to a job until
 * it is there (tp__sfd_on_data), or the stream is over. */
static uint8_t *tp__sfd_data_buf(void *sdata, uint32_t sid, size_t n) {
  tp__srelay_t *r = sdata;
  (void) sid;
  if (r->dxres || r->plen + n > r->win || tp__sfd_room(r, n) < 0)
    return NULL; /* the copy's path then tells what is wrong */
  r->dxres = 1;
  return r->pend + r->plen;
}

static void tp__sfd_on_data(void *sdata, uint32_t sid, const uint8_t *p, size_t n) {
  tp__srelay_t *r = sdata;
  (void) sid;
  if (r->dxres) { /* in place (tp__sfd_data_buf): checked and made room for there */
    r->dxres = 0;
    if (p != r->pend + r->plen) {
      tp__srelay_fail(r, EIO, "a payload not where its room was");
      return;
    }
  } else {
    if (n == 0)
      return;
    if (r->plen + n > r->win) { /* the client's credit bounds it: a client that overran */
      tp__srelay_fail(r, EPROTO, "more than the window");
      return;
    }
    if (tp__sfd_room(r, n) < 0) {
      tp__srelay_fail(r, ENOMEM, "out of memory");
      return;
    }
    memcpy(r->pend + r->plen, p, n);
  }
  r->plen += n;
  if (r->job == NULL)
    tp__sfd_start(r);
}

static void tp__sfd_on_end(void *sdata, uint32_t sid) {
  tp__srelay_t *r = sdata;
  (void) sid;
  r->peer_end = 1;
  tp__sfd_maybe_done(r);
}

static const tp__sdc_ops_t tp__sfd_ops = {
  tp__sfd_on_data, tp__sfd_on_end, tp__sfs_on_writable, tp__sfs_on_error, tp__sfd_data_buf,
};

/* A relay of the box's file fd (opened by its agent, for acc: O_WRONLY or
 * O_RDONLY) as stream sid of d, its OPEN sent with window win and linked
 * to b and d; or NULL (err).  The caller sets what is its own before any
 * frame of the client can come (none comes before the loop turns). */
static tp__srelay_t *tp__sfd_new(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int fd, const char *path, int acc,
                                 const tp__sdc_ops_t *ops, uint64_t offset, tp_error_t *err) {
  tp__srelay_t *r;
  struct stat st;
  if (d->c == NULL)
    return tp_error_set(err, EPIPE, "the data connection is closed"), NULL;
  if (!tp_dbox_running(b))
    return tp_error_set(err, EPIPE, "sandbox is not running"), NULL;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (fcntl(fd, F_GETFL) & O_ACCMODE) != acc)
    return tp_error_set(err, EINVAL, "stream %u: not a regular file open for %s", sid,
                        acc == O_WRONLY ? "writing" : "reading"), NULL;
  if ((r = calloc(1, sizeof(*r))) == NULL || (r->path = strdup(path)) == NULL) {
    if (r != NULL)
      free(r->path);
    free(r);
    return tp_error_set(err, ENOMEM, "out of memory"), NULL;
  }
  if ((r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
    int e = errno;
    free(r->path);
    free(r);
    return tp_error_errno(err, e, "stream %u: dup", sid), NULL;
  }
  r->hdr.ops = ops;
  r->pipe[0] = r->pipe[1] = -1;
  r->spec.path = r->path;
  r->d = d;
  r->b = b;
  r->sid = sid;
  r->write = acc == O_WRONLY;
  r->next_off = offset;
  r->end = (uint64_t) st.st_size; /* a read's: the size as opened, nothing is asked for past it */
  r->win = r->write ? tp__sfs_write_window(d) : 0;
  if (tp_sconn_open(d->c, sid, r->write ? TP_SK_FILE_WRITE : TP_SK_FILE_READ, r->win, 1, r, err) < 0) {
    close(r->fd);
    free(r->path);
    free(r);
    return NULL;
  }
  r->bnext = b->c_data;
  b->c_data = r;
  b->c_frame = tp__sfs_frame;
  b->c_down = tp__sfs_down;
  r->dnext = d->relays;
  d->relays = r;
  d->nrelays++;
  d->write_windows += r->win;
  return r;
}

int tp_sdc_file_fd(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int fd, const char *path, uint64_t offset,
                   int append, tp_error_t *err) {
  tp__srelay_t *r = tp__sfd_new(d, b, sid, fd, path, O_WRONLY, &tp__sfd_ops, offset, err);
  if (r == NULL)
    return -1;
  r->fdw = 1;
  tp__sfd_live++;
  r->append = append;
  r->end = UINT64_MAX;
  return 0;
}

/* ---- a read of the box's file itself (tp_sdc_file_fd_read) ------------------------ */

#define TP__SFD_READ_MAX (2u * TP_CHUNK_MAX) /* bytes one read job asks for */

static void tp__sfdr_pump(tp__srelay_t *r);
static int tp__sfdr_queue(tp__srelay_t *r, uint64_t pending);

static void tp__sfdr_work(void *data) {
  tp__sfsjob_t *j = data;
  size_t got = 0;
  /* into the pipe: the page cache's pages are lent, not copied (the
   * connection splices them on); a full pipe (an offset that is not a
   * page's start fills its buffers partly) ends this job short */
  while (j->pipe[1] >= 0 && got < j->cap) {
    loff_t o = (loff_t) (j->off + got);
    ssize_t n = splice(j->fd, &o, j->pipe[1], NULL, j->cap - got, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && got == 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
      j->nosplice = 1; /* a file without splice_read: read below */
      break;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && got > 0)
      break;
    if (n < 0) {
      j->err = errno == EAGAIN ? EIO : errno;
      return;
    }
    if (n == 0) {
      j->eof = 1;
      break;
    }
    got += (size_t) n;
  }
  if (j->pipe[1] >= 0 && !j->nosplice) {
    j->len = got;
    return;
  }
  if (j->buf == NULL && (j->buf = malloc(j->cap)) == NULL) {
    j->err = ENOMEM;
    return;
  }
  while (got < j->cap) {
    ssize_t n = pread(j->fd, j->buf + got, j->cap - got, (off_t) (j->off + got));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      j->err = errno;
      break;
    }
    if (n == 0) {
      j->eof = 1;
      break;
    }
    got += (size_t) n;
  }
  j->len = got;
}

/* The pipe's frame is out. */
static void tp__sfdr_spliced(void *arg, int err) {
  tp__srelay_t *r = arg;
  (void) err; /* 0: a failed connection does not call */
  r->spl = 0;
  r->done += r->splen;
  tp__sfdr_pump(r);
}

static void tp__sfdr_after(void *data, int status) {
  tp__sfsjob_t *j = data;
  tp__srelay_t *r = j->r;
  if (r == NULL) {
    close(j->fd);
    tp__sfd_pipe_close(j->pipe);
    free(j->buf);
    free(j);
    return;
  }
  r->job = NULL;
  if (status == 0 && j->err == 0 && j->nosplice)
    tp__sfd_pipe_close(r->pipe); /* this file's and the next reads go through a buffer */
  if (status == 0 && j->err == 0 && r->pipe[0] >= 0) {
    tp_error_t e = { 0 };
    size_t len = j->len;
    r->next_off += len;
    if (j->eof)
      r->eof = 1;
    free(j);
    if (len > 0 && r->d->c != NULL) {
      r->spl = 1; /* before: a socket with room sends it all, and calls back, at once */
      r->splen = len;
      if (tp_sconn_splice(r->d->c, r->sid, r->pipe[0], len, tp__sfdr_spliced, r, &e) < 0) {
        r->spl = 0;
        tp__srelay_fail(r, e.code ? e.code : EIO, "the data connection did not take the file's bytes");
      }
      return; /* tp__sfdr_spliced goes on */
    }
    tp__sfdr_pump(r);
    return;
  }
  if (status != 0 || j->err != 0) {
    char msg[TP_SF_MSG_MAX + 1];
    int e = status != 0 ? ECANCELED : j->err;
    snprintf(msg, sizeof(msg), "read '%s': %s", r->path, strerror(e));
    free(j->buf);
    free(j);
    tp__srelay_fail(r, e, msg);
    return;
  }
  uint8_t *buf = j->buf;
  size_t len = j->len, cap = j->nosplice ? j->cap : r->jcap;
  r->next_off += len;
  if (j->eof || len < j->cap)
    r->eof = 1;
  free(j);
  /* the next read goes to the pool before these bytes go out (within the
   * credit they leave): the box's disk and the socket overlap */
  if (!r->eof && r->next_off < r->end && r->d->c != NULL && tp__sfdr_queue(r, len) < 0) {
    free(buf);
    return; /* r is gone */
  }
  if (len > 0 && r->d->c != NULL) {
    long k = tp_sconn_write(r->d->c, r->sid, buf, len, NULL);
    if (k != (long) len) { /* asked for no more than the credit: the stream is gone */
      free(buf);
      tp__srelay_fail(r, EPROTO, "the data connection took less than its credit");
      return;
    }
  }
  r->done += len;
  if (r->spare == NULL) { /* kept for the next read */
    r->spare = buf;
    r->spcap = cap;
  } else {
    free(buf);
  }
  tp__sfdr_pump(r);
}

/* Queues one read job of what the client's credit has room for, but for
 * pending bytes read and not yet sent; none when there is no room.  -1:
 * failed, r is gone. */
static int tp__sfdr_queue(tp__srelay_t *r, uint64_t pending) {
  tp__sfsjob_t *j;
  uint64_t want, credit = tp_sconn_can_write(r->d->c, r->sid);
  int rc;
  if (credit <= pending)
    return 0; /* on_writable (or the write of pending) comes back */
  credit -= pending;
  want = r->end - r->next_off;
  if (want > credit)
    want = credit;
  if (want > TP__SFD_READ_MAX)
    want = TP__SFD_READ_MAX;
  if (r->pipe[0] >= 0 && want > r->pipecap)
    want = r->pipecap; /* one frame of the pipe at a time */
  if ((j = calloc(1, sizeof(*j))) == NULL) {
    tp__srelay_fail(r, ENOMEM, "out of memory");
    return -1;
  }
  j->pipe[0] = -1;
  j->pipe[1] = r->pipe[0] >= 0 ? r->pipe[1] : -1;
  if (j->pipe[1] >= 0) { /* no buffer: the pipe (one made by the job if it must read) */
    r->jcap = 0;
  } else if (r->spare != NULL && r->spcap >= want) { /* the last read's buffer */
    j->buf = r->spare;
    r->jcap = r->spcap;
    r->spare = NULL;
  } else if ((j->buf = malloc((size_t) want)) != NULL) {
    r->jcap = (size_t) want;
  } else {
    free(j);
    tp__srelay_fail(r, ENOMEM, "out of memory");
    return -1;
  }
  j->r = r;
  j->fd = r->fd;
  j->cap = (size_t) want;
  j->off = r->next_off;
  r->job = j;
  if ((rc = tp_job_queue_long(r->b->loop, tp__sfdr_work, tp__sfdr_after, j)) < 0) {
    r->job = NULL;
    free(j->buf);
    free(j);
    tp__srelay_fail(r, -rc, "cannot queue the read");
    return -1;
  }
  return 0;
}

/* Reads as much as the client's credit has room for, one job at a time. */
static void tp__sfdr_pump(tp__srelay_t *r) {
  if (r->job != NULL || r->spl || r->d->c == NULL)
    return;
  if (r->eof || r->next_off >= r->end) {
    tp_sconn_end(r->d->c, r->sid, 1, r->done, NULL);
    tp__srelay_free(r);
    return;
  }
  if (tp__sfdr_queue(r, 0) < 0)
    return; /* r is gone */
  if (r->job == NULL && r->spare != NULL) {
    /* waiting for the client's credit: no buffer held meanwhile (a client's
     * 256 streams that give no credit would each keep 2 MiB) */
    free(r->spare);
    r->spare = NULL;
    r->spcap = 0;
  }
}

static void tp__sfdr_on_data(void *sdata, uint32_t sid, const uint8_t *p, size_t n) {
  (void) sdata, (void) sid, (void) p, (void) n; /* a read stream: the connection refuses DATA */
}

static void tp__sfdr_on_end(void *sdata, uint32_t sid) { (void) sdata, (void) sid; }

static void tp__sfdr_on_writable(void *sdata, uint32_t sid) {
  (void) sid;
  tp__sfdr_pump(sdata);
}

static const tp__sdc_ops_t tp__sfdr_ops = {
  tp__sfdr_on_data, tp__sfdr_on_end, tp__sfdr_on_writable, tp__sfs_on_error, NULL,
};

int tp_sdc_file_fd_read(tp_sdc_t *d, tp_dbox_t *b, uint32_t sid, int fd, const char *path, uint64_t offset,
                        uint64_t length, tp_error_t *err) {
  tp__srelay_t *r = tp__sfd_new(d, b, sid, fd, path, O_RDONLY, &tp__sfdr_ops, offset, err);
  if (r == NULL)
    return -1;
  if (length <= UINT64_MAX - offset && offset + length < r->end)
    r->end = offset + length;
  /* the file's pages go through a pipe of one frame into the connection
   * (no copy in the daemon); without one (TP__SFD_PIPES_MAX in use, no fds
   * left), through a buffer */
  r->pipe[0] = r->pipe[1] = -1;
  if (tp__sfd_pipes < TP__SFD_PIPES_MAX && pipe2(r->pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
    tp__sfd_pipes++;
    int cap = fcntl(r->pipe[1], F_SETPIPE_SZ, (int) TP_SF_DATA_MAX);
    if (cap < 0)
      cap = fcntl(r->pipe[1], F_GETPIPE_SZ);
    if (cap > 0)
      r->pipecap = (size_t) cap < TP_SF_DATA_MAX ? (size_t) cap : TP_SF_DATA_MAX;
    else
      tp__sfd_pipe_close(r->pipe);
  }
  tp__sfdr_pump(r);
  return 0;
}

void tp_sdc_close(tp_sdc_t *d) {
  while (d->relays != NULL)
    tp__srelay_fail(d->relays, ECONNRESET, "the data connection's client is gone");
  tp__sdc_procs_close(d);
  if (d->c != NULL)
    tp_sconn_close(d->c);
  free(d);
}
