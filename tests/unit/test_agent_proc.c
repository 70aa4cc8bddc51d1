/* Drives the real tupper-agent (env TUPPER_AGENT) as an ordinary process over
 * a socketpair, playing the host: processes, held exec and release, the
 * privileges a child drops, stdin, signals, file operations, hostile frames,
 * and detaching from a lost channel and re-attaching through a listening
 * socket.  Every wait is a poll with a deadline, never a sleep.  The test is
 * a child subreaper, so whatever the agent leaves behind comes to us; at the
 * end it checks that nothing is left running.  It must run as root (the
 * agent switches uid/gid and drops capabilities it must first have). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "tap.h"

#define TIMEOUT_MS 10000
#define MAX_TPROCS 128
#define AGENT_WATCH_DIRS_MAX_T 8193 /* one past the agent's AGENT_WATCH_DIRS_MAX */



/* buf = a followed by b; buf has PATH_MAX bytes. */
static char *join(char *buf, const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la + lb >= PATH_MAX) {
    fprintf(stderr, "test_agent: path too long\n");
    exit(1);
  }
  memcpy(buf, a, la);
  memcpy(buf + la, b, lb + 1);
  return buf;
}

/* ---- the host side of the channel ------------------------------------------------ */

typedef struct msg_s {
  struct msg_s *next;
  uint8_t type;
  uint32_t id;
  uint32_t len;         /* payload length */
  int n;
  tp_field_t *f;
  uint8_t *raw;         /* payload */
} msg_t;

typedef struct tproc_s {
  int64_t pid;
  tp_buf_t out[3];      /* [1] stdout, [2] stderr */
  int exited;
  int64_t code, sig;
} tproc_t;

typedef struct host_s {
  int fd;
  pid_t agent;
  int eof;
  int bad_frames;       /* frames from the agent that did not parse */
  int stray_events;     /* events for pids without an OK, or after EXIT */
  int ready_count;
  int64_t ready_version, ready_pid;
  int first_event;      /* type of the first event received, 0 before */
  uint8_t *rbuf;
  size_t rlen;
  uint32_t next_id, cur_id;
  tp_buf_t req;
  msg_t *replies;
  int nprocs;
  tproc_t procs[MAX_TPROCS];
  tp_buf_t wev;         /* WATCH_EVENTs as text lines "WATCH EVENT NAME" */
} host_t;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void msg_free(msg_t *m) {
  if (m == NULL)
    return;
  free(m->f);
  free(m->raw);
  free(m);
}

static const tp_field_t *msg_get(const msg_t *m, uint16_t tag) {
  return m ? tp_fields_get(m->f, m->n, tag) : NULL;
}

static int64_t msg_int(const msg_t *m, uint16_t tag, int64_t def) {
  int64_t v;
  return tp_field_int(msg_get(m, tag), &v) == 0 ? v : def;
}

static int msg_is_ok(const msg_t *m) { return m != NULL && m->type == TP_MSG_OK; }

/* ERRNO of an ERR reply, 0 for anything else. */
static int msg_errno(const msg_t *m) {
  return m != NULL && m->type == TP_MSG_ERR ? (int) msg_int(m, TP_TAG_ERRNO, -1) : 0;
}

static int msg_has_text(const msg_t *m, const char *needle) {
  const tp_field_t *f = msg_get(m, TP_TAG_MSG);
  return f != NULL && memmem(f->val, f->len, needle, strlen(needle)) != NULL;
}

static tproc_t *tproc_get(host_t *h, int64_t pid) {
  for (int i = 0; i < h->nprocs; i++)
    if (h->procs[i].pid == pid)
      return &h->procs[i];
  return NULL;
}

static void on_event(host_t *h, const msg_t *m) {
  tproc_t *p;
  if (h->first_event == 0)
    h->first_event = m->type;
  if (m->type == TP_MSG_READY) {
    h->ready_count++;
    h->ready_version = msg_int(m, TP_TAG_VERSION, -1);
    h->ready_pid = msg_int(m, TP_TAG_PID, -1);
    return;
  }
  if (m->type == TP_MSG_WATCH_EVENT) {
    const tp_field_t *name = msg_get(m, TP_TAG_NAME);
    char line[64];
    int n = snprintf(line, sizeof(line), "%lld %lld ", (long long) msg_int(m, TP_TAG_WATCH, -1),
                     (long long) msg_int(m, TP_TAG_EVENT, -1));
    if (msg_get(m, TP_TAG_WATCH) == NULL || msg_get(m, TP_TAG_EVENT) == NULL)
      h->stray_events++;
    tp_buf_append(&h->wev, line, (size_t) n);
    if (name != NULL)
      tp_buf_append(&h->wev, name->val, name->len);
    tp_buf_append(&h->wev, "\n", 1);
    return;
  }
  p = tproc_get(h, msg_int(m, TP_TAG_PID, -1));
  if (p == NULL || p->exited) {
    h->stray_events++;
    return;
  }
  if (m->type == TP_MSG_OUTPUT) {
    int64_t stream = msg_int(m, TP_TAG_STREAM, 0);
    const tp_field_t *d = msg_get(m, TP_TAG_DATA);
    if ((stream != 1 && stream != 2) || d == NULL)
      h->stray_events++;
    else
      tp_buf_append(&p->out[stream], d->val, d->len);
  } else if (m->type == TP_MSG_EXIT) {
    p->exited = 1;
    p->code = msg_int(m, TP_TAG_CODE, -100);
    p->sig = msg_int(m, TP_TAG_SIGNAL, -100);
  }
}

/* Handles whole frames in the read buffer: events are tracked, replies
 * queued.  An OK carrying a PID (EXEC) registers the pid before any event
 * that follows it is looked at. */
static void handle_frames(host_t *h) {
  size_t off = 0;
  for (;;) {
    tp_frame_t f;
    msg_t *m;
    long l = tp_frame_parse_header(h->rbuf + off, h->rlen - off, &f);
    if (l < 0) {
      h->bad_frames++;
      h->eof = 1;
      break;
    }
    if (l == 0)
      break;
    m = calloc(1, sizeof(*m));
    m->type = f.type;
    m->id = f.id;
    m->len = f.len;
    m->raw = malloc(f.len ? f.len : 1);
    memcpy(m->raw, f.payload, f.len);
    m->f = calloc(f.len / 6 + 1, sizeof(*m->f));
    m->n = tp_fields_parse(m->raw, f.len, m->f, (int) (f.len / 6 + 1));
    off += (size_t) l;
    if (m->n < 0) {
      h->bad_frames++;
      m->n = 0;
    }
    if (m->id == 0) {
      on_event(h, m);
      msg_free(m);
      continue;
    }
    if (m->type == TP_MSG_OK && msg_get(m, TP_TAG_PID) != NULL && h->nprocs < MAX_TPROCS) {
      tproc_t *p = &h->procs[h->nprocs++];
      memset(p, 0, sizeof(*p));
      p->pid = msg_int(m, TP_TAG_PID, -1);
    }
    msg_t **tail = &h->replies;
    while (*tail != NULL)
      tail = &(*tail)->next;
    *tail = m;
  }
  memmove(h->rbuf, h->rbuf + off, h->rlen - off);
  h->rlen -= off;
}

/* Reads once (waiting until the deadline) and handles what arrived.
 * Returns -1 on timeout or EOF. */
static int pump(host_t *h, long long deadline) {
  struct pollfd pfd = {.fd = h->fd, .events = POLLIN};
  long long left = deadline - now_ms();
  ssize_t n;
  if (h->eof || left <= 0)
    return -1;
  if (poll(&pfd, 1, (int) left) <= 0)
    return -1;
  n = read(h->fd, h->rbuf + h->rlen, TP_FRAME_HDR + TP_FRAME_MAX - h->rlen);
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return 0;
  if (n <= 0) {
    h->eof = 1;
    return -1;
  }
  h->rlen += (size_t) n;
  handle_frames(h);
  return 0;
}

/* Writes everything, reading whatever the agent sends meanwhile (it may be
 * blocked writing OUTPUT to us). */
static int send_all(host_t *h, const uint8_t *p, size_t n) {
  long long deadline = now_ms() + TIMEOUT_MS;
  while (n > 0) {
    struct pollfd pfd = {.fd = h->fd, .events = POLLOUT | POLLIN};
    ssize_t w;
    if (poll(&pfd, 1, (int) (deadline - now_ms())) <= 0)
      return -1;
    if ((pfd.revents & POLLIN) && h->rlen < TP_FRAME_HDR + TP_FRAME_MAX)
      pump(h, now_ms() + 1);
    if (!(pfd.revents & POLLOUT))
      continue;
    w = write(h->fd, p, n);
    if (w < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (w < 0)
      return -1;
    p += w;
    n -= (size_t) w;
  }
  return 0;
}

static msg_t *wait_reply(host_t *h, uint32_t id) {
  long long deadline = now_ms() + TIMEOUT_MS;
  for (;;) {
    for (msg_t **pp = &h->replies; *pp != NULL; pp = &(*pp)->next)
      if ((*pp)->id == id) {
        msg_t *m = *pp;
        *pp = m->next;
        return m;
      }
    if (pump(h, deadline) < 0)
      return NULL;
  }
}

static tp_buf_t *req_begin(host_t *h, uint8_t type) {
  tp_buf_reset(&h->req);
  h->cur_id = ++h->next_id;
  tp_frame_begin(&h->req, type, h->cur_id);
  return &h->req;
}

static msg_t *req_call(host_t *h) {
  if (tp_frame_end(&h->req) < 0 || send_all(h, h->req.data, h->req.len) < 0)
    return NULL;
  return wait_reply(h, h->cur_id);
}

static tproc_t *wait_exit(host_t *h, int64_t pid) {
  long long deadline = now_ms() + TIMEOUT_MS;
  tproc_t *p = tproc_get(h, pid);
  while (p != NULL && !p->exited)
    if (pump(h, deadline) < 0)
      return NULL;
  return p;
}

static int out_has(const tproc_t *p, int stream, const char *s) {
  const tp_buf_t *b = &p->out[stream];
  return b->len > 0 && memmem(b->data, b->len, s, strlen(s)) != NULL;
}

static int out_is(const tproc_t *p, int stream, const char *s) {
  const tp_buf_t *b = &p->out[stream];
  return b->len == strlen(s) && memcmp(b->data, s, b->len) == 0;
}

/* ---- starting and stopping agents ------------------------------------------------- */

static void host_init(host_t *h, int fd) {
  memset(h, 0, sizeof(*h));
  tp_buf_init(&h->req);
  h->rbuf = malloc(TP_FRAME_HDR + TP_FRAME_MAX);
  h->fd = fd;
  h->agent = -1;
  fcntl(h->fd, F_SETFL, O_NONBLOCK);
}

/* Pretends the host knew pid from an EXEC (a new daemon after PS). */
static tproc_t *host_track(host_t *h, int64_t pid) {
  tproc_t *p = &h->procs[h->nprocs++];
  memset(p, 0, sizeof(*p));
  p->pid = pid;
  return p;
}

/* Starts the agent with its channel at fd 10.  stray_rd != NULL: a stray
 * inherited pipe at fds 11 and TP_AGENT_LISTEN_FD (its write end; *stray_rd
 * gets the read end), which the agent must close.  listen_fd >= 0: a
 * listening socket at TP_AGENT_LISTEN_FD.  grace: "--grace" value or NULL.
 * The agent runs with oom_score_adj 300, which its children must not get. */
static int agent_start_opts(host_t *h, const char *agent, const char *cwd, int *stray_rd,
                            int listen_fd, const char *grace) {
  int sv[2], stray[2] = {-1, -1};
  host_init(h, -1);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 ||
      (stray_rd != NULL && pipe2(stray, O_CLOEXEC) < 0))
    return -1;
  h->agent = fork();
  if (h->agent < 0)
    return -1;
  if (h->agent == 0) {
    int oom = open("/proc/self/oom_score_adj", O_WRONLY);
    int lfd = listen_fd >= 0 ? fcntl(listen_fd, F_DUPFD_CLOEXEC, 100) : -1;
    if (oom < 0 || write(oom, "300", 3) != 3 || chdir(cwd) < 0 || dup2(sv[1], 10) < 0 ||
        (listen_fd >= 0 && (lfd < 0 || dup2(lfd, TP_AGENT_LISTEN_FD) < 0)) ||
        (stray_rd != NULL &&
         (dup2(stray[1], 11) < 0 || dup2(11, TP_AGENT_LISTEN_FD) < 0)))
      _exit(126);
    if (grace != NULL)
      execl(agent, agent, "--fd", "10", "--grace", grace, (char *) NULL);
    else
      execl(agent, agent, "--fd", "10", (char *) NULL);
    _exit(127);
  }
  close(sv[1]);
  if (stray_rd != NULL) {
    close(stray[1]);
    *stray_rd = stray[0];
  }
  h->fd = sv[0];
  fcntl(h->fd, F_SETFL, O_NONBLOCK);
  return 0;
}

