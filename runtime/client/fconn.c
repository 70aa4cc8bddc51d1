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

/* A reader of fd whose first TP__FLINE_FIRST bytes are first's (in .bss:
 * a buffer from malloc is a mapping of its own at that size, made and
 * unmapped once a command, each a page-table change that a virtualised
 * host pays dearly for). */
void tp__fline_init(tp__fline_t *l, int fd, char *first) {
  memset(l, 0, sizeof(*l));
  l->fd = fd;
  l->buf = first;
  l->cap = first != NULL ? TP__FLINE_FIRST : 0;
}

void tp__fline_free(tp__fline_t *l) {
  if (l->owned)
    free(l->buf);
  l->buf = NULL;
  l->have = l->cap = 0;
  l->owned = 0;
}

/* One read into l: 1 bytes came, 0 the end, -1 an error. */
int tp__fline_fill(tp__fline_t *l, tp_error_t *err) {
  ssize_t r;
  if (l->have == l->cap) {
    size_t ncap = l->cap ? l->cap * 2 : TP__FLINE_FIRST;
    char *nb;
    if (l->cap >= TP_FAST_LINE_MAX)
      return tp_error_set(err, EMSGSIZE, "a message of the daemon is longer than %d bytes",
                          TP_FAST_LINE_MAX);
    if (ncap > TP_FAST_LINE_MAX)
      ncap = TP_FAST_LINE_MAX;
    nb = l->owned ? realloc(l->buf, ncap) : malloc(ncap);
    if (nb == NULL)
      return tp_error_set(err, ENOMEM, "out of memory");
    if (!l->owned && l->have > 0)
      memcpy(nb, l->buf, l->have);
    l->buf = nb;
    l->cap = ncap;
    l->owned = 1;
  }
  do
    r = read(l->fd, l->buf + l->have, l->cap - l->have);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return tp_error_errno(err, errno, "read from the daemon");
  l->have += (size_t) r;
  return r > 0;
}

/* Parses a line into c->msg (the last one let go); it must be a JSON
 * object. */
int tp__fast_parse(tp__fast_t *c, const char *line, size_t len, tp_error_t *err) {
  json_decref(c->msg);
  c->msg = tp_freply_parse(line, len, err);
  if (c->msg == NULL)
    return tp_error_prefix(err, "the daemon sent a malformed message");
  if (!json_is_object(c->msg))
    return tp_error_set(err, EPROTO, "the daemon sent a message that is not an object");
  return 0;
}

/* ------------------------------------------------------------- requests */

/* The requests' first bytes (tp__fout_t), and whether a tp__fout_t
 * holds them: the client is single-threaded. */
#define TP__FOUT_BSS 8192
static char tp__fout_bss[TP__FOUT_BSS];
static int tp__fout_bss_taken;

/* o's buffer with room for need bytes, or NULL (o unchanged). */
static char *tp__fout_room(tp__fout_t *o, size_t need) {
  char *nb;
  if (o->b == NULL && !tp__fout_bss_taken && need <= TP__FOUT_BSS) {
    tp__fout_bss_taken = 1;
    o->in_bss = 1;
    return tp__fout_bss;
  }
  if (o->in_bss) {
    if (need <= TP__FOUT_BSS)
      return o->b;
    if ((nb = malloc(need)) == NULL)
      return NULL;
    memcpy(nb, o->b, o->len);
    tp__fout_bss_taken = 0;
    o->in_bss = 0;
    return nb;
  }
  return realloc(o->b, need);
}

/* Appends msg (taken; NULL: a pack that failed) as one line. */
void tp__fout_add(tp__fout_t *o, json_t *msg) {
  size_t n = msg ? json_dumpb(msg, NULL, 0, JSON_COMPACT | JSON_REAL_PRECISION(14)) : 0;
  char *nb;
  if (o->failed || n == 0 || n > TP__FAST_REQ_MAX - o->len - 1 ||
      (nb = tp__fout_room(o, o->len + n + 1)) == NULL) {
    o->failed = 1;
    json_decref(msg);
    return;
  }
  o->b = nb;
  o->len += json_dumpb(msg, o->b + o->len, n, JSON_COMPACT | JSON_REAL_PRECISION(14));
  o->b[o->len++] = '\n';
  json_decref(msg);
}

void tp__fout_free(tp__fout_t *o) {
  if (o->in_bss)
    tp__fout_bss_taken = 0;
  else
    free(o->b);
  memset(o, 0, sizeof(*o));
}

