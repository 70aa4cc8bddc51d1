/* tupper-agent: PID 1 of every box.  Main loop, channel and request dispatch,
 * detaching from a lost daemon and re-attaching to the next one.
 *
 * Usage: tupper-agent [--fd N] [--grace SECONDS]
 *   As /init of a microVM guest (pid 1, no fd 3) it takes no arguments and
 *   sets the guest up first (agent_vm.c).
 *   --fd     the channel (default fd 3)
 *   --grace  how long to wait for a new daemon once the channel is lost
 *            (default 60), when fd TP_AGENT_LISTEN_FD is a listening socket
 *
 * Every frame from the host is hostile: a frame whose header does not parse
 * (version, length, type) ends the agent, since the stream can no longer be
 * trusted to be in sync; a frame with bad fields gets ERR EINVAL.
 *
 * EOF on the channel is the host's way to say stop, unless the box was given
 * a listening socket, or the agent is a microVM guest (whose port QEMU keeps
 * open for the next daemon): then the daemon may only have crashed, and the
 * agent keeps the box running for the grace period (see agent.h).  One daemon at a
 * time: while attached, further connections are accepted and closed at
 * once, so no second client can ever take over a live channel, and none
 * waits in the backlog to take over the next one. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LISTEN_PAUSE_MS 1000 /* after an accept that failed for want of fds or memory */
#define TRIM_QUIET_MS 2000 /* the heap is trimmed once the agent was this long without work */

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
        /* a microVM's port whose host end closed reads HUP and never takes
         * a byte until a host reopens it: the channel is lost */
        if ((pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) && !(pfd.revents & POLLOUT)) {
          errno = EPIPE;
          return -1;
        }
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

int agent_held_flush(agent_t *a) {
  int rc = 0;
  if (a->held.len == 0)
    return 0;
  if (a->dead || a->chan < 0) {
    rc = -1;
  } else if (write_all(a->chan, a->held.data, a->held.len) < 0) {
    agent_log("channel write: %s", strerror(errno));
    a->dead = 1;
    rc = -1;
  }
  tp_buf_reset(&a->held);
  if (rc < 0)
    agent_proc_requeue_held(a);
  a->held_nexits = 0;
  return rc;
}

void agent_hold(agent_t *a) {
  a->holding = 1;
}

int agent_release(agent_t *a) {
  a->holding = 0;
  return agent_held_flush(a);
}

int agent_write_chan(agent_t *a, const uint8_t *p, size_t n) {
  if (a->dead || a->chan < 0)
    return -1;
  if (agent_held_flush(a) < 0)
    return -1;
  if (write_all(a->chan, p, n) < 0) {
    agent_log("channel write: %s", strerror(errno));
    a->dead = 1;
    return -1;
  }
  return 0;
}

int agent_send(agent_t *a) {
  if (tp_frame_end(&a->out) < 0) {
    agent_log("dropping a frame: out of memory or too large");
    tp_buf_reset(&a->out);
    return -1;
  }
  if (a->dead || a->chan < 0)
    return -1;
  if (a->holding && a->held.len + a->out.len <= AGENT_HELD_MAX) {
    if (tp_buf_append(&a->held, a->out.data, a->out.len) == 0) {
      tp_buf_reset(&a->out);
      return 0;
    }
  }
  if (agent_held_flush(a) < 0) {
    tp_buf_reset(&a->out);
    return -1;
  }
  if (write_all(a->chan, a->out.data, a->out.len) < 0) {
    agent_log("channel write: %s", strerror(errno));
    a->dead = 1;
    return -1;
  }
  tp_buf_reset(&a->out);
  return 0;
}

long long agent_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

long long agent_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- request helpers ------------------------------------------------------ */

