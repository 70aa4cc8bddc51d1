/* The C client of the hot verbs (fast.h).  Its wire is the Lua CLI's
 * (lua/tupper/client/cli_verbs.lua run_streamed, run_in, M.run, M.exec;
 * lua/tupper/wire/client.lua and stream.lua), with the requests that do
 * not wait on each other written together: hello and stream.channel (and
 * run's sandbox.create) in one write, the data connection's attach while
 * a create is still running. */
#define _GNU_SOURCE
#include "fast.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fargv.h"
#include "fjson.h"
#include "spump.h"
#include "utils.h"

#define TP__FAST_WINDOW (4u * 1024u * 1024u) /* stream.attach's window, the Lua client's */
#define TP__FAST_REQ_MAX (64u * 1024u * 1024u) /* bytes of one request we write */

/* A connection's reader of JSON lines. */
typedef struct tp__fline_s {
  int fd;
  char *buf;
  size_t have, cap;
} tp__fline_t;

typedef struct tp__fast_s {
  const tp_fargv_t *a;
  char socket[sizeof(((struct sockaddr_un *) 0)->sun_path)];
  tp__fline_t ctl;
  size_t used;    /* bytes of ctl's buffer c->msg still points into */
  tp_fjson_t msg; /* the last message read */
  tp_fjson_tok_t *tok;
  /* replies that came before the one waited for (run's create and channel
   * may answer in either order) */
  struct { int64_t id; char *line; size_t len; } stash[4];
  int nstash;
  char *held; /* the stashed line c->msg points into */
  int64_t next_id;
  char id[TP_FAST_ID_MAX]; /* the sandbox */
  /* the process */
  int64_t pid;
  uint32_t sid_out, sid_err, sid_in;
  tp_spump_t *dc;
  int dc_over;
  /* -i from a pipe (or anything but a regular file, which the pump sends
   * itself): read here within the stream's credit */
  int in_here, in_over;
  uint64_t in_credit;
  uint8_t *in_buf;
  /* the loop's state, as run_streamed keeps it */
  int pending, exited, closed, out_done, err_done;
  int exit_code; /* once exited */
  int broken_errno;
  char broken[320], failed[320];
  int has_broken, has_failed;
} tp__fast_t;

/* --------------------------------------------------------------- places */

static int tp__fast_connect(const char *path, int *err) {
  struct sockaddr_un sa;
  int fd;
  if (strlen(path) >= sizeof(sa.sun_path)) {
    *err = ENAMETOOLONG;
    return -1;
  }
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  while (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
    if (errno == EINTR)
      continue;
    *err = errno;
    close(fd);
    return -1;
  }
  return fd;
}

static const char *tp__fast_env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

/* The control connection, tried where the Lua client tries
 * (util/paths.lua client_sockets, wire/client.lua connect): --socket;
 * else $TUPPER_SOCKET; else the system's for root, else the user's and
 * then the system's.  -1 when none answers: the Lua CLI then says so in
 * its words, or starts a daemon. */
static int tp__fast_ctl(tp__fast_t *c) {
  const char *sys = tp__fast_env("TUPPER_SYSTEM_SOCKET");
  const char *first, *second = NULL;
  char user[sizeof(c->socket)];
  struct stat st;
  int fd, e = 0;
  if (sys == NULL)
    sys = "/run/tupper/tupper.sock";
  if (c->a->socket) {
    first = c->a->socket;
  } else if ((first = tp__fast_env("TUPPER_SOCKET")) == NULL) {
    uid_t uid = getuid();
    const char *run = tp__fast_env("XDG_RUNTIME_DIR");
    int n;
    if (uid == 0)
      n = snprintf(user, sizeof(user), "%s", sys);
    else if (run)
      n = snprintf(user, sizeof(user), "%s/tupper.sock", run);
    else
      n = snprintf(user, sizeof(user), "/tmp/tupper-%u/tupper.sock", (unsigned) uid);
    if (n < 0 || (size_t) n >= sizeof(user))
      return -1;
    first = user;
    if (strcmp(first, sys) != 0)
      second = sys;
  }
  if (strlen(first) >= sizeof(c->socket))
    return -1;
  fd = tp__fast_connect(first, &e);
  if (fd >= 0) {
    snprintf(c->socket, sizeof(c->socket), "%s", first);
    return fd;
  }
  if (second == NULL || (e != ENOENT && e != ECONNREFUSED))
    return -1;
  if (stat(second, &st) < 0 || !S_ISSOCK(st.st_mode) || strlen(second) >= sizeof(c->socket))
    return -1;
  fd = tp__fast_connect(second, &e);
  if (fd >= 0)
    snprintf(c->socket, sizeof(c->socket), "%s", second);
  return fd;
}

/* Whether run would send a policy: the nearest tupper.lua from the working
 * directory up (recipe/policy.lua find).  Anything there at all, or a
 * directory that cannot be read, is the Lua CLI's to judge. */
