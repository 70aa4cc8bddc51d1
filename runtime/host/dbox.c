/* tp_dbox_t: the box object's channel, frames and lifetime.  Start, adopt
 * and destroy are in dbox_life.c, process trees in dbox_tree.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dbox_int.h"

tp_dbox_t *tp__dbox_new(const tp_backend_t *be, uv_loop_t *loop, const char *dir) {
  tp_dbox_t *b = calloc(1, sizeof(*b));
  if (b == NULL)
    return NULL;
  if ((b->dir = strdup(dir)) == NULL) {
    free(b);
    return NULL;
  }
  b->be = be;
  b->loop = loop;
  b->box.pid = 0;
  b->box.pidfd = b->box.chan_fd = -1;
  return b;
}

void tp__dbox_free(tp_dbox_t *b) {
  free(b->rbuf);
  free(b->fields);
  free(b->dir);
  free(b->keep_upper);
  free(b->werr);
  free(b);
}

void tp__dbox_maybe_free(tp_dbox_t *b) {
  if (b->open_handles > 0 || b->work_pending || b->tree_jobs > 0 || b->held_destroy == 2 ||
      !b->released)
    return;
  tp__dbox_free(b);
}

static void tp__dbox_close_cb(uv_handle_t *h) {
  tp_dbox_t *b = h->data;
  b->open_handles--;
  tp__dbox_maybe_free(b);
}

/* The relays are told, and the agent's channel closed; the exit poll is
 * left to the caller (a started box's).  Returns whether the box had been
 * started (its handles made). */
int tp__dbox_stop_chan(tp_dbox_t *b) {
  if (b->c_down != NULL)
    b->c_down(b, "sandbox stopped");
  if (b->n_down != NULL)
    b->n_down(b, "sandbox stopped");
  if (b->p_down != NULL)
    b->p_down(b, "sandbox stopped");
  if (!b->started)
    return 0;
  b->started = 0;
  uv_read_stop((uv_stream_t *) &b->chan);
  uv_close((uv_handle_t *) &b->chan, tp__dbox_close_cb); /* closes chan_fd */
  b->box.chan_fd = -1;
  return 1;
}

void tp__dbox_stop(tp_dbox_t *b) {
  if (!tp__dbox_stop_chan(b))
    return;
  uv_close((uv_handle_t *) &b->exitp, tp__dbox_close_cb);
  /* uv_poll made the pidfd non-blocking; destroy waits on it */
  int fl = fcntl(b->box.pidfd, F_GETFL);
  if (fl >= 0)
    fcntl(b->box.pidfd, F_SETFL, fl & ~O_NONBLOCK);
}

/* The box is unusable from now on: tell the owner once. */
static void tp__dbox_down(tp_dbox_t *b, const char *reason) {
  if (b->down)
    return;
  b->down = 1;
  if (b->c_down != NULL)
    b->c_down(b, reason);
  if (b->n_down != NULL)
    b->n_down(b, reason);
  if (b->p_down != NULL)
    b->p_down(b, reason);
  if (b->started) {
    uv_read_stop((uv_stream_t *) &b->chan);
    uv_poll_stop(&b->exitp);
  }
  if (b->released || b->on_down == NULL)
    return;
  b->on_down(b, reason);
}

/* The read buffer (128 KiB, doubled up to a whole frame) and the parsed
 * fields (TP_FIELDS_MAX * 2, 130 KiB) are working memory of a burst: made
 * on the first read of one, dropped by the read that leaves no byte behind
 * and took fewer than TP__DBOX_QUIET (the burst is over: a reply, an
 * event), so that an idle box holds neither, a box that moved a large file
 * does not keep its 1 MiB buffer, and a stream of full reads keeps them. */
#define TP__DBOX_RBUF_MIN 131072
#define TP__DBOX_QUIET 16384

static void tp__dbox_buffers_drop(tp_dbox_t *b) {
  free(b->rbuf);
  b->rbuf = NULL;
  b->rcap = b->rlen = 0;
  free(b->fields);
  b->fields = NULL;
}