int agent_req_check(const agent_req_t *r, uint64_t allowed, uint64_t repeated, const char *what,
                    tp_error_t *err) {
  uint64_t seen = 0;
  for (int i = 0; i < r->n; i++) {
    unsigned tag = r->fields[i].tag;
    if (tag >= 64 || !(allowed & AGENT_TAG(tag)))
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
  case TP_MSG_RELEASE: return agent_proc_release;
  case TP_MSG_PS: return agent_proc_ps;
  case TP_MSG_OUTPUT_ACK: return agent_proc_output_ack;
  case TP_MSG_FS_READ: return agent_fs_read;
  case TP_MSG_FS_WRITE: return agent_fs_write;
  case TP_MSG_FS_STAT: return agent_fs_stat;
  case TP_MSG_FS_LIST: return agent_fs_list;
  case TP_MSG_FS_MKDIR: return agent_fs_mkdir;
  case TP_MSG_FS_REMOVE: return agent_fs_remove;
  case TP_MSG_FS_RENAME: return agent_fs_rename;
  case TP_MSG_FS_SETATTR: return agent_fs_setattr;
  case TP_MSG_FS_SYMLINK: return agent_fs_symlink;
  case TP_MSG_FS_OPEN: return agent_fs_open;
  case TP_MSG_NET_LISTEN: return agent_net_listen;
  case TP_MSG_PTY_RESIZE: return agent_proc_pty_resize;
  case TP_MSG_WATCH_ADD: return agent_watch_add;
  case TP_MSG_WATCH_REMOVE: return agent_watch_remove;
  case TP_MSG_VM_INIT: return agent_vm_init;
  case TP_MSG_VM_ATTACH: return agent_vm_attach;
  case TP_MSG_VM_LIMITS: return agent_vm_limits;
  default: return NULL; /* agent -> host types */
  }
}

/* Requests that act as the account their UID GID GROUPS? name. */
static int acts_as(uint8_t type) {
  return (type >= TP_MSG_FS_READ && type <= TP_MSG_FS_OPEN) || type == TP_MSG_WATCH_ADD;
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
  int rc;

  tp_error_clear(&err);
  if (tp_msg_net_stream(f->type)) { /* network stream frames: no reply */
    agent_net_frame(a, f);
    return;
  }
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
  memset(&a->as, 0, sizeof(a->as));
  if (acts_as(f->type)) {
    /* never as root by mistake: a switch that fails fails the request */
    rc = agent_as_parse(&r, "request", &a->as, &err) < 0 || agent_as_enter(&a->as, &err) < 0
             ? -1 : h(a, &r, &err);
    if (agent_as_leave(&a->as) < 0) {
      agent_log("cannot return to root's filesystem ids: %s: stopping", strerror(errno));
      a->broken = 1;
    }
  } else {
    rc = h(a, &r, &err);
  }
  if (rc < 0) {
    reply_err(a, f->id, &err);
    return;
  }
  if (tp_frame_end(&a->out) < 0) {
    tp_error_set(&err, ENOMEM, "reply too large or out of memory");
    reply_err(a, f->id, &err);
    return;
  }
  if (f->type == TP_MSG_EXEC || f->type == TP_MSG_RELEASE) {
    /* A short process (busybox's `true`: 0.5 ms) has often exited by the
     * time its start is answered: its output and EXIT go in the OK's write,
     * one wakeup of the daemon, not two (EXIT still after its output). */
    agent_hold(a);
    agent_send(a);
    agent_proc_reap(a);
    agent_release(a);
    return;
  }
  agent_send(a);
}

/* Reads what the channel has and handles every whole frame.  EOF or a
 * channel error marks the agent dead; a protocol error returns -1. */
/* The offset in rbuf of the last frame that starts before rlen: file
 * descriptors that came with a read belong to it (the host attaches them to
 * a frame's first byte, and a read of a unix socket ends with the bytes
 * they came with). */
static size_t last_frame_start(const agent_t *a) {
  size_t off = 0;
  for (;;) {
    tp_frame_t f;
    long fl = tp_frame_parse_header(a->rbuf + off, a->rlen - off, &f);
    if (fl <= 0 || off + (size_t) fl >= a->rlen)
      return off;
    off += (size_t) fl;
  }
}

/* Reads from the channel (a socket: with the fds the host sent along; the
 * microVM port carries none). */
static ssize_t channel_recv(agent_t *a, size_t cap, int *fds, int *nfds) {
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * AGENT_FDSET_FDS * 2)];
  } cm;
  struct iovec iov = {.iov_base = a->rbuf + a->rlen, .iov_len = cap - a->rlen};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                      .msg_controllen = sizeof(cm.buf)};
  ssize_t n;
  *nfds = 0;
  if (a->chan == a->vm_port)
    return read(a->chan, iov.iov_base, iov.iov_len);
  n = recvmsg(a->chan, &mh, MSG_CMSG_CLOEXEC);
  if (n < 0 && errno == ENOTSOCK) /* a pipe or a port: no fds come that way */
    return read(a->chan, iov.iov_base, iov.iov_len);
  for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c != NULL; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
      if (*nfds < AGENT_FDSET_FDS * 2)
        fds[(*nfds)++] = fd;
      else
        close(fd);
    }
  }
  return n;
}