static int tp__fast_policy_near(void) {
  char dir[4096 + 16];
  if (getcwd(dir, 4096) == NULL)
    return 1;
  for (;;) {
    size_t l = strlen(dir);
    struct stat st;
    char *slash;
    while (l > 0 && dir[l - 1] == '/')
      dir[--l] = '\0';
    memcpy(dir + l, "/tupper.lua", sizeof("/tupper.lua"));
    if (stat(dir, &st) == 0 || errno != ENOENT)
      return 1;
    dir[l] = '\0';
    if (l == 0)
      return 0;
    slash = strrchr(dir, '/');
    *slash = '\0';
  }
}

/* ---------------------------------------------------------------- lines */

static int tp__fast_send(int fd, const char *b, size_t n, tp_error_t *err) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return tp_error_errno(err, errno, "write to the daemon");
    }
    b += w;
    n -= (size_t) w;
  }
  return 0;
}

/* The next line of l (its newline cut), without reading: NULL when none
 * is whole yet. */
static char *tp__fline_take(tp__fline_t *l, size_t *len, size_t *used) {
  char *nl = memchr(l->buf, '\n', l->have);
  if (nl == NULL)
    return NULL;
  *len = (size_t) (nl - l->buf);
  *used = *len + 1;
  return l->buf;
}

static void tp__fline_drop(tp__fline_t *l, size_t used) {
  memmove(l->buf, l->buf + used, l->have - used);
  l->have -= used;
}

/* One read into l: 1 bytes came, 0 the end, -1 an error. */
static int tp__fline_fill(tp__fline_t *l, tp_error_t *err) {
  ssize_t r;
  if (l->have == l->cap) {
    size_t ncap = l->cap ? l->cap * 2 : 65536;
    char *nb;
    if (l->cap >= TP_FAST_LINE_MAX)
      return tp_error_set(err, EMSGSIZE, "a message of the daemon is longer than %d bytes",
                          TP_FAST_LINE_MAX);
    if (ncap > TP_FAST_LINE_MAX)
      ncap = TP_FAST_LINE_MAX;
    nb = realloc(l->buf, ncap);
    if (nb == NULL)
      return tp_error_set(err, ENOMEM, "out of memory");
    l->buf = nb;
    l->cap = ncap;
  }
  do
    r = read(l->fd, l->buf + l->have, l->cap - l->have);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return tp_error_errno(err, errno, "read from the daemon");
  l->have += (size_t) r;
  return r > 0;
}

/* Parses a line into c->msg; it must be a JSON object. */
static int tp__fast_parse(tp__fast_t *c, const char *line, size_t len, tp_error_t *err) {
  if (tp_fjson_parse(&c->msg, line, len, c->tok, TP_FAST_TOKENS, err) < 0)
    return tp_error_prefix(err, "the daemon sent a malformed message");
  if (!tp_fjson_is(&c->msg, 0, TP_FJ_OBJECT))
    return tp_error_set(err, EPROTO, "the daemon sent a message that is not an object");
  return 0;
}

/* ------------------------------------------------------------- requests */

static int64_t tp__fast_begin(tp__fast_t *c, tp_fjson_buf_t *w, const char *method) {
  int64_t id = c->next_id++;
  tp_fjson_raw(w, "{\"jsonrpc\":\"2.0\",\"id\":");
  tp_fjson_int_out(w, id);
  tp_fjson_raw(w, ",\"method\":\"");
  tp_fjson_raw(w, method);
  tp_fjson_raw(w, "\",\"params\":");
  return id;
}

/* The env object of -e K=V (a key's last value; in the order first given). */
static void tp__fast_env_obj(const tp_fargv_t *a, tp_fjson_buf_t *w) {
  int first = 1;
  tp_fjson_raw(w, "{");
  for (int i = 0; i < a->nenv; i++) {
    size_t kl = tp_fargv_key_len(a->env[i]);
    int last = i, seen = 0;
    char key[4096];
    for (int k = 0; k < i; k++)
      seen |= tp_fargv_key_len(a->env[k]) == kl && memcmp(a->env[k], a->env[i], kl) == 0;
    if (seen)
      continue;
    for (int k = i + 1; k < a->nenv; k++)
      if (tp_fargv_key_len(a->env[k]) == kl && memcmp(a->env[k], a->env[i], kl) == 0)
        last = k;
    if (kl >= sizeof(key)) {
      w->failed = 1;
      return;
    }
    memcpy(key, a->env[i], kl);
    key[kl] = '\0';
    if (!first)
      tp_fjson_raw(w, ",");
    first = 0;
    tp_fjson_string(w, key);
    tp_fjson_raw(w, ":");
    tp_fjson_string(w, a->env[last] + kl + 1);
  }
  tp_fjson_raw(w, "}");
}

static void tp__fast_hello(tp__fast_t *c, tp_fjson_buf_t *w) {
  tp__fast_begin(c, w, "hello");
  tp_fjson_raw(w, "{\"protocol\":1,\"client\":\"tupper-lua\"}}\n");
}

