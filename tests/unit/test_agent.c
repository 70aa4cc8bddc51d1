/* Drives the real tupper-agent (env TUPPER_AGENT) as an ordinary process over
 * a socketpair, playing the host: processes, stdin, signals, file operations
 * and hostile frames.  Every wait is a poll with a deadline, never a sleep.
 * The test is a child subreaper, so whatever the agent leaves behind comes to
 * us; at the end it checks that nothing is left running. */
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"

#define TIMEOUT_MS 10000
#define MAX_TPROCS 64

static int t_num, t_failed;

static void check(int ok, const char *fmt, ...) TP_PRINTF(2, 3);
static void check(int ok, const char *fmt, ...) {
  va_list ap;
  printf("%s %d - ", ok ? "ok" : "not ok", ++t_num);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
  if (!ok)
    t_failed++;
}

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
  uint8_t *rbuf;
  size_t rlen;
  uint32_t next_id, cur_id;
  tp_buf_t req;
  msg_t *replies;
  int nprocs;
  tproc_t procs[MAX_TPROCS];
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
  if (m->type == TP_MSG_READY) {
    h->ready_count++;
    h->ready_version = msg_int(m, TP_TAG_VERSION, -1);
    h->ready_pid = msg_int(m, TP_TAG_PID, -1);
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

/* Starts the agent with its channel at fd 10 and a stray inherited fd 11
 * (the write end of *stray_rd), which the agent must close. */
static int agent_start(host_t *h, const char *agent, const char *cwd, int *stray_rd) {
  int sv[2], stray[2];
  memset(h, 0, sizeof(*h));
  tp_buf_init(&h->req);
  h->rbuf = malloc(TP_FRAME_HDR + TP_FRAME_MAX);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(stray, O_CLOEXEC) < 0)
    return -1;
  h->agent = fork();
  if (h->agent < 0)
    return -1;
  if (h->agent == 0) {
    if (chdir(cwd) < 0 || dup2(sv[1], 10) < 0 || dup2(stray[1], 11) < 0)
      _exit(126);
    execl(agent, agent, "--fd", "10", (char *) NULL);
    _exit(127);
  }
  close(sv[1]);
  close(stray[1]);
  if (stray_rd != NULL)
    *stray_rd = stray[0];
  else
    close(stray[0]);
  h->fd = sv[0];
  fcntl(h->fd, F_SETFL, O_NONBLOCK);
  return 0;
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
  test_fs(&h, tmp);
  test_bad_requests(&h, tmp);
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

  test_hostile_fields(agent, tmp);
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION + 1, TP_MSG_FS_STAT, "bad version");
  test_hostile_header(agent, tmp, TP_FRAME_MAX + 1, TP_PROTO_VERSION, TP_MSG_FS_STAT, "oversized len");
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION, 99, "unknown type");
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;

  nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  printf("1..%d\n", t_num);
  return t_failed ? 1 : 0;
}