/* A call of method with params (taken; NULL, a params object that could
 * not be made, fails the request): its id. */
int64_t tp__fast_call(tp__fast_t *c, tp__fout_t *o, const char *method, json_t *params) {
  int64_t id = c->next_id++;
  tp__fout_add(o, json_pack("{s:s, s:I, s:s, s:o}", "jsonrpc", "2.0", "id", (json_int_t) id, "method", method,
                            "params", params));
  return id;
}

/* The env object of -e K=V (a key's last value; in the order first given:
 * jansson keeps a key where it was first set).  NULL when jansson refuses
 * a string (tp_fast_mine leaves invalid UTF-8 to the Lua CLI). */
static json_t *tp__fast_env_obj(const tp_fargv_t *a) {
  json_t *o = json_object();
  for (int i = 0; o != NULL && i < a->nenv; i++) {
    size_t kl = tp_fargv_key_len(a->env[i]);
    if (json_object_setn_new(o, a->env[i], kl, json_string(a->env[i] + kl + 1)) < 0) {
      json_decref(o);
      o = NULL;
    }
  }
  return o;
}

void tp__fast_hello(tp__fast_t *c, tp__fout_t *o) {
  tp__fast_call(c, o, "hello", json_pack("{s:i, s:s}", "protocol", 1, "client", "tupper-c"));
}

void tp__fast_channel(tp__fast_t *c, tp__fout_t *o, const char *token) {
  tp__fast_call(c, o, "stream.channel", json_pack("{s:s}", "token", token));
}

/* run's sandbox.create: what M.run sends with no limits, policy or recipe. */
void tp__fast_create(tp__fast_t *c, tp__fout_t *o) {
  const tp_fargv_t *a = c->a;
  json_t *p = json_pack("{s:b}", "kill_on_disconnect", 1);
  json_t *lim = json_object();
  int bad = p == NULL || lim == NULL;
  if (a->image)
    bad |= json_object_set_new(p, "image", json_string(a->image)) < 0;
  if (a->nenv > 0)
    bad |= json_object_set_new(p, "env", tp__fast_env_obj(a)) < 0;
  /* the limits as given (cli_args.lua: tonumber for cpus and pids); no
   * --timeout: 0, a run box lives as long as its command (no policy here
   * to cap it) */
  if (a->memory)
    bad |= json_object_set_new(lim, "memory", json_string(a->memory)) < 0;
  if (a->disk)
    bad |= json_object_set_new(lim, "disk", json_string(a->disk)) < 0;
  if (a->cpus) {
    double v = strtod(a->cpus, NULL); /* fargv: at most 4 digits, a fraction of 6 */
    bad |= json_object_set_new(lim, "cpus", v == (double) (json_int_t) v ? json_integer((json_int_t) v)
                                                                         : json_real(v)) < 0;
  }
  if (a->pids)
    bad |= json_object_set_new(lim, "pids", json_integer(strtoll(a->pids, NULL, 10))) < 0;
  if (a->timeout && strspn(a->timeout, "0123456789") == strlen(a->timeout))
    bad |= json_object_set_new(lim, "timeout", json_integer(strtoll(a->timeout, NULL, 10))) < 0; /* seconds */
  else
    bad |= json_object_set_new(lim, "timeout", a->timeout ? json_string(a->timeout) : json_integer(0)) < 0;
  bad |= json_object_set_new(p, "limits", lim) < 0;
  if (bad) {
    json_decref(p);
    p = NULL;
  }
  tp__fast_call(c, o, "sandbox.create", p);
}

void tp__fast_start(tp__fast_t *c, tp__fout_t *o) {
  const tp_fargv_t *a = c->a;
  json_t *argv = json_array();
  for (int i = 0; argv != NULL && i < a->ncmd; i++)
    if (json_array_append_new(argv, json_string(a->cmd[i])) < 0) {
      json_decref(argv);
      argv = NULL;
    }
  tp__fast_call(c, o, "process.start",
                json_pack("{s:s, s:o, s:o, s:s*, s:b, s:b}", "sandbox", c->id, "argv", argv, "env", tp__fast_env_obj(a),
                          "cwd", a->workdir, "stdin", a->interactive, "streams", 1));
}

int tp__fast_write(int fd, tp__fout_t *o, tp_error_t *err) {
  if (o->failed)
    return tp_error_set(err, E2BIG, "the request is too big, or not UTF-8");
  return tp__fast_send(fd, o->b, o->len, err);
}