static void tp__fast_channel(tp__fast_t *c, tp_fjson_buf_t *w) {
  tp__fast_begin(c, w, "stream.channel");
  tp_fjson_raw(w, "{}}\n");
}

/* run's sandbox.create: what M.run sends with no limits, policy or recipe. */
static void tp__fast_create(tp__fast_t *c, tp_fjson_buf_t *w) {
  tp__fast_begin(c, w, "sandbox.create");
  tp_fjson_raw(w, "{");
  if (c->a->image) {
    tp_fjson_raw(w, "\"image\":");
    tp_fjson_string(w, c->a->image);
    tp_fjson_raw(w, ",");
  }
  if (c->a->nenv > 0) {
    tp_fjson_raw(w, "\"env\":");
    tp__fast_env_obj(c->a, w);
    tp_fjson_raw(w, ",");
  }
  /* the limits as given; no --timeout: 0, a run box lives as long as its
   * command (no policy here to cap it) */
  tp_fjson_raw(w, "\"limits\":{");
  if (c->a->memory) {
    tp_fjson_raw(w, "\"memory\":");
    tp_fjson_string(w, c->a->memory);
    tp_fjson_raw(w, ",");
  }
  if (c->a->disk) {
    tp_fjson_raw(w, "\"disk\":");
    tp_fjson_string(w, c->a->disk);
    tp_fjson_raw(w, ",");
  }
  if (c->a->cpus) {
    char num[40];
    snprintf(num, sizeof(num), "\"cpus\":%.14g,", strtod(c->a->cpus, NULL));
    tp_fjson_raw(w, num);
  }
  if (c->a->pids) {
    tp_fjson_raw(w, "\"pids\":");
    tp_fjson_int_out(w, strtoll(c->a->pids, NULL, 10));
    tp_fjson_raw(w, ",");
  }
  tp_fjson_raw(w, "\"timeout\":");
  if (c->a->timeout && strspn(c->a->timeout, "0123456789") == strlen(c->a->timeout))
    tp_fjson_int_out(w, strtoll(c->a->timeout, NULL, 10)); /* tonumber(v): seconds */
  else if (c->a->timeout)
    tp_fjson_string(w, c->a->timeout);
  else
    tp_fjson_raw(w, "0");
  tp_fjson_raw(w, "},\"kill_on_disconnect\":true}}\n");
}

static void tp__fast_start(tp__fast_t *c, tp_fjson_buf_t *w) {
  const tp_fargv_t *a = c->a;
  tp__fast_begin(c, w, "process.start");
  tp_fjson_raw(w, "{\"sandbox\":");
  tp_fjson_string(w, c->id);
  tp_fjson_raw(w, ",\"argv\":[");
  for (int i = 0; i < a->ncmd; i++) {
    if (i > 0)
      tp_fjson_raw(w, ",");
    tp_fjson_string(w, a->cmd[i]);
  }
  tp_fjson_raw(w, "],\"env\":");
  tp__fast_env_obj(a, w);
  if (a->workdir) {
    tp_fjson_raw(w, ",\"cwd\":");
    tp_fjson_string(w, a->workdir);
  }
  tp_fjson_raw(w, a->interactive ? ",\"stdin\":true" : ",\"stdin\":false");
  tp_fjson_raw(w, ",\"streams\":true}}\n");
}

static int tp__fast_write(tp__fast_t *c, tp_fjson_buf_t *w, tp_error_t *err) {
  if (w->failed)
    return tp_error_set(err, E2BIG, "the request is too big");
  return tp__fast_send(c->ctl.fd, w->b, w->len, err);
}

/* ---------------------------------------------------------------- replies */

/* Reads messages until the reply to id (in c->msg: its result token in
 * *res, or its error token in *eobj).  A process.exit seen meanwhile is
 * kept.  0, or -1 (err: the connection ended, or a bad message). */
static void tp__fast_note(tp__fast_t *c);

/* Lets go of the line c->msg points into. */
static void tp__fast_settle(tp__fast_t *c) {
  if (c->used > 0)
    tp__fline_drop(&c->ctl, c->used);
  c->used = 0;
  free(c->held);
  c->held = NULL;
}

/* A reply in c->msg: its result token in *res, or its error in *eobj. */
static int tp__fast_answer(tp__fast_t *c, int *res, int *eobj, tp_error_t *err) {
  *res = tp_fjson_get(&c->msg, 0, "result");
  *eobj = tp_fjson_get(&c->msg, 0, "error");
  if (*res < 0 && !tp_fjson_is(&c->msg, *eobj, TP_FJ_OBJECT))
    return tp_error_set(err, EPROTO, "the daemon's reply has neither a result nor an error");
  return 0;
}