static int channel_read(agent_t *a) {
  const size_t cap = TP_FRAME_HDR + TP_FRAME_MAX;
  size_t off = 0;
  int fds[AGENT_FDSET_FDS * 2], nfds;
  ssize_t n;
  if (agent_net_splice(a) > 0) /* downloads' payloads, spliced to the box (agent_net.c) */
    return 0;
  n = channel_recv(a, cap, fds, &nfds);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return 0;
  if (n <= 0) {
    if (n < 0)
      agent_log("channel read: %s", strerror(errno));
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    a->dead = 1;
    return 0;
  }
  a->rlen += (size_t) n;
  if (nfds > 0)
    agent_fdsets_add(a, a->rpos + last_frame_start(a), fds, nfds);
  while (!a->dead) {
    tp_frame_t f;
    long fl = tp_frame_parse_header(a->rbuf + off, a->rlen - off, &f);
    if (fl < 0) {
      agent_log("protocol error: bad frame header");
      return -1;
    }
    if (fl == 0)
      break;
    a->fpos = a->rpos + off;
    dispatch(a, &f);
    off += (size_t) fl;
  }
  memmove(a->rbuf, a->rbuf + off, a->rlen - off);
  a->rlen -= off;
  a->rpos += off;
  return 0;
}

/* ---- set-up --------------------------------------------------------------- */

/* A channel that is a socket: room for a few whole 1 MiB replies in the
 * kernel, so that an FS_READ's reply or a burst of output is written in one
 * call instead of one wake-up of each side per ~200 KiB.  The kernel caps
 * it at net.core.wmem_max (the daemon may have raised this socket's before
 * the box started: never lowered here); a port is not a socket. */
static void channel_tune(int fd) {
  int want = (int) AGENT_CHAN_SNDBUF, have = 0;
  socklen_t len = sizeof(have);
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &have, &len) == 0 && have < want)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
}

static void close_fds(unsigned lo, unsigned hi) {
  long max;
  if (lo > hi || syscall(SYS_close_range, lo, hi, 0) == 0) /* musl has no wrapper */
    return;
  max = sysconf(_SC_OPEN_MAX);
  if (max <= 0 || max > 65536)
    max = 65536;
  for (unsigned fd = lo; fd <= hi && fd < (unsigned) max; fd++)
    close((int) fd);
}

/* Closes every fd from 3 up but keep1 and keep2 (either may be -1). */
static void close_inherited_fds(int keep1, int keep2) {
  int keep[2] = {keep1 < keep2 ? keep1 : keep2, keep1 < keep2 ? keep2 : keep1};
  unsigned lo = 3;
  for (int i = 0; i < 2; i++) {
    if (keep[i] < (int) lo)
      continue;
    if ((unsigned) keep[i] > lo)
      close_fds(lo, (unsigned) keep[i] - 1);
    lo = (unsigned) keep[i] + 1;
  }
  close_fds(lo, ~0u);
}

static int sockopt_is(int fd, int opt, int want) {
  int v = 0;
  socklen_t len = sizeof(v);
  return getsockopt(fd, SOL_SOCKET, opt, &v, &len) == 0 && v == want;
}

/* TP_AGENT_LISTEN_FD when it is a listening unix stream socket (and not the
 * channel), else -1: then it is just another inherited fd, closed with the
 * rest. */
