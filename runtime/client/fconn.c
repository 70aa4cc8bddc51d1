/* The C client's control connection (fast_int.h): where the daemon is,
 * JSON lines in and out, the requests it writes and the replies and
 * notifications it reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fast_int.h"

/* --------------------------------------------------------------- places */

int tp__fast_connect(const char *path, int *err) {
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
int tp__fast_ctl(tp__fast_t *c) {
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
int tp__fast_policy_near(void) {
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

int tp__fast_send(int fd, const char *b, size_t n, tp_error_t *err) {
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
char *tp__fline_take(tp__fline_t *l, size_t *len, size_t *used) {
  char *nl = memchr(l->buf, '\n', l->have);
  if (nl == NULL)
    return NULL;
  *len = (size_t) (nl - l->buf);
  *used = *len + 1;
  return l->buf;
}

void tp__fline_drop(tp__fline_t *l, size_t used) {
  memmove(l->buf, l->buf + used, l->have - used);
  l->have -= used;
}

/* One read into l: 1 bytes came, 0 the end, -1 an error. */
int tp__fline_fill(tp__fline_t *l, tp_error_t *err) {
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
int tp__fast_parse(tp__fast_t *c, const char *line, size_t len, tp_error_t *err) {
  if (tp_fjson_parse(&c->msg, line, len, c->tok, TP_FAST_TOKENS, err) < 0)
    return tp_error_prefix(err, "the daemon sent a malformed message");
  if (!tp_fjson_is(&c->msg, 0, TP_FJ_OBJECT))
    return tp_error_set(err, EPROTO, "the daemon sent a message that is not an object");
  return 0;
}

/* ------------------------------------------------------------- requests */

int64_t tp__fast_begin(tp__fast_t *c, tp_fjson_buf_t *w, const char *method) {
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

void tp__fast_hello(tp__fast_t *c, tp_fjson_buf_t *w) {
  tp__fast_begin(c, w, "hello");
  tp_fjson_raw(w, "{\"protocol\":1,\"client\":\"tupper-lua\"}}\n");
}

void tp__fast_channel(tp__fast_t *c, tp_fjson_buf_t *w) {
  tp__fast_begin(c, w, "stream.channel");
  tp_fjson_raw(w, "{}}\n");
}

/* run's sandbox.create: what M.run sends with no limits, policy or recipe. */
void tp__fast_create(tp__fast_t *c, tp_fjson_buf_t *w) {
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

void tp__fast_start(tp__fast_t *c, tp_fjson_buf_t *w) {
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

int tp__fast_write(tp__fast_t *c, tp_fjson_buf_t *w, tp_error_t *err) {
  if (w->failed)
    return tp_error_set(err, E2BIG, "the request is too big");
  return tp__fast_send(c->ctl.fd, w->b, w->len, err);
}

/* ---------------------------------------------------------------- replies */

/* Reads messages until the reply to id (in c->msg: its result token in
 * *res, or its error token in *eobj).  A process.exit seen meanwhile is
 * kept.  0, or -1 (err: the connection ended, or a bad message). */

/* Lets go of the line c->msg points into. */
void tp__fast_settle(tp__fast_t *c) {
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

int tp__fast_reply(tp__fast_t *c, int64_t id, int *res, int *eobj, tp_error_t *err) {
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
void tp__fast_errmsg(tp__fast_t *c, int eobj, char *buf, size_t cap) {
  int m = tp_fjson_get(&c->msg, eobj, "message");
  if (tp_fjson_str(&c->msg, m, buf, cap) < 0)
    snprintf(buf, cap, "%s", tp_fjson_is(&c->msg, m, TP_FJ_STRING) ? "(a message too long)" : "nil");
}

/* A notification of the control connection: the process's exit is ours
 * when it names our sandbox and pid (run_streamed's process.exit). */
void tp__fast_note(tp__fast_t *c) {
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
