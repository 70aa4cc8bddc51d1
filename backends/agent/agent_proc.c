/* tupper-agent: processes.  EXEC starts a child in its own session and
 * process group with stdout/stderr pipes (and a stdin pipe on request); the
 * child reports a failed chdir/execve over a close-on-exec status pipe, so
 * the host gets ERR instead of OK.  The loop streams OUTPUT as the pipes
 * fill, writes queued STDIN as the child reads, and sends EXIT when the child
 * is reaped, without waiting for grandchildren that keep a pipe open. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "utils.h"

enum { STAGE_SETUP = 1, STAGE_CHDIR = 2, STAGE_EXEC = 3 };

/* What a child writes on its status pipe when it cannot exec. */
typedef struct exec_status_s {
  int stage;
  int err;
} exec_status_t;

/* Everything the child needs, prepared before fork: between fork and execve
 * the child only makes async-signal-safe calls. */
typedef struct exec_spec_s {
  const char *path;   /* resolved program */
  char **argv;
  char **envp;
  const char *cwd;
  int in_fd;          /* child's stdin */
  int out_fd;         /* child's stdout */
  int err_fd;         /* child's stderr */
  int status_fd;      /* write end of the status pipe (CLOEXEC) */
  const struct rlimit *nofile;
  mode_t umask;
} exec_spec_t;

/* ---- process table --------------------------------------------------------- */

static agent_proc_t *proc_find(agent_t *a, int64_t pid) {
  if (pid <= 0)
    return NULL;
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid == pid)
      return &a->procs[i];
  return NULL;
}

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static void stdin_drop(agent_proc_t *p) {
  while (p->q_head != NULL) {
    agent_chunk_t *c = p->q_head;
    p->q_head = c->next;
    free(c);
  }
  p->q_tail = NULL;
  p->queued = 0;
  close_fd(&p->in_fd);
}

static void proc_free(agent_t *a, agent_proc_t *p) {
  stdin_drop(p);
  close_fd(&p->out_fd);
  close_fd(&p->err_fd);
  *p = (agent_proc_t){.out_fd = -1, .err_fd = -1, .in_fd = -1};
  a->nprocs--;
}

static agent_proc_t *proc_lookup(agent_t *a, const agent_req_t *r, const char *what, tp_error_t *err) {
  int64_t pid;
  agent_proc_t *p;
  if (agent_req_get(r, TP_TAG_PID) == NULL) {
    tp_error_set(err, EINVAL, "%s: no PID", what);
    return NULL;
  }
  pid = agent_req_int(r, TP_TAG_PID, 0);
  p = proc_find(a, pid);
  if (p == NULL)
    tp_error_set(err, ESRCH, "%s: no process %lld", what, (long long) pid);
  return p;
}

/* ---- exec ------------------------------------------------------------------ */

static void strv_free(char **v) {
  if (v == NULL)
    return;
  for (char **s = v; *s != NULL; s++)
    free(*s);
  free(v);
}

static void strv_freep(char ***v) { strv_free(*v); }
#define cleanup_strv __attribute__((cleanup(strv_freep)))

/* The string fields `tag` of r as a NULL-terminated vector. */
static char **strv_from(const agent_req_t *r, uint16_t tag, tp_error_t *err) {
  int n = tp_fields_count(r->fields, r->n, tag), k = 0;
  char **v = calloc((size_t) n + 1, sizeof(*v));
  if (v == NULL)
    goto oom;
  for (int i = 0; i < r->n; i++) {
    if (r->fields[i].tag != tag)
      continue;
    v[k] = tp_field_strdup(&r->fields[i]);
    if (v[k++] == NULL)
      goto oom;
  }
  return v;
oom:
  strv_free(v);
  tp_error_set(err, ENOMEM, "exec: out of memory");
  return NULL;
}

/* argv[0] as given when it holds a '/', else the first executable regular
 * file of that name in PATH (from envp, or the default).  Empty PATH entries
 * are skipped rather than meaning the current directory. */