static int tp__fast_reply(tp__fast_t *c, int64_t id, int *res, int *eobj, tp_error_t *err) {
  tp__fast_settle(c);
  for (int k = 0; k < c->nstash; k++) {
    if (c->stash[k].id != id)
      continue;
    size_t len = c->stash[k].len;
    c->held = c->stash[k].line;
    c->stash[k] = c->stash[--c->nstash];
    if (tp__fast_parse(c, c->held, len, err) < 0)
      return -1;
    return tp__fast_answer(c, res, eobj, err);
  }
  for (;;) {
    size_t len, used;
    char *line;
    int t;
    int64_t got;
    while ((line = tp__fline_take(&c->ctl, &len, &used)) == NULL) {
      int r = tp__fline_fill(&c->ctl, err);
      if (r < 0)
        return -1;
      if (r == 0)
        return tp_error_set(err, ECONNRESET, "connection to the daemon lost");
    }
    if (len == 0) {
      tp__fline_drop(&c->ctl, used);
      continue;
    }
    if (tp__fast_parse(c, line, len, err) < 0)
      return -1;
    t = tp_fjson_get(&c->msg, 0, "id");
    if (t < 0 || tp_fjson_is(&c->msg, t, TP_FJ_NULL)) {
      tp__fast_note(c);
    } else if (tp_fjson_int(&c->msg, t, &got) == 0 && got == id) {
      c->used = used; /* the caller reads c->msg before the next line replaces it */
      return tp__fast_answer(c, res, eobj, err);
    } else if (tp_fjson_int(&c->msg, t, &got) == 0 && got > 0 && got < c->next_id &&
               c->nstash < (int) (sizeof(c->stash) / sizeof(c->stash[0]))) {
      char *copy = strndup(line, len);
      if (copy == NULL)
        return tp_error_set(err, ENOMEM, "out of memory");
      c->stash[c->nstash].id = got;
      c->stash[c->nstash].line = copy;
      c->stash[c->nstash++].len = len;
    }
    tp__fline_drop(&c->ctl, used);
  }
}

/* An error object's message ("tostring(e.message)" of the Lua CLI). */
static void tp__fast_errmsg(tp__fast_t *c, int eobj, char *buf, size_t cap) {
  int m = tp_fjson_get(&c->msg, eobj, "message");
  if (tp_fjson_str(&c->msg, m, buf, cap) < 0)
    snprintf(buf, cap, "%s", tp_fjson_is(&c->msg, m, TP_FJ_STRING) ? "(a message too long)" : "nil");
}

/* A notification of the control connection: the process's exit is ours
 * when it names our sandbox and pid (run_streamed's process.exit). */
static void tp__fast_note(tp__fast_t *c) {
  int m = tp_fjson_get(&c->msg, 0, "method");
  int p = tp_fjson_get(&c->msg, 0, "params");
  char name[32], sb[TP_FAST_ID_MAX];
  int64_t pid, v;
  int t;
  if (c->pid <= 0 || tp_fjson_str(&c->msg, m, name, sizeof(name)) < 0 || strcmp(name, "process.exit") != 0)
    return;
  if (tp_fjson_str(&c->msg, tp_fjson_get(&c->msg, p, "sandbox"), sb, sizeof(sb)) < 0 ||
      strcmp(sb, c->id) != 0 || tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, p, "pid"), &pid) < 0 ||
      pid != c->pid)
    return;
  c->exited = 1;
  /* exit_code (cli_verbs.lua): an OOM kill is said; a signal is 128+N;
   * else the exit code, or 125 when there is none */
  if (tp_fjson_is(&c->msg, tp_fjson_get(&c->msg, p, "oom_killed"), TP_FJ_TRUE))
    fputs("tupper: the command was killed: out of memory (the sandbox's memory limit)\n", stderr);
  t = tp_fjson_get(&c->msg, p, "signal");
  if (tp_fjson_int(&c->msg, t, &v) == 0 && v > 0)
    c->exit_code = (int) ((128 + v) & 0xff);
  else if (tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, p, "exit_code"), &v) == 0)
    c->exit_code = (int) (v & 0xff);
  else
    c->exit_code = 125;
}

/* ---------------------------------------------------------- the data plane */

/* Connects the data connection with token (stream.attach) and makes its
 * pump.  0; 1 when the daemon refused the attach (the Lua CLI then uses
 * the old path); -1 on an error. */