static int find_listener(int chan) {
  const int fd = TP_AGENT_LISTEN_FD;
  if (chan == fd || !sockopt_is(fd, SO_ACCEPTCONN, 1) || !sockopt_is(fd, SO_DOMAIN, AF_UNIX) ||
      !sockopt_is(fd, SO_TYPE, SOCK_STREAM))
    return -1;
  return fd;
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

static int agent_init(agent_t *a, int chan, long long grace_s, tp_error_t *err) {
  sigset_t set;
  struct rlimit rl;
  int fl;

  a->chan = chan;
  a->sigfd = -1;
  a->vm_port = -1;
  a->grace_ms = grace_s * 1000;
  /* procs[] is left as the zeroed bss: a free slot (pid 0) is never read
   * past its pid, and exec fills a slot whole.  Writing -1s into all
   * AGENT_PROC_MAX slots here would make ~100 KiB of every idle box's
   * agent resident (docs/benchmarks.md, "Loop"). */
  tp_buf_init(&a->out);
  tp_buf_init(&a->held);

  if (fcntl(chan, F_GETFD) < 0)
    return tp_error_errno(err, errno, "channel fd %d", chan);
  a->listen_fd = find_listener(chan);
  /* A guest's /init inherits nothing, and keeps its cgroup fds open */
  if (!agent_vm_guest)
    close_inherited_fds(chan, a->listen_fd);
  ensure_std_fds();
  if (fcntl(chan, F_SETFD, FD_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "channel cloexec");
  fl = fcntl(chan, F_GETFL);
  if (agent_vm_guest) { /* the port: non-blocking, SIGIO when the host end opens or closes */
    if (agent_vm_port_init(chan, err) < 0)
      return -1;
    a->vm_port = chan;
  } else if (fl >= 0 && (fl & O_NONBLOCK)) {
    fcntl(chan, F_SETFL, fl & ~O_NONBLOCK);
  }
  if (!agent_vm_guest)
    channel_tune(chan);
  /* Non-blocking: a connection that goes away between poll and accept must
   * not hang the loop. */
  if (a->listen_fd >= 0 && (fcntl(a->listen_fd, F_SETFD, FD_CLOEXEC) < 0 ||
                            fcntl(a->listen_fd, F_SETFL, O_NONBLOCK) < 0))
    return tp_error_errno(err, errno, "listening socket");

  signal(SIGPIPE, SIG_IGN);
  /* what a child undoes before it execs, found out once here and not in
   * each child (agent_cred.c) */
  agent_sig_init(&a->sig_reset);
  a->bset_empty = agent_cred_init();
  /* Nothing in the box may read our memory, environment or fds (the
   * listener) through /proc/1, nor ptrace us. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
    return tp_error_errno(err, errno, "prctl PR_SET_DUMPABLE");
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
  if (agent_vm_guest)
    sigaddset(&set, SIGIO);
  if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
    return tp_error_errno(err, errno, "sigprocmask");
  a->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (a->sigfd < 0)
    return tp_error_errno(err, errno, "signalfd");

  a->rbuf = malloc(TP_FRAME_HDR + TP_FRAME_MAX);
  if (a->rbuf == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  return 0;
}

static void drain_sigfd(agent_t *a) {
  struct signalfd_siginfo si[16];
  while (read(a->sigfd, si, sizeof(si)) > 0)
    ;
}

static void send_ready(agent_t *a) {
  agent_event_begin(a, TP_MSG_READY);
  tp_frame_add_int(&a->out, TP_TAG_VERSION, TP_PROTO_VERSION);
  tp_frame_add_int(&a->out, TP_TAG_PID, getpid());
  /* FS_OPEN's fd needs a socket channel: a microVM guest's port carries none */
  tp_frame_add_int(&a->out, TP_TAG_FLAGS, TP_F_READY_NET_DOWN | TP_F_READY_EXEC_USER | TP_F_READY_NET_FD |
                                              (a->vm_port < 0 ? TP_F_READY_FS_FD : 0) |
                                              (a->net != NULL ? TP_F_READY_NET_LISTEN : 0));
  agent_send(a);
}

/* The channel is gone but a daemon may come back: keep the box running.  A
 * guest keeps its port open (closing it would tell QEMU the guest left). */
static void detach(agent_t *a) {
  if (a->chan != a->vm_port)
    close(a->chan);
  a->chan = -1;
  a->dead = 0;
  a->rlen = 0; /* a request cut in half by the crash */
  a->rpos = 0;
  agent_fdsets_clear(a);
  agent_net_detach(a);
  agent_watch_clear(a);
  tp_buf_reset(&a->out);
  a->deadline = agent_now_ms() + a->grace_ms;
  agent_log("channel lost: detached, waiting %lld s for a daemon", a->grace_ms / 1000);
}

/* A connection on the listener: the new channel when detached, refused
 * (closed unread) while attached. */
static void listener_accept(agent_t *a) {
  int fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
      return;
    agent_log("accept: %s", strerror(errno));
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      a->listen_pause = agent_now_ms() + LISTEN_PAUSE_MS; /* retry later, no busy loop */
    } else { /* the socket itself is broken: no re-adoption from now on */
      close(a->listen_fd);
      a->listen_fd = -1;
    }
    return;
  }
  if (a->chan >= 0) {
    agent_log("refusing a second connection: a daemon is attached");
    close(fd);
    return;
  }
  a->chan = fd;
  channel_tune(fd);
  agent_log("re-attached");
  send_ready(a);
  agent_proc_flush_exits(a);
}

