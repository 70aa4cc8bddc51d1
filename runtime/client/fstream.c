/* The C client's data connection and loop (fast_int.h): the attach, the
 * process's streams through the pump, stdin, signals, the exit code, as
 * run_streamed in lua/tupper/client/cli_verbs.lua. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fast_int.h"
#include "utils.h"

/* ---------------------------------------------------------- the data plane */

/* Connects the data connection and sends stream.attach with token; its
 * reply is tp__fast_attached's to read.  0, or -1 on an error. */
int tp__fast_attach(tp__fast_t *c, const char *token, tp_error_t *err) {
  static char first[TP__FLINE_FIRST]; /* one attach reads at a time */
  tp__fout_t w = { 0 };
  int e = 0, r, fd;
  fd = tp__fast_connect(c->socket, &e);
  if (fd < 0)
    return tp_error_errno(err, e, "connect %s", c->socket);
  tp__fline_init(&c->att, fd, first);
  tp__fout_add(&w, json_pack("{s:s, s:i, s:s, s:{s:s, s:I}}", "jsonrpc", "2.0", "id", 1, "method",
                             "stream.attach", "params", "token", token, "window", (json_int_t) TP__FAST_WINDOW));
  r = tp__fast_write(c->att.fd, &w, err);
  tp__fout_free(&w);
  return r;
}

void tp__fast_att_free(tp__fast_t *c) {
  if (c->att.fd >= 0)
    close(c->att.fd);
  tp__fline_free(&c->att);
  c->att.fd = -1;
}

/* The attach's reply, and the data connection's pump.  0; 1 when the
 * daemon refused the attach (the Lua CLI then uses the old path); -1 on
 * an error. */
int tp__fast_attached(tp__fast_t *c, tp_error_t *err) {
  tp__fline_t *l = &c->att;
  int ret = -1;
  size_t len, used;
  char *line;
  /* the reply is the only JSON line: what follows its newline is frames */
  while ((line = tp__fline_take(l, &len, &used)) == NULL) {
    int r = tp__fline_fill(l, err);
    if (r < 0)
      goto out;
    if (r == 0) {
      ret = 1;
      goto out;
    }
    if (l->have > 65536) { /* stream.lua's bound on the attach reply */
      ret = 1;
      goto out;
    }
  }
  if (tp__fast_parse(c, line, len, err) < 0)
    goto out;
  if (!json_is_object(json_object_get(c->msg, "result"))) {
    ret = 1;
    goto out;
  }
  c->dc = tp_spump_new(l->fd, (const uint8_t *) l->buf + used, l->have - used, err);
  if (c->dc == NULL)
    goto out;
  l->fd = -1; /* the pump's now */
  ret = 0;
out:
  tp__fast_att_free(c);
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
  tp__fout_t w = { 0 };
  tp_error_t err;
  tp__fast_call(c, &w, "process.signal",
                json_pack("{s:s, s:I, s:s}", "sandbox", c->id, "pid", (json_int_t) c->pid, "signal", name));
  if (tp__fast_write(c->ctl.fd, &w, &err) < 0)
    c->closed = 1;
  tp__fout_free(&w);
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

/* process.start with streams, its streams to fd 1, 2 (and from 0), the
 * loop: the exit code in *code (run_streamed).  0, or -1: err, before
 * the process ran. */
int tp__fast_run_in(tp__fast_t *c, int *code, tp_error_t *err) {
  tp__fout_t w = { 0 };
  json_t *res, *eobj, *st;
  int r;
  int64_t v, start_id = c->start_id;
  if (start_id == 0) {
    start_id = c->next_id;
    tp__fast_start(c, &w);
    r = tp__fast_write(c->ctl.fd, &w, err);
    tp__fout_free(&w);
    if (r < 0)
      return -1;
  }
  if (tp__fast_reply(c, start_id, &res, &eobj, err) < 0)
    return -1;
  if (res == NULL) {
    /* start_failed: ENOENT 127, EACCES 126, else 125 */
    char msg[4096], ecode[16] = "";
    tp__fast_errmsg(eobj, msg, sizeof(msg));
    fprintf(stderr, "tupper: %s\n", msg);
    (void) tp_freply_str(json_object_get(json_object_get(eobj, "data"), "code"), ecode, sizeof(ecode));
    *code = strcmp(ecode, "ENOENT") == 0 ? 127 : strcmp(ecode, "EACCES") == 0 ? 126 : 125;
    return 0;
  }
  st = json_object_get(res, "streams");
  if (tp_freply_int(json_object_get(res, "pid"), &v) < 0 || v <= 0)
    return tp_error_set(err, EPROTO, "the daemon's reply to process.start has no pid");
  c->pid = v;
  for (int k = 0; k < 3; k++) {
    static const char *const names[] = { "stdout", "stderr", "stdin" };
    uint32_t *sid = k == 0 ? &c->sid_out : k == 1 ? &c->sid_err : &c->sid_in;
    if (k == 2 && !c->a->interactive)
      break;
    if (tp_freply_int(json_object_get(st, names[k]), &v) < 0 || v <= 0 ||
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