static int agent_start(host_t *h, const char *agent, const char *cwd, int *stray_rd) {
  return agent_start_opts(h, agent, cwd, stray_rd, -1, NULL);
}

/* Waits for the agent to exit; returns its wait status or -1 on timeout. */
static int agent_wait(host_t *h) {
  long long deadline = now_ms() + TIMEOUT_MS;
  int status;
  for (;;) {
    pid_t r = waitpid(h->agent, &status, WNOHANG);
    if (r == h->agent)
      return status;
    if (r < 0 || now_ms() > deadline) {
      kill(h->agent, SIGKILL);
      waitpid(h->agent, NULL, 0);
      return -1;
    }
    poll(NULL, 0, 10);
  }
}

/* The host's side of a listening socket at `path`, or -1. */
static int listener_make(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || strlen(path) >= sizeof(sa.sun_path))
    goto fail;
  strcpy(sa.sun_path, path);
  if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 8) < 0)
    goto fail;
  return fd;
fail:
  if (fd >= 0)
    close(fd);
  return -1;
}

static int connect_to(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  strcpy(sa.sun_path, path);
  if (fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void host_free(host_t *h) {
  while (h->replies != NULL) {
    msg_t *m = h->replies;
    h->replies = m->next;
    msg_free(m);
  }
  for (int i = 0; i < h->nprocs; i++)
    for (int s = 0; s < 3; s++)
      tp_buf_free(&h->procs[i].out[s]);
  tp_buf_free(&h->req);
  tp_buf_free(&h->wev);
  free(h->rbuf);
  if (h->fd >= 0)
    close(h->fd);
  h->fd = -1;
}

/* Waits until kill(target, 0) says ESRCH: a pid or (negative) a group is gone. */
static int wait_gone(pid_t target) {
  long long deadline = now_ms() + TIMEOUT_MS;
  while (kill(target, 0) == 0 || errno != ESRCH) {
    while (waitpid(-1, NULL, WNOHANG) > 0) /* orphans that came to us */
      ;
    if (now_ms() > deadline)
      return -1;
    poll(NULL, 0, 10);
  }
  return 0;
}

/* ---- request helpers ---------------------------------------------------------------- */

#define NO_ID INT64_MIN /* leave UID/GID out */

/* EXEC with UID and GID fields unless NO_ID. */
static msg_t *exec_as(host_t *h, const char *const *argv, const char *cwd, int flags, int64_t uid,
                      int64_t gid) {
  tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
  for (; argv && *argv; argv++)
    tp_frame_add_str(b, TP_TAG_ARG, *argv);
  if (cwd)
    tp_frame_add_str(b, TP_TAG_CWD, cwd);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  if (uid != NO_ID)
    tp_frame_add_int(b, TP_TAG_UID, uid);
  if (gid != NO_ID)
    tp_frame_add_int(b, TP_TAG_GID, gid);
  return req_call(h);
}

static int64_t run_as(host_t *h, const char *const *argv, int flags, int64_t uid, int64_t gid) {
  msg_t *m = exec_as(h, argv, NULL, flags, uid, gid);
  int64_t pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -EPROTO) : m ? -msg_errno(m) : -ETIMEDOUT;
  msg_free(m);
  return pid;
}

static msg_t *exec_req(host_t *h, const char *const *argv, const char *const *env, const char *cwd,
                       int flags) {
  tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
  for (; argv && *argv; argv++)
    tp_frame_add_str(b, TP_TAG_ARG, *argv);
  for (; env && *env; env++)
    tp_frame_add_str(b, TP_TAG_ENV, *env);
  if (cwd)
    tp_frame_add_str(b, TP_TAG_CWD, cwd);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  return req_call(h);
}

/* Runs a command; returns its pid, or -errno. */
static int64_t run(host_t *h, const char *const *argv, const char *const *env, const char *cwd,
                   int flags) {
  msg_t *m = exec_req(h, argv, env, cwd, flags);
  int64_t pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -EPROTO) : m ? -msg_errno(m) : -ETIMEDOUT;
  msg_free(m);
  return pid;
}

static msg_t *pid_req(host_t *h, uint8_t type, int64_t pid, uint16_t tag, int64_t v) {
  tp_buf_t *b = req_begin(h, type);
  tp_frame_add_int(b, TP_TAG_PID, pid);
  if (tag)
    tp_frame_add_int(b, tag, v);
  return req_call(h);
}

static msg_t *stdin_req(host_t *h, int64_t pid, const void *data, size_t n) {
  tp_buf_t *b = req_begin(h, TP_MSG_STDIN);
  tp_frame_add_int(b, TP_TAG_PID, pid);
  tp_frame_add(b, TP_TAG_DATA, data, (uint32_t) n);
  return req_call(h);
}

static msg_t *path_req(host_t *h, uint8_t type, const char *path) {
  tp_buf_t *b = req_begin(h, type);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  return req_call(h);
}

static msg_t *write_req(host_t *h, const char *path, const void *data, size_t n, int64_t off,
                        int flags, int mode) {
  tp_buf_t *b = req_begin(h, TP_MSG_FS_WRITE);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  tp_frame_add(b, TP_TAG_DATA, data, (uint32_t) n);
  if (off >= 0)
    tp_frame_add_int(b, TP_TAG_OFFSET, off);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  if (mode >= 0)
    tp_frame_add_int(b, TP_TAG_MODE, mode);
  return req_call(h);
}

static msg_t *read_req(host_t *h, const char *path, int64_t off, int64_t len) {
  tp_buf_t *b = req_begin(h, TP_MSG_FS_READ);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  if (off >= 0)
    tp_frame_add_int(b, TP_TAG_OFFSET, off);
  if (len >= 0)
    tp_frame_add_int(b, TP_TAG_LENGTH, len);
  return req_call(h);
}

static msg_t *flags_req(host_t *h, uint8_t type, const char *path, int flags, int mode) {
  tp_buf_t *b = req_begin(h, type);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  if (mode >= 0)
    tp_frame_add_int(b, TP_TAG_MODE, mode);
  return req_call(h);
}

/* Checks that m is ERR with errno e, and frees it. */
static void expect_err(msg_t *m, int e, const char *what) {
  const tp_field_t *msg = msg_get(m, TP_TAG_MSG);
  check(msg_errno(m) == e && msg != NULL && msg->len > 0, "%s -> ERR %s (got %d%s%.*s)", what,
        strerror(e), msg_errno(m), msg ? ": " : "", msg ? (int) msg->len : 0,
        msg ? (const char *) msg->val : "");
  msg_free(m);
}

static void expect_ok(msg_t *m, const char *what) {
  const tp_field_t *msg = msg_get(m, TP_TAG_MSG);
  check(msg_is_ok(m), "%s -> OK%s%.*s", what, msg ? " (got: " : "", msg ? (int) msg->len : 0,
        msg ? (const char *) msg->val : "");
  msg_free(m);
}

static int data_eq(const msg_t *m, const void *want, size_t n) {
  const tp_field_t *d = msg_get(m, TP_TAG_DATA);
  return d != NULL && d->len == n && memcmp(d->val, want, n) == 0;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_ready(host_t *h, int stray_rd) {
  long long deadline = now_ms() + TIMEOUT_MS;
  struct pollfd pfd = {.fd = stray_rd, .events = POLLIN};
  char c;
  while (h->ready_count == 0 && pump(h, deadline) == 0)
    ;
  check(h->ready_count == 1, "READY arrives first");
  check(h->ready_version == TP_PROTO_VERSION, "READY carries VERSION 1");
  check(h->ready_pid == h->agent, "READY carries the agent's pid");
  check(poll(&pfd, 1, TIMEOUT_MS) == 1 && read(stray_rd, &c, 1) == 0,
        "the agent closed an inherited fd other than the channel");
  close(stray_rd);
}

/* The microVM guest's requests are refused by an agent that is not one
 * (a linux box's): nothing of the guest set-up runs in a box. */
static void test_vm_requests(host_t *h) {
  req_begin(h, TP_MSG_VM_ATTACH);
  expect_err(req_call(h), EOPNOTSUPP, "VM_ATTACH outside a microVM");
  tp_buf_t *b = req_begin(h, TP_MSG_VM_INIT);
  tp_frame_add_str(b, TP_TAG_NAME, "x");
  tp_frame_add_int(b, TP_TAG_MTIME, 1);
  tp_frame_add_int(b, TP_TAG_GRACE, 1);
  expect_err(req_call(h), EOPNOTSUPP, "VM_INIT outside a microVM");
}

static void test_exec(host_t *h, const char *tmp) {
  const char *sh[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
  const char *pathsearch[] = {"sh", "-c", "exit 0", NULL};
  const char *envcmd[] = {"/usr/bin/env", NULL};
  const char *env[] = {"FOO=bar", "EMPTY=", NULL};
  const char *pwd[] = {"/bin/sh", "-c", "pwd", NULL};
  const char *fds[] = {"/bin/sh", "-c", "ls /proc/self/fd | wc -l", NULL};
  const char *um[] = {"/bin/sh", "-c", "umask", NULL};
  char want[PATH_MAX + 2];
  int64_t pid;
  tproc_t *p;

  pid = run(h, sh, NULL, NULL, 0);
  check(pid > 0, "exec sh -> OK with PID (%lld)", (long long) pid);
  p = wait_exit(h, pid);
  check(p != NULL, "EXIT arrives");
  if (p == NULL)
    return;
  check(out_is(p, 1, "out\n"), "stdout is \"out\\n\"");
  check(out_is(p, 2, "err\n"), "stderr is \"err\\n\"");
  check(p->code == 3 && p->sig == 0, "EXIT CODE 3 SIGNAL 0 (got %lld %lld)", (long long) p->code,
        (long long) p->sig);

  pid = run(h, pathsearch, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == 0, "argv[0] without '/' is found in the default PATH");

  pid = run(h, envcmd, env, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "FOO=bar\nEMPTY=\n"), "the environment is exactly ENV");

  pid = run(h, pwd, NULL, tmp, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  join(want, tmp, "\n");
  check(p != NULL && out_is(p, 1, want), "CWD is honoured");
  pid = run(h, pwd, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "/\n"), "CWD defaults to /");

  /* ls sees 0-2 plus the fd it opened on /proc/self/fd: nothing inherited. */
  pid = run(h, fds, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "4\n"), "the child has only fds 0-2 (ls counts 0-2 and its own)");

  pid = run(h, um, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "0027\n"), "the child gets the agent's inherited umask");
}

static void test_exec_errors(host_t *h, const char *tmp) {
  const char *missing[] = {"no-such-binary-tupper", NULL};
  const char *missing_abs[] = {"/nonexistent/tupper", NULL};
  const char *tru[] = {"/bin/true", NULL};
  const char *sh[] = {"sh", NULL};
  const char *badpath[] = {"PATH=/nonexistent", NULL};
  char noexec[PATH_MAX];
  const char *noexec_argv[] = {noexec, NULL};
  msg_t *m;
  int fd;

  m = exec_req(h, missing, NULL, NULL, 0);
  check(msg_errno(m) == ENOENT && msg_has_text(m, "exec 'no-such-binary-tupper'"),
        "exec of a missing program -> ERR ENOENT \"exec 'no-such-binary-tupper': ...\"");
  msg_free(m);
  expect_err(exec_req(h, missing_abs, NULL, NULL, 0), ENOENT, "exec of a missing absolute path");
  expect_err(exec_req(h, sh, badpath, NULL, 0), ENOENT, "PATH comes from ENV");
  m = exec_req(h, tru, NULL, "/nonexistent-dir", 0);
  check(msg_errno(m) == ENOENT && msg_has_text(m, "chdir"), "exec with a missing CWD -> ERR ENOENT (chdir)");
  msg_free(m);
  expect_err(exec_req(h, tru, NULL, "relative", 0), EINVAL, "exec with a relative CWD");

  join(noexec, tmp, "/noexec.sh");
  fd = open(noexec, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    check(write(fd, "#!/bin/sh\n", 10) == 10, "write a non-executable script");
    close(fd);
  }
  expect_err(exec_req(h, noexec_argv, NULL, NULL, 0), EACCES, "exec of a non-executable file");
  m = exec_req(h, NULL, NULL, NULL, 0);
  check(msg_errno(m) == EINVAL && msg_has_text(m, "exec: no ARG"), "exec without ARG -> ERR EINVAL \"exec: no ARG\"");
  msg_free(m);
  expect_err(exec_req(h, tru, NULL, NULL, 0x100), EINVAL, "exec with unknown FLAGS");
}

