/* A box's destroy in two halves (runtime/host/dbox_life.c): with
 * tp_dbox_on_dead, the dead callback runs on the loop once PID 1 has exited
 * (every process of its PID namespace gone), before the removal of the
 * box's dir and cgroup is queued; done runs after that removal.  Without
 * it, or for a box with no pidfd, only done runs.  On the host's real
 * cgroups and a real loop; PID 1 is this test's child, PID 1 of a pid
 * namespace with a child of its own, in the box cgroup. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "cgroup.h"
#include "dbox.h"
#include "job.h"
#include "dbox_int.h"
#include "utils.h"

#include "cgroup_test.h"

static int order, dead_seen, done_seen, done_ret;
static int dead_dir_there, dead_cg_there, dead_pids; /* seen by the dead callback */
static char box_dir[64];
static const tp_cgroup_root_t *groot;
static const char *gid;

/* PID 1 of a new pid namespace that forks a child (both wait for ever),
 * moved into cg before the fork; its host pid, or -1. */
static pid_t spawn_box(const tp_cgroup_t *cg) {
  tp_error_t e = {0};
  int p[2];
  char c;
  pid_t pid;
  if (pipe(p) < 0)
    return -1;
  pid = (pid_t) syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
  if (pid == 0) {
    close(p[1]);
    if (read(p[0], &c, 1) != 1) /* in the cgroup first */
      _exit(1);
    if (fork() == 0)
      for (;;)
        pause();
    for (;;)
      pause();
  }
  close(p[0]);
  if (pid > 0 && tp_cgroup_attach(cg, pid, &e) < 0) {
    diag("attach", &e);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pid = -1;
  }
  if (pid > 0 && write(p[1], "x", 1) != 1)
    pid = -1;
  close(p[1]);
  return pid;
}

static void dead_cb(tp_dbox_t *b, int ret, const tp_error_t *err) {
  (void) ret;
  (void) err;
  dead_seen = ++order;
  dead_dir_there = exists(box_dir);
  dead_cg_there = listed(groot, gid);
  dead_pids = (int) npids(&b->cg);
}

static void done_cb(tp_dbox_t *b, int ret, const tp_error_t *err) {
  (void) b;
  done_seen = ++order;
  done_ret = ret;
  if (ret < 0)
    diag("destroy", err);
}

static int frame_cb(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fields, int n,
                    tp_field_t *scratch, int scratch_max) {
  (void) b, (void) type, (void) id, (void) fields, (void) n, (void) scratch, (void) scratch_max;
  return 0;
}

static int downs;
static void down_cb(tp_dbox_t *b, const char *reason) {
  (void) b, (void) reason;
  downs++;
}

/* A box object for dir with a cgroup id and, when with_pid, a PID 1 (and
 * its child) in it; NULL on failure. */
