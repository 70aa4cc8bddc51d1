/* The C client of the hot verbs (fast.h): the entry, which command lines
 * and environments it takes, and the conversation.  Its wire is the Lua
 * CLI's (lua/tupper/client/cli_verbs.lua run_streamed, run_in, M.run,
 * M.exec; lua/tupper/wire/client.lua and stream.lua), with the requests
 * that do not wait on each other written together: hello, stream.channel
 * with a token of its own and exec's process.start (or run's
 * sandbox.create) in one write, the data connection's attach with that
 * token at once, before any reply. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fast_int.h"

static int tp__fast_hello_ok(json_t *res) {
  int64_t s, ps;
  return tp_freply_int(json_object_get(res, "streams"), &s) == 0 && s == 1 &&
         tp_freply_int(json_object_get(res, "process_streams"), &ps) == 0 && ps == 1;
}

/* A token of our own for stream.channel: 32 lowercase hex digits. */
static int tp__fast_token(char *out, tp_error_t *err) {
  uint8_t b[16];
  size_t got = 0;
  while (got < sizeof(b)) {
    ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "getrandom");
    got += (size_t) n;
  }
  for (size_t i = 0; i < sizeof(b); i++)
    snprintf(out + 2 * i, 3, "%02x", b[i]);
  return 0;
}

/* The conversation; 1 handled (*code), 0 fall back.  Everything that does
 * not wait on an answer goes at once: hello, stream.channel with a token
 * of our own, exec's process.start (or run's sandbox.create) on the
 * control connection, and the data connection's attach with that token
 * (the daemon matches the two whichever it reads first, and a start that
 * asks for streams waits for the attach: docs/protocol.md). */
static int tp__fast_talk(tp__fast_t *c, int *code) {
  const tp_fargv_t *a = c->a;
  tp__fout_t w = { 0 };
  tp_error_t err;
  int64_t hello_id, channel_id, create_id = 0;
  json_t *res, *eobj;
  int r;
  char msg[4096], token[33], got[64];
  tp_error_clear(&err);
  if (tp__fast_token(token, &err) < 0)
    goto fail;
  hello_id = c->next_id;
  tp__fast_hello(c, &w);
  if (a->verb == TP_FV_RUN) {
    create_id = c->next_id;
    tp__fast_create(c, &w);
  }
  channel_id = c->next_id;
  tp__fast_channel(c, &w, token);
  if (a->verb == TP_FV_EXEC) {
    snprintf(c->id, sizeof(c->id), "%s", a->id);
    c->start_id = c->next_id;
    tp__fast_start(c, &w);
  }
  r = tp__fast_write(c->ctl.fd, &w, &err);
  tp__fout_free(&w);
  if (r < 0 || tp__fast_attach(c, token, &err) < 0 || tp__fast_reply(c, hello_id, &res, &eobj, &err) < 0)
    goto fail;
  if (res == NULL) {
    tp__fast_errmsg(eobj, msg, sizeof(msg));
    fprintf(stderr, "tupper: hello: %s\n", msg);
    *code = 125;
    return 1;
  }
  /* an older daemon: the Lua CLI's JSON path (a run's box goes with us);
   * our start asked for streams, which such a daemon refuses */
  if (!tp__fast_hello_ok(res))
    return 0;
  if (tp__fast_reply(c, channel_id, &res, &eobj, &err) < 0)
    goto fail;
  if (res == NULL || tp_freply_str(json_object_get(res, "token"), got, sizeof(got)) < 0 ||
      strcmp(got, token) != 0) {
    /* a daemon that takes no token of ours: its attach is refused, so a
     * start gets no data connection and fails; once it did, the Lua CLI's
     * old path (never a second start of a process that runs) */
    if (c->start_id == 0)
      return 0;
    if (tp__fast_reply(c, c->start_id, &res, &eobj, &err) < 0)
      goto fail;
    if (res == NULL)
      return 0;
    tp_error_set(&err, EPROTO, "the daemon started the process without its data connection");
    goto fail;
  }
  if (a->verb == TP_FV_RUN) {
    if (tp__fast_reply(c, create_id, &res, &eobj, &err) < 0)
      goto fail;
    if (res == NULL) {
      tp__fast_errmsg(eobj, msg, sizeof(msg));
      fprintf(stderr, "tupper: %s\n", msg);
      *code = 125;
      return 1;
    }
    if (tp_freply_str(json_object_get(res, "id"), c->id, sizeof(c->id)) <= 0) {
      tp_error_set(&err, EPROTO, "the daemon's reply to sandbox.create has no id");
      goto fail;
    }
    /* the start right away, whether the attach was answered or not */
    c->start_id = c->next_id;
    tp__fast_start(c, &w);
    r = tp__fast_write(c->ctl.fd, &w, &err);
    tp__fout_free(&w);
    if (r < 0)
      goto fail;
  }
  r = tp__fast_attached(c, &err);
  if (r == 1) {
    /* refused: the attach may have been read before the channel, by a
     * daemon with too many such attaches waiting already; the channel is
     * answered now and a refused token is still unused: once more */
    r = tp__fast_attach(c, token, &err) < 0 ? -1 : tp__fast_attached(c, &err);
  }
  if (r < 0)
    goto fail;
  if (r == 1) {
    /* the start is out: no fall back that would start it again */
    tp_error_set(&err, EPROTO, "the daemon refused the data connection");
    goto fail;
  }
  if (tp__fast_run_in(c, code, &err) < 0)
    goto fail;
  if (a->verb == TP_FV_RUN && !c->closed) {
    /* --rm: a notification, not a call (M.run): the daemon removes the box
     * on its own */
    tp__fout_add(&w, json_pack("{s:s, s:s, s:{s:s}}", "jsonrpc", "2.0", "method", "sandbox.kill", "params", "id",
                               c->id));
    (void) tp__fast_write(c->ctl.fd, &w, &err);
    tp__fout_free(&w);
  }
  return 1;
fail:
  fprintf(stderr, "tupper: %s\n", err.msg);
  *code = 125;
  return 1;
}