static void test_stdin(host_t *h) {
  const char *cat[] = {"/bin/cat", NULL};
  const char *sleeper[] = {"/bin/sleep", "100", NULL};
  const size_t total = 300 * 1024, chunk = 64 * 1024;
  uint8_t *in = malloc(total), *big = calloc(1, TP_CHUNK_MAX);
  int64_t pid;
  tproc_t *p;
  int all_ok = 1, eagain = 0;

  for (size_t i = 0; i < total; i++)
    in[i] = (uint8_t) (i * 31 + i / 1000);
  pid = run(h, cat, NULL, NULL, TP_F_EXEC_STDIN);
  check(pid > 0, "exec cat with a stdin pipe");
  for (size_t off = 0; pid > 0 && off < total; off += chunk) {
    msg_t *m = stdin_req(h, pid, in + off, off + chunk > total ? total - off : chunk);
    all_ok &= msg_is_ok(m);
    msg_free(m);
  }
  check(all_ok, "STDIN frames -> OK");
  expect_ok(pid_req(h, TP_MSG_STDIN_CLOSE, pid, 0, 0), "STDIN_CLOSE");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == 0 && p->sig == 0, "cat exits 0 after STDIN_CLOSE");
  check(p != NULL && p->out[1].len == total && memcmp(p->out[1].data, in, total) == 0,
        "cat's output equals its input (%zu bytes)", p ? p->out[1].len : 0);
  expect_err(stdin_req(h, pid, "x", 1), ESRCH, "STDIN to a reaped pid");
  expect_err(pid_req(h, TP_MSG_STDIN_CLOSE, 999999999, 0, 0), ESRCH, "STDIN_CLOSE to an unknown pid");

  /* A child that never reads: the queue is bounded. */
  pid = run(h, sleeper, NULL, NULL, TP_F_EXEC_STDIN);
  for (int i = 0; pid > 0 && i < 6; i++) {
    msg_t *m = stdin_req(h, pid, big, TP_CHUNK_MAX);
    eagain += msg_errno(m) == EAGAIN;
    msg_free(m);
  }
  check(eagain > 0, "STDIN beyond TP_STDIN_QUEUE_MAX -> ERR EAGAIN");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to the non-reader");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == -1 && p->sig == SIGKILL, "it exits with SIGNAL 9 despite its stdin backlog");
  free(in);
  free(big);
}

static void test_signal(host_t *h) {
  const char *tree[] = {"/bin/sh", "-c", "sleep 100 & echo $!; wait", NULL};
  long long deadline = now_ms() + TIMEOUT_MS;
  int64_t pid = run(h, tree, NULL, NULL, 0);
  long long t0;
  pid_t bg = 0;
  int r;
  tproc_t *p = tproc_get(h, pid);

  check(pid > 0, "exec a shell with a background sleep");
  if (p == NULL)
    return;
  while (!out_has(p, 1, "\n") && pump(h, deadline) == 0)
    ;
  if (p->out[1].len > 0)
    bg = (pid_t) strtol((const char *) p->out[1].data, NULL, 10);
  check(bg > 0, "the shell printed the background pid (%d)", (int) bg);
  expect_err(stdin_req(h, pid, "x", 1), EPIPE, "STDIN to a process without a stdin pipe");
  expect_err(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, 0), EINVAL, "SIGNAL 0");
  expect_err(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, 65), EINVAL, "SIGNAL 65");
  expect_err(pid_req(h, TP_MSG_SIGNAL, 999999999, TP_TAG_SIGNAL, 15), ESRCH, "SIGNAL to an unknown pid");
  expect_err(pid_req(h, TP_MSG_SIGNAL, pid, 0, 0), EINVAL, "SIGNAL without SIGNAL");
  t0 = now_ms();
  expect_ok(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, SIGTERM), "SIGNAL 15 to the group");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == -1 && (p->sig == SIGTERM || p->sig == SIGKILL),
        "EXIT with SIGNAL 15 (got %lld) after %lld ms", p ? (long long) p->sig : 0, now_ms() - t0);
  r = bg > 0 ? wait_gone(bg) : -1;
  check(r == 0, "the background sleep died with its group");
  if (bg > 0 && r < 0)
    kill(bg, SIGKILL);
}

static void test_background(host_t *h) {
  const char *bgcmd[] = {"/bin/sh", "-c", "sleep 100 & echo done", NULL};
  long long t0 = now_ms();
  int64_t pid = run(h, bgcmd, NULL, NULL, 0);
  tproc_t *p = pid > 0 ? wait_exit(h, pid) : NULL;

  check(p != NULL && p->code == 0 && out_is(p, 1, "done\n"),
        "a grandchild holding stdout open does not delay EXIT (%lld ms)", now_ms() - t0);
  if (pid > 0) {
    kill(-(pid_t) pid, SIGKILL);
    check(wait_gone(-(pid_t) pid) == 0, "its process group is gone after SIGKILL");
  }
}

/* A directory too big for one reply: the listing is cut, flagged, sorted,
 * and still parses with the codec's TP_FIELDS_MAX. */
static void test_list_many(host_t *h, const char *d) {
  const int files = TP_FIELDS_MAX + 40;
  char dir[PATH_MAX], name[PATH_MAX], num[16];
  tp_field_t *fs = calloc(TP_FIELDS_MAX, sizeof(*fs));
  int k = 0, sorted = 1;
  char prev[32] = "";
  msg_t *m;

  join(dir, d, "/many");
  mkdir(dir, 0755);
  for (int i = 0; i < files; i++) {
    snprintf(num, sizeof(num), "/%05d", (i * 7919) % files);
    close(open(join(name, dir, num), O_WRONLY | O_CREAT, 0644));
  }
  m = path_req(h, TP_MSG_FS_LIST, dir);
  for (int i = 0; m && i < m->n; i++) {
    tp_field_t sub[8];
    int n;
    const tp_field_t *nf;
    char cur[32] = "";
    if (m->f[i].tag != TP_TAG_ENTRY)
      continue;
    n = tp_fields_parse(m->f[i].val, m->f[i].len, sub, 8);
    nf = n > 0 ? tp_fields_get(sub, n, TP_TAG_NAME) : NULL;
    if (nf != NULL && nf->len < sizeof(cur))
      memcpy(cur, nf->val, nf->len);
    sorted &= strcmp(prev, cur) < 0;
    memcpy(prev, cur, sizeof(prev));
    k++;
  }
  check(msg_is_ok(m) && msg_int(m, TP_TAG_FLAGS, 0) == 1 && k > 1000 && k < files && k <= TP_LIST_MAX,
        "list of %d entries: %d sent, FLAGS=1 (truncated)", files, k);
  check(sorted, "the truncated listing is sorted");
  check(m && tp_fields_parse(m->raw, m->len, fs, TP_FIELDS_MAX) == m->n,
        "the reply parses with TP_FIELDS_MAX fields");
  msg_free(m);
  free(fs);
}

