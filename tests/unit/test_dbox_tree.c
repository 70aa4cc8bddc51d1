/* A box's process trees in the thread pool (runtime/host/dbox_tree.c) on
 * the host's real cgroups and a real loop: tp_dbox_tree_start moves a
 * process into its tree's sub, tp_dbox_tree_kill_start kills the tree while
 * a removal waits for it, tp_dbox_freeze_start freezes and thaws the box
 * there, and a destroy of the box while a tree or freeze job is in the
 * pool waits for that job.  The box object has no PID 1 of its own
 * (none is needed: the processes are this test's children, each PID 1 of a
 * pid namespace, in its cgroup). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
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

static int order, tree_seen, kill_seen, done_seen, freeze_seen;
static tp_error_t last;
static const tp_error_t *last_err; /* &last, or NULL: success */
static size_t killed_n;

static void keep(const tp_error_t *err) {
  last_err = NULL;
  if (err != NULL) { /* the job's own, freed after the callback */
    last = *err;
    last_err = &last;
    printf("# callback: %s\n", err->msg);
  }
}

static void tree_cb(void *data, const tp_error_t *err) {
  *(int *) data = ++order;
  keep(err);
}

/* Whether the box cgroup says it is frozen (or thawed: frozen 0) */
static int box_frozen(const tp_cgroup_t *cg, int frozen) {
  if (cg->version == 2)
    return file_has(cg->path_v2, "cgroup.events", frozen ? "frozen 1" : "frozen 0");
  return file_is(cg->path_v1[TP_CG_FREEZER], "freezer.state", frozen ? "FROZEN" : "THAWED");
}

static void kill_cb(void *data, size_t n, const tp_error_t *err) {
  *(int *) data = ++order;
  killed_n = n;
  keep(err);
}

/* A process that is PID 1 of a pid namespace of its own, as a box's
 * processes are in theirs (a tree's pid is the one its box sees: 1 here),
 * moved into box cgroup cg.  Its host pid, or -1. */
