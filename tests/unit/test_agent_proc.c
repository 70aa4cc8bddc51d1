/* Drives the real tupper-agent (env TUPPER_AGENT) as an ordinary process over
 * a socketpair, playing the host (agent_client.h): READY, processes, their
 * stdin, signals and process groups, terminals, the privileges a child
 * drops, held exec and release, PS, and the channel closing.  The test is a
 * child subreaper, so whatever the agent leaves behind comes to us; at the
 * end it checks that nothing is left running.  It must run as root (the
 * agent switches uid/gid and drops capabilities it must first have).  The
 * other test_agent_* executables drive the same agent's files, watches,
 * protocol errors, and detaching. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
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
#include "agent_client.h"

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
  check((h->ready_flags & TP_F_READY_EXEC_USER) != 0, "READY says the agent takes USER in EXEC");
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

/* Quick processes: one that has exited by the time its start is answered
 * has its output and EXIT in the OK's write (agent.c's dispatch), the EXIT
 * still after all its output, and nothing of it before the OK (the client
 * counts any such frame as stray). */
static void test_exec_quick(host_t *h) {
  const char *sh[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 5", NULL};
  int good = 0, early = 0;
  for (int i = 0; i < 16; i++) {
    int64_t pid = run(h, sh, NULL, NULL, 0);
    tproc_t *p = pid > 0 ? tproc_get(h, pid) : NULL;
    if (p != NULL && p->exited)
      early++; /* came with the OK, or in the same read */
    p = pid > 0 ? wait_exit(h, pid) : NULL;
    if (p != NULL && out_is(p, 1, "out\n") && out_is(p, 2, "err\n") && p->code == 5)
      good++;
  }
  check(good == 16, "16 quick processes: all output before EXIT, code 5 (%d)", good);
  diag("%d of 16 had exited when their OK was read", early);
}

/* EXEC with USER: the agent looks the name up in the files of its root (here
 * the host's; agent_acct.c and test_agent_acct.c for hostile ones). */
static msg_t *exec_user(host_t *h, const char *const *argv, const char *const *env, const char *cwd,
                        const char *user, int64_t uid) {
  tp_buf_t *b = exec_begin(h, argv, env, cwd);
  tp_frame_add_str(b, TP_TAG_USER, user);
  if (uid != NO_ID)
    tp_frame_add_int(b, TP_TAG_UID, uid);
  return req_call(h);
}

static void test_exec_user(host_t *h, const char *tmp) {
  const char *ids[] = {"/bin/sh", "-c", "echo $(id -u) $(id -g) $HOME $USER $LOGNAME $(pwd)", NULL};
  const char *env[] = {"HOME=/given", NULL};
  struct passwd *pw = getpwnam("daemon");
  char want[PATH_MAX + 64];
  const tp_field_t *cwd;
  msg_t *m;
  tproc_t *p;
  int64_t pid;

  m = exec_user(h, ids, NULL, NULL, "root", NO_ID);
  pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  cwd = msg_is_ok(m) ? msg_get(m, TP_TAG_CWD) : NULL;
  check(pid > 0 && msg_int(m, TP_TAG_UID, -1) == 0 && cwd != NULL && cwd->len == 5 && memcmp(cwd->val, "/root", 5) == 0,
        "USER root -> OK with PID, UID 0 and CWD /root");
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "0 0 /root root root /root\n"), "root runs in /root with HOME, USER and LOGNAME");

  m = exec_user(h, ids, env, tmp, "root", NO_ID);
  pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  snprintf(want, sizeof(want), "0 0 /given root root %s\n", tmp);
  check(p != NULL && out_is(p, 1, want), "ENV's HOME and CWD win over the account's");

  if (pw != NULL && pw->pw_uid > 0 && pw->pw_uid <= TP_ID_MAX && pw->pw_gid <= TP_ID_MAX) {
    m = exec_user(h, ids, NULL, "/", "daemon", NO_ID);
    pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
    msg_free(m);
    p = pid > 0 ? wait_exit(h, pid) : NULL;
    snprintf(want, sizeof(want), "%u %u %s daemon daemon /\n", (unsigned) pw->pw_uid, (unsigned) pw->pw_gid,
             pw->pw_dir);
    check(p != NULL && out_is(p, 1, want), "USER daemon runs as its uid and gid (%s)", want);
  } else {
    check(1, "# SKIP no account daemon here");
  }

  m = exec_user(h, ids, NULL, NULL, "no-such-user-here", NO_ID);
  check(msg_errno(m) == ENOENT && msg_has_text(m, "user 'no-such-user-here' is not in the box's /etc/passwd"),
        "an unknown USER -> ERR ENOENT, the daemon's message");
  msg_free(m);
  m = exec_user(h, ids, NULL, NULL, "root", 0);
  check(msg_errno(m) == EINVAL, "USER with UID -> ERR EINVAL");
  msg_free(m);
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
  /* TP_F_EXIT_OOM is a microVM guest's word; the host counts a linux box's kills */
  check(p != NULL && p->flags == 0, "a linux box's agent marks no EXIT as OOM-killed (no FLAGS)");
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

