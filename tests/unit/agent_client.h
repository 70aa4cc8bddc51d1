/* The host's side of the agent's channel, for the test_agent_* executables:
 * starting the real tupper-agent (env TUPPER_AGENT) over a socketpair,
 * sending requests and collecting replies and events (processes' output and
 * exits, watch events), the request helpers, and each test's set-up and
 * tear-down.  Every wait is a poll with a deadline, never a sleep.  Include
 * it after the test's include block (the libc headers, frame.h, tap.h); its
 * functions are static, and a test uses the ones it needs. */
#ifndef TP_AGENT_CLIENT_H
#define TP_AGENT_CLIENT_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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
  int64_t flags;        /* EXIT's FLAGS (TP_F_EXIT_*), 0 when absent */
  int64_t stdin_acked;  /* STDIN_ACK sizes (a TP_F_EXEC_CREDIT process) */
  int frames[3];        /* OUTPUT frames of [1] stdout, [2] stderr */
  size_t max_frame[3];  /* the largest DATA of each */
} tproc_t;

typedef struct host_s {
  int fd;
  pid_t agent;
  int eof;
  int bad_frames;       /* frames from the agent that did not parse */
  int stray_events;     /* events for pids without an OK, or after EXIT */
  int ready_count;
  int64_t ready_version, ready_pid, ready_flags;
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
    h->ready_flags = msg_int(m, TP_TAG_FLAGS, 0);
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
    else {
      tp_buf_append(&p->out[stream], d->val, d->len);
      p->frames[stream]++;
      if (d->len > p->max_frame[stream])
        p->max_frame[stream] = d->len;
    }
  } else if (m->type == TP_MSG_STDIN_ACK) {
    int64_t n = msg_int(m, TP_TAG_SIZE, -1);
    if (n < 1)
      h->stray_events++;
    else
      p->stdin_acked += n;
  } else if (m->type == TP_MSG_EXIT) {
    p->exited = 1;
    p->code = msg_int(m, TP_TAG_CODE, -100);
    p->sig = msg_int(m, TP_TAG_SIGNAL, -100);
    p->flags = msg_int(m, TP_TAG_FLAGS, 0);
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
 * The agent runs with oom_score_adj agent_test_oom (300 unless a test
 * sets it: at 0 the agent starts its children in its own memory,
 * agent_proc.c) and SIGHUP ignored (as under nohup), which its children
 * must not get. */
static const char *agent_test_oom = "300";
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
    if (oom < 0 || write(oom, agent_test_oom, strlen(agent_test_oom)) != (ssize_t) strlen(agent_test_oom) || signal(SIGHUP, SIG_IGN) == SIG_ERR || chdir(cwd) < 0 ||
        dup2(sv[1], 10) < 0 ||
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

/* An EXEC's frame with its argv, env and cwd (each may be NULL), for the
 * caller to add its own fields to and send with req_call. */
static tp_buf_t *exec_begin(host_t *h, const char *const *argv, const char *const *env,
                            const char *cwd) {
  tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
  for (; argv && *argv; argv++)
    tp_frame_add_str(b, TP_TAG_ARG, *argv);
  for (; env && *env; env++)
    tp_frame_add_str(b, TP_TAG_ENV, *env);
  if (cwd)
    tp_frame_add_str(b, TP_TAG_CWD, cwd);
  return b;
}

/* EXEC with UID and GID fields unless NO_ID. */
static msg_t *exec_as(host_t *h, const char *const *argv, const char *cwd, int flags, int64_t uid,
                      int64_t gid) {
  tp_buf_t *b = exec_begin(h, argv, NULL, cwd);
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
  tp_buf_t *b = exec_begin(h, argv, env, cwd);
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

/* ---- reading /proc ------------------------------------------------------------------------ */

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

/* ---- PS ------------------------------------------------------------------------------------- */

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

/* ---- a test's set-up and tear-down ------------------------------------------------------ */

/* What every agent test needs first: TUPPER_AGENT, root (the agent switches
 * uid/gid and drops capabilities it must first have), SIGPIPE ignored, umask
 * 027 (the agent must apply MODE exactly, and hand this to children), this
 * process a child subreaper (whatever the agent leaves behind comes to us)
 * and a temp dir of its own in tmp (PATH_MAX bytes).  Returns the agent's
 * path, or NULL with *rc the exit code (77 skip, 1 set-up failed). */
static const char *agent_test_begin(const char *name, char *tmp, int *rc) {
  const char *agent = getenv("TUPPER_AGENT");
  char tmpl[] = "/tmp/tupper-test-agent.XXXXXX";

  if (agent == NULL || *agent == '\0') {
    printf("1..0 # SKIP TUPPER_AGENT is not set\n");
    *rc = 77;
    return NULL;
  }
  if (geteuid() != 0) { /* the agent must be able to switch ids and drop capabilities */
    printf("1..0 # SKIP needs root\n");
    *rc = 77;
    return NULL;
  }
  signal(SIGPIPE, SIG_IGN);
  umask(027); /* the agent must apply MODE exactly, and hand this to children */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 || mkdtemp(tmpl) == NULL ||
      realpath(tmpl, tmp) == NULL) {
    fprintf(stderr, "%s: set-up: %s\n", name, strerror(errno));
    *rc = 1;
    return NULL;
  }
  return agent;
}

/* Starts the agent a session of tests shares (in tmp); 0, or -1 said. */
static int agent_session(host_t *h, const char *name, const char *agent, const char *tmp,
                         int *stray_rd) {
  if (agent_start(h, agent, tmp, stray_rd) < 0) {
    fprintf(stderr, "%s: start the agent: %s\n", name, strerror(errno));
    return -1;
  }
  return 0;
}

/* Ends a session whose ending test_agent_proc checks: the channel closes,
 * the agent exits 0 and leaves no process.  That, no event for a pid
 * before its OK or after its EXIT, and every frame parsing are guarded,
 * not counted again. */
static void agent_session_close(host_t *h) {
  long long deadline;
  int status, r;

  tap_guard(h->stray_events == 0, "no event for a pid before its OK or after its EXIT (%d)",
            h->stray_events);
  tap_guard(h->bad_frames == 0, "every frame from the agent parsed");
  close(h->fd);
  h->fd = -1;
  status = agent_wait(h);
  tap_guard(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the agent exits 0 when the channel closes (status 0x%x)", status);
  deadline = now_ms() + TIMEOUT_MS;
  while ((r = waitpid(-1, NULL, WNOHANG)) >= 0 && now_ms() < deadline)
    if (r == 0)
      poll(NULL, 0, 10);
  tap_guard(r < 0 && errno == ECHILD, "no process started by the agent remains");
  host_free(h);
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void) st;
  (void) ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Reaps what is left, removes tmp; prints the plan, returns the exit code. */
static int agent_test_end(const char *tmp) {
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
  nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  return tap_done();
}

#pragma GCC diagnostic pop

#endif