static void test_fs(host_t *h, const char *tmp) {
  char d[PATH_MAX], a[PATH_MAX], big[PATH_MAX], big2[PATH_MAX], deep[PATH_MAX], path[PATH_MAX];
  char outside[PATH_MAX], keep[PATH_MAX], tree[PATH_MAX], longpath[TP_PATH_MAX + 16];
  const size_t bigsize = 3u * 1024 * 1024;
  uint8_t *pat = malloc(bigsize);
  struct stat st;
  msg_t *m;
  int good;

  join(d, tmp, "/fs");
  join(a, d, "/a.txt");
  join(big, d, "/big");
  join(big2, d, "/big2");

  m = flags_req(h, TP_MSG_FS_MKDIR, d, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 1, "mkdir -> CREATED 1");
  msg_free(m);
  m = flags_req(h, TP_MSG_FS_MKDIR, d, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 0, "mkdir of an existing dir -> CREATED 0");
  msg_free(m);
  check(stat(d, &st) == 0 && (st.st_mode & 07777) == 0755, "mkdir default mode 0755");

  /* write / read */
  m = write_req(h, a, "hello", 5, -1, TP_F_WRITE_TRUNC, 0600);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 5, "write 'hello' -> SIZE 5");
  msg_free(m);
  check(stat(a, &st) == 0 && (st.st_mode & 07777) == 0600, "MODE 0600 applied exactly on create");
  m = read_req(h, a, -1, -1);
  check(msg_is_ok(m) && data_eq(m, "hello", 5) && msg_int(m, TP_TAG_SIZE, -1) == 5, "read it back");
  msg_free(m);
  m = write_req(h, a, "XY", 2, 10, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 12, "write at OFFSET 10 without TRUNC -> SIZE 12");
  msg_free(m);
  m = read_req(h, a, 3, 9);
  check(msg_is_ok(m) && data_eq(m, "lo\0\0\0\0\0XY", 9), "read OFFSET 3 LENGTH 9 sees the hole");
  msg_free(m);
  m = write_req(h, a, "!", 1, -1, TP_F_WRITE_APPEND, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 13, "APPEND -> SIZE 13");
  msg_free(m);
  m = write_req(h, a, "new", 3, -1, TP_F_WRITE_TRUNC, 0644);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 3, "TRUNC -> SIZE 3");
  msg_free(m);
  check(stat(a, &st) == 0 && (st.st_mode & 07777) == 0600, "MODE is only used on create");
  m = read_req(h, a, 100, -1);
  check(msg_is_ok(m) && data_eq(m, "", 0), "read past EOF -> empty DATA");
  msg_free(m);

  join(deep, d, "/p/q/r/f.txt");
  m = write_req(h, deep, "x", 1, -1, TP_F_WRITE_PARENTS, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 1, "write with PARENTS creates p/q/r");
  msg_free(m);
  join(path, d, "/p/q");
  check(stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755, "parents are 0755");
  join(path, d, "/x/y/f");
  expect_err(write_req(h, path, "x", 1, -1, 0, -1), ENOENT, "write without PARENTS into a missing dir");
  expect_err(write_req(h, d, "x", 1, -1, 0, -1), EISDIR, "write to a directory");
  expect_err(write_req(h, a, "x", 1, -1, 0x80, -1), EINVAL, "write with unknown FLAGS");
  expect_err(write_req(h, a, "x", 1, -1, 0, 010000), EINVAL, "write with MODE beyond 07777");

  /* 3 MiB in 1 MiB chunks, both ways */
  for (size_t i = 0; i < bigsize; i++)
    pat[i] = (uint8_t) (i * 7 + i / 4093);
  good = 1;
  for (size_t off = 0; off < bigsize; off += TP_CHUNK_MAX) {
    m = write_req(h, big, pat + off, TP_CHUNK_MAX, (int64_t) off, off == 0 ? TP_F_WRITE_TRUNC : 0, -1);
    good &= msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == (int64_t) (off + TP_CHUNK_MAX);
    msg_free(m);
  }
  check(good, "3 MiB written in three 1 MiB chunks");
  good = 1;
  for (size_t off = 0; off < bigsize; off += TP_CHUNK_MAX) {
    m = read_req(h, big, (int64_t) off, -1);
    good &= msg_is_ok(m) && data_eq(m, pat + off, TP_CHUNK_MAX) &&
            msg_int(m, TP_TAG_SIZE, -1) == (int64_t) bigsize;
    msg_free(m);
  }
  check(good, "3 MiB read back in 1 MiB chunks (default LENGTH), SIZE is the file size");
  m = read_req(h, big, 0, 2 * TP_CHUNK_MAX);
  check(msg_is_ok(m) && data_eq(m, pat, TP_CHUNK_MAX), "LENGTH above TP_CHUNK_MAX is clamped");
  msg_free(m);
  m = read_req(h, big, (int64_t) bigsize - 1000, 5000);
  check(msg_is_ok(m) && data_eq(m, pat + bigsize - 1000, 1000), "a read at the tail is short");
  msg_free(m);
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_READ);
    tp_frame_add_str(b, TP_TAG_PATH, big);
    tp_frame_add_int(b, TP_TAG_OFFSET, -2);
    expect_err(req_call(h), EINVAL, "negative OFFSET");
  }
  expect_err(path_req(h, TP_MSG_FS_READ, d), EISDIR, "read of a directory");
  join(path, d, "/missing");
  expect_err(path_req(h, TP_MSG_FS_READ, path), ENOENT, "read of a missing file");

  /* stat */
  m = path_req(h, TP_MSG_FS_STAT, a);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_FILE && msg_int(m, TP_TAG_SIZE, -1) == 3 &&
            msg_int(m, TP_TAG_MODE, -1) == 0600 && msg_int(m, TP_TAG_MTIME, 0) > 1000000000 &&
            msg_int(m, TP_TAG_UID, -1) == (int64_t) getuid() &&
            msg_int(m, TP_TAG_GID, -1) == (int64_t) getgid() && msg_get(m, TP_TAG_LINK) == NULL,
        "stat of a file: TYPE SIZE MODE MTIME UID GID");
  msg_free(m);
  m = path_req(h, TP_MSG_FS_STAT, d);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_DIR, "stat of a dir: TYPE DIR");
  msg_free(m);
  join(path, d, "/link");
  check(symlink("a.txt", path) == 0, "make a symlink");
  m = path_req(h, TP_MSG_FS_STAT, path);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_SYMLINK && msg_get(m, TP_TAG_LINK) &&
            msg_get(m, TP_TAG_LINK)->len == 5 && memcmp(msg_get(m, TP_TAG_LINK)->val, "a.txt", 5) == 0,
        "stat of a symlink: TYPE SYMLINK, LINK is its target");
  msg_free(m);
  join(path, d, "/missing");
  expect_err(path_req(h, TP_MSG_FS_STAT, path), ENOENT, "stat of a missing path");

  /* list: a.txt big link p (sorted) */
  m = path_req(h, TP_MSG_FS_LIST, d);
  {
    const char *names[] = {"a.txt", "big", "link", "p"};
    const int types[] = {TP_FT_FILE, TP_FT_FILE, TP_FT_SYMLINK, TP_FT_DIR};
    int k = 0;
    good = msg_is_ok(m) && msg_get(m, TP_TAG_FLAGS) == NULL;
    for (int i = 0; m && i < m->n; i++) {
      tp_field_t sub[16];
      int n;
      const tp_field_t *name;
      if (m->f[i].tag != TP_TAG_ENTRY)
        continue;
      n = tp_fields_parse(m->f[i].val, m->f[i].len, sub, 16);
      name = tp_fields_get(sub, n > 0 ? n : 0, TP_TAG_NAME);
      good &= k < 4 && n == 5 && name != NULL && name->len == strlen(names[k]) &&
              memcmp(name->val, names[k], name->len) == 0;
      if (k < 4 && n > 0) {
        int64_t type = 0, size = -1;
        tp_field_int(tp_fields_get(sub, n, TP_TAG_TYPE), &type);
        tp_field_int(tp_fields_get(sub, n, TP_TAG_SIZE), &size);
        good &= type == types[k] && (k != 1 || size == (int64_t) bigsize);
      }
      k++;
    }
    check(good && k == 4, "list: 4 ENTRY groups sorted by NAME, with TYPE and SIZE (lstat)");
  }
  msg_free(m);
  expect_err(path_req(h, TP_MSG_FS_LIST, a), ENOTDIR, "list of a file");
  test_list_many(h, d);

  /* mkdir */
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, a, 0, -1), EEXIST, "mkdir over a file");
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, a, TP_F_MKDIR_PARENTS, -1), EEXIST, "mkdir -p over a file");
  join(path, d, "/m/n/o");
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, path, 0, -1), ENOENT, "mkdir with a missing parent");
  m = flags_req(h, TP_MSG_FS_MKDIR, path, TP_F_MKDIR_PARENTS, 0700);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 1, "mkdir PARENTS -> CREATED 1");
  msg_free(m);
  check(stat(path, &st) == 0 && (st.st_mode & 07777) == 0700, "mkdir MODE 0700 applied");
  m = flags_req(h, TP_MSG_FS_MKDIR, path, TP_F_MKDIR_PARENTS, 0700);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 0, "mkdir PARENTS again -> CREATED 0");
  msg_free(m);

  /* remove: a recursive remove never follows a symlink */
  join(outside, tmp, "/outside");
  join(keep, tmp, "/outside/keep.txt");
  join(tree, d, "/tree");
  join(path, d, "/tree/sub");
  mkdir(outside, 0755);
  close(open(keep, O_WRONLY | O_CREAT, 0644));
  mkdir(tree, 0755);
  mkdir(path, 0755);
  join(path, d, "/tree/sub/dirlink");
  check(symlink(outside, path) == 0, "symlink to a directory outside the tree");
  join(path, d, "/tree/filelink");
  check(symlink(keep, path) == 0, "symlink to a file outside the tree");
  join(path, d, "/tree/sub/f");
  close(open(path, O_WRONLY | O_CREAT, 0644));
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, tree, 0, -1), ENOTEMPTY, "non-recursive remove of a non-empty dir");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, tree, TP_F_REMOVE_RECURSIVE, -1), "recursive remove");
  check(lstat(tree, &st) < 0 && errno == ENOENT, "the tree is gone");
  check(stat(keep, &st) == 0 && stat(outside, &st) == 0, "the symlinks' targets outside survive");
  join(path, d, "/link");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, path, TP_F_REMOVE_RECURSIVE, -1), "recursive remove of a symlink");
  check(stat(a, &st) == 0, "removes the link, not its target");
  m = flags_req(h, TP_MSG_FS_REMOVE, "/", TP_F_REMOVE_RECURSIVE, -1);
  check(msg_errno(m) == EBUSY || msg_errno(m) == EINVAL, "remove of / is refused");
  msg_free(m);
  join(path, d, "/..");
  m = flags_req(h, TP_MSG_FS_REMOVE, "/tmp/..", TP_F_REMOVE_RECURSIVE, -1);
  check(msg_errno(m) == EBUSY || msg_errno(m) == EINVAL, "remove of /tmp/.. is refused");
  msg_free(m);
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, path, TP_F_REMOVE_RECURSIVE, -1), EINVAL,
             "remove of a path ending in ..");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, a, 0, -1), "remove a file");
  check(lstat(a, &st) < 0 && errno == ENOENT, "the file is gone");
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, a, 0, -1), ENOENT, "remove of a missing path");

  /* rename */
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_RENAME);
    tp_frame_add_str(b, TP_TAG_PATH, big);
    tp_frame_add_str(b, TP_TAG_PATH2, big2);
    expect_ok(req_call(h), "rename");
  }
  check(lstat(big, &st) < 0 && stat(big2, &st) == 0 && (size_t) st.st_size == bigsize,
        "renamed: old name gone, new name has the data");
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_RENAME);
    tp_frame_add_str(b, TP_TAG_PATH, big2);
    expect_err(req_call(h), EINVAL, "rename without PATH2");
  }

  /* path validation */
  expect_err(path_req(h, TP_MSG_FS_READ, "relative/path"), EINVAL, "relative path (read)");
  expect_err(write_req(h, "x", "x", 1, -1, 0, -1), EINVAL, "relative path (write)");
  expect_err(path_req(h, TP_MSG_FS_LIST, ""), EINVAL, "empty path (list)");
  memset(longpath, 'a', sizeof(longpath) - 1);
  longpath[0] = '/';
  longpath[TP_PATH_MAX + 1] = '\0';
  expect_err(path_req(h, TP_MSG_FS_STAT, longpath), ENAMETOOLONG, "path longer than TP_PATH_MAX");
  free(pat);
}

static void test_bad_requests(host_t *h, const char *tmp) {
  tp_buf_t *b;
  msg_t *m;

  b = req_begin(h, TP_MSG_FS_READ);
  m = req_call(h);
  check(msg_errno(m) == EINVAL && msg_has_text(m, "no PATH"), "FS_READ without PATH -> ERR EINVAL");
  msg_free(m);
  b = req_begin(h, TP_MSG_EXEC);
  tp_frame_add_str(b, TP_TAG_ARG, "/bin/true");
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  expect_err(req_call(h), EINVAL, "EXEC with a PATH field");
  b = req_begin(h, TP_MSG_FS_STAT);
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  expect_err(req_call(h), EINVAL, "FS_STAT with PATH twice");
  b = req_begin(h, TP_MSG_FS_WRITE);
  tp_frame_add_str(b, TP_TAG_PATH, "/nonexistent/x");
  expect_err(req_call(h), EINVAL, "FS_WRITE without DATA");
  b = req_begin(h, TP_MSG_STDIN);
  tp_frame_add(b, TP_TAG_DATA, "x", 1);
  expect_err(req_call(h), EINVAL, "STDIN without PID");
  b = req_begin(h, TP_MSG_OK);
  expect_err(req_call(h), EINVAL, "an OK frame from the host");
  b = req_begin(h, TP_MSG_EXIT);
  tp_frame_add_int(b, TP_TAG_PID, 1);
  expect_err(req_call(h), EINVAL, "an EXIT frame from the host");
  /* a microVM guest's requests, refused by an agent that is not one */
  b = req_begin(h, TP_MSG_VM_LIMITS);
  tp_frame_add_int(b, TP_TAG_PIDS, 10);
  expect_err(req_call(h), EOPNOTSUPP, "VM_LIMITS outside a VM");

  /* An event-typed frame with id 0 is ignored; a request byte by byte, and
   * two requests in one write, are all answered. */
  tp_buf_reset(&h->req);
  tp_frame_begin(&h->req, TP_MSG_READY, 0);
  tp_frame_end(&h->req);
  h->cur_id = ++h->next_id;
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, h->cur_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, tmp);
  tp_frame_end(&h->req);
  for (size_t i = 0; i < h->req.len; i++)
    if (send_all(h, h->req.data + i, 1) < 0)
      break;
  m = wait_reply(h, h->cur_id);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_DIR,
        "an id-0 READY is ignored; a request sent byte by byte is answered");
  msg_free(m);

  tp_buf_reset(&h->req);
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, ++h->next_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, "/");
  tp_frame_end(&h->req);
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, ++h->next_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, "relative");
  tp_frame_end(&h->req);
  send_all(h, h->req.data, h->req.len);
  m = wait_reply(h, h->next_id - 1);
  check(msg_is_ok(m), "first of two requests in one write -> OK");
  msg_free(m);
  expect_err(wait_reply(h, h->next_id), EINVAL, "second of two requests in one write");
}

/* A separate agent for a frame whose fields do not parse (unknown tag): it
 * may answer ERR or close the channel, but must not die by a signal. */
static void test_hostile_fields(const char *agent, const char *tmp) {
  host_t h;
  uint8_t raw[64];
  size_t n;
  int status;
  msg_t *m;

  if (agent_start(&h, agent, tmp, NULL) < 0) {
    check(0, "start a second agent");
    return;
  }
  /* EXEC: ARG "/bin/true", then a field with tag 99 */
  memset(raw, 0, sizeof(raw));
  n = TP_FRAME_HDR;
  raw[n] = TP_TAG_ARG;
  raw[n + 2] = 9;
  memcpy(raw + n + 6, "/bin/true", 9);
  n += 15;
  raw[n] = 99;
  raw[n + 2] = 8;
  n += 14;
  raw[0] = (uint8_t) (n - TP_FRAME_HDR);
  raw[4] = TP_PROTO_VERSION;
  raw[5] = TP_MSG_EXEC;
  raw[8] = 7;
  check(send_all(&h, raw, n) == 0, "send EXEC with an unknown field tag");
  m = wait_reply(&h, 7);
  if (m != NULL) {
    check(msg_errno(m) == EINVAL, "unknown field tag -> ERR EINVAL");
    msg_free(m);
    /* the channel is still in sync */
    m = path_req(&h, TP_MSG_FS_STAT, "/");
    check(msg_is_ok(m), "the agent still answers after a malformed request");
    msg_free(m);
    close(h.fd);
    h.fd = -1;
  } else {
    check(h.eof, "unknown field tag -> the agent closed the channel");
  }
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status), "the agent exited without a signal (status 0x%x)", status);
  host_free(&h);
}