static void tp__dbox_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tp_dbox_t *b = h->data;
  size_t max = TP_FRAME_HDR + TP_FRAME_MAX;
  (void) suggested;
  if (b->rcap - b->rlen < 65536 && b->rcap < max) {
    size_t cap = b->rcap ? b->rcap * 2 : TP__DBOX_RBUF_MIN;
    if (cap > max)
      cap = max;
    uint8_t *p = realloc(b->rbuf, cap);
    if (p != NULL) {
      b->rbuf = p;
      b->rcap = cap;
    }
  }
  buf->base = (char *) b->rbuf + b->rlen;
  buf->len = b->rcap - b->rlen;
}

/* Delivers every complete frame in rbuf; returns -1 on a protocol error,
 * -2 when no memory was left for the fields. */
static int tp__dbox_dispatch(tp_dbox_t *b) {
  size_t off = 0;
  int ret = 0;
  while (!b->down && !b->destroyed && b->rlen > off) {
    tp_frame_t f;
    long n = tp_frame_parse_header(b->rbuf + off, b->rlen - off, &f);
    if (n == 0)
      break;
    if (b->fields == NULL && n > 0 &&
        (b->fields = malloc(sizeof(tp_field_t) * TP_FIELDS_MAX * 2)) == NULL) {
      ret = -2;
      break;
    }
    /* from the agent: events, replies and network stream frames only */
    if (n < 0 || (f.type >= TP_MSG_EXEC && !tp_msg_net_stream(f.type) && f.type != TP_MSG_WATCH_EVENT)) {
      ret = -1;
      break;
    }
    int m = tp_fields_parse(f.payload, f.len, b->fields, TP_FIELDS_MAX);
    if (m < 0) {
      ret = -1;
      break;
    }
    off += (size_t) n; /* consumed before the call: it may destroy the box */
    if (b->p_frame != NULL &&
        (f.type == TP_MSG_OUTPUT || f.type == TP_MSG_EXIT || f.type == TP_MSG_STDIN_ACK ||
         (f.id >= TP_DBOX_PID_MIN && (f.type == TP_MSG_OK || f.type == TP_MSG_ERR)))) {
      int took = b->p_frame(b, f.type, f.id, b->fields, m, b->fields + TP_FIELDS_MAX, TP_FIELDS_MAX);
      if (took < 0) {
        ret = -1;
        break;
      }
      if (took > 0 || b->down || b->destroyed)
        continue;
    } else if (f.id >= TP_DBOX_PID_MIN && (f.type == TP_MSG_OK || f.type == TP_MSG_ERR)) {
      continue; /* a late reply to a process relay that is gone */
    } else if (f.type == TP_MSG_STDIN_ACK) {
      continue; /* no relay: nobody waits for it */
    }
    if (f.id >= TP_DBOX_CID_MIN && (f.type == TP_MSG_OK || f.type == TP_MSG_ERR)) {
      /* a C relay's reply (a late one for a relay that is gone is dropped) */
      if (b->c_frame != NULL &&
          b->c_frame(b, f.type, f.id, b->fields, m, b->fields + TP_FIELDS_MAX, TP_FIELDS_MAX) < 0) {
        ret = -1;
        break;
      }
      continue;
    }
    if (b->n_frame != NULL && tp_msg_net_stream(f.type)) {
      int taken = b->n_frame(b, f.type, b->fields, m); /* a relayed stream's: no Lua */
      if (taken < 0) {
        ret = -1;
        break;
      }
      if (taken > 0)
        continue;
    }
    if (!b->released && b->on_frame != NULL &&
        b->on_frame(b, f.type, f.id, b->fields, m, b->fields + TP_FIELDS_MAX, TP_FIELDS_MAX) < 0) {
      ret = -1;
      break;
    }
  }
  if (b->rbuf != NULL && off > 0) {
    memmove(b->rbuf, b->rbuf + off, b->rlen - off);
    b->rlen -= off;
  }
  return ret;
}

static void tp__dbox_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  tp_dbox_t *b = s->data;
  (void) buf;
  if (nread < 0) {
    tp__dbox_down(b, nread == UV_EOF ? "agent channel closed" : uv_strerror((int) nread));
    return;
  }
  b->rlen += (size_t) nread;
  switch (tp__dbox_dispatch(b)) {
  case -1:
    tp__dbox_down(b, "agent protocol error: malformed frame");
    break;
  case -2:
    tp__dbox_down(b, "out of memory for the agent's frames");
    break;
  default:
    if (b->rlen == 0 && (size_t) nread < TP__DBOX_QUIET)
      tp__dbox_buffers_drop(b);
  }
}