static pid_t spawn_ns(const tp_cgroup_t *cg) {
  tp_error_t e = {0};
  pid_t pid = (pid_t) syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
  if (pid == 0)
    for (;;)
      pause();
  if (pid > 0 && tp_cgroup_attach(cg, pid, &e) < 0) {
    diag("attach", &e);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

static void done_cb(tp_dbox_t *b, int ret, const tp_error_t *err) {
  (void) b;
  done_seen = ++order;
  if (ret != 0 && err != NULL)
    printf("# destroy: %s\n", err->msg);
  check(ret == 0, "the held destroy succeeds");
}

/* Spare trees: made ahead, taken, run out, refilled in the pool; a
 * process that writes itself to a taken one's fds (as the agent's child
 * does) is in it, and its kill kills it.  v names the cgroup version. */
static void spares_part(uv_loop_t *loop, tp_dbox_t *b, const char *v) {
  tp_error_t err = {0};
  int status, r;
  tp_dbox_tree_t *s1, *s2, *s3;
  int fds[TP_CG_NCTRL], n, ok = 1;
  pid_t c;
  /* a box's first take finds none and makes none: its tree comes back */
  check(tp_dbox_tree_take(b) == NULL && b->spares == 0 && !b->refilling && b->tree_jobs == 0,
        "%s: a box's first take gets none and queues no refill", v);
  /* a pooled box: one made ahead of its first process */
  tp_dbox_tree_refill_to(b, 1);
  check(b->refilling == 1 && b->tree_jobs == 1, "%s: a refill up to one queues a job", v);
  uv_run(loop, UV_RUN_DEFAULT);
  check(b->spares == 1 && !b->refilling && b->tree_jobs == 0, "it made one spare, no more");
  tp_dbox_tree_refill_to(b, 1);
  check(!b->refilling && b->tree_jobs == 0, "with one there, a refill up to one queues nothing");
  r = tp__dbox_spares_make(b, TP_DBOX_SPARES - 1, &err);
  check(r == 0 && b->spares == TP_DBOX_SPARES, "%s: the box has %d spare trees", v, TP_DBOX_SPARES);
  s1 = tp_dbox_tree_take(b);
  check(s1 != NULL && !s1->spare && tp_dbox_tree_find(b, s1->name) == s1 && b->spares == 1 &&
            !b->refilling && b->tree_jobs == 0,
        "a take hands one over (found by name from now on); one is left: no refill");
  s2 = tp_dbox_tree_take(b);
  check(s2 != NULL && b->spares == 0 && !b->refilling && b->tree_jobs == 0,
        "the take that leaves none queues nothing (its tree comes back)");
  s3 = tp_dbox_tree_take(b);
  check(s3 == NULL && b->spares == 0 && b->refilling == 1 && b->tree_jobs == 1,
        "the next finds none (the owner takes the held way) and queues a refill");
  check(tp_dbox_tree_take(b) == NULL && b->tree_jobs == 1, "one refill at a time");
  uv_run(loop, UV_RUN_DEFAULT);
  check(b->spares == TP_DBOX_SPARES && !b->refilling && b->tree_jobs == 0,
        "the refill made up the count (%d spare)", b->spares);
  /* an ended process's tree comes back as a spare while the box is short */
  if (s2 != NULL) {
    const char *d[TP_CG_NCTRL];
    tp_dbox_tree_t *s4;
    check(tp_dbox_tree_recycle(b, s2) == 0 && !s2->spare && tp_dbox_tree_find(b, s2->name) == s2,
          "a box with its spares keeps no more: the tree is the caller's to remove");
    s4 = tp_dbox_tree_take(b);
    s2->busy = 1;
    check(tp_dbox_tree_recycle(b, s2) == 0 && !s2->spare, "a tree a kill job reads is not reused");
    s2->busy = 0;
    check(s4 != NULL && tp_dbox_tree_recycle(b, s2) == 1 && s2->spare &&
              tp_dbox_tree_find(b, s2->name) == NULL && b->spares == TP_DBOX_SPARES && b->tree_jobs == 0,
          "one short: the tree becomes a spare, no longer found by name, no job queued");
    int nd = cg_ndirs(&s2->cg, d);
    check(all_exist(nd, d), "its cgroup is kept as it is (%d dirs)", nd);
    check(s4 != NULL && tp_dbox_tree_remove(b, s4, &err) == 0, "the other taken tree is removed");
  }
  /* the agent's child: writes itself to the fds the EXEC brings */
  n = s1 != NULL ? tp_cgroup_enter_fds_self(&s1->cg, fds, &err) : -1;
  c = n > 0 ? fork() : -1;
  if (c == 0) {
    for (int i = 0; i < n; i++)
      if (write(fds[i], "0", 1) != 1)
        _exit(1);
    for (;;)
      pause();
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  for (long long end = now_ms() + WAIT_MS; c > 0 && in_cgroup(c, &s1->cg) < n && now_ms() < end;)
    poll(NULL, 0, 2);
  ok = c > 0 && in_cgroup(c, &s1->cg) == n;
  check(ok, "a process that writes itself to a taken tree's fds is in it in every hierarchy (%d)", n);
  if (c > 0) {
    size_t cnt = 0, k = 9;
    check(tp_dbox_tree_count(b, s1, &k, &err) == 0 && k == 1, "the tree counts it");
    check(tp_dbox_tree_signal(b, s1, SIGKILL, &cnt, &err) == 0 && cnt == 1 &&
              wait_pid(c, WAIT_MS, &status) == 0 && killed(status),
          "the tree's kill kills it");
    check(tp_dbox_tree_count(b, s1, &k, &err) == 0 && k == 0, "then the tree counts none");
  }
  check(s1 != NULL && tp_dbox_tree_remove(b, s1, &err) == 0, "the tree is removed");
}

/* The same on a private cgroup2 mount (a v1 host's v2 code paths), in a
 * child with a mount namespace of its own. */
static void v2_private(const tp_backend_t *lx, const char *host_id) {
  pid_t c = fork();
  int status;
  if (c == 0) {
    char mnt[] = "/tmp/tp-dbox-cg2-XXXXXX", bdir[] = "/tmp/tupper-dbox-tree2.XXXXXX", id[48];
    tp_cgroup_root_t root = {0};
    tp_error_t err = {0};
    uv_loop_t loop;
    tp_dbox_t *b;
    int queued = 0;
    snprintf(id, sizeof(id), "%s-v2", host_id);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mkdtemp(mnt) == NULL || mount("cgroup2", mnt, "cgroup2", 0, NULL) < 0) {
      skip("v2: no private cgroup2 mount");
      _exit(0);
    }
    if (mkdtemp(bdir) == NULL || tp_cgroup_detect(mnt, &root, &err) < 0 || uv_loop_init(&loop) != 0) {
      check(0, "v2: a private cgroup2 root: %s", err.msg);
      _exit(0);
    }
    b = tp__dbox_new(lx, &loop, bdir);
    if (tp_cgroup_create(&root, id, NULL, &b->cg, &err) == 0) {
      b->has_cg = 1;
      spares_part(&loop, b, "v2");
      /* the freeze in the pool on v2: cgroup.freeze, then cgroup.events */
      pid_t p = spawn_ns(&b->cg);
      freeze_seen = 0;
      check(p > 0 && tp_dbox_freeze_start(b, 1, tree_cb, &freeze_seen, &err) == 0 &&
                b->tree_jobs == 1,
            "v2: a process in the box, a freeze queued");
      uv_run(&loop, UV_RUN_DEFAULT);
      check(freeze_seen > 0 && last_err == NULL && box_frozen(&b->cg, 1),
            "v2: frozen when its callback runs");
      freeze_seen = 0;
      check(tp_dbox_freeze_start(b, 0, tree_cb, &freeze_seen, &err) == 0, "v2: a thaw queued");
      uv_run(&loop, UV_RUN_DEFAULT);
      check(freeze_seen > 0 && last_err == NULL && box_frozen(&b->cg, 0),
            "v2: thawed when its callback runs");
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
      }
      check(tp_dbox_destroy(b, NULL, NULL, &queued, &err) == 0, "v2: the box's destroy");
      uv_run(&loop, UV_RUN_DEFAULT);
    } else {
      check(0, "v2: a box cgroup: %s", err.msg);
    }
    tp_dbox_release(b);
    uv_run(&loop, UV_RUN_DEFAULT);
    tp_job_stop(&loop); /* the loop's workers, made at its first job */
    uv_run(&loop, UV_RUN_DEFAULT);
    check(uv_loop_close(&loop) == 0, "v2: the loop closes");
    tp_cgroup_prune(&root, NULL);
    tp_cgroup_root_free(&root);
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    rmdir(bdir);
    fflush(stdout);
    _exit(0);
  }
  if (c > 0)
    waitpid(c, &status, 0);
}

int main(void) {
  tp_cgroup_root_t root = {0};
  tp_error_t err = {0};
  char id[32], dir[] = "/tmp/tupper-dbox-tree.XXXXXX";
  char *ids[] = {id};
  const tp_backend_t *lx;
  tp_dbox_tree_t *t;
  uv_loop_t loop;
  tp_dbox_t *b;
  pid_t p1, p2;
  int r, status, queued = 0;

  if ((r = cg_test_begin()) != 0)
    return r;
  snprintf(id, sizeof(id), "t%d-tree", (int) getpid());
  if (tp_cgroup_detect(NULL, &root, &err) < 0) {
    printf("# host cgroups: %s\n1..0 # SKIP no host cgroups\n", err.msg);
    return 77;
  }
  lx = tp_backend_find("linux");
  if (mkdtemp(dir) == NULL || lx == NULL || uv_loop_init(&loop) != 0) {
    printf("1..0 # SKIP no temp dir, linux backend or loop\n");
    return 77;
  }
  b = tp__dbox_new(lx, &loop, dir);
  r = tp_cgroup_create(&root, id, NULL, &b->cg, &err);
  if (r < 0)
    diag("create", &err);
  check(r == 0, "a box cgroup %s", id);
  if (r < 0)
    goto out;
  b->has_cg = 1;

  spares_part(&loop, b, root.version == 1 ? "v1" : "v2");
  if (root.version == 1)
    v2_private(lx, id);

  /* a tree made in the pool */
  p1 = spawn_ns(&b->cg);
  check(p1 > 0 && has_own_pid(&b->cg, p1) == 1, "a process in the box's own cgroup");
  r = tp_dbox_tree_start(b, "t1", 1, tree_cb, &tree_seen, &err);
  check(r == 0 && b->tree_jobs == 1 && tp_dbox_tree_find(b, "t1") == NULL,
        "tree_start queues a job; the tree is not listed before it is made");
  check(tp_dbox_tree_start(b, "bad/name", 1, tree_cb, &tree_seen, &err) < 0 && err.code == EINVAL,
        "a bad tree name is refused before anything is queued");
  uv_run(&loop, UV_RUN_DEFAULT);
  t = tp_dbox_tree_find(b, "t1");
  check(tree_seen == 1 && last_err == NULL && t != NULL && b->tree_jobs == 0,
        "its callback runs on the loop, the tree listed");
  check(t != NULL && in_cgroup(p1, &t->cg) == cg_ndirs(&t->cg, (const char *[TP_CG_NCTRL]){0}) &&
            has_own_pid(&b->cg, p1) == 0,
        "the process is in the tree's sub in every hierarchy, no longer the box's own");
  r = tp_dbox_tree_start(b, "t9", 999999, tree_cb, &tree_seen, &err);
  uv_run(&loop, UV_RUN_DEFAULT);
  check(r == 0 && tree_seen == 2 && last_err != NULL && last_err->code == ESRCH &&
            tp_dbox_tree_find(b, "t9") == NULL,
        "a pid not in the box: the callback gets ESRCH, no tree is left");

  /* a kill in the pool, and a removal asked for meanwhile waits for it */
  if (t != NULL) {
    const char *d[TP_CG_NCTRL];
    int n = cg_ndirs(&t->cg, d);
    char *copy[TP_CG_NCTRL];
    for (int i = 0; i < n; i++)
      copy[i] = strdup(d[i]);
    r = tp_dbox_tree_kill_start(b, t, kill_cb, &kill_seen, &err);
    check(r == 0 && t->busy == 1, "kill_start queues a job, the tree busy");
    check(tp_dbox_tree_remove(b, t, &err) < 0 && err.code == EBUSY, "a synchronous removal of a busy tree is EBUSY");
    check(tp_dbox_tree_remove_start(b, t, &err) == 0 && tp_dbox_tree_find(b, "t1") == NULL,
          "remove_start unlinks it at once");
    uv_run(&loop, UV_RUN_DEFAULT);
    check(kill_seen == 3 && last_err == NULL && killed_n == 1, "the kill's callback: 1 process");
    check(wait_pid(p1, WAIT_MS, &status) == 0 && killed(status), "the process died of SIGKILL");
    check(b->tree_jobs == 0 && !any_dir_left(n, (const char *const *) copy),
          "the removal ran after the kill: the sub is gone in every hierarchy");
    for (int i = 0; i < n; i++)
      free(copy[i]);
  }

  /* a freeze and a thaw in the pool, the loop free meanwhile */
  p2 = spawn_ns(&b->cg);
  if (root.version == 2 || b->cg.path_v1[TP_CG_FREEZER] != NULL) {
    r = tp_dbox_freeze_start(b, 1, tree_cb, &freeze_seen, &err);
    check(r == 0 && b->tree_jobs == 1 && freeze_seen == 0,
          "freeze_start queues a job; its callback has not run");
    uv_run(&loop, UV_RUN_DEFAULT);
    check(freeze_seen > 0 && last_err == NULL && b->tree_jobs == 0 && box_frozen(&b->cg, 1),
          "its callback runs on the loop once the box is frozen");
    freeze_seen = 0;
    r = tp_dbox_freeze_start(b, 0, tree_cb, &freeze_seen, &err);
    uv_run(&loop, UV_RUN_DEFAULT);
    check(r == 0 && freeze_seen > 0 && last_err == NULL && box_frozen(&b->cg, 0),
          "a thaw the same way");
  } else {
    skip("no freezer hierarchy");
  }

  /* a destroy while a freeze job (here a thaw: a box left frozen is the
   * owner's to thaw before its destroy, as the daemon does) is in the pool
   * waits for it */
  freeze_seen = 0;
  if (root.version == 2 || b->cg.path_v1[TP_CG_FREEZER] != NULL) {
    r = tp_dbox_freeze_start(b, 0, tree_cb, &freeze_seen, &err);
    check(r == 0, "another freeze job");
  }

  /* a destroy while a tree job is in the pool waits for it */
  tree_seen = 0;
  r = tp_dbox_tree_start(b, "t2", 1, tree_cb, &tree_seen, &err);
  check(r == 0, "another tree job");
  r = tp_dbox_destroy(b, NULL, done_cb, &queued, &err);
  check(r == 0 && queued == 1 && b->held_destroy == 1, "a destroy meanwhile is held, reported queued");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(tree_seen > 0 && done_seen > tree_seen && done_seen > freeze_seen,
        "the tree's and the thaw's callbacks ran first, then the destroy's");
  check(p2 > 0 && wait_pid(p2, WAIT_MS, &status) == 0 && killed(status), "the box's destroy killed its tree");
  check(!listed(&root, id), "the box cgroup is gone");
  tp_dbox_release(b); /* frees it: destroyed, no job */
  b = NULL;
out:
  if (b != NULL) {
    tp_dbox_release(b);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "the loop closes");
  rmdir(dir);
  tp_cgroup_prune(&root, NULL);
  tp_cgroup_root_free(&root);
  cg_test_end(ids, 1);
  return S->failed ? 1 : 0;
}