/* Separate agents for frames whose header does not parse: they must exit
 * (the host then destroys the box), without a signal. */
static void test_hostile_header(const char *agent, const char *tmp, uint32_t len, uint8_t version,
                                uint8_t type, const char *what) {
  host_t h;
  uint8_t raw[TP_FRAME_HDR] = {0};
  long long deadline;
  int status;

  if (agent_start(&h, agent, tmp, NULL) < 0) {
    check(0, "start an agent");
    return;
  }
  for (int i = 0; i < 4; i++)
    raw[i] = (uint8_t) (len >> (8 * i));
  raw[4] = version;
  raw[5] = type;
  raw[8] = 1;
  send_all(&h, raw, sizeof(raw));
  deadline = now_ms() + TIMEOUT_MS;
  while (pump(&h, deadline) == 0)
    ;
  check(h.eof && h.bad_frames == 0, "%s: the agent closes the channel", what);
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0,
        "%s: the agent exits with an error, not a signal (status 0x%x)", what, status);
  host_free(&h);
}

/* ---- privileges, held exec, PS -------------------------------------------------------- */

/* Copies the value of the "key:" line of a /proc/<pid>/status text into out. */
static int status_field(const char *text, size_t len, const char *key, char *out, size_t outlen) {
  size_t klen = strlen(key);
  for (size_t i = 0; i + klen + 1 < len; i++) {
    size_t j, n = 0;
    if ((i > 0 && text[i - 1] != '\n') || memcmp(text + i, key, klen) != 0 || text[i + klen] != ':')
      continue;
    for (j = i + klen + 1; j < len && (text[j] == '\t' || text[j] == ' '); j++)
      ;
    while (j < len && text[j] != '\n' && n + 1 < outlen)
      out[n++] = text[j++];
    while (n > 0 && out[n - 1] == ' ') /* the Groups line ends with a blank */
      n--;
    out[n] = '\0';
    return 0;
  }
  out[0] = '\0';
  return -1;
}

static int field_is(const char *text, size_t len, const char *key, const char *want) {
  char v[256];
  return text != NULL && status_field(text, len, key, v, sizeof(v)) == 0 && strcmp(v, want) == 0;
}

/* Reads a small file into buf (NUL-terminated); returns its length or -1. */
static ssize_t slurp(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  size_t n = 0;
  ssize_t r = 0;
  buf[0] = '\0';
  if (fd < 0)
    return -1;
  while (n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0)
    n += (size_t) r;
  close(fd);
  buf[n] = '\0';
  return r < 0 ? -1 : (ssize_t) n;
}

/* Every capability set empty and no_new_privs, in a status text. */
static int caps_all_dropped(const char *t, size_t n) {
  const char *zero = "0000000000000000";
  return field_is(t, n, "CapInh", zero) && field_is(t, n, "CapPrm", zero) &&
         field_is(t, n, "CapEff", zero) && field_is(t, n, "CapBnd", zero) &&
         field_is(t, n, "CapAmb", zero) && field_is(t, n, "NoNewPrivs", "1");
}

static int count_fds(pid_t pid) {
  char path[64];
  DIR *d;
  struct dirent *e;
  int n = 0;
  snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
  if ((d = opendir(path)) == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* The state letter in /proc/<pid>/stat, or 0. */
static char proc_state(pid_t pid) {
  char path[64], buf[512], *rp;
  snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
  if (slurp(path, buf, sizeof(buf)) < 0 || (rp = strrchr(buf, ')')) == NULL || rp[1] != ' ')
    return 0;
  return rp[2];
}

static void test_creds(host_t *h, const char *tmp) {
  const char *status[] = {"/bin/cat", "/proc/self/status", NULL};
  const char *oom[] = {"/bin/cat", "/proc/self/oom_score_adj", NULL};
  const char *tru[] = {"/bin/true", NULL};
  char path[64], agent_oom[32];
  int64_t pid;
  tproc_t *p;
  msg_t *m;

  snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int) h->agent);
  slurp(path, agent_oom, sizeof(agent_oom));
  check(strcmp(agent_oom, "300\n") == 0, "the agent runs with oom_score_adj 300");
  pid = run(h, oom, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "0\n"), "the child's oom_score_adj is reset to 0");

  pid = run(h, status, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && field_is((char *) p->out[1].data, p->out[1].len, "Uid", "0\t0\t0\t0") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Gid", "0\t0\t0\t0") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Groups", "0"),
        "without UID/GID the child is uid 0, gid 0, groups {0}");
  check(p != NULL && caps_all_dropped((char *) p->out[1].data, p->out[1].len),
        "as uid 0: CapInh/Prm/Eff/Bnd/Amb all 0, NoNewPrivs 1");

  pid = run_as(h, status, 0, 1000, 1001);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && field_is((char *) p->out[1].data, p->out[1].len, "Uid", "1000\t1000\t1000\t1000") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Gid", "1001\t1001\t1001\t1001") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Groups", "1001"),
        "UID 1000 GID 1001: real, effective, saved and fs ids, groups {1001}");
  check(p != NULL && caps_all_dropped((char *) p->out[1].data, p->out[1].len),
        "as uid 1000: every capability set empty, NoNewPrivs 1");

  pid = run_as(h, tru, 0, 65535, 65535);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == 0, "UID/GID 65535 (the top of the mapped range) runs");
  expect_err(exec_as(h, tru, NULL, 0, 65536, NO_ID), EINVAL, "UID 65536");
  expect_err(exec_as(h, tru, NULL, 0, -1, NO_ID), EINVAL, "UID -1");
  expect_err(exec_as(h, tru, NULL, 0, NO_ID, 70000), EINVAL, "GID 70000");
  /* tmp is root's and 0700: chdir is judged as the new user, without caps. */
  m = exec_as(h, tru, tmp, 0, 1000, 1000);
  check(msg_errno(m) == EACCES && msg_has_text(m, "chdir"),
        "uid 1000 cannot chdir into root's 0700 dir -> ERR EACCES (chdir)");
  msg_free(m);
}

static msg_t *release_req(host_t *h, int64_t pid) { return pid_req(h, TP_MSG_RELEASE, pid, 0, 0); }

static void test_hold(host_t *h, const char *agent, const char *tmp) {
  const char *echo[] = {"/bin/sh", "-c", "echo released", NULL};
  const char *sleeper[] = {"/bin/sleep", "100", NULL};
  char prog[PATH_MAX], exe[PATH_MAX], want[PATH_MAX], path[64], st[4096];
  const char *progv[] = {prog, NULL};
  long long deadline;
  ssize_t n;
  int64_t pid;
  tproc_t *p;
  msg_t *m;
  int fd;

  pid = run_as(h, echo, TP_F_EXEC_HOLD, 1000, 1000);
  check(pid > 0, "EXEC with HOLD -> OK with PID at once");
  if (pid <= 0)
    return;
  p = tproc_get(h, pid);
  snprintf(path, sizeof(path), "/proc/%d/exe", (int) pid);
  n = readlink(path, exe, sizeof(exe) - 1);
  exe[n > 0 ? n : 0] = '\0';
  check(realpath(agent, want) != NULL && strcmp(exe, want) == 0,
        "the held child has not exec'd (its exe is still the agent)");
  snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
  n = slurp(path, st, sizeof(st));
  check(n > 0 && caps_all_dropped(st, (size_t) n) &&
            field_is(st, (size_t) n, "Uid", "1000\t1000\t1000\t1000"),
        "the held child already runs as uid 1000 without capabilities");
  n = count_fds((pid_t) pid);
  check(n == 5, "the held child has only 0-2 and its status and hold pipes (%d fds)", (int) n);
  deadline = now_ms() + 200;
  while (pump(h, deadline) == 0)
    ;
  check(p->out[1].len == 0 && !p->exited, "no output and no EXIT before RELEASE");
  expect_ok(release_req(h, pid), "RELEASE");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == 0 && out_is(p, 1, "released\n"),
        "after RELEASE it runs: its output, then EXIT 0");
  expect_err(release_req(h, pid), ESRCH, "RELEASE of a reaped pid");
  expect_err(release_req(h, 999999999), ESRCH, "RELEASE of an unknown pid");
  req_begin(h, TP_MSG_RELEASE);
  expect_err(req_call(h), EINVAL, "RELEASE without PID");

  pid = run(h, sleeper, NULL, NULL, 0);
  expect_err(release_req(h, pid), EINVAL, "RELEASE of a process that is not held");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to it");
  wait_exit(h, pid);

  /* The program goes away between EXEC and RELEASE: the exec error comes in
   * RELEASE's reply, then the child exits 127. */
  join(prog, tmp, "/vanishing.sh");
  fd = open(prog, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  check(fd >= 0 && write(fd, "#!/bin/sh\n", 10) == 10 && close(fd) == 0, "write a script");
  pid = run(h, progv, NULL, NULL, TP_F_EXEC_HOLD);
  check(pid > 0 && unlink(prog) == 0, "EXEC HOLD of the script -> OK; then the script is removed");
  m = release_req(h, pid);
  check(msg_errno(m) == ENOENT && msg_has_text(m, "release: exec"),
        "RELEASE -> ERR ENOENT for the exec that failed (got %d)", msg_errno(m));
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == 127 && p->sig == 0, "then EXIT CODE 127");

  /* A held child dies of a signal like any other. */
  pid = run(h, sleeper, NULL, NULL, TP_F_EXEC_HOLD);
  expect_ok(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, SIGTERM), "SIGNAL 15 to a held child");
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == -1 && p->sig == SIGTERM, "the held child's EXIT has SIGNAL 15");
  expect_err(release_req(h, pid), ESRCH, "RELEASE after it died");

  /* Errors found before the hold still come in EXEC's reply. */
  m = exec_as(h, sleeper, "/nonexistent-dir", TP_F_EXEC_HOLD, NO_ID, NO_ID);
  check(msg_errno(m) == ENOENT && msg_has_text(m, "chdir"),
        "EXEC HOLD with a missing CWD -> ERR ENOENT (chdir) in EXEC's reply");
  msg_free(m);

  /* Something stops a held child (anything in the box running as the same
   * user can): RELEASE must not hang the agent on it. */
  pid = run(h, sleeper, NULL, NULL, TP_F_EXEC_HOLD);
  check(pid > 0 && kill((pid_t) pid, SIGSTOP) == 0, "SIGSTOP a held child");
  deadline = now_ms() + TIMEOUT_MS;
  while (pid > 0 && proc_state((pid_t) pid) != 'T' && now_ms() < deadline)
    poll(NULL, 0, 5);
  m = release_req(h, pid);
  check(msg_errno(m) == ECANCELED && msg_has_text(m, "stopped"),
        "RELEASE of a stopped child -> ERR ECANCELED, no hang (got %d)", msg_errno(m));
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->sig == SIGKILL, "the stopped child was killed: EXIT SIGNAL 9");
}

/* The ENTRY groups of a PS reply: pids and, for each, its ARGs joined by ' '. */
static int ps_entries(const msg_t *m, int64_t *pids, char (*args)[128], int max) {
  int k = 0;
  for (int i = 0; m != NULL && i < m->n && k < max; i++) {
    tp_field_t sub[16];
    int n;
    if (m->f[i].tag != TP_TAG_ENTRY)
      continue;
    n = tp_fields_parse(m->f[i].val, m->f[i].len, sub, 16);
    pids[k] = -1;
    args[k][0] = '\0';
    for (int j = 0; j < n; j++) {
      size_t used = strlen(args[k]);
      if (sub[j].tag == TP_TAG_PID)
        tp_field_int(&sub[j], &pids[k]);
      else if (sub[j].tag == TP_TAG_ARG)
        snprintf(args[k] + used, 128 - used, "%s%.*s", used ? " " : "", (int) sub[j].len,
                 (const char *) sub[j].val);
    }
    k++;
  }
  return k;
}