/* ---- flow-controlled output (TP_F_EXEC_CREDIT) ------------------------------------------ */

static msg_t *ack_req(host_t *h, int64_t pid, int64_t stream, int64_t size) {
  tp_buf_t *b = req_begin(h, TP_MSG_OUTPUT_ACK);
  tp_frame_add_int(b, TP_TAG_PID, pid);
  tp_frame_add_int(b, TP_TAG_STREAM, stream);
  tp_frame_add_int(b, TP_TAG_SIZE, size);
  return req_call(h);
}

/* Pumps for ms (no deadline error: it is the quiet that is measured). */
static void pump_for(host_t *h, int ms) {
  long long end = now_ms() + ms;
  while (now_ms() < end)
    pump(h, end);
}

static void test_credit(host_t *h) {
  const char *big[] = {"/bin/sh", "-c", "head -c 8000000 /dev/zero; echo fin >&2", NULL};
  const char *cat[] = {"/bin/cat", NULL};
  const char *plain[] = {"/bin/sleep", "100", NULL};
  uint8_t *in = calloc(1, 300 * 1024);
  size_t acked = 0;
  int bad_acks = 0;
  long long deadline;
  int64_t pid = run(h, big, NULL, NULL, TP_F_EXEC_CREDIT), other;
  tproc_t *p = tproc_get(h, pid);

  check(pid > 0 && p != NULL, "exec with FLAGS CREDIT");
  if (p == NULL)
    return;
  pump_for(h, 300);
  check(p->out[1].len == TP_OUT_WINDOW, "no more than the window before an ack (%zu bytes)", p->out[1].len);
  check(!p->exited, "the writer waits for credit");
  expect_err(ack_req(h, pid, 1, TP_OUT_WINDOW + 1), EINVAL, "OUTPUT_ACK beyond the window");
  expect_err(ack_req(h, pid, 3, 1), EINVAL, "OUTPUT_ACK of an unknown stream");
  expect_err(ack_req(h, pid, 1, 0), EINVAL, "OUTPUT_ACK of 0 bytes");
  deadline = now_ms() + TIMEOUT_MS;
  while (!p->exited && now_ms() < deadline) {
    if (p->out[1].len > acked) {
      size_t n = p->out[1].len - acked; /* more may come while the reply is awaited */
      msg_t *m = ack_req(h, pid, 1, (int64_t) n);
      /* the last one may cross the exit (ESRCH) */
      bad_acks += !msg_is_ok(m) && !(p->exited && msg_errno(m) == ESRCH);
      msg_free(m);
      acked += n;
    } else {
      pump(h, now_ms() + 50);
    }
  }
  check(bad_acks == 0, "every OUTPUT_ACK within the window -> OK");
  check(p->exited && p->code == 0, "it ends once acked");
  check(p->out[1].len == 8000000 && out_is(p, 2, "fin\n"), "every byte came (%zu), stderr too", p->out[1].len);
  expect_err(ack_req(h, pid, 1, 1), ESRCH, "OUTPUT_ACK to a reaped pid");

  other = run(h, plain, NULL, NULL, 0);
  expect_err(ack_req(h, other, 1, 1), EINVAL, "OUTPUT_ACK to a process without CREDIT");
  expect_ok(pid_req(h, TP_MSG_SIGNAL, other, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9");
  wait_exit(h, other);

  /* stdin: STDIN_ACK counts what the pipe took */
  pid = run(h, cat, NULL, NULL, TP_F_EXEC_CREDIT | TP_F_EXEC_STDIN);
  p = tproc_get(h, pid);
  for (int i = 0; i < 3 && p != NULL; i++) {
    msg_t *m = stdin_req(h, pid, in + i * 102400, 102400);
    msg_free(m);
    /* cat's output comes within the credit: ack it as it comes */
    deadline = now_ms() + TIMEOUT_MS;
    while (p->out[1].len < (size_t) (i + 1) * 102400 && pump(h, deadline) == 0)
      ;
    expect_ok(ack_req(h, pid, 1, 102400), "OUTPUT_ACK of cat's echo");
  }
  expect_ok(pid_req(h, TP_MSG_STDIN_CLOSE, pid, 0, 0), "STDIN_CLOSE");
  p = p ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == 0 && p->out[1].len == 3 * 102400, "cat echoed its stdin");
  check(p != NULL && p->stdin_acked == 3 * 102400, "STDIN_ACK told every byte the pipe took (%lld)",
        p ? (long long) p->stdin_acked : -1);
  free(in);
}

/* A full pipe goes out in large frames, spliced onto the channel after
 * their head: the bytes arrive exact and in order (a pattern, not zeros);
 * a writer of small pieces makes about one frame a millisecond, not one a
 * write (AGENT_REST_US). */
static void test_output_frames(host_t *h) {
  const char *seq[] = {"/usr/bin/seq", "1", "1000000", NULL};
  const char *dd[] = {"/bin/dd", "if=/dev/zero", "bs=512", "count=8000", "status=none", NULL};
  tp_buf_t want;
  size_t acked = 0;
  long long t0, deadline;
  int64_t pid = run(h, seq, NULL, NULL, TP_F_EXEC_CREDIT);
  tproc_t *p = tproc_get(h, pid);
  char line[16];

  check(pid > 0 && p != NULL, "exec seq with FLAGS CREDIT");
  if (p == NULL)
    return;
  tp_buf_init(&want);
  for (int i = 1; i <= 1000000; i++)
    tp_buf_append(&want, line, (size_t) snprintf(line, sizeof(line), "%d\n", i));
  pump_for(h, 300); /* the window goes, then the pipe fills */
  deadline = now_ms() + TIMEOUT_MS;
  while (!p->exited && now_ms() < deadline) {
    if (p->out[1].len > acked) {
      size_t n = p->out[1].len - acked;
      msg_free(ack_req(h, pid, 1, (int64_t) n));
      acked += n;
    } else {
      pump(h, now_ms() + 50);
    }
  }
  check(p->exited && p->code == 0, "seq ends once acked");
  check(p->out[1].len == want.len && memcmp(p->out[1].data, want.data, want.len) == 0,
        "every byte of seq came, in order (%zu of %zu)", p->out[1].len, want.len);
  check(p->max_frame[1] >= 64 * 1024, "a full pipe went in large frames (the largest %zu bytes)",
        p->max_frame[1]);
  tp_buf_free(&want);

  t0 = now_ms();
  pid = run(h, dd, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  /* a frame a millisecond at most, plus one per 64 KiB the pipe gathered
   * meanwhile (each of dd's 8000 writes was a frame before) */
  check(p != NULL && p->code == 0 && p->out[1].len == 8000 * 512, "dd's 8000 writes of 512 bytes came");
  check(p != NULL && p->frames[1] <= (now_ms() - t0) + 8000 * 512 / 65536 + 10,
        "small writes gathered: %d frames in %lld ms", p ? p->frames[1] : -1, now_ms() - t0);
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

/* ---- privileges, held exec, PS -------------------------------------------------------- */

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
  char path[64], agent_oom[32], want[32], agent_status[4096];
  int64_t pid;
  tproc_t *p;
  msg_t *m;

  snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int) h->agent);
  snprintf(want, sizeof(want), "%s\n", agent_test_oom);
  slurp(path, agent_oom, sizeof(agent_oom));
  check(strcmp(agent_oom, want) == 0, "the agent runs with oom_score_adj %s", agent_test_oom);
  pid = run(h, oom, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "0\n"), "the child's oom_score_adj is 0 (agent at %s)", agent_test_oom);
  slurp(path, agent_oom, sizeof(agent_oom));
  check(strcmp(agent_oom, want) == 0, "the agent keeps its oom_score_adj %s", agent_test_oom);

  pid = run(h, status, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && field_is((char *) p->out[1].data, p->out[1].len, "Uid", "0\t0\t0\t0") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Gid", "0\t0\t0\t0") &&
            field_is((char *) p->out[1].data, p->out[1].len, "Groups", "0"),
        "without UID/GID the child is uid 0, gid 0, groups {0}");
  check(p != NULL && caps_all_dropped((char *) p->out[1].data, p->out[1].len),
        "as uid 0: CapInh/Prm/Eff/Bnd/Amb all 0, NoNewPrivs 1");
  snprintf(path, sizeof(path), "/proc/%d/status", (int) h->agent);
  slurp(path, agent_status, sizeof(agent_status));
  /* SIGHUP (1) inherited, SIGPIPE (13) the agent's own: both ignored there
   * (and whatever else its parent ignored: make hands down glibc's own 32
   * and 33 ignored, which the child below must reset too) */
  {
    char v[64];
    unsigned long long ign = 0;
    check(status_field(agent_status, strlen(agent_status), "SigIgn", v, sizeof(v)) == 0 &&
              sscanf(v, "%llx", &ign) == 1 && (ign & 0x1001ULL) == 0x1001ULL,
          "the agent ignores SIGHUP (inherited) and SIGPIPE");
  }
  check(p != NULL && field_is((char *) p->out[1].data, p->out[1].len, "SigIgn", "0000000000000000") &&
            field_is((char *) p->out[1].data, p->out[1].len, "SigCgt", "0000000000000000") &&
            field_is((char *) p->out[1].data, p->out[1].len, "SigBlk", "0000000000000000"),
        "the child execs with every signal at SIG_DFL and none blocked");

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

