/* tupper-agent: PID 1 of every box.  Main loop, channel and request dispatch.
 *
 * Usage: tupper-agent [--fd N]   (the channel, default fd 3)
 *
 * Every frame from the host is hostile: a frame whose header does not parse
 * (version, length, type) ends the agent, since the stream can no longer be
 * trusted to be in sync; a frame with bad fields gets ERR EINVAL. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

void agent_log(const char *fmt, ...) {
  va_list ap;
  fputs("tupper-agent: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* ---- channel -------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN) { /* a non-blocking channel: wait, never interleave */
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
          return -1;
        continue;
      }
      return -1;
    }
    p += w;
    n -= (size_t) w;
  }
  return 0;
}

void agent_event_begin(agent_t *a, uint8_t type) {
  tp_buf_reset(&a->out);
  tp_frame_begin(&a->out, type, 0);
}

int agent_send(agent_t *a) {
  if (tp_frame_end(&a->out) < 0) {
    agent_log("dropping a frame: out of memory or too large");
    tp_buf_reset(&a->out);
    return -1;
  }
  if (a->dead)
    return -1;
  if (write_all(a->chan, a->out.data, a->out.len) < 0) {
    agent_log("channel write: %s", strerror(errno));
    a->dead = 1;
    return -1;
  }
  tp_buf_reset(&a->out);
  return 0;
}

/* ---- request helpers ------------------------------------------------------ */

int agent_req_check(const agent_req_t *r, uint32_t allowed, uint32_t repeated, const char *what,
                    tp_error_t *err) {
  uint32_t seen = 0;
  for (int i = 0; i < r->n; i++) {
    unsigned tag = r->fields[i].tag;
    if (tag >= 32 || !(allowed & AGENT_TAG(tag)))
      return tp_error_set(err, EINVAL, "%s: unexpected field %u", what, tag);
    if ((seen & AGENT_TAG(tag)) && !(repeated & AGENT_TAG(tag)))
      return tp_error_set(err, EINVAL, "%s: repeated field %u", what, tag);
    seen |= AGENT_TAG(tag);
  }
  return 0;
}

const tp_field_t *agent_req_get(const agent_req_t *r, uint16_t tag) {
  return tp_fields_get(r->fields, r->n, tag);
}

int64_t agent_req_int(const agent_req_t *r, uint16_t tag, int64_t def) {
  int64_t v;
  if (tp_field_int(agent_req_get(r, tag), &v) < 0)
    return def;
  return v;
}

int agent_req_path(const agent_req_t *r, uint16_t tag, const char *what, char *buf, tp_error_t *err) {
  const tp_field_t *f = agent_req_get(r, tag);
  const char *name = tag == TP_TAG_PATH2 ? "PATH2" : tag == TP_TAG_CWD ? "CWD" : "PATH";
  if (f == NULL)
    return tp_error_set(err, EINVAL, "%s: no %s", what, name);
  if (f->len > TP_PATH_MAX)
    return tp_error_set(err, ENAMETOOLONG, "%s: %s longer than %d bytes", what, name, TP_PATH_MAX);
  if (f->len == 0 || f->val[0] != '/')
    return tp_error_set(err, EINVAL, "%s: %s must be absolute", what, name);
  memcpy(buf, f->val, f->len);
  buf[f->len] = '\0';
  return 0;
}

/* ---- dispatch ------------------------------------------------------------- */

typedef int (*agent_handler_t)(agent_t *a, const agent_req_t *r, tp_error_t *err);

static agent_handler_t handler_for(uint8_t type) {
  switch (type) {
  case TP_MSG_EXEC: return agent_proc_exec;
  case TP_MSG_STDIN: return agent_proc_stdin;
  case TP_MSG_STDIN_CLOSE: return agent_proc_stdin_close;
  case TP_MSG_SIGNAL: return agent_proc_signal;
  case TP_MSG_FS_READ: return agent_fs_read;
  case TP_MSG_FS_WRITE: return agent_fs_write;
  case TP_MSG_FS_STAT: return agent_fs_stat;
  case TP_MSG_FS_LIST: return agent_fs_list;
  case TP_MSG_FS_MKDIR: return agent_fs_mkdir;
  case TP_MSG_FS_REMOVE: return agent_fs_remove;
  case TP_MSG_FS_RENAME: return agent_fs_rename;
  default: return NULL; /* agent -> host types */
  }
}