/* ---------------------------------------------------------------- replies */

/* Lets go of the last message. */
void tp__fast_settle(tp__fast_t *c) {
  json_decref(c->msg);
  c->msg = NULL;
}

/* A reply in c->msg: its result in *res, or its error in *eobj. */
static int tp__fast_answer(tp__fast_t *c, json_t **res, json_t **eobj, tp_error_t *err) {
  *res = json_object_get(c->msg, "result");
  *eobj = json_object_get(c->msg, "error");
  if (*res == NULL && !json_is_object(*eobj))
    return tp_error_set(err, EPROTO, "the daemon's reply has neither a result nor an error");
  return 0;
}

/* Reads messages until the reply to id (in c->msg, valid until the next
 * call: its result in *res, or its error in *eobj).  A process.exit seen
 * meanwhile is kept.  0, or -1 (err: the connection ended, or a bad
 * message). */
int tp__fast_reply(tp__fast_t *c, int64_t id, json_t **res, json_t **eobj, tp_error_t *err) {
  tp__fast_settle(c);
  for (int k = 0; k < c->nstash; k++) {
    if (c->stash[k].id != id)
      continue;
    c->msg = c->stash[k].msg;
    c->stash[k] = c->stash[--c->nstash];
    return tp__fast_answer(c, res, eobj, err);
  }
  for (;;) {
    size_t len, used;
    char *line;
    json_t *t;
    int64_t got;
    int r;
    while ((line = tp__fline_take(&c->ctl, &len, &used)) == NULL) {
      r = tp__fline_fill(&c->ctl, err);
      if (r < 0)
        return -1;
      if (r == 0)
        return tp_error_set(err, ECONNRESET, "connection to the daemon lost");
    }
    r = len == 0 ? 1 : tp__fast_parse(c, line, len, err);
    tp__fline_drop(&c->ctl, used); /* jansson holds its own copy */
    if (r < 0)
      return -1;
    if (r == 1)
      continue;
    t = json_object_get(c->msg, "id");
    if (t == NULL || json_is_null(t)) {
      tp__fast_note(c);
    } else if (tp_freply_int(t, &got) == 0 && got == id) {
      return tp__fast_answer(c, res, eobj, err);
    } else if (tp_freply_int(t, &got) == 0 && got > 0 && got < c->next_id &&
               c->nstash < (int) (sizeof(c->stash) / sizeof(c->stash[0]))) {
      c->stash[c->nstash].id = got;
      c->stash[c->nstash++].msg = c->msg;
      c->msg = NULL;
    }
  }
}

/* An error object's message ("tostring(e.message)" of the Lua CLI). */
void tp__fast_errmsg(json_t *eobj, char *buf, size_t cap) {
  json_t *m = json_object_get(eobj, "message");
  if (tp_freply_str(m, buf, cap) < 0)
    snprintf(buf, cap, "%s", json_is_string(m) ? "(a message too long)" : "nil");
}

/* A notification of the control connection: the process's exit is ours
 * when it names our sandbox and pid (run_streamed's process.exit). */
void tp__fast_note(tp__fast_t *c) {
  json_t *p = json_object_get(c->msg, "params");
  char name[32], sb[TP_FAST_ID_MAX];
  int64_t pid, v;
  if (c->pid <= 0 || tp_freply_str(json_object_get(c->msg, "method"), name, sizeof(name)) < 0 ||
      strcmp(name, "process.exit") != 0)
    return;
  if (tp_freply_str(json_object_get(p, "sandbox"), sb, sizeof(sb)) < 0 || strcmp(sb, c->id) != 0 ||
      tp_freply_int(json_object_get(p, "pid"), &pid) < 0 || pid != c->pid)
    return;
  c->exited = 1;
  /* exit_code (cli_verbs.lua): an OOM kill is said; a signal is 128+N;
   * else the exit code, or 125 when there is none */
  if (json_is_true(json_object_get(p, "oom_killed")))
    fputs("tupper: the command was killed: out of memory (the sandbox's memory limit)\n", stderr);
  if (tp_freply_int(json_object_get(p, "signal"), &v) == 0 && v > 0)
    c->exit_code = (int) ((128 + v) & 0xff);
  else if (tp_freply_int(json_object_get(p, "exit_code"), &v) == 0)
    c->exit_code = (int) (v & 0xff);
  else
    c->exit_code = 125;
}