static char *resolve_program(const char *prog, char *const *envp, tp_error_t *err) {
  const char *path = AGENT_DEFAULT_PATH;
  int eacces = 0;

  if (strchr(prog, '/') != NULL) {
    char *s = strdup(prog);
    if (s == NULL)
      tp_error_set(err, ENOMEM, "exec: out of memory");
    return s;
  }
  for (char *const *e = envp; *e != NULL; e++)
    if (strncmp(*e, "PATH=", 5) == 0) {
      path = *e + 5;
      break;
    }
  for (const char *d = path; *d != '\0';) {
    size_t dlen = strcspn(d, ":");
    char cand[TP_PATH_MAX + 1];
    struct stat st;
    if (dlen > 0 && dlen + 1 + strlen(prog) <= TP_PATH_MAX) {
      memcpy(cand, d, dlen);
      cand[dlen] = '/';
      strcpy(cand + dlen + 1, prog);
      if (stat(cand, &st) < 0) {
        eacces |= errno == EACCES;
      } else if (S_ISREG(st.st_mode)) {
        if (access(cand, X_OK) == 0) {
          char *s = strdup(cand);
          if (s == NULL)
            tp_error_set(err, ENOMEM, "exec: out of memory");
          return s;
        }
        eacces = 1;
      }
    }
    d += dlen;
    if (*d == ':')
      d++;
  }
  tp_error_errno(err, eacces ? EACCES : ENOENT, "exec '%s'", prog);
  return NULL;
}

__attribute__((noreturn)) static void child_exec(const exec_spec_t *s) {
  exec_status_t st = {.stage = STAGE_SETUP};
  struct sigaction sa;
  sigset_t none;

  if (setsid() < 0)
    goto fail;
  if (dup2(s->in_fd, 0) < 0 || dup2(s->out_fd, 1) < 0 || dup2(s->err_fd, 2) < 0)
    goto fail;
  st.stage = STAGE_CHDIR;
  if (chdir(s->cwd) < 0)
    goto fail;
  st.stage = STAGE_EXEC;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    sigaction(sig, &sa, NULL); /* fails harmlessly for SIGKILL, SIGSTOP, glibc's own */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  umask(s->umask);
  setrlimit(RLIMIT_NOFILE, s->nofile);
  /* Our fds are all CLOEXEC already; this also covers any that are not. */
  close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
  execve(s->path, s->argv, s->envp);
fail:
  st.err = errno;
  while (write(s->status_fd, &st, sizeof(st)) < 0 && errno == EINTR)
    ;
  _exit(127);
}

static int pipe_cloexec(int *rd, int *wr, tp_error_t *err) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "exec: pipe");
  *rd = p[0];
  *wr = p[1];
  return 0;
}

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* The child's stdin when the host sends none: /dev/null, or a pipe whose
 * write end is already closed when the box has no /dev/null. */
static int null_stdin(tp_error_t *err) {
  int rd = -1, wr = -1;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0)
    return fd;
  if (pipe_cloexec(&rd, &wr, err) < 0)
    return -1;
  close(wr);
  return rd;
}

/* Waits for the child's verdict: 0 once it exec'd (EOF on the status pipe),
 * else -1 with err set (the child has then been reaped). */
static int exec_wait_status(pid_t pid, int status_fd, const char *prog, const char *cwd,
                            tp_error_t *err) {
  exec_status_t st;
  ssize_t n;
  do
    n = read(status_fd, &st, sizeof(st));
  while (n < 0 && errno == EINTR);
  if (n == 0)
    return 0;
  if (n != (ssize_t) sizeof(st)) {
    st.stage = STAGE_SETUP;
    st.err = n < 0 ? errno : EIO;
    kill(pid, SIGKILL);
  }
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
    ;
  if (st.stage == STAGE_CHDIR)
    return tp_error_errno(err, st.err, "exec '%s': chdir '%s'", prog, cwd);
  if (st.stage == STAGE_EXEC)
    return tp_error_errno(err, st.err, "exec '%s'", prog);
  return tp_error_errno(err, st.err, "exec '%s': child set-up", prog);
}