static void tp__dbox_exit_cb(uv_poll_t *p, int status, int events) {
  tp_dbox_t *b = p->data;
  (void) status;
  (void) events;
  tp__dbox_down(b, "box init exited");
}

int tp_dbox_on(tp_dbox_t *b, tp_dbox_frame_cb on_frame, tp_dbox_down_cb on_down,
               tp_error_t *err) {
  int r;
  if (b->started || b->destroyed || b->open_handles > 0)
    return tp_error_set(err, EBUSY, "box: on() called twice or after destroy");
  if ((r = uv_pipe_init(b->loop, &b->chan, 0)) < 0)
    return tp_error_set(err, -r, "box channel: %s", uv_strerror(r));
  b->chan.data = b;
  b->open_handles++;
  /* from here the pipe is in the loop's handle queue: every failure must
   * close it before b can be freed (the box keeps chan_fd: uv_pipe_open
   * took it only if it succeeded) */
  if ((r = uv_pipe_open(&b->chan, b->box.chan_fd)) == 0 &&
      (r = uv_poll_init(b->loop, &b->exitp, b->box.pidfd)) < 0)
    b->box.chan_fd = -1; /* the pipe owns it now: uv_close closes it */
  if (r < 0) {
    uv_close((uv_handle_t *) &b->chan, tp__dbox_close_cb);
    return tp_error_set(err, -r, "box channel: %s", uv_strerror(r));
  }
  b->exitp.data = b;
  b->open_handles++;
  b->started = 1;
  {
    /* the daemon's end of the channel: a few whole FS_WRITE frames fit in
     * the kernel, so that they go from the relay's buffer uncopied (as
     * root past net.core.wmem_max, else up to it; a port is no socket) */
    int want = (int) TP_DBOX_CHAN_SNDBUF;
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *) &b->chan, &fd) == 0 &&
        setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) < 0)
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  }
  b->on_frame = on_frame;
  b->on_down = on_down;
  uv_read_start((uv_stream_t *) &b->chan, tp__dbox_alloc_cb, tp__dbox_read_cb);
  uv_poll_start(&b->exitp, UV_READABLE, tp__dbox_exit_cb);
  return 0;
}

int tp_dbox_running(const tp_dbox_t *b) { return b->started && !b->down && !b->destroyed; }

typedef struct tp__wreq_s {
  uv_write_t req;
  tp_buf_t buf;
} tp__wreq_t;

static void tp__dbox_write_cb(uv_write_t *req, int status) {
  tp__wreq_t *w = (tp__wreq_t *) req;
  (void) status; /* a failed write shows up as EOF on the read side */
  tp_buf_free(&w->buf);
  free(w);
}

int tp_dbox_send(tp_dbox_t *b, tp_buf_t *buf, tp_error_t *err) {
  tp__wreq_t *w;
  uv_buf_t ub;
  int r;
  if (!tp_dbox_running(b)) {
    tp_buf_free(buf);
    return tp_error_set(err, EPIPE, "box is not running");
  }
  w = calloc(1, sizeof(*w));
  if (w == NULL) {
    tp_buf_free(buf);
    return tp_error_set(err, ENOMEM, "out of memory");
  }
  w->buf = *buf;
  memset(buf, 0, sizeof(*buf));
  ub = uv_buf_init((char *) w->buf.data, (unsigned) w->buf.len);
  r = uv_write(&w->req, (uv_stream_t *) &b->chan, &ub, 1, tp__dbox_write_cb);
  if (r < 0) {
    tp_buf_free(&w->buf);
    free(w);
    return tp_error_set(err, -r, "box channel: %s", uv_strerror(r));
  }
  return 0;
}