static int tp__fast_attach(tp__fast_t *c, const char *token, tp_error_t *err) {
  tp_fjson_buf_t w;
  tp__fline_t l = { .fd = -1 };
  int e = 0, ret = -1, res = -1;
  size_t len, used;
  char *line;
  l.fd = tp__fast_connect(c->socket, &e);
  if (l.fd < 0)
    return tp_error_errno(err, e, "connect %s", c->socket);
  tp_fjson_buf_init(&w, 4096);
  tp_fjson_raw(&w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"stream.attach\",\"params\":{\"token\":");
  tp_fjson_string(&w, token);
  tp_fjson_raw(&w, ",\"window\":");
  tp_fjson_int_out(&w, TP__FAST_WINDOW);
  tp_fjson_raw(&w, "}}\n");
  if (w.failed) {
    tp_error_set(err, E2BIG, "stream.attach: the token is too long");
    goto out;
  }
  if (tp__fast_send(l.fd, w.b, w.len, err) < 0)
    goto out;
  /* the reply is the only JSON line: what follows its newline is frames */
  while ((line = tp__fline_take(&l, &len, &used)) == NULL) {
    int r = tp__fline_fill(&l, err);
    if (r < 0)
      goto out;
    if (r == 0) {
      ret = 1;
      goto out;
    }
    if (l.have > 65536) { /* stream.lua's bound on the attach reply */
      ret = 1;
      goto out;
    }
  }
  if (tp__fast_parse(c, line, len, err) < 0)
    goto out;
  res = tp_fjson_get(&c->msg, 0, "result");
  if (!tp_fjson_is(&c->msg, res, TP_FJ_OBJECT)) {
    ret = 1;
    goto out;
  }
  c->dc = tp_spump_new(l.fd, (const uint8_t *) l.buf + used, l.have - used, err);
  if (c->dc == NULL)
    goto out;
  l.fd = -1; /* the pump's now */
  ret = 0;
out:
  if (l.fd >= 0)
    close(l.fd);
  free(l.buf);
  tp_fjson_buf_free(&w);
  return ret;
}

/* The pump's frames and failures (run_streamed's two drains). */
static void tp__fast_frame(void *data, const tp_sframe_t *f, int local) {
  tp__fast_t *c = data;
  int *done;
  size_t ml = f->msg_len < 300 ? f->msg_len : 300;
  if (f->sid == 0) {
    char msg[320];
    if (f->type != TP_SF_ERROR)
      return;
    c->dc_over = 1;
    if (ml == 0 && !local)
      snprintf(msg, sizeof(msg), "the daemon closed the data connection");
    else
      snprintf(msg, sizeof(msg), "%.*s", (int) ml, f->msg);
    /* every stream still open ends with it (stream.lua DC:_down) */
    for (int k = 0; k < 2; k++) {
      done = k == 0 ? &c->out_done : &c->err_done;
      if (*done)
        continue;
      *done = 1;
      c->pending--;
      if (!c->has_failed) {
        snprintf(c->failed, sizeof(c->failed), "%s", msg);
        c->has_failed = 1;
      }
    }
    return;
  }
  if (f->sid == c->sid_in && c->in_here) {
    if (f->type == TP_SF_OPEN)
      c->in_credit += f->window;
    else if (f->type == TP_SF_CREDIT)
      c->in_credit += f->credit;
    else if (f->type == TP_SF_END || f->type == TP_SF_ERROR)
      c->in_over = 1; /* the process takes no more (its stdin closed, or it exited) */
    return;
  }
  if (f->sid == c->sid_out)
    done = &c->out_done;
  else if (f->sid == c->sid_err)
    done = &c->err_done;
  else
    return; /* stdin's frames, or a stream of nobody here */
  if (*done || (f->type != TP_SF_END && f->type != TP_SF_ERROR))
    return;
  *done = 1;
  c->pending--;
  if (f->type == TP_SF_END)
    return;
  if (!c->has_failed) {
    snprintf(c->failed, sizeof(c->failed), "%.*s", (int) ml, f->msg);
    c->has_failed = 1;
  }
  if (local && !c->has_broken) {
    snprintf(c->broken, sizeof(c->broken), "%.*s", (int) ml, f->msg);
    c->broken_errno = (int) f->err;
    c->has_broken = 1;
  }
}

/* ------------------------------------------------------------- the loop */

static void tp__fast_signal(tp__fast_t *c, int signo) {
  const char *name = signo == SIGINT ? "INT" : signo == SIGTERM ? "TERM" : "HUP";
  tp_fjson_buf_t w;
  tp_error_t err;
  tp_fjson_buf_init(&w, 4096);
  tp__fast_begin(c, &w, "process.signal");
  tp_fjson_raw(&w, "{\"sandbox\":");
  tp_fjson_string(&w, c->id);
  tp_fjson_raw(&w, ",\"pid\":");
  tp_fjson_int_out(&w, c->pid);
  tp_fjson_raw(&w, ",\"signal\":\"");
  tp_fjson_raw(&w, name);
  tp_fjson_raw(&w, "\"}}\n");
  if (tp__fast_write(c, &w, &err) < 0)
    c->closed = 1;
  tp_fjson_buf_free(&w);
}

/* Reads what stdin has (at most the stream's credit) and queues it as
 * DATA; its end (or a failed read, as the Lua CLI's loop takes it) as END. */