int agent_proc_exec(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint32_t allowed = AGENT_TAG(TP_TAG_ARG) | AGENT_TAG(TP_TAG_ENV) | AGENT_TAG(TP_TAG_CWD) |
                           AGENT_TAG(TP_TAG_FLAGS);
  cleanup_strv char **argv = NULL;
  cleanup_strv char **envp = NULL;
  cleanup_free char *path = NULL;
  cleanup_close int in_r = -1, in_w = -1, out_r = -1, out_w = -1, err_r = -1, err_w = -1;
  cleanup_close int st_r = -1, st_w = -1;
  char cwd[TP_PATH_MAX + 1] = "/";
  int nargs = tp_fields_count(r->fields, r->n, TP_TAG_ARG);
  int nenv = tp_fields_count(r->fields, r->n, TP_TAG_ENV);
  int64_t flags = agent_req_int(r, TP_TAG_FLAGS, 0);
  agent_proc_t *p = NULL;
  exec_spec_t spec;
  pid_t pid;

  if (agent_req_check(r, allowed, AGENT_TAG(TP_TAG_ARG) | AGENT_TAG(TP_TAG_ENV), "exec", err) < 0)
    return -1;
  if (nargs == 0)
    return tp_error_set(err, EINVAL, "exec: no ARG");
  if (nargs + nenv > TP_ARGS_MAX)
    return tp_error_set(err, E2BIG, "exec: more than %d ARG and ENV fields", TP_ARGS_MAX);
  if (flags & ~(int64_t) TP_F_EXEC_STDIN)
    return tp_error_set(err, EINVAL, "exec: unknown FLAGS 0x%llx", (unsigned long long) flags);
  if (agent_req_get(r, TP_TAG_CWD) != NULL && agent_req_path(r, TP_TAG_CWD, "exec", cwd, err) < 0)
    return -1;
  for (int i = 0; i < AGENT_PROC_MAX && p == NULL; i++)
    if (a->procs[i].pid == 0)
      p = &a->procs[i];
  if (p == NULL)
    return tp_error_set(err, EAGAIN, "exec: too many processes (%d)", AGENT_PROC_MAX);

  argv = strv_from(r, TP_TAG_ARG, err);
  envp = argv ? strv_from(r, TP_TAG_ENV, err) : NULL;
  if (envp == NULL)
    return -1;
  if (argv[0][0] == '\0')
    return tp_error_set(err, EINVAL, "exec: empty program name");
  path = resolve_program(argv[0], envp, err);
  if (path == NULL)
    return -1;

  if (flags & TP_F_EXEC_STDIN) {
    if (pipe_cloexec(&in_r, &in_w, err) < 0)
      return -1;
  } else if ((in_r = null_stdin(err)) < 0) {
    return -1;
  }
  if (pipe_cloexec(&out_r, &out_w, err) < 0 || pipe_cloexec(&err_r, &err_w, err) < 0 ||
      pipe_cloexec(&st_r, &st_w, err) < 0)
    return -1;

  spec = (exec_spec_t){.path = path, .argv = argv, .envp = envp, .cwd = cwd, .in_fd = in_r,
                       .out_fd = out_w, .err_fd = err_w, .status_fd = st_w, .nofile = &a->nofile,
                       .umask = a->umask};
  pid = fork();
  if (pid < 0)
    return tp_error_errno(err, errno, "exec '%s': fork", argv[0]);
  if (pid == 0)
    child_exec(&spec);

  close_fd(&st_w); /* so that the read below sees EOF once the child exec'd */
  if (exec_wait_status(pid, st_r, argv[0], cwd, err) < 0)
    return -1;

  set_nonblock(out_r);
  set_nonblock(err_r);
  *p = (agent_proc_t){.pid = pid, .out_fd = out_r, .err_fd = err_r, .in_fd = in_w};
  out_r = err_r = in_w = -1;
  if (p->in_fd >= 0)
    set_nonblock(p->in_fd);
  a->nprocs++;
  tp_frame_add_int(&a->out, TP_TAG_PID, pid);
  return 0;
}

