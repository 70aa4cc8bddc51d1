/* The C client of the hot verbs (fast.h): the entry, which command lines
 * and environments it takes, and the conversation.  Its wire is the Lua
 * CLI's (lua/tupper/client/cli_verbs.lua run_streamed, run_in, M.run,
 * M.exec; lua/tupper/wire/client.lua and stream.lua), with the requests
 * that do not wait on each other written together: hello and
 * stream.channel (and run's sandbox.create) in one write, the data
 * connection's attach while a create is still running. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fast_int.h"

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