/* The agent's oom_score_adj raised while it runs (by the host): its next
 * child is forked again, and both keep their own value. */
static void test_oom_raised(host_t *h) {
  const char *oom[] = {"/bin/cat", "/proc/self/oom_score_adj", NULL};
  char path[64], v[32];
  int64_t pid;
  tproc_t *p;
  int fd;

  snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int) h->agent);
  fd = open(path, O_WRONLY | O_CLOEXEC);
  check(fd >= 0 && write(fd, "500", 3) == 3, "raise the running agent's oom_score_adj to 500");
  if (fd >= 0)
    close(fd);
  pid = run(h, oom, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "0\n"), "its next child's oom_score_adj is reset to 0");
  slurp(path, v, sizeof(v));
  check(strcmp(v, "500\n") == 0, "the agent keeps 500 (%s)", v);
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

/* ---- FLAGS TREE: a cgroup the host made ahead, its fds with the EXEC ---------------- */

/* Sends the request being built with fds attached to its first byte (as
 * the daemon's tp_dbox_send_tree does) and waits for its reply. */
static msg_t *req_call_fds(host_t *h, const int *fds, int n) {
  union {
    struct cmsghdr hd;
    char buf[CMSG_SPACE(sizeof(int) * 8)];
  } cm;
  struct iovec iov;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (tp_frame_end(&h->req) < 0)
    return NULL;
  iov = (struct iovec){.iov_base = h->req.data, .iov_len = h->req.len};
  if (n > 0) {
    struct cmsghdr *c;
    memset(cm.buf, 0, sizeof(cm.buf));
    mh.msg_control = cm.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t) n);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t) n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t) n);
  }
  if (sendmsg(h->fd, &mh, MSG_NOSIGNAL) != (ssize_t) h->req.len)
    return NULL;
  return wait_reply(h, h->cur_id);
}