static tp_dbox_t *box_new(uv_loop_t *loop, const tp_backend_t *lx, const tp_cgroup_root_t *root,
                          const char *id, const char *dir, int with_pid) {
  tp_error_t err = {0};
  tp_dbox_t *b = tp__dbox_new(lx, loop, dir);
  char f[96];
  int fd;
  if (b == NULL)
    return NULL;
  if (tp_cgroup_create(root, id, NULL, &b->cg, &err) < 0) {
    diag("create", &err);
    tp_dbox_release(b);
    return NULL;
  }
  b->has_cg = 1;
  snprintf(f, sizeof(f), "%s/file", dir);
  if ((fd = open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
    close(fd);
  if (with_pid) {
    b->box.pid = spawn_box(&b->cg);
    b->box.pidfd = b->box.pid > 0 ? (int) syscall(SYS_pidfd_open, b->box.pid, 0) : -1;
    for (long long end = now_ms() + WAIT_MS; b->box.pidfd >= 0 && npids(&b->cg) < 2 && now_ms() < end;)
      nap_ms(2);
  }
  return b;
}

int main(void) {
  tp_cgroup_root_t root = {0};
  tp_error_t err = {0};
  char id[32], id2[32];
  char *ids[] = {id, id2};
  const tp_backend_t *lx;
  uv_loop_t loop;
  tp_dbox_t *b;
  int r, queued = 0;

  if ((r = cg_test_begin()) != 0)
    return r;
  snprintf(id, sizeof(id), "t%d-dead", (int) getpid());
  snprintf(id2, sizeof(id2), "t%d-dead2", (int) getpid());
  if (tp_cgroup_detect(NULL, &root, &err) < 0) {
    printf("# host cgroups: %s\n1..0 # SKIP no host cgroups\n", err.msg);
    return 77;
  }
  lx = tp_backend_find("linux");
  snprintf(box_dir, sizeof(box_dir), "/tmp/tupper-dbox-dead.XXXXXX");
  if (mkdtemp(box_dir) == NULL || lx == NULL || uv_loop_init(&loop) != 0) {
    printf("1..0 # SKIP no temp dir, linux backend or loop\n");
    return 77;
  }
  groot = &root;

  /* the two halves */
  gid = id;
  b = box_new(&loop, lx, &root, id, box_dir, 1);
  check(b != NULL && b->box.pidfd >= 0 && npids(&b->cg) == 2,
        "a box: PID 1 of a pid namespace and its child, in the box cgroup");
  if (b == NULL || b->box.pidfd < 0)
    goto out;
  tp_dbox_on_dead(b, dead_cb);
  r = tp_dbox_destroy(b, NULL, done_cb, &queued, &err);
  check(r == 0 && queued == 1 && b->work_pending == 1 && b->open_handles == 1,
        "the destroy waits on the loop (a poll on the pidfd), nothing in the pool yet");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(dead_seen == 1 && done_seen == 2 && done_ret == 0, "dead ran first, then done (ok)");
  check(dead_pids == 0, "at dead, no process is left in the box cgroup");
  check(dead_dir_there && dead_cg_there, "at dead, the dir and the cgroup are still there");
  check(!exists(box_dir) && !listed(&root, id), "at done, the dir and the cgroup are gone");
  check(b->work_pending == 0 && b->open_handles == 0, "no job, no handle left");
  tp_dbox_release(b);
  uv_run(&loop, UV_RUN_DEFAULT);

  /* a started box (its channel and exit poll on the loop): the exit poll
   * waits for the end, as deadp does for a box never started */
  order = dead_seen = done_seen = 0;
  if (mkdir(box_dir, 0700) < 0) {
    check(0, "the dir again: %s", strerror(errno));
    goto out;
  }
  b = box_new(&loop, lx, &root, id, box_dir, 1);
  {
    int sp[2];
    check(b != NULL && b->box.pidfd >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0,
          "a box with a PID 1 and a channel");
    if (b == NULL || b->box.pidfd < 0)
      goto out;
    b->box.chan_fd = sp[0];
    check(tp_dbox_on(b, frame_cb, down_cb, &err) == 0 && b->open_handles == 2, "started: two handles");
    tp_dbox_on_dead(b, dead_cb);
    r = tp_dbox_destroy(b, NULL, done_cb, &queued, &err);
    check(r == 0 && queued == 1 && b->work_pending == 1 && b->open_handles == 2,
          "its destroy waits on its exit poll (the channel closing), nothing in the pool yet");
    uv_run(&loop, UV_RUN_DEFAULT);
    close(sp[1]);
  }
  check(dead_seen == 1 && done_seen == 2 && done_ret == 0, "dead ran first, then done (ok)");
  check(dead_pids == 0, "at dead, no process is left in the box cgroup");
  check(dead_dir_there && dead_cg_there, "at dead, the dir and the cgroup are still there");
  check(!exists(box_dir) && !listed(&root, id), "at done, the dir and the cgroup are gone");
  check(b->work_pending == 0 && b->open_handles == 0, "no job, no handle left");
  check(downs == 0, "the owner was not told the box went down: it destroyed it");
  tp_dbox_release(b);
  uv_run(&loop, UV_RUN_DEFAULT);

  /* no pidfd: done is the only word */
  order = dead_seen = done_seen = 0;
  gid = id2;
  if (mkdir(box_dir, 0700) < 0) {
    check(0, "the dir again: %s", strerror(errno));
    goto out;
  }
  b = box_new(&loop, lx, &root, id2, box_dir, 0);
  check(b != NULL, "a box with no PID 1");
  if (b == NULL)
    goto out;
  tp_dbox_on_dead(b, dead_cb);
  r = tp_dbox_destroy(b, NULL, done_cb, &queued, &err);
  check(r == 0 && queued == 1 && b->open_handles == 0, "its destroy goes to the pool at once");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(dead_seen == 0 && done_seen == 1 && done_ret == 0, "dead never ran, done did");
  check(!exists(box_dir) && !listed(&root, id2), "the dir and the cgroup are gone");
  tp_dbox_release(b);
out:
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "the loop closes");
  rmdir(box_dir);
  tp_cgroup_prune(&root, NULL);
  tp_cgroup_root_free(&root);
  cg_test_end(ids, 2);
  return S->failed ? 1 : 0;
}