static void tp__fast_stdin(tp__fast_t *c) {
  size_t n = c->in_credit < TP_SF_DATA_MAX ? (size_t) c->in_credit : TP_SF_DATA_MAX;
  ssize_t r;
  do
    r = read(0, c->in_buf + TP_SF_HDR, n);
  while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return;
  if (r > 0) {
    tp_sframe_header(c->in_buf, TP_SF_DATA, c->sid_in, (uint32_t) r);
    c->in_credit -= (uint64_t) r;
  } else {
    r = 0;
    (void) tp_sframe_end(c->in_buf, c->sid_in, 0, 0);
    c->in_over = 1;
  }
  if (tp_spump_send(c->dc, c->in_buf, TP_SF_HDR + (size_t) r, NULL) < 0 ||
      tp_spump_write(c->dc, tp__fast_frame, c) < 0)
    c->dc_over = 1;
}

/* Handles the whole lines the control connection has: 0, or -1 on a bad
 * message (err). */
static int tp__fast_lines(tp__fast_t *c, tp_error_t *err) {
  size_t len, used;
  char *line;
  tp__fast_settle(c);
  while ((line = tp__fline_take(&c->ctl, &len, &used)) != NULL) {
    if (len > 0) {
      if (tp__fast_parse(c, line, len, err) < 0)
        return -1;
      tp__fast_note(c); /* a reply (to a signal) needs nothing */
    }
    tp__fline_drop(&c->ctl, used);
  }
  return 0;
}

/* Until the process exited and both its streams ended (or the control
 * connection is gone, or writing our output failed). */
static int tp__fast_loop(tp__fast_t *c, tp_error_t *err) {
  sigset_t set;
  cleanup_close int sfd = -1;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  /* ^C and friends go to the process, as docker run does */
  if (sigprocmask(SIG_BLOCK, &set, NULL) < 0 || (sfd = signalfd(-1, &set, SFD_CLOEXEC)) < 0)
    return tp_error_errno(err, errno, "signalfd");
  if (tp__fast_lines(c, err) < 0)
    return -1;
  if (!c->dc_over && (tp_spump_read(c->dc, tp__fast_frame, c) < 0 ||
                      tp_spump_write(c->dc, tp__fast_frame, c) < 0))
    c->dc_over = 1;
  while ((!c->exited || c->pending > 0) && !c->closed && !c->has_broken) {
    struct pollfd pf[4] = {
      { .fd = c->ctl.fd, .events = POLLIN },
      { .fd = c->dc_over ? -1 : tp_spump_fd(c->dc), .events = POLLIN },
      { .fd = sfd, .events = POLLIN },
      { .fd = -1, .events = POLLIN },
    };
    if (!c->dc_over && tp_spump_queued(c->dc) > 0)
      pf[1].events |= POLLOUT;
    if (c->in_here && !c->in_over && !c->dc_over && c->in_credit > 0 &&
        tp_spump_queued(c->dc) < TP_SPUMP_QUEUE)
      pf[3].fd = 0;
    if (poll(pf, 4, -1) < 0) {
      if (errno == EINTR)
        continue;
      return tp_error_errno(err, errno, "poll");
    }
    if (pf[2].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof(si)) == (ssize_t) sizeof(si))
        tp__fast_signal(c, (int) si.ssi_signo);
    }
    if (pf[0].revents) {
      int r;
      tp__fast_settle(c);
      r = tp__fline_fill(&c->ctl, err);
      if (r < 0 && err->code != EMSGSIZE)
        r = 0; /* a read that failed: the connection is gone */
      if (r < 0)
        return -1;
      if (r == 0)
        c->closed = 1;
      if (tp__fast_lines(c, err) < 0)
        return -1;
    }
    if (!c->dc_over && pf[1].revents) {
      if ((pf[1].revents & ~POLLOUT) && tp_spump_read(c->dc, tp__fast_frame, c) < 0)
        c->dc_over = 1;
      if (!c->dc_over && tp_spump_write(c->dc, tp__fast_frame, c) < 0)
        c->dc_over = 1;
    }
    if (pf[3].fd == 0 && pf[3].revents && !c->in_over && !c->dc_over)
      tp__fast_stdin(c);
  }
  return 0;
}

/* The data connection: stream.channel's token (the reply to channel_id)
 * and the attach.  0; 1: fall back (stream.open failed: the Lua CLI's
 * old path); -1: err. */
static int tp__fast_open(tp__fast_t *c, int64_t channel_id, tp_error_t *err) {
  char token[128];
  int res, eobj;
  if (tp__fast_reply(c, channel_id, &res, &eobj, err) < 0)
    return -1;
  if (res < 0 || tp_fjson_str(&c->msg, tp_fjson_get(&c->msg, res, "token"), token, sizeof(token)) < 0)
    return 1;
  return tp__fast_attach(c, token, err);
}

/* process.start with streams, its streams to fd 1, 2 (and from 0), the
 * loop: the exit code in *code (run_streamed).  0, or -1: err, before
 * the process ran. */