/* A guest's port whose host end is open again: the new channel. */
static void vm_reattach(agent_t *a) {
  a->chan = a->vm_port;
  agent_log("re-attached");
  send_ready(a);
  agent_proc_flush_exits(a);
}

#define VM_RECHECK_MS 1000 /* detached guest: the port's state is checked at least this often */

/* The whole pages of [from, to) given back: they read as zeros next. */
static void drop_pages(void *from, void *to) {
  const uintptr_t pg = (uintptr_t) sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t) from + pg - 1) & ~(pg - 1), hi = (uintptr_t) to & ~(pg - 1);
  if (from != NULL && hi > lo)
    madvise((void *) lo, hi - lo, MADV_DONTNEED);
}

/* glibc's malloc keeps freed memory at the top of its heap until told
 * otherwise; musl's (the agent is built against it where it is installed:
 * backends/agent/CMakeLists.txt) unmaps or madvises a freed group's pages
 * itself, and has no malloc_trim. */
static void heap_trim(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

/* Gives the kernel back the pages of a quiet agent's buffers: the free
 * heap, the channel's read buffer past what it holds and the buffer frames
 * are built in (both made resident by 1 MiB frames), and the one processes'
 * output is read into.  Their next use faults zeroed pages in again.  A box's agent spends most of its
 * life idle: what its requests left (buffers of a file transfer, a
 * command's argv) is given back then, not kept resident in each of
 * thousands of boxes (malloc keeps up to its trim threshold, which grows
 * to twice the largest block it has freed). */
static void trim(agent_t *a) {
  heap_trim();
  if (a->rbuf != NULL)
    drop_pages(a->rbuf + a->rlen, a->rbuf + TP_FRAME_HDR + TP_FRAME_MAX);
  if (a->out.data != NULL)
    drop_pages(a->out.data + a->out.len, a->out.data + a->out.cap);
  if (a->held.data != NULL)
    drop_pages(a->held.data + a->held.len, a->held.data + a->held.cap);
  drop_pages(a->iobuf, a->iobuf + sizeof(a->iobuf));
}

/* The poll timeout: until the grace period or a listener pause ends, or
 * trim_at (when the buffers are to be trimmed; 0: they were since the
 * last work). */
static int poll_timeout(const agent_t *a, long long now, int listen_paused, long long trim_at) {
  long long t = -1;
  if (trim_at > 0)
    t = trim_at > now ? trim_at - now : 0;
  if (a->chan < 0 && (t < 0 || a->deadline - now < t))
    t = a->deadline - now;
  /* SIGIO wakes a detached guest when the host reopens its port; this bounds
   * the wait should a signal be merged with an earlier one */
  if (a->chan < 0 && a->vm_port >= 0 && t > VM_RECHECK_MS)
    t = VM_RECHECK_MS;
  if (listen_paused && (t < 0 || a->listen_pause - now < t))
    t = a->listen_pause - now;
  if (t > 60000)
    t = 60000;
  return t < 0 ? -1 : (int) t;
}

static int agent_run(agent_t *a) {
  long long trim_at = 0;
  /* a linux box's: its network ports bound before READY says so (a guest's
   * waits for the host's NET_LISTEN, after its VM_INIT); should it fail,
   * the host's NET_LISTEN tries again and reports it */
  if (a->vm_port < 0) {
    tp_error_t err;
    tp_error_clear(&err);
    if (agent_net_listen_now(a, &err) < 0)
      agent_log("network ports: %s", err.msg);
  }
  send_ready(a);

  for (;;) {
    long long now;
    int n, nproc, nw, paused, ready, timeout;
    if (a->broken)
      return -1;
    if (a->dead) {
      if (a->listen_fd < 0 && a->vm_port < 0)
        return 0;
      detach(a);
    }
    if (a->chan < 0 && a->vm_port >= 0 && agent_vm_host_connected(a->vm_port))
      vm_reattach(a);
    now = agent_now_ms();
    if (a->chan < 0 && (now >= a->deadline || (a->listen_fd < 0 && a->vm_port < 0))) {
      agent_log("no daemon within %lld s: stopping", a->grace_ms / 1000);
      return 0;
    }
    paused = a->listen_fd >= 0 && now < a->listen_pause;
    a->pfds[0] = (struct pollfd){.fd = a->chan, .events = POLLIN};
    a->pfds[1] = (struct pollfd){.fd = a->sigfd, .events = POLLIN};
    a->pfds[2] = (struct pollfd){.fd = paused ? -1 : a->listen_fd, .events = POLLIN};
    nproc = agent_proc_poll_fill(a, AGENT_POLL_FIRST);
    nw = agent_watch_poll_fill(a, nproc);
    n = agent_net_poll_fill(a, nw);
    timeout = poll_timeout(a, now, paused, trim_at);
    if (a->rest_until_us > 0) { /* a resting pipe (agent_proc_poll_fill) is read then */
      long long us = a->rest_until_us - agent_now_us();
      int ms = us <= 0 ? 0 : (int) ((us + 999) / 1000);
      if (timeout < 0 || ms < timeout)
        timeout = ms;
    }
    ready = poll(a->pfds, (nfds_t) n, timeout);
    if (ready < 0) {
      if (errno == EINTR)
        continue;
      agent_log("poll: %s", strerror(errno));
      return -1;
    }
    if (ready > 0) {
      trim_at = agent_now_ms() + TRIM_QUIET_MS;
    } else if (trim_at > 0 && agent_now_ms() >= trim_at) {
      trim(a);
      trim_at = 0;
    }
    /* Output first, then reaping (which drains and sends EXIT), then new
     * requests, which may reuse the slots freed by reaping, then a new
     * connection. */
    agent_proc_poll_handle(a, AGENT_POLL_FIRST, nproc);
    agent_watch_poll_handle(a, nproc, nw);
    agent_net_poll_handle(a, nw, n);
    if (a->pfds[1].revents) {
      drain_sigfd(a);
      agent_proc_reap(a);
    }
    if (a->pfds[0].revents && a->chan >= 0 && channel_read(a) < 0)
      return -1;
    if (a->pfds[2].revents) {
      if (a->dead) /* lost in this same round: the caller may be the new daemon */
        detach(a);
      listener_accept(a);
    }
  }
}

static int parse_num(const char *opt, const char *s, long max, long *out) {
  char *end;
  long v;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < 0 || v > max) {
    agent_log("bad %s value '%s'", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  static agent_t agent;
  tp_error_t err;
  long chan = AGENT_CHAN_FD, grace = AGENT_GRACE_DEFAULT_S;
  int rc;

  if (agent_vm_detect()) { /* /init of a microVM guest: the kernel's arguments are not ours */
    tp_error_clear(&err);
    if (agent_vm_setup(&rc, &err) < 0) {
      agent_log("guest set-up: %s", err.msg);
      agent_vm_poweroff();
      return 1;
    }
    chan = rc;
    argc = 1;
  }
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--fd") == 0 && i + 1 < argc) {
      if (parse_num("--fd", argv[++i], INT_MAX, &chan) < 0)
        return 2;
    } else if (strcmp(argv[i], "--grace") == 0 && i + 1 < argc) {
      if (parse_num("--grace", argv[++i], AGENT_GRACE_MAX_S, &grace) < 0)
        return 2;
    } else {
      agent_log("usage: tupper-agent [--fd N] [--grace SECONDS]");
      return 2;
    }
  }
  /* What the C library's start-up left free at the top of the heap (128
   * KiB) is given back, so that the first large zeroed block (the network
   * relay's table, 70 KiB, at every box's start) is fresh memory from the
   * kernel, which calloc does not write through: only the pages it uses
   * become resident. */
  heap_trim();
  tp_error_clear(&err);
  if (agent_init(&agent, (int) chan, grace, &err) < 0) {
    agent_log("%s", err.msg);
    return 1;
  }
  rc = agent_run(&agent);
  /* Stopping: take every process group with us (as PID 1 of a PID
   * namespace our exit kills the rest anyway). */
  agent_proc_kill_all(&agent);
  agent_watch_clear(&agent);
  if (agent_vm_guest) /* PID 1 of the guest must not exit: power off instead */
    agent_vm_poweroff();
  return rc < 0 ? 1 : 0;
}
