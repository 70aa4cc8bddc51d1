/* The real tupper-agent (agent_client.h) losing its channel: with a
 * listening socket it keeps its processes running and their output drained
 * while detached, and a new connection gets READY and what happened
 * meanwhile; a second client while attached is refused; with no daemon back
 * within --grace it exits and takes its processes along; a bad --grace is a
 * usage error.  Each test starts agents of its own.  Runs as root. */
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

/* ---- detaching and re-attaching --------------------------------------------------------- */

/* Connects to the agent's listener, as a host that already knows the
 * processes pids[0..n), and waits for READY. */
static int host_connect(host_t *h, const char *sock, const int64_t *pids, int n) {
  long long deadline = now_ms() + TIMEOUT_MS;
  host_init(h, connect_to(sock));
  for (int i = 0; i < n; i++)
    host_track(h, pids[i]);
  if (h->fd < 0)
    return -1;
  while (h->ready_count == 0 && pump(h, deadline) == 0)
    ;
  return h->ready_count == 1 ? 0 : -1;
}

/* Leaves nothing of an agent behind: SIGKILL, reap, reap what came to us. */
static void agent_stop(host_t *h) {
  if (h->agent > 0) {
    kill(h->agent, SIGKILL);
    waitpid(h->agent, NULL, 0);
  }
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

static void test_detach(const char *agent, const char *tmp) {
  const char *sleeper[] = {"/bin/sleep", "100", NULL};
  const char *noisy[] = {"/bin/sh", "-c", "read x; head -c 4000000 /dev/zero; exit 7", NULL};
  const char *fds[] = {"/bin/sh", "-c", "ls /proc/self/fd | wc -l", NULL};
  char sock[PATH_MAX], buf[64];
  int64_t pid, sleep_pid, noisy_pid, pids[8];
  char args[8][128];
  host_t h, h2;
  long long deadline;
  struct pollfd pfd;
  tproc_t *p;
  msg_t *m;
  int lfd, c2, k, r;
  ssize_t n;

  join(sock, tmp, "/agent.sock");
  lfd = listener_make(sock);
  if (lfd < 0 || agent_start_opts(&h, agent, tmp, NULL, lfd, "5") < 0) {
    check(0, "start an agent with a listening socket");
    return;
  }
  close(lfd); /* only the agent holds it now */
  deadline = now_ms() + TIMEOUT_MS;
  while (h.ready_count == 0 && pump(&h, deadline) == 0)
    ;
  check(h.ready_count == 1, "the agent with a listener sends READY");
  pid = run(&h, fds, NULL, NULL, 0);
  p = pid > 0 ? wait_exit(&h, pid) : NULL;
  check(p != NULL && out_is(p, 1, "4\n"), "its children do not inherit the listener (only fds 0-2)");
  sleep_pid = run(&h, sleeper, NULL, NULL, 0);
  noisy_pid = run(&h, noisy, NULL, NULL, TP_F_EXEC_STDIN);
  check(sleep_pid > 0 && noisy_pid > 0, "start a sleep and a shell that writes 4 MB once told");
  expect_ok(stdin_req(&h, noisy_pid, "go\n", 3), "tell it to go");
  close(h.fd); /* the daemon crashes */
  h.fd = -1;
  /* Its 4 MB go nowhere: it can only finish (and be reaped) if the agent
   * keeps draining its pipe while detached. */
  check(wait_gone((pid_t) noisy_pid) == 0, "the noisy shell ran to its end while detached");
  check(kill((pid_t) sleep_pid, 0) == 0 && waitpid(h.agent, NULL, WNOHANG) == 0,
        "the agent and the sleep are still alive");

  pids[0] = sleep_pid;
  pids[1] = noisy_pid;
  r = host_connect(&h2, sock, pids, 2);
  check(r == 0 && h2.first_event == TP_MSG_READY && h2.ready_pid == h.agent,
        "a new connection gets READY first, with the agent's pid");
  p = wait_exit(&h2, noisy_pid);
  check(p != NULL && p->code == 7 && p->sig == 0, "then the EXIT kept while detached (CODE 7)");
  m = ps_req(&h2);
  k = ps_entries(m, pids, args, 8);
  check(msg_is_ok(m) && k == 1 && pids[0] == sleep_pid && strcmp(args[0], "/bin/sleep 100") == 0,
        "PS on the new channel lists the sleep");
  msg_free(m);

  /* A second client while attached: closed at once, never READY. */
  c2 = connect_to(sock);
  pfd = (struct pollfd){.fd = c2, .events = POLLIN};
  n = c2 >= 0 && poll(&pfd, 1, TIMEOUT_MS) == 1 ? read(c2, buf, sizeof(buf)) : -1;
  check(n == 0, "a second connection while attached is closed without a byte (read %zd)", n);
  if (c2 >= 0)
    close(c2);
  m = ps_req(&h2);
  check(msg_is_ok(m), "the attached channel still answers");
  msg_free(m);
  expect_ok(pid_req(&h2, TP_MSG_SIGNAL, sleep_pid, TP_TAG_SIGNAL, SIGKILL), "SIGNAL 9 to the sleep");
  p = wait_exit(&h2, sleep_pid);
  check(p != NULL && p->sig == SIGKILL, "its EXIT arrives on the new channel");
  check(h2.stray_events == 0 && h2.bad_frames == 0, "no stray event or bad frame on the new channel");

  /* Lost again: a client that goes away at once leaves the agent waiting
   * for the next one. */
  close(h2.fd);
  h2.fd = -1;
  host_free(&h2);
  c2 = connect_to(sock);
  if (c2 >= 0)
    close(c2);
  r = host_connect(&h2, sock, NULL, 0);
  check(r == 0, "after another loss and a client that left at once, the next one gets READY");
  host_free(&h2);
  agent_stop(&h);
  host_free(&h);
  unlink(sock);
}

static void test_grace(const char *agent, const char *tmp) {
  const char *tree[] = {"/bin/sh", "-c", "sleep 100 & exec sleep 100", NULL};
  char sock[PATH_MAX];
  long long deadline, t0;
  int64_t pid;
  host_t h;
  int lfd, status, r, c;

  join(sock, tmp, "/grace.sock");
  lfd = listener_make(sock);
  if (lfd < 0 || agent_start_opts(&h, agent, tmp, NULL, lfd, "1") < 0) {
    check(0, "start an agent with a listening socket and --grace 1");
    return;
  }
  close(lfd);
  pid = run(&h, tree, NULL, NULL, 0);
  check(pid > 0, "start a process tree");
  t0 = now_ms();
  close(h.fd);
  h.fd = -1;
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "with no daemon back within the grace period the agent exits 0 (status 0x%x)", status);
  check(now_ms() - t0 >= 900, "but not before the grace period (%lld ms)", now_ms() - t0);
  r = pid > 0 ? wait_gone(-(pid_t) pid) : -1;
  check(r == 0, "and its process group is gone");
  deadline = now_ms() + TIMEOUT_MS;
  while ((r = waitpid(-1, NULL, WNOHANG)) >= 0 && now_ms() < deadline)
    if (r == 0)
      poll(NULL, 0, 10);
  check(r < 0 && errno == ECHILD, "no process of it remains");
  c = connect_to(sock);
  check(c < 0, "the listener died with the agent");
  if (c >= 0)
    close(c);
  host_free(&h);
  unlink(sock);
}

static void test_bad_args(const char *agent, const char *tmp) {
  const char *bad[] = {"x", "-1", "86401", ""};
  for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
    host_t h;
    int status;
    if (agent_start_opts(&h, agent, tmp, NULL, -1, bad[i]) < 0) {
      check(0, "start an agent");
      continue;
    }
    status = agent_wait(&h);
    check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 2,
          "--grace '%s' -> usage error, exit 2", bad[i]);
    host_free(&h);
  }
}

int main(void) {
  const char *agent;
  char tmp[PATH_MAX];
  int r;

  if ((agent = agent_test_begin("test_agent_detach", tmp, &r)) == NULL)
    return r;
  test_detach(agent, tmp);
  test_grace(agent, tmp);
  test_bad_args(agent, tmp);
  return agent_test_end(tmp);
}