static msg_t *ps_req(host_t *h) {
  req_begin(h, TP_MSG_PS);
  return req_call(h);
}

static void test_ps(host_t *h) {
  const char *a1[] = {"/bin/sleep", "100", NULL};
  const char *a2[] = {"/bin/sh", "-c", "exec sleep 101", NULL};
  int64_t p1 = run(h, a1, NULL, NULL, 0), p2 = run(h, a2, NULL, NULL, TP_F_EXEC_HOLD);
  int first = p1 < p2 ? 0 : 1;
  const char *want[2] = {"/bin/sleep 100", "/bin/sh -c exec sleep 101"};
  int64_t pids[8];
  char args[8][128];
  tp_buf_t *b;
  msg_t *m;
  int k;

  check(p1 > 0 && p2 > 0, "start a sleep and a held shell");
  m = ps_req(h);
  k = ps_entries(m, pids, args, 8);
  check(msg_is_ok(m) && k == 2 && pids[0] == (first ? p2 : p1) && pids[1] == (first ? p1 : p2) &&
            strcmp(args[0], want[first]) == 0 && strcmp(args[1], want[!first]) == 0 &&
            msg_get(m, TP_TAG_FLAGS) == NULL,
        "PS -> one ENTRY per live process (held too), by pid, with its ARGs");
  msg_free(m);
  b = req_begin(h, TP_MSG_PS);
  tp_frame_add_int(b, TP_TAG_PID, p1);
  expect_err(req_call(h), EINVAL, "PS with a field");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, p1, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to the sleep");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, p2, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to the held shell");
  wait_exit(h, p1);
  wait_exit(h, p2);
  m = ps_req(h);
  check(msg_is_ok(m) && ps_entries(m, pids, args, 8) == 0, "PS once they were reaped -> no ENTRY");
  msg_free(m);
}

/* ---- detaching and re-attaching --------------------------------------------------------- */

/* Connects to the agent's listener, as a host that already knows the
 * processes pids[0..n), and waits for READY. */
static int host_connect(host_t *h, const char *sock, const int64_t *pids, int n) {
  long long deadline = now_ms() + TIMEOUT_MS;
  host_init(h, connect_to(sock));
  for (int i = 0; i < n; i++)
    host_track(h, pids[i]);
  if (h->fd < 0)
    return -1;
  while (h->ready_count == 0 && pump(h, deadline) == 0)
    ;
  return h->ready_count == 1 ? 0 : -1;
}

/* Leaves nothing of an agent behind: SIGKILL, reap, reap what came to us. */
static void agent_stop(host_t *h) {
  if (h->agent > 0) {
    kill(h->agent, SIGKILL);
    waitpid(h->agent, NULL, 0);
  }
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

static void test_detach(const char *agent, const char *tmp) {
  const char *sleeper[] = {"/bin/sleep", "100", NULL};
  const char *noisy[] = {"/bin/sh", "-c", "read x; head -c 4000000 /dev/zero; exit 7", NULL};
  const char *fds[] = {"/bin/sh", "-c", "ls /proc/self/fd | wc -l", NULL};
  char sock[PATH_MAX], buf[64];
  int64_t pid, sleep_pid, noisy_pid, pids[8];
  char args[8][128];
  host_t h, h2;
  long long deadline;
  struct pollfd pfd;
  tproc_t *p;
  msg_t *m;
  int lfd, c2, k, r;
  ssize_t n;

  join(sock, tmp, "/agent.sock");
  lfd = listener_make(sock);
  if (lfd < 0 || agent_start_opts(&h, agent, tmp, NULL, lfd, "5") < 0) {
    check(0, "start an agent with a listening socket");
    return;
  }
  close(lfd); /* only the agent holds it now */
  deadline = now_ms() + TIMEOUT_MS;
  while (h.ready_count == 0 && pump(&h, deadline) == 0)
    ;
  check(h.ready_count == 1, "the agent with a listener sends READY");
  pid = run(&h, fds, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(&h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "4\n"), "its children do not inherit the listener (only fds 0-2)");
  sleep_pid = run(&h, sleeper, NULL, NULL, 0);
  noisy_pid = run(&h, noisy, NULL, NULL, TP_F_EXEC_STDIN);
  check(sleep_pid > 0 && noisy_pid > 0, "start a sleep and a shell that writes 4 MB once told");
  expect_ok(stdin_req(&h, noisy_pid, "go\n", 3), "tell it to go");
  close(h.fd); /* the daemon crashes */
  h.fd = -1;
  /* Its 4 MB go nowhere: it can only finish (and be reaped) if the agent
   * keeps draining its pipe while detached. */
  check(wait_gone((pid_t) noisy_pid) == 0, "the noisy shell ran to its end while detached");
  check(kill((pid_t) sleep_pid, 0) == 0 && waitpid(h.agent, NULL, WNOHANG) == 0,
        "the agent and the sleep are still alive");

  pids[0] = sleep_pid;
  pids[1] = noisy_pid;
  r = host_connect(&h2, sock, pids, 2);
  check(r == 0 && h2.first_event == TP_MSG_READY && h2.ready_pid == h.agent,
        "a new connection gets READY first, with the agent's pid");
  p = wait_exit(&h2, noisy_pid);
  check(p != NULL && p->code == 7 && p->sig == 0, "then the EXIT kept while detached (CODE 7)");
  m = ps_req(&h2);
  k = ps_entries(m, pids, args, 8);
  check(msg_is_ok(m) && k == 1 && pids[0] == sleep_pid && strcmp(args[0], "/bin/sleep 100") == 0,
        "PS on the new channel lists the sleep");
  msg_free(m);

  /* A second client while attached: closed at once, never READY. */
  c2 = connect_to(sock);
  pfd = (struct pollfd){.fd = c2, .events = POLLIN};
  n = c2 >= 0 && poll(&pfd, 1, TIMEOUT_MS) == 1 ? read(c2, buf, sizeof(buf)) : -1;
  check(n == 0, "a second connection while attached is closed without a byte (read %zd)", n);
  if (c2 >= 0)
    close(c2);
  m = ps_req(&h2);
  check(msg_is_ok(m), "the attached channel still answers");
  msg_free(m);
  expect_ok(pid_req(&h2, TP_MSG_SIGNAL, sleep_pid, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to the sleep");
  p = wait_exit(&h2, sleep_pid);
  check(p != NULL && p->sig == SIGKILL, "its EXIT arrives on the new channel");
  check(h2.stray_events == 0 && h2.bad_frames == 0, "no stray event or bad frame on the new channel");

  /* Lost again: a client that goes away at once leaves the agent waiting
   * for the next one. */
  close(h2.fd);
  h2.fd = -1;
  host_free(&h2);
  c2 = connect_to(sock);
  if (c2 >= 0)
    close(c2);
  r = host_connect(&h2, sock, NULL, 0);
  check(r == 0, "after another loss and a client that left at once, the next one gets READY");
  host_free(&h2);
  agent_stop(&h);
  host_free(&h);
  unlink(sock);
}

static void test_grace(const char *agent, const char *tmp) {
  const char *tree[] = {"/bin/sh", "-c", "sleep 100 & exec sleep 100", NULL};
  char sock[PATH_MAX];
  long long deadline, t0;
  int64_t pid;
  host_t h;
  int lfd, status, r, c;

  join(sock, tmp, "/grace.sock");
  lfd = listener_make(sock);
  if (lfd < 0 || agent_start_opts(&h, agent, tmp, NULL, lfd, "1") < 0) {
    check(0, "start an agent with a listening socket and --grace 1");
    return;
  }
  close(lfd);
  pid = run(&h, tree, NULL, NULL, 0);
  check(pid > 0, "start a process tree");
  t0 = now_ms();
  close(h.fd);
  h.fd = -1;
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "with no daemon back within the grace period the agent exits 0 (status 0x%x)", status);
  check(now_ms() - t0 >= 900, "but not before the grace period (%lld ms)", now_ms() - t0);
  r = pid > 0 ? wait_gone(-(pid_t) pid) : -1;
  check(r == 0, "and its process group is gone");
  deadline = now_ms() + TIMEOUT_MS;
  while ((r = waitpid(-1, NULL, WNOHANG)) >= 0 && now_ms() < deadline)
    if (r == 0)
      poll(NULL, 0, 10);
  check(r < 0 && errno == ECHILD, "no process of it remains");
  c = connect_to(sock);
  check(c < 0, "the listener died with the agent");
  if (c >= 0)
    close(c);
  host_free(&h);
  unlink(sock);
}

static void test_bad_args(const char *agent, const char *tmp) {
  const char *bad[] = {"x", "-1", "86401", ""};
  for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
    host_t h;
    int status;
    if (agent_start_opts(&h, agent, tmp, NULL, -1, bad[i]) < 0) {
      check(0, "start an agent");
      continue;
    }
    status = agent_wait(&h);
    check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 2,
          "--grace '%s' -> usage error, exit 2", bad[i]);
    host_free(&h);
  }
}

/* ---- terminals ------------------------------------------------------------------------- */

static msg_t *pty_exec(host_t *h, const char *const *argv, int64_t cols, int64_t rows, int flags) {
  tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
  for (; argv && *argv; argv++)
    tp_frame_add_str(b, TP_TAG_ARG, *argv);
  tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  if (cols >= 0)
    tp_frame_add_int(b, TP_TAG_COLS, cols);
  if (rows >= 0)
    tp_frame_add_int(b, TP_TAG_ROWS, rows);
  return req_call(h);
}

static msg_t *resize_req(host_t *h, int64_t pid, int64_t cols, int64_t rows) {
  tp_buf_t *b = req_begin(h, TP_MSG_PTY_RESIZE);
  tp_frame_add_int(b, TP_TAG_PID, pid);
  if (cols >= 0)
    tp_frame_add_int(b, TP_TAG_COLS, cols);
  if (rows >= 0)
    tp_frame_add_int(b, TP_TAG_ROWS, rows);
  return req_call(h);
}

/* Pumps until p's stdout holds s (or the deadline). */
static int wait_out(host_t *h, tproc_t *p, const char *s) {
  long long deadline = now_ms() + TIMEOUT_MS;
  while (p != NULL && !out_has(p, 1, s))
    if (pump(h, deadline) < 0)
      return 0;
  return p != NULL;
}

static void test_pty(host_t *h) {
  const char *shell[] = {"/bin/sh", "-c",
                         "stty size; tty; echo via-dev-tty > /dev/tty; read line; echo \"got:$line\"",
                         NULL};
  const char *resize[] = {"/bin/sh", "-c", "read x; stty size", NULL};
  const char *plain[] = {"/bin/sleep", "100", NULL};
  msg_t *m = pty_exec(h, shell, 100, 30, TP_F_EXEC_PTY);
  int64_t pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  tproc_t *p;

  msg_free(m);
  check(pid > 0, "EXEC with FLAGS PTY, COLS 100 ROWS 30 -> OK(PID)");
  p = tproc_get(h, pid);
  check(wait_out(h, p, "30 100"), "stty in it sees the size asked for");
  check(wait_out(h, p, "/dev/pts/"), "its stdin is a terminal (tty)");
  check(wait_out(h, p, "via-dev-tty"), "the terminal is its controlling one (/dev/tty opens): %.*s", p ? (int) p->out[1].len : 0, p ? (const char *) p->out[1].data : "");
  expect_ok(stdin_req(h, pid, "hello\n", 6), "STDIN to the terminal");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == 0 && out_has(p, 1, "got:hello") && out_has(p, 1, "hello\r\n"),
        "it reads the line, the terminal echoes it (CRLF), output ends before EXIT");
  check(p != NULL && p->out[2].len == 0, "nothing comes as stderr from a terminal");

  m = pty_exec(h, resize, 80, 24, TP_F_EXEC_PTY);
  pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  msg_free(m);
  check(pid > 0, "a second terminal");
  expect_ok(resize_req(h, pid, 132, 43), "PTY_RESIZE to 132x43");
  expect_err(resize_req(h, pid, 0, 43), EINVAL, "PTY_RESIZE COLS 0");
  expect_err(resize_req(h, pid, 132, TP_PTY_DIM_MAX + 1), EINVAL, "PTY_RESIZE ROWS past the cap");
  expect_err(resize_req(h, pid, -1, 43), EINVAL, "PTY_RESIZE without COLS");
  expect_ok(stdin_req(h, pid, "\n", 1), "a newline to go on");
  p = wait_exit(h, pid);
  check(p != NULL && p->code == 0 && out_has(p, 1, "43 132"), "stty size shows the new size");
  expect_err(resize_req(h, pid, 80, 24), ESRCH, "PTY_RESIZE once it exited");

  expect_err(pty_exec(h, shell, -1, 24, TP_F_EXEC_PTY), EINVAL, "PTY without COLS");
  expect_err(pty_exec(h, shell, 0, 24, TP_F_EXEC_PTY), EINVAL, "PTY with COLS 0");
  expect_err(pty_exec(h, shell, 80, 1 << 20, TP_F_EXEC_PTY), EINVAL, "PTY with ROWS 2^20");
  expect_err(pty_exec(h, shell, 80, 24, 0), EINVAL, "COLS and ROWS without FLAGS PTY");
  pid = run(h, plain, NULL, NULL, 0);
  check(pid > 0, "a process without a terminal");
  expect_err(resize_req(h, pid, 80, 24), ENOTTY, "PTY_RESIZE of it");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, pid, TP_TAG_SIGNAL, SIGKILL), "kill it");
  check(wait_exit(h, pid) != NULL, "it exits");
}