static int tp__fast_run_in(tp__fast_t *c, int *code, tp_error_t *err) {
  tp_fjson_buf_t w;
  int res, eobj, r, st;
  int64_t v, start_id;
  tp_fjson_buf_init(&w, TP__FAST_REQ_MAX);
  start_id = c->next_id;
  tp__fast_start(c, &w);
  r = tp__fast_write(c, &w, err);
  tp_fjson_buf_free(&w);
  if (r < 0 || tp__fast_reply(c, start_id, &res, &eobj, err) < 0)
    return -1;
  if (res < 0) {
    /* start_failed: ENOENT 127, EACCES 126, else 125 */
    char msg[4096], ecode[16] = "";
    tp__fast_errmsg(c, eobj, msg, sizeof(msg));
    fprintf(stderr, "tupper: %s\n", msg);
    (void) tp_fjson_str(&c->msg, tp_fjson_get(&c->msg, tp_fjson_get(&c->msg, eobj, "data"), "code"),
                        ecode, sizeof(ecode));
    *code = strcmp(ecode, "ENOENT") == 0 ? 127 : strcmp(ecode, "EACCES") == 0 ? 126 : 125;
    return 0;
  }
  st = tp_fjson_get(&c->msg, res, "streams");
  if (tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, res, "pid"), &v) < 0 || v <= 0)
    return tp_error_set(err, EPROTO, "the daemon's reply to process.start has no pid");
  c->pid = v;
  for (int k = 0; k < 3; k++) {
    static const char *const names[] = { "stdout", "stderr", "stdin" };
    uint32_t *sid = k == 0 ? &c->sid_out : k == 1 ? &c->sid_err : &c->sid_in;
    if (k == 2 && !c->a->interactive)
      break;
    if (tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, st, names[k]), &v) < 0 || v <= 0 ||
        v >= (int64_t) TP_SF_CLIENT_SID)
      return tp_error_set(err, EPROTO, "the daemon's reply to process.start has no %s stream",
                          names[k]);
    *sid = (uint32_t) v;
  }
  if (c->sid_out == c->sid_err || (c->sid_in && (c->sid_in == c->sid_out || c->sid_in == c->sid_err)))
    return tp_error_set(err, EPROTO, "the daemon's reply to process.start names one stream twice");
  if (tp_spump_sink(c->dc, c->sid_out, 1, UINT64_MAX, err) < 0 ||
      tp_spump_sink(c->dc, c->sid_err, 2, UINT64_MAX, err) < 0)
    return -1;
  if (c->sid_in) {
    struct stat sb;
    /* a file on our stdin goes from the pump; a pipe is read here */
    if (fstat(0, &sb) == 0 && S_ISREG(sb.st_mode)) {
      if (tp_spump_source(c->dc, c->sid_in, 0, 0, UINT64_MAX, err) < 0)
        return -1;
    } else {
      c->in_buf = malloc(TP_SF_HDR + TP_SF_DATA_MAX);
      if (c->in_buf == NULL)
        return tp_error_set(err, ENOMEM, "out of memory");
      c->in_here = 1;
    }
  }
  c->pending = 2;
  r = tp__fast_loop(c, err);
  /* what is queued (an ERROR telling the daemon our reader went, a last
   * CREDIT) goes if the socket takes it now; the close says the rest */
  if (!c->dc_over)
    (void) tp_spump_write(c->dc, tp__fast_frame, c);
  if (r < 0) {
    fprintf(stderr, "tupper: %s\n", err->msg);
    *code = 125;
    return 0;
  }
  if (c->has_broken) {
    if (c->broken_errno == EPIPE)
      *code = 141;
    else {
      fprintf(stderr, "tupper: writing the process's output failed: %s\n", c->broken);
      *code = 125;
    }
  } else if (!c->exited) {
    fputs("tupper: lost the connection to the daemon\n", stderr);
    *code = 125;
  } else if (c->has_failed) {
    fprintf(stderr, "tupper: the process's output stream failed: %s\n", c->failed);
    *code = 125;
  } else {
    *code = c->exit_code;
  }
  return 0;
}

/* hello's result: 1 when it speaks the data plane and process streams. */
static int tp__fast_hello_ok(tp__fast_t *c, int res) {
  int64_t s, ps;
  return tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, res, "streams"), &s) == 0 && s == 1 &&
         tp_fjson_int(&c->msg, tp_fjson_get(&c->msg, res, "process_streams"), &ps) == 0 && ps == 1;
}