/* ---- stdin and signals ------------------------------------------------------ */

int agent_proc_stdin(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const tp_field_t *data;
  agent_proc_t *p;
  agent_chunk_t *c;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_DATA), 0, "stdin", err) < 0)
    return -1;
  data = agent_req_get(r, TP_TAG_DATA);
  if (data == NULL)
    return tp_error_set(err, EINVAL, "stdin: no DATA");
  if ((p = proc_lookup(a, r, "stdin", err)) == NULL)
    return -1;
  if (p->in_fd < 0 || p->in_close)
    return tp_error_set(err, EPIPE, "stdin: process %d has no open stdin", (int) p->pid);
  if (data->len == 0)
    return 0;
  if (p->queued + data->len > TP_STDIN_QUEUE_MAX)
    return tp_error_set(err, EAGAIN, "stdin: process %d has %zu bytes queued", (int) p->pid,
                        p->queued);
  c = malloc(sizeof(*c) + data->len);
  if (c == NULL)
    return tp_error_set(err, ENOMEM, "stdin: out of memory");
  c->next = NULL;
  c->len = data->len;
  c->off = 0;
  memcpy(c->data, data->val, data->len);
  if (p->q_tail != NULL)
    p->q_tail->next = c;
  else
    p->q_head = c;
  p->q_tail = c;
  p->queued += data->len;
  return 0;
}

int agent_proc_stdin_close(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  agent_proc_t *p;
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID), 0, "stdin_close", err) < 0)
    return -1;
  if ((p = proc_lookup(a, r, "stdin_close", err)) == NULL)
    return -1;
  p->in_close = 1;
  if (p->q_head == NULL)
    close_fd(&p->in_fd);
  return 0;
}

int agent_proc_signal(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  int64_t sig = agent_req_int(r, TP_TAG_SIGNAL, 0);
  agent_proc_t *p;
  int group_rc;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_SIGNAL), 0, "signal", err) < 0)
    return -1;
  if (agent_req_get(r, TP_TAG_SIGNAL) == NULL)
    return tp_error_set(err, EINVAL, "signal: no SIGNAL");
  if (sig < 1 || sig > 64)
    return tp_error_set(err, EINVAL, "signal: bad signal %lld", (long long) sig);
  if ((p = proc_lookup(a, r, "signal", err)) == NULL)
    return -1;
  /* The child is unreaped, so neither its pid nor its group id can have
   * been reused. */
  group_rc = kill(-p->pid, (int) sig);
  if (kill(p->pid, (int) sig) < 0 && group_rc < 0)
    return tp_error_errno(err, errno, "signal %lld to process %d", (long long) sig, (int) p->pid);
  return 0;
}

/* ---- the loop's side ------------------------------------------------------- */

static void send_output(agent_t *a, pid_t pid, int stream, const uint8_t *data, size_t n) {
  agent_event_begin(a, TP_MSG_OUTPUT);
  tp_frame_add_int(&a->out, TP_TAG_PID, pid);
  tp_frame_add_int(&a->out, TP_TAG_STREAM, stream);
  tp_frame_add(&a->out, TP_TAG_DATA, data, (uint32_t) n);
  agent_send(a);
}

/* Reads one of p's output pipes (non-blocking) until at least `limit` bytes
 * were sent as OUTPUT (so 1 means a single read), the pipe is empty, or it
 * reached EOF or failed (then it is closed). */