static void reply_err(agent_t *a, uint32_t id, const tp_error_t *err) {
  tp_buf_reset(&a->out);
  tp_frame_begin(&a->out, TP_MSG_ERR, id);
  tp_frame_add_int(&a->out, TP_TAG_ERRNO, err->code ? err->code : EIO);
  tp_frame_add_str(&a->out, TP_TAG_MSG, err->msg);
  agent_send(a);
}

static void dispatch(agent_t *a, const tp_frame_t *f) {
  agent_handler_t h = handler_for(f->type);
  agent_req_t r = {.id = f->id, .type = f->type, .fields = a->fields};
  tp_error_t err;

  tp_error_clear(&err);
  if (f->id == 0) { /* no way to answer: requests carry non-zero ids */
    agent_log("ignoring frame of type %u with id 0", f->type);
    return;
  }
  if (h == NULL) {
    tp_error_set(&err, EINVAL, "message type %u is not a request", f->type);
    reply_err(a, f->id, &err);
    return;
  }
  r.n = tp_fields_parse(f->payload, f->len, a->fields, TP_FIELDS_MAX);
  if (r.n < 0) {
    tp_error_set(&err, EINVAL, "request %u: malformed fields", f->type);
    reply_err(a, f->id, &err);
    return;
  }
  tp_buf_reset(&a->out);
  tp_frame_begin(&a->out, TP_MSG_OK, f->id);
  if (h(a, &r, &err) < 0) {
    reply_err(a, f->id, &err);
    return;
  }
  if (tp_frame_end(&a->out) < 0) {
    tp_error_set(&err, ENOMEM, "reply too large or out of memory");
    reply_err(a, f->id, &err);
    return;
  }
  agent_send(a);
}

/* Reads what the channel has and handles every whole frame.  EOF or a
 * channel error marks the agent dead; a protocol error returns -1. */
static int channel_read(agent_t *a) {
  const size_t cap = TP_FRAME_HDR + TP_FRAME_MAX;
  size_t off = 0;
  ssize_t n = read(a->chan, a->rbuf + a->rlen, cap - a->rlen);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return 0;
  if (n <= 0) {
    if (n < 0)
      agent_log("channel read: %s", strerror(errno));
    a->dead = 1;
    return 0;
  }
  a->rlen += (size_t) n;
  while (!a->dead) {
    tp_frame_t f;
    long fl = tp_frame_parse_header(a->rbuf + off, a->rlen - off, &f);
    if (fl < 0) {
      agent_log("protocol error: bad frame header");
      return -1;
    }
    if (fl == 0)
      break;
    dispatch(a, &f);
    off += (size_t) fl;
  }
  memmove(a->rbuf, a->rbuf + off, a->rlen - off);
  a->rlen -= off;
  return 0;
}

/* ---- set-up --------------------------------------------------------------- */

static void close_fds(unsigned lo, unsigned hi) {
  long max;
  if (lo > hi || close_range(lo, hi, 0) == 0)
    return;
  max = sysconf(_SC_OPEN_MAX);
  if (max <= 0 || max > 65536)
    max = 65536;
  for (unsigned fd = lo; fd <= hi && fd < (unsigned) max; fd++)
    close((int) fd);
}

static void close_inherited_fds(int keep) {
  if (keep > 3)
    close_fds(3, (unsigned) keep - 1);
  close_fds(keep >= 3 ? (unsigned) keep + 1 : 3, ~0u);
}

/* Fds 0-2 must be open so that no pipe lands there and gets clobbered by the
 * dup2 calls in a child.  Without /dev/null, a pipe with no writer will do. */
static void ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++) {
    int nfd, p[2];
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    nfd = open("/dev/null", O_RDWR);
    if (nfd < 0) {
      if (pipe(p) < 0)
        continue;
      close(p[1]);
      nfd = p[0];
    }
    if (nfd != fd) {
      dup2(nfd, fd);
      close(nfd);
    }
  }
}