/* ---- watching ---------------------------------------------------------------------------- */

static msg_t *watch_req(host_t *h, const char *path, int flags) {
  tp_buf_t *b = req_begin(h, TP_MSG_WATCH_ADD);
  if (path)
    tp_frame_add_str(b, TP_TAG_PATH, path);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  return req_call(h);
}

static msg_t *unwatch_req(host_t *h, int64_t id) {
  tp_buf_t *b = req_begin(h, TP_MSG_WATCH_REMOVE);
  if (id >= 0)
    tp_frame_add_int(b, TP_TAG_WATCH, id);
  return req_call(h);
}

static int64_t watch_add(host_t *h, const char *path, int flags) {
  msg_t *m = watch_req(h, path, flags);
  int64_t id = msg_is_ok(m) ? msg_int(m, TP_TAG_WATCH, -1) : -1;
  msg_free(m);
  return id;
}

static int wev_has(const host_t *h, int64_t id, int kind, const char *name) {
  char line[PATH_MAX + 64];
  int n = snprintf(line, sizeof(line), "%lld %d %s\n", (long long) id, kind, name);
  return h->wev.len > 0 && memmem(h->wev.data, h->wev.len, line, (size_t) n) != NULL;
}

/* Pumps until watch id reported kind for name. */
static int wait_wev(host_t *h, int64_t id, int kind, const char *name) {
  long long deadline = now_ms() + TIMEOUT_MS;
  while (!wev_has(h, id, kind, name))
    if (pump(h, deadline) < 0)
      return 0;
  return 1;
}

/* Runs a shell command in dir and waits for its exit 0. */
static int sh_in(host_t *h, const char *dir, const char *cmd) {
  const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
  int64_t pid = run(h, argv, NULL, dir, 0);
  tproc_t *p = pid > 0 ? wait_exit(h, pid) : NULL;
  return p != NULL && p->code == 0;
}

static void test_watch(host_t *h, const char *tmp) {
  char w[PATH_MAX], many[PATH_MAX], file[PATH_MAX], d[PATH_MAX];
  int64_t rec, flat, gone;
  int ok = 1;

  join(w, tmp, "/w");
  check(mkdir(w, 0755) == 0 && mkdir(join(d, w, "/sub"), 0755) == 0, "make w/sub");
  rec = watch_add(h, w, TP_F_WATCH_RECURSIVE);
  flat = watch_add(h, w, 0);
  check(rec > 0 && flat > 0 && rec != flat, "WATCH_ADD recursive and flat on one directory -> two ids");

  check(sh_in(h, w, "mkdir -p sub/new/deep"), "mkdir -p sub/new/deep");
  check(wait_wev(h, rec, TP_WE_CREATE, "sub/new") && wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep"),
        "recursive: CREATE for a new directory and for the one made in it at once");
  check(sh_in(h, w, "echo x > sub/new/deep/f"), "write a file in it");
  check(wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep/f") && wait_wev(h, rec, TP_WE_WRITE, "sub/new/deep/f"),
        "CREATE and WRITE three levels down");
  check(sh_in(h, w, "mv sub/new/deep/f sub/new/deep/g"), "rename it");
  check(wait_wev(h, rec, TP_WE_RENAME, "sub/new/deep/f") && wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep/g"),
        "RENAME for the old name, CREATE for the new one");
  check(sh_in(h, w, "chmod 600 sub/new/deep/g"), "chmod it");
  check(wait_wev(h, rec, TP_WE_CHMOD, "sub/new/deep/g"), "CHMOD");
  check(sh_in(h, w, "rm sub/new/deep/g"), "remove it");
  check(wait_wev(h, rec, TP_WE_REMOVE, "sub/new/deep/g"), "REMOVE");
  check(sh_in(h, w, "mv sub/new moved && echo y > moved/deep/h"), "move a watched directory up a level");
  check(wait_wev(h, rec, TP_WE_RENAME, "sub/new") && wait_wev(h, rec, TP_WE_CREATE, "moved") &&
            wait_wev(h, rec, TP_WE_CREATE, "moved/deep/h"),
        "a moved directory is watched under its new name");
  check(sh_in(h, w, "echo z > top"), "a file at the top");
  check(wait_wev(h, flat, TP_WE_CREATE, "top") && wait_wev(h, rec, TP_WE_CREATE, "top"),
        "both watches see the top level");
  check(!wev_has(h, flat, TP_WE_CREATE, "sub/new/deep") && !wev_has(h, flat, TP_WE_CREATE, "moved/deep/h"),
        "the flat watch reports nothing below the top level");

  expect_ok(unwatch_req(h, flat), "WATCH_REMOVE");
  expect_err(unwatch_req(h, flat), ENOENT, "WATCH_REMOVE twice");
  expect_err(unwatch_req(h, -1), EINVAL, "WATCH_REMOVE without WATCH");
  expect_err(watch_req(h, "relative", 0), EINVAL, "WATCH_ADD of a relative path");
  expect_err(watch_req(h, NULL, 0), EINVAL, "WATCH_ADD without PATH");
  expect_err(watch_req(h, join(d, w, "/nonexistent"), 0), ENOENT, "WATCH_ADD of nothing");
  expect_err(watch_req(h, join(file, w, "/top"), 0), ENOTDIR, "WATCH_ADD of a file");
  expect_err(watch_req(h, w, 0x80), EINVAL, "WATCH_ADD with unknown FLAGS");

  /* the root going away ends the watch */
  join(d, tmp, "/gone");
  check(mkdir(d, 0755) == 0, "make gone/");
  gone = watch_add(h, d, TP_F_WATCH_RECURSIVE);
  check(gone > 0 && rmdir(d) == 0, "watch it, remove it");
  check(wait_wev(h, gone, TP_WE_END, ""), "END when the watched directory is gone");
  expect_err(unwatch_req(h, gone), ENOENT, "an ended watch is forgotten");

  /* more directories than a watch may hold */
  join(many, tmp, "/many");
  ok = mkdir(many, 0755) == 0;
  for (int i = 0; ok && i < AGENT_WATCH_DIRS_MAX_T; i++) {
    char name[32];
    snprintf(name, sizeof(name), "/d%d", i);
    ok = mkdir(join(d, many, name), 0755) == 0;
  }
  check(ok, "make %d directories", AGENT_WATCH_DIRS_MAX_T);
  expect_err(watch_req(h, many, TP_F_WATCH_RECURSIVE), ENOSPC, "WATCH_ADD of a tree past the cap");
  {
    int64_t id = watch_add(h, many, 0);
    check(id > 0, "a flat watch of it is fine");
    msg_free(unwatch_req(h, id));
  }

  /* too many watches */
  {
    int64_t ids[80];
    int n = 0;
    msg_t *m = NULL;
    for (; n < 80; n++) {
      m = watch_req(h, tmp, 0);
      if (!msg_is_ok(m))
        break;
      ids[n] = msg_int(m, TP_TAG_WATCH, -1);
      msg_free(m);
      m = NULL;
    }
    check(n < 80 && msg_errno(m) == EMFILE, "WATCH_ADD past the cap -> ERR EMFILE (after %d)", n);
    msg_free(m);
    for (int i = 0; i < n; i++)
      msg_free(unwatch_req(h, ids[i]));
  }
  expect_ok(unwatch_req(h, rec), "WATCH_REMOVE the recursive one");
}

/* ---- acting as an account (UID GID GROUPS? on FS_* and WATCH_ADD) ---------------------- */

/* Adds UID, GID and (ngroups > 0) GROUPS, each group as a u32 (raw: the
 * field's bytes as given, for hostile sizes). */
static void add_as(tp_buf_t *b, int64_t uid, int64_t gid, const uint32_t *groups, int ngroups) {
  uint8_t raw[4 * 80];
  if (uid != NO_ID)
    tp_frame_add_int(b, TP_TAG_UID, uid);
  if (gid != NO_ID)
    tp_frame_add_int(b, TP_TAG_GID, gid);
  for (int i = 0; i < ngroups && i < 80; i++)
    for (int k = 0; k < 4; k++)
      raw[4 * i + k] = (uint8_t) (groups[i] >> (8 * k));
  if (ngroups > 0)
    tp_frame_add(b, TP_TAG_GROUPS, raw, (uint32_t) (4 * (ngroups < 80 ? ngroups : 80)));
}

static msg_t *write_as(host_t *h, const char *path, const char *data, int flags, int64_t uid,
                       int64_t gid, const uint32_t *groups, int ngroups) {
  tp_buf_t *b = req_begin(h, TP_MSG_FS_WRITE);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  tp_frame_add(b, TP_TAG_DATA, data, (uint32_t) strlen(data));
  tp_frame_add_int(b, TP_TAG_FLAGS, TP_F_WRITE_TRUNC | flags);
  add_as(b, uid, gid, groups, ngroups);
  return req_call(h);
}

/* A request of type with PATH (and PATH2 or FLAGS), as uid:gid. */
static msg_t *path_as(host_t *h, uint8_t type, const char *path, const char *path2, int flags,
                      int64_t uid, int64_t gid) {
  tp_buf_t *b = req_begin(h, type);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  if (path2)
    tp_frame_add_str(b, TP_TAG_PATH2, path2);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  add_as(b, uid, gid, NULL, 0);
  return req_call(h);
}

static int owned_by(const char *path, uid_t uid, gid_t gid) {
  struct stat st;
  return lstat(path, &st) == 0 && st.st_uid == uid && st.st_gid == gid;
}

/* The agent's own filesystem ids and groups are root's, none. */
static int agent_is_root(const host_t *h) {
  char path[64], t[4096];
  ssize_t n;
  snprintf(path, sizeof(path), "/proc/%d/status", (int) h->agent);
  n = slurp(path, t, sizeof(t));
  return n > 0 && field_is(t, (size_t) n, "Uid", "0\t0\t0\t0") &&
         field_is(t, (size_t) n, "Gid", "0\t0\t0\t0") && field_is(t, (size_t) n, "Groups", "");
}