static msg_t *exec_tree(host_t *h, const char *const *argv, int flags, const int *fds, int n) {
  tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
  for (; *argv; argv++)
    tp_frame_add_str(b, TP_TAG_ARG, *argv);
  tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  return req_call_fds(h, fds, n);
}

/* In a cgroup dir of hierarchy mnt (v1 or v2): the child is there before it
 * runs anything, and so is what it forks. */
static void tree_in(host_t *h, const char *mnt, const char *label) {
  const char *cat[] = {"/bin/cat", "/proc/self/cgroup", NULL};
  const char *bg[] = {"/bin/sh", "-c", "sleep 100 & echo $!", NULL};
  char dir[PATH_MAX], procs[PATH_MAX + 16], want[128], list[4096];
  long long deadline;
  int fd, gpid, listed = 0;
  tproc_t *p;
  msg_t *m;
  int64_t pid;

  snprintf(dir, sizeof(dir), "%s/tupper-agent-test-%d", mnt, (int) getpid());
  snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
  if (mkdir(dir, 0755) < 0 || (fd = open(procs, O_WRONLY | O_CLOEXEC)) < 0) {
    check(0, "%s: make a cgroup at %s: %s", label, dir, strerror(errno));
    rmdir(dir);
    return;
  }
  snprintf(want, sizeof(want), ":/tupper-agent-test-%d\n", (int) getpid());
  m = exec_tree(h, cat, TP_F_EXEC_TREE, &fd, 1);
  pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  check(p != NULL && p->code == 0 && out_has(p, 1, want),
        "%s: EXEC TREE -> the program runs in the cgroup whose fd came with it", label);
  m = exec_tree(h, bg, TP_F_EXEC_TREE, &fd, 1);
  pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
  msg_free(m);
  p = pid > 0 ? wait_exit(h, pid) : NULL;
  gpid = p != NULL ? atoi((const char *) p->out[1].data) : 0;
  deadline = now_ms() + TIMEOUT_MS;
  while (gpid > 0 && !listed && now_ms() < deadline) {
    ssize_t n = slurp(procs, list, sizeof(list));
    char needle[32];
    snprintf(needle, sizeof(needle), "%d\n", gpid);
    listed = n > 0 && (strncmp(list, needle, strlen(needle)) == 0 || strstr(list, needle) != NULL);
    if (!listed)
      poll(NULL, 0, 5);
  }
  check(listed, "%s: its background child (%d) is in that cgroup too", label, gpid);
  if (gpid > 0)
    kill(gpid, SIGKILL);
  close(fd);
  deadline = now_ms() + TIMEOUT_MS;
  while (rmdir(dir) < 0 && errno == EBUSY && now_ms() < deadline)
    poll(NULL, 0, 5);
  check(access(dir, F_OK) < 0, "%s: the cgroup is removed", label);
}