static int agent_init(agent_t *a, int chan, tp_error_t *err) {
  sigset_t set;
  struct rlimit rl;
  int fl;

  a->chan = chan;
  a->sigfd = -1;
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    a->procs[i] = (agent_proc_t){.out_fd = -1, .err_fd = -1, .in_fd = -1};
  tp_buf_init(&a->out);

  if (fcntl(chan, F_GETFD) < 0)
    return tp_error_errno(err, errno, "channel fd %d", chan);
  close_inherited_fds(chan);
  ensure_std_fds();
  if (fcntl(chan, F_SETFD, FD_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "channel cloexec");
  fl = fcntl(chan, F_GETFL);
  if (fl >= 0 && (fl & O_NONBLOCK))
    fcntl(chan, F_SETFL, fl & ~O_NONBLOCK);

  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  /* As PID 1 orphans come to us anyway; as an ordinary process (tests) this
   * makes the background children of our children ours to reap too. */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  /* Exact modes for FS_WRITE/FS_MKDIR; children get the inherited umask. */
  a->umask = umask(0);
  /* Up to three pipes per process: raise the soft fd limit, restored in children. */
  if (getrlimit(RLIMIT_NOFILE, &a->nofile) == 0) {
    rl = a->nofile;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  } else {
    a->nofile.rlim_cur = a->nofile.rlim_max = RLIM_INFINITY;
  }

  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
    return tp_error_errno(err, errno, "sigprocmask");
  a->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (a->sigfd < 0)
    return tp_error_errno(err, errno, "signalfd");

  a->rbuf = malloc(TP_FRAME_HDR + TP_FRAME_MAX);
  a->fsbuf = malloc(TP_CHUNK_MAX);
  if (a->rbuf == NULL || a->fsbuf == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  return 0;
}

static void drain_sigfd(agent_t *a) {
  struct signalfd_siginfo si[16];
  while (read(a->sigfd, si, sizeof(si)) > 0)
    ;
}

static int agent_run(agent_t *a) {
  agent_event_begin(a, TP_MSG_READY);
  tp_frame_add_int(&a->out, TP_TAG_VERSION, TP_PROTO_VERSION);
  tp_frame_add_int(&a->out, TP_TAG_PID, getpid());
  agent_send(a);

  while (!a->dead) {
    int n;
    a->pfds[0] = (struct pollfd){.fd = a->chan, .events = POLLIN};
    a->pfds[1] = (struct pollfd){.fd = a->sigfd, .events = POLLIN};
    n = agent_proc_poll_fill(a, 2);
    if (poll(a->pfds, (nfds_t) n, -1) < 0) {
      if (errno == EINTR)
        continue;
      agent_log("poll: %s", strerror(errno));
      return -1;
    }
    /* Output first, then reaping (which drains and sends EXIT), then new
     * requests, which may reuse the slots freed by reaping. */
    agent_proc_poll_handle(a, 2, n);
    if (a->pfds[1].revents) {
      drain_sigfd(a);
      agent_proc_reap(a);
    }
    if (a->pfds[0].revents && channel_read(a) < 0)
      return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  static agent_t agent;
  tp_error_t err;
  int chan = AGENT_CHAN_FD;
  int rc;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--fd") == 0 && i + 1 < argc) {
      char *end;
      long v;
      errno = 0;
      v = strtol(argv[++i], &end, 10);
      if (errno || *end || end == argv[i] || v < 0 || v > INT_MAX) {
        agent_log("bad --fd value '%s'", argv[i]);
        return 2;
      }
      chan = (int) v;
    } else {
      agent_log("usage: tupper-agent [--fd N]");
      return 2;
    }
  }
  tp_error_clear(&err);
  if (agent_init(&agent, chan, &err) < 0) {
    agent_log("%s", err.msg);
    return 1;
  }
  rc = agent_run(&agent);
  /* EOF is the host's way to say stop: take every process group with us
   * (as PID 1 of a PID namespace our exit kills the rest anyway). */
  agent_proc_kill_all(&agent);
  return rc < 0 ? 1 : 0;
}