/* Whether s is UTF-8 as jansson takes it in a string. */
static int tp__fast_utf8(const char *s) {
  json_t *j = s ? json_string(s) : NULL;
  int ok = s == NULL || j != NULL;
  json_decref(j);
  return ok;
}

/* Whether every word sent as a JSON string is UTF-8: the Lua CLI sends
 * other bytes as they are (lua-cjson does not check), which jansson
 * refuses to write, so such a command line is the Lua CLI's. */
static int tp__fast_words_utf8(const tp_fargv_t *a) {
  const char *one[] = { a->id, a->workdir, a->image, a->memory, a->disk, a->cpus, a->pids, a->timeout };
  for (size_t k = 0; k < sizeof(one) / sizeof(one[0]); k++)
    if (!tp__fast_utf8(one[k]))
      return 0;
  for (int i = 0; i < a->ncmd; i++)
    if (!tp__fast_utf8(a->cmd[i]))
      return 0;
  for (int i = 0; i < a->nenv; i++)
    if (!tp__fast_utf8(a->env[i]))
      return 0;
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
  /* jansson's blocks from the client's arena from here on, these checks'
   * strings too (from malloc, each was a page mapped and unmapped) */
  tp_freply_init();
  return tp__fast_words_utf8(a);
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
  static char ctl_first[TP__FLINE_FIRST];
  if (!tp_fast_mine(argc, argv, &a))
    return only_c ? tp__fast_refuse(code) : 0;
  memset(&c, 0, sizeof(c));
  c.a = &a;
  c.next_id = 1;
  c.att.fd = -1;
  tp__fline_init(&c.ctl, tp__fast_ctl(&c), ctl_first);
  if (c.ctl.fd < 0)
    return only_c ? tp__fast_refuse(code) : 0;
  ret = tp__fast_talk(&c, code);
  tp__fast_settle(&c);
  for (int k = 0; k < c.nstash; k++)
    json_decref(c.stash[k].msg);
  tp__fast_att_free(&c);
  tp_spump_free(c.dc);
  free(c.in_buf);
  close(c.ctl.fd);
  tp__fline_free(&c.ctl);
  return ret == 0 && only_c ? tp__fast_refuse(code) : ret;
}