int tp_dbox_send_tail(tp_dbox_t *b, tp_buf_t *buf, const void *tail, size_t tlen, tp_error_t *err) {
  uv_buf_t ub[2];
  size_t done = 0;
  int r;
  if (!tp_dbox_running(b)) {
    tp_buf_free(buf);
    return tp_error_set(err, EPIPE, "box is not running");
  }
  /* the room for the copy first: a frame is never cut by a failed realloc */
  if (tp_buf_reserve(buf, tlen) < 0) {
    tp_buf_free(buf);
    return tp_error_set(err, ENOMEM, "out of memory");
  }
  if (tp_dbox_queued(b) == 0) {
    ub[0] = uv_buf_init((char *) buf->data, (unsigned) buf->len);
    ub[1] = uv_buf_init((char *) tail, (unsigned) tlen);
    r = uv_try_write((uv_stream_t *) &b->chan, ub, tlen ? 2 : 1);
    if (r > 0)
      done = (size_t) r; /* an error other than EAGAIN: tp_dbox_send reports it */
  }
  if (done >= buf->len + tlen) {
    tp_buf_free(buf);
    return 0;
  }
  if (done < buf->len) {
    memmove(buf->data, buf->data + done, buf->len - done);
    buf->len -= done;
    if (tlen)
      memcpy(buf->data + buf->len, tail, tlen);
    buf->len += tlen;
  } else {
    done -= buf->len;
    memcpy(buf->data, (const uint8_t *) tail + done, tlen - done);
    buf->len = tlen - done;
  }
  return tp_dbox_send(b, buf, err);
}

int tp_dbox_send_fds(tp_dbox_t *b, tp_buf_t *buf, const int *fds, int n, tp_error_t *err) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * TP_DBOX_SEND_FDS_MAX)];
  } cm;
  struct iovec iov;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf};
  struct cmsghdr *c;
  uv_os_fd_t fd;
  ssize_t w;
  int e;
  if (n <= 0 || n > TP_DBOX_SEND_FDS_MAX) {
    tp_buf_free(buf);
    return tp_error_set(err, EINVAL, "box channel: %d fds with one frame", n);
  }
  if (!tp_dbox_running(b)) {
    tp_buf_free(buf);
    return tp_error_set(err, EPIPE, "box is not running");
  }
  if (tp_dbox_queued(b) > 0 || uv_fileno((uv_handle_t *) &b->chan, &fd) < 0) {
    tp_buf_free(buf);
    return tp_error_set(err, EAGAIN, "box channel: busy, no fds can go with this frame");
  }
  memset(cm.buf, 0, sizeof(cm.buf));
  mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t) n);
  c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t) n);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t) n);
  iov = (struct iovec){.iov_base = buf->data, .iov_len = buf->len};
  do
    w = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  e = errno;
  if (w < 0) {
    tp_buf_free(buf);
    if (e == EAGAIN || e == EWOULDBLOCK)
      return tp_error_set(err, EAGAIN, "box channel: full, no fds can go with this frame");
    return tp_error_errno(err, e, "box channel: sendmsg");
  }
  if ((size_t) w == buf->len) {
    tp_buf_free(buf);
    return 0;
  }
  /* the rest after it, in order: nothing else was queued */
  memmove(buf->data, buf->data + w, buf->len - (size_t) w);
  buf->len -= (size_t) w;
  return tp_dbox_send(b, buf, err);
}

_Static_assert(TP_CG_NCTRL <= TP_DBOX_SEND_FDS_MAX, "a tree's fds must fit one send");

int tp_dbox_send_tree(tp_dbox_t *b, tp_buf_t *buf, const tp_dbox_tree_t *t, tp_error_t *err) {
  int fds[TP_CG_NCTRL], n, r;
  if (!tp_dbox_running(b)) {
    tp_buf_free(buf);
    return tp_error_set(err, EPIPE, "box is not running");
  }
  if (tp_dbox_queued(b) > 0) {
    tp_buf_free(buf);
    return tp_error_set(err, EAGAIN, "box channel: busy, no fds can go with this frame");
  }
  /* the agent's child, single-threaded, writes itself to each: tasks on v1 */
  if ((n = tp_cgroup_enter_fds_self(&t->cg, fds, err)) <= 0) {
    tp_buf_free(buf);
    return n < 0 ? -1 : tp_error_set(err, ENOENT, "tree '%s' has no cgroup", t->name);
  }
  r = tp_dbox_send_fds(b, buf, fds, n, err);
  for (int i = 0; i < n; i++) /* the kernel holds its own references */
    close(fds[i]);
  return r;
}

size_t tp_dbox_queued(const tp_dbox_t *b) {
  return b->started ? uv_stream_get_write_queue_size((const uv_stream_t *) &b->chan) : 0;
}

int tp_dbox_has_cgroup(const tp_dbox_t *b) { return b->has_cg && !b->destroyed; }