static void test_fs_as(host_t *h, const char *tmp) {
  char home[PATH_MAX], etc[PATH_MAX], priv[PATH_MAX], grp[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
  const uint32_t both[] = {1000, 2000}, bad_group[] = {70000};
  uint32_t many[TP_GROUPS_MAX + 1];
  const char *status[] = {"/bin/cat", "/proc/self/status", NULL};
  int64_t rec;
  tproc_t *pr;
  msg_t *m;

  /* tmp: searchable by anyone; home: uid 1000's; etc: root's 0755; priv:
   * root's 0700; grp: root:2000 0770 */
  join(home, tmp, "/home");
  join(etc, tmp, "/etc");
  join(priv, tmp, "/priv");
  join(grp, tmp, "/grp");
  check(chmod(tmp, 0711) == 0 && mkdir(home, 0755) == 0 && chown(home, 1000, 1000) == 0 &&
            mkdir(etc, 0755) == 0 && mkdir(priv, 0700) == 0 && mkdir(grp, 0770) == 0 &&
            chown(grp, 0, 2000) == 0 && chmod(home, 0755) == 0 && chmod(etc, 0755) == 0 &&
            chmod(grp, 0770) == 0 && sh_in(h, priv, "echo s > secret && echo e > ../etc/e && chmod 644 ../etc/e"),
        "set up home (1000), etc (root 0755), priv (root 0700), grp (root:2000 0770)");

  /* writes: what the account creates is its own, parents included */
  m = write_as(h, join(p, home, "/a/b/f"), "hi", TP_F_WRITE_PARENTS, 1000, 1000, NULL, 0);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 2, "FS_WRITE as 1000 with PARENTS -> OK");
  msg_free(m);
  check(owned_by(p, 1000, 1000) && owned_by(join(q, home, "/a"), 1000, 1000) &&
            owned_by(join(q, home, "/a/b"), 1000, 1000),
        "the file and the parents made for it belong to 1000:1000");
  m = write_as(h, join(p, etc, "/x"), "no", 0, 1000, 1000, NULL, 0);
  check(msg_errno(m) == EACCES && msg_has_text(m, "etc/x") && access(p, F_OK) < 0,
        "FS_WRITE as 1000 into root's 0755 dir -> ERR EACCES naming the path, nothing made");
  msg_free(m);
  expect_err(write_as(h, join(p, etc, "/e"), "no", 0, 1000, 1000, NULL, 0), EACCES,
             "FS_WRITE as 1000 over root's 0644 file");
  expect_err(write_as(h, join(p, etc, "/new/f"), "no", TP_F_WRITE_PARENTS, 1000, 1000, NULL, 0),
             EACCES, "FS_WRITE as 1000 whose parent it would have to make in root's dir");
  check(agent_is_root(h), "after a refused request the agent's fs ids are root's again");
  m = write_as(h, join(p, etc, "/x"), "ok", 0, NO_ID, NO_ID, NULL, 0);
  check(msg_is_ok(m) && owned_by(p, 0, 0), "the same FS_WRITE without UID/GID acts as root");
  msg_free(m);
  m = write_as(h, join(p, etc, "/x0"), "ok", 0, 0, 0, NULL, 0);
  check(msg_is_ok(m) && owned_by(p, 0, 0), "UID 0 GID 0 acts as root too");
  msg_free(m);

  /* groups: the account's supplementary groups count, and only those given */
  expect_err(write_as(h, join(p, grp, "/f"), "no", 0, 1000, 1000, NULL, 0), EACCES,
             "FS_WRITE as 1000 (groups {1000}) into root:2000 0770");
  m = write_as(h, join(p, grp, "/f"), "ok", 0, 1000, 1000, both, 2);
  check(msg_is_ok(m) && owned_by(p, 1000, 1000), "with GROUPS {1000, 2000} -> OK, the file is 1000:1000");
  msg_free(m);

  /* reads, stat, list: the account's permissions */
  expect_err(path_as(h, TP_MSG_FS_READ, join(p, priv, "/secret"), NULL, 0, 1000, 1000), EACCES,
             "FS_READ as 1000 under root's 0700 dir");
  expect_err(path_as(h, TP_MSG_FS_STAT, p, NULL, 0, 1000, 1000), EACCES, "FS_STAT as 1000 there");
  expect_err(path_as(h, TP_MSG_FS_LIST, priv, NULL, 0, 1000, 1000), EACCES, "FS_LIST as 1000 of it");
  expect_err(path_as(h, TP_MSG_WATCH_ADD, priv, NULL, 0, 1000, 1000), EACCES, "WATCH_ADD as 1000 of it");
  m = path_as(h, TP_MSG_FS_READ, p, NULL, 0, NO_ID, NO_ID);
  check(msg_is_ok(m) && data_eq(m, "s\n", 2), "root reads it");
  msg_free(m);
  m = path_as(h, TP_MSG_FS_READ, join(p, home, "/a/b/f"), NULL, 0, 1000, 1000);
  check(msg_is_ok(m) && data_eq(m, "hi", 2), "FS_READ as 1000 of its own file");
  msg_free(m);
  m = path_as(h, TP_MSG_FS_LIST, home, NULL, 0, 1000, 1000);
  check(msg_is_ok(m) && tp_fields_count(m->f, m->n, TP_TAG_ENTRY) == 1, "FS_LIST as 1000 of its home");
  msg_free(m);

  /* mkdir, rename, remove */
  m = path_as(h, TP_MSG_FS_MKDIR, join(p, home, "/d/e"), NULL, TP_F_MKDIR_PARENTS, 1000, 1000);
  check(msg_is_ok(m) && owned_by(p, 1000, 1000) && owned_by(join(q, home, "/d"), 1000, 1000),
        "FS_MKDIR -p as 1000 -> its own directories");
  msg_free(m);
  expect_err(path_as(h, TP_MSG_FS_MKDIR, join(p, etc, "/d"), NULL, 0, 1000, 1000), EACCES,
             "FS_MKDIR as 1000 in root's dir");
  expect_ok(path_as(h, TP_MSG_FS_RENAME, join(p, home, "/a/b/f"), join(q, home, "/g"), 0, 1000, 1000),
            "FS_RENAME as 1000 in its home");
  expect_err(path_as(h, TP_MSG_FS_RENAME, join(p, etc, "/x"), join(q, home, "/x"), 0, 1000, 1000), EACCES,
             "FS_RENAME as 1000 out of root's dir");
  expect_err(path_as(h, TP_MSG_FS_REMOVE, join(p, etc, "/x"), NULL, 0, 1000, 1000), EACCES,
             "FS_REMOVE as 1000 of root's file");
  expect_ok(path_as(h, TP_MSG_FS_REMOVE, join(p, home, "/a"), NULL, TP_F_REMOVE_RECURSIVE, 1000, 1000),
            "FS_REMOVE -r as 1000 of its own tree");

  /* a recursive watch as 1000 grows as 1000: a directory it cannot read is not walked */
  m = path_as(h, TP_MSG_WATCH_ADD, home, NULL, TP_F_WATCH_RECURSIVE, 1000, 1000);
  rec = msg_is_ok(m) ? msg_int(m, TP_TAG_WATCH, -1) : -1;
  msg_free(m);
  check(rec > 0, "WATCH_ADD as 1000 of its home");
  check(mkdir(join(p, home, "/hidden"), 0700) == 0 && close(creat(join(p, home, "/hidden/f"), 0600)) == 0 &&
            mkdir(join(p, home, "/open"), 0755) == 0 && chmod(p, 0755) == 0 &&
            close(creat(join(p, home, "/open/f"), 0600)) == 0,
        "root makes a 0700 dir (a file in it) and a 0755 one (a file in it) there");
  check(wait_wev(h, rec, TP_WE_CREATE, "open/f") && wait_wev(h, rec, TP_WE_OVERFLOW, "hidden") &&
            !wev_has(h, rec, TP_WE_CREATE, "hidden/f"),
        "the watch reports open/f, and an OVERFLOW for hidden, never hidden/f");
  expect_ok(unwatch_req(h, rec), "WATCH_REMOVE");
  check(agent_is_root(h), "after all that the agent's ids are root's");

  /* exec takes GROUPS too */
  {
    tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
    int64_t pid;
    for (const char *const *a = status; *a; a++)
      tp_frame_add_str(b, TP_TAG_ARG, *a);
    add_as(b, 1000, 1001, both, 2);
    m = req_call(h);
    pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
    msg_free(m);
    pr = pid > 0 ? wait_exit(h, pid) : NULL;
    check(pr != NULL && field_is((char *) pr->out[1].data, pr->out[1].len, "Groups", "1000 2000") &&
              field_is((char *) pr->out[1].data, pr->out[1].len, "Gid", "1001\t1001\t1001\t1001"),
          "EXEC with GROUPS {1000, 2000}: the child's groups are those");
  }

  /* hostile account fields */
  join(p, home, "/h");
  expect_err(write_as(h, p, "x", 0, 1000, NO_ID, NULL, 0), EINVAL, "UID without GID");
  expect_err(write_as(h, p, "x", 0, NO_ID, 1000, NULL, 0), EINVAL, "GID without UID");
  expect_err(write_as(h, p, "x", 0, NO_ID, NO_ID, both, 2), EINVAL, "GROUPS without UID and GID");
  expect_err(write_as(h, p, "x", 0, 65536, 1000, NULL, 0), EINVAL, "UID 65536");
  expect_err(write_as(h, p, "x", 0, -1, 1000, NULL, 0), EINVAL, "UID -1");
  expect_err(write_as(h, p, "x", 0, 1000, 1000, bad_group, 1), EINVAL, "a group of 70000");
  for (int i = 0; i < TP_GROUPS_MAX + 1; i++)
    many[i] = 1000;
  expect_err(write_as(h, p, "x", 0, 1000, 1000, many, TP_GROUPS_MAX + 1), EINVAL, "65 GROUPS");
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_WRITE);
    tp_frame_add_str(b, TP_TAG_PATH, p);
    tp_frame_add(b, TP_TAG_DATA, "x", 1);
    add_as(b, 1000, 1000, NULL, 0);
    tp_frame_add(b, TP_TAG_GROUPS, "abc", 3);
    expect_err(req_call(h), EINVAL, "GROUPS of 3 bytes");
  }
  expect_err(path_as(h, TP_MSG_FS_STAT, home, NULL, 0, 70000, 0), EINVAL, "FS_STAT with UID 70000");
  check(access(p, F_OK) < 0 && agent_is_root(h), "none of them wrote anything or left the ids switched");
  chmod(tmp, 0700);
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void) st;
  (void) ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int main(void) {
  const char *agent = getenv("TUPPER_AGENT");
  const char *leftover[] = {"/bin/sh", "-c", "sleep 100 & exec sleep 100", NULL};
  char tmpl[] = "/tmp/tupper-test-agent.XXXXXX";
  char tmp[PATH_MAX];
  host_t h;
  int stray_rd = -1, status, r;
  int64_t pid;
  long long deadline;

  if (agent == NULL || *agent == '\0') {
    printf("1..0 # SKIP TUPPER_AGENT is not set\n");
    return 77;
  }
  if (geteuid() != 0) { /* the agent must be able to switch ids and drop capabilities */
    printf("1..0 # SKIP needs root\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  umask(027); /* the agent must apply MODE exactly, and hand this to children */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 || mkdtemp(tmpl) == NULL ||
      realpath(tmpl, tmp) == NULL) {
    perror("test_agent: set-up");
    return 1;
  }
  if (agent_start(&h, agent, tmp, &stray_rd) < 0) {
    perror("test_agent: start the agent");
    return 1;
  }
  test_ready(&h, stray_rd);
  test_exec(&h, tmp);
  test_exec_errors(&h, tmp);
  test_stdin(&h);
  test_signal(&h);
  test_background(&h);
  test_pty(&h);
  test_watch(&h, tmp);
  test_creds(&h, tmp);
  test_hold(&h, agent, tmp);
  test_ps(&h);
  test_fs(&h, tmp);
  test_fs_as(&h, tmp);
  test_bad_requests(&h, tmp);
  test_vm_requests(&h);
  check(h.stray_events == 0, "no event for a pid before its OK or after its EXIT (%d)", h.stray_events);
  check(h.bad_frames == 0, "every frame from the agent parsed");

  /* Closing the channel stops the agent, which kills what still runs. */
  pid = run(&h, leftover, NULL, NULL, 0);
  check(pid > 0, "start a process tree that would outlive us");
  close(h.fd);
  h.fd = -1;
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the agent exits 0 when the channel closes (status 0x%x)", status);
  deadline = now_ms() + TIMEOUT_MS;
  while ((r = waitpid(-1, NULL, WNOHANG)) >= 0 && now_ms() < deadline)
    if (r == 0)
      poll(NULL, 0, 10);
  r = r < 0 && errno == ECHILD;
  check(r, "no process started by the agent remains");
  if (!r && pid > 0)
    kill(-(pid_t) pid, SIGKILL);
  host_free(&h);

  test_detach(agent, tmp);
  test_grace(agent, tmp);
  test_bad_args(agent, tmp);
  test_hostile_fields(agent, tmp);
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION + 1, TP_MSG_FS_STAT, "bad version");
  test_hostile_header(agent, tmp, TP_FRAME_MAX + 1, TP_PROTO_VERSION, TP_MSG_FS_STAT, "oversized len");
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION, 99, "unknown type");
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;

  nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}