static void read_output(agent_t *a, agent_proc_t *p, int stream, size_t limit) {
  int *fd = stream == 1 ? &p->out_fd : &p->err_fd;
  size_t total = 0;
  while (*fd >= 0 && total < limit) {
    ssize_t n = read(*fd, a->iobuf, sizeof(a->iobuf));
    if (n > 0) {
      send_output(a, p->pid, stream, a->iobuf, (size_t) n);
      total += (size_t) n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      break;
    } else {
      close_fd(fd);
    }
  }
}

/* Writes queued stdin until the pipe is full.  EPIPE (the child closed its
 * stdin or died) drops the queue silently. */
static void stdin_flush(agent_proc_t *p) {
  while (p->q_head != NULL) {
    agent_chunk_t *c = p->q_head;
    ssize_t n = write(p->in_fd, c->data + c->off, c->len - c->off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    if (n < 0) {
      stdin_drop(p);
      return;
    }
    c->off += (size_t) n;
    p->queued -= (size_t) n;
    if (c->off == c->len) {
      p->q_head = c->next;
      if (p->q_head == NULL)
        p->q_tail = NULL;
      free(c);
    }
  }
  if (p->in_close)
    close_fd(&p->in_fd);
}

int agent_proc_poll_fill(agent_t *a, int first) {
  int n = first;
  for (int i = 0, live = 0; i < AGENT_PROC_MAX && live < a->nprocs; i++) {
    const agent_proc_t *p = &a->procs[i];
    if (p->pid == 0)
      continue;
    live++;
    if (p->out_fd >= 0) {
      a->pfds[n] = (struct pollfd){.fd = p->out_fd, .events = POLLIN};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 1};
    }
    if (p->err_fd >= 0) {
      a->pfds[n] = (struct pollfd){.fd = p->err_fd, .events = POLLIN};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 2};
    }
    if (p->in_fd >= 0 && p->q_head != NULL) {
      a->pfds[n] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 0};
    }
  }
  return n;
}

void agent_proc_poll_handle(agent_t *a, int first, int n) {
  for (int i = first; i < n; i++) {
    agent_proc_t *p = &a->procs[a->prefs[i].slot];
    int stream = a->prefs[i].stream;
    if (a->pfds[i].revents == 0 || p->pid == 0)
      continue;
    if (stream == 0 && p->in_fd == a->pfds[i].fd)
      stdin_flush(p);
    else if (stream == 1 && p->out_fd == a->pfds[i].fd)
      read_output(a, p, 1, 1);
    else if (stream == 2 && p->err_fd == a->pfds[i].fd)
      read_output(a, p, 2, 1);
  }
}

/* The child is gone: send what its pipes still hold (a grandchild keeping
 * them open must not delay EXIT, hence non-blocking and bounded), then EXIT. */
static void proc_exited(agent_t *a, agent_proc_t *p, int status) {
  read_output(a, p, 1, AGENT_DRAIN_MAX);
  read_output(a, p, 2, AGENT_DRAIN_MAX);
  agent_event_begin(a, TP_MSG_EXIT);
  tp_frame_add_int(&a->out, TP_TAG_PID, p->pid);
  tp_frame_add_int(&a->out, TP_TAG_CODE, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  tp_frame_add_int(&a->out, TP_TAG_SIGNAL, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  agent_send(a);
  proc_free(a, p);
}

void agent_proc_reap(agent_t *a) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    agent_proc_t *p;
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0)
      return;
    p = proc_find(a, pid);
    if (p != NULL) /* else an orphan we inherited: reaped silently */
      proc_exited(a, p, status);
  }
}

void agent_proc_kill_all(agent_t *a) {
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid > 0) {
      kill(-a->procs[i].pid, SIGKILL);
      kill(a->procs[i].pid, SIGKILL);
    }
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid > 0) {
      while (waitpid(a->procs[i].pid, NULL, 0) < 0 && errno == EINTR)
        ;
      proc_free(a, &a->procs[i]);
    }
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}