/* The conversation; 1 handled (*code), 0 fall back. */
static int tp__fast_talk(tp__fast_t *c, int *code) {
  const tp_fargv_t *a = c->a;
  tp_fjson_buf_t w;
  tp_error_t err;
  int64_t hello_id, channel_id, create_id = 0;
  int res, eobj, r;
  char msg[4096];
  tp_error_clear(&err);
  tp_fjson_buf_init(&w, TP__FAST_REQ_MAX);
  hello_id = c->next_id;
  tp__fast_hello(c, &w);
  if (a->verb == TP_FV_RUN) {
    create_id = c->next_id;
    tp__fast_create(c, &w);
  }
  channel_id = c->next_id;
  tp__fast_channel(c, &w);
  r = tp__fast_write(c, &w, &err);
  tp_fjson_buf_free(&w);
  if (r < 0 || tp__fast_reply(c, hello_id, &res, &eobj, &err) < 0)
    goto fail;
  if (res < 0) {
    tp__fast_errmsg(c, eobj, msg, sizeof(msg));
    fprintf(stderr, "tupper: hello: %s\n", msg);
    *code = 125;
    return 1;
  }
  if (!tp__fast_hello_ok(c, res))
    return 0; /* an older daemon: the Lua CLI's JSON path (a run's box goes with us) */
  /* the data connection is made while a run's create goes on */
  r = tp__fast_open(c, channel_id, &err);
  if (r < 0)
    goto fail;
  if (r == 1)
    return 0;
  if (a->verb == TP_FV_RUN) {
    if (tp__fast_reply(c, create_id, &res, &eobj, &err) < 0)
      goto fail;
    if (res < 0) {
      tp__fast_errmsg(c, eobj, msg, sizeof(msg));
      fprintf(stderr, "tupper: %s\n", msg);
      *code = 125;
      return 1;
    }
    if (tp_fjson_str(&c->msg, tp_fjson_get(&c->msg, res, "id"), c->id, sizeof(c->id)) <= 0) {
      tp_error_set(&err, EPROTO, "the daemon's reply to sandbox.create has no id");
      goto fail;
    }
  } else {
    snprintf(c->id, sizeof(c->id), "%s", a->id);
  }
  if (tp__fast_run_in(c, code, &err) < 0)
    goto fail;
  if (a->verb == TP_FV_RUN && !c->closed) {
    /* --rm: a notification, not a call (M.run): the daemon removes the box
     * on its own */
    tp_fjson_buf_init(&w, 4096);
    tp_fjson_raw(&w, "{\"jsonrpc\":\"2.0\",\"method\":\"sandbox.kill\",\"params\":{\"id\":");
    tp_fjson_string(&w, c->id);
    tp_fjson_raw(&w, "}}\n");
    (void) tp__fast_write(c, &w, &err);
    tp_fjson_buf_free(&w);
  }
  return 1;
fail:
  fprintf(stderr, "tupper: %s\n", err.msg);
  *code = 125;
  return 1;
}

int tp_fast_mine(int argc, char **argv, tp_fargv_t *a) {
  const char *client = getenv("TUPPER_CLIENT");
  struct stat st;
  if (client != NULL && strcmp(client, "lua") == 0)
    return 0; /* the Lua CLI asked for by name (tests, A/B measurements) */
  if (!tp_fargv_parse(argc, argv, a))
    return 0;
  /* a closed 0, 1 or 2 would be our sockets' number: the output would go
   * into the connection */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0)
      return 0;
  /* a terminal gets the escaping filter; -it and the terminal keys are Lua's */
  if (isatty(1) || isatty(2))
    return 0;
  if (a->interactive && (fstat(0, &st) < 0 || isatty(0)))
    return 0; /* a terminal on stdin is the Lua CLI's (and no stdin at all) */
  if (a->verb == TP_FV_RUN && !a->no_policy && tp__fast_policy_near())
    return 0;
  if (a->verb == TP_FV_EXEC && strlen(a->id) >= TP_FAST_ID_MAX)
    return 0;
  return 1;
}

/* TUPPER_CLIENT=c: the C client or nothing (what the tests prove with). */
static int tp__fast_refuse(int *code) {
  fputs("tupper: TUPPER_CLIENT=c: the C client does not take this command line (docs/cli.md)\n", stderr);
  *code = 125;
  return 1;
}

int tp_fast_main(int argc, char **argv, int *code) {
  const char *want = getenv("TUPPER_CLIENT");
  int only_c = want != NULL && strcmp(want, "c") == 0;
  tp_fargv_t a;
  tp__fast_t c;
  int ret;
  if (!tp_fast_mine(argc, argv, &a))
    return only_c ? tp__fast_refuse(code) : 0;
  memset(&c, 0, sizeof(c));
  c.a = &a;
  c.next_id = 1;
  c.ctl.fd = tp__fast_ctl(&c);
  c.tok = c.ctl.fd >= 0 ? malloc(sizeof(*c.tok) * TP_FAST_TOKENS) : NULL;
  if (c.tok == NULL) {
    if (c.ctl.fd >= 0)
      close(c.ctl.fd);
    return only_c ? tp__fast_refuse(code) : 0;
  }
  ret = tp__fast_talk(&c, code);
  tp__fast_settle(&c);
  for (int k = 0; k < c.nstash; k++)
    free(c.stash[k].line);
  tp_spump_free(c.dc);
  free(c.in_buf);
  close(c.ctl.fd);
  free(c.ctl.buf);
  free(c.tok);
  return ret == 0 && only_c ? tp__fast_refuse(code) : ret;
}