static void test_tree(host_t *h, const char *tmp) {
  const char *tr[] = {"/bin/true", NULL};
  char mnt[PATH_MAX];
  struct stat sb;
  int fd, nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
  msg_t *m;

  if (stat("/sys/fs/cgroup/pids/cgroup.procs", &sb) == 0)
    tree_in(h, "/sys/fs/cgroup/pids", "cgroup v1 (pids)");
  join(mnt, tmp, "/cg2");
  if (mkdir(mnt, 0700) == 0 && mount("cgroup2", mnt, "cgroup2", 0, NULL) == 0) {
    tree_in(h, mnt, "cgroup v2 (a private cgroup2 mount)");
    umount2(mnt, MNT_DETACH);
  } else {
    printf("# no cgroup2 mount here (%s): v2 not tried\n", strerror(errno));
  }
  rmdir(mnt);

  /* Denials: the fds must be a cgroup file open for writing, and come with
   * the EXEC itself. */
  expect_err(exec_tree(h, tr, TP_F_EXEC_TREE, NULL, 0), EBADF, "EXEC TREE without fds");
  expect_err(exec_tree(h, tr, TP_F_EXEC_TREE, &nul, 1), EBADF, "EXEC TREE with /dev/null's fd");
  fd = open("/sys/fs/cgroup/pids/cgroup.procs", O_RDONLY | O_CLOEXEC);
  if (fd >= 0)
    expect_err(exec_tree(h, tr, TP_F_EXEC_TREE, &fd, 1), EBADF, "EXEC TREE with a read-only fd");
  expect_err(exec_tree(h, tr, TP_F_EXEC_TREE | TP_F_EXEC_HOLD, &nul, 1), EINVAL, "EXEC TREE|HOLD");
  expect_err(exec_tree(h, tr, TP_F_EXEC_TREE, NULL, 0), EBADF,
             "the next EXEC TREE does not get the fds of the one before");
  req_begin(h, TP_MSG_PS);
  m = req_call_fds(h, &nul, 1);
  check(msg_is_ok(m), "PS with an fd attached -> OK (the fd is not used)");
  msg_free(m);
  expect_err(exec_tree(h, tr, TP_F_EXEC_TREE, NULL, 0), EBADF,
             "an EXEC TREE after it does not get the fd that came with PS");
  if (fd >= 0)
    close(fd);
  close(nul);
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

int main(void) {
  const char *leftover[] = {"/bin/sh", "-c", "sleep 100 & exec sleep 100", NULL};
  const char *agent;
  char tmp[PATH_MAX];
  host_t h;
  int stray_rd = -1, status, r;
  int64_t pid;
  long long deadline;

  if ((agent = agent_test_begin("test_agent_proc", tmp, &r)) == NULL)
    return r;
  if (agent_session(&h, "test_agent_proc", agent, tmp, &stray_rd) < 0)
    return 1;
  test_ready(&h, stray_rd);
  test_exec(&h, tmp);
  test_exec_quick(&h);
  test_exec_errors(&h, tmp);
  test_exec_user(&h, tmp);
  test_stdin(&h);
  test_credit(&h);
  test_output_frames(&h);
  test_signal(&h);
  test_background(&h);
  test_pty(&h);
  test_creds(&h, tmp);
  test_hold(&h, agent, tmp);
  test_tree(&h, tmp);
  test_ps(&h);
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

  /* An agent at oom_score_adj 0 starts its children in its own memory
   * (clone(CLONE_VM), agent_proc.c): the same set-up, failures and drops. */
  agent_test_oom = "0";
  if (agent_session(&h, "test_agent_proc", agent, tmp, NULL) < 0)
    return 1;
  test_exec(&h, tmp);
  test_exec_errors(&h, tmp);
  test_exec_user(&h, tmp);
  test_stdin(&h);
  test_signal(&h);
  test_pty(&h);
  test_creds(&h, tmp);
  test_oom_raised(&h);
  test_tree(&h, tmp);
  agent_session_close(&h);
  return agent_test_end(tmp);
}
