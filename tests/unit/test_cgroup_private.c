/* Drives backends/linux/cgroup.c on cgroup mounts of its own, each in a
 * private mount namespace (a forked child).
 * A cgroup2 filesystem: no controllers are bound to it on a v1 host, so it
 * checks that a limit is refused by name, and exercises attach,
 * cgroup.freeze, cgroup.kill and destroy.
 * On v1 hosts, only the pids and freezer hierarchies under a private root
 * whose path has a space: the host's other hierarchies, outside that root,
 * are left alone.
 * test_cgroup runs the host's own cgroups.  Exit 0 pass, 1 fail, 77 skip
 * (not root, or neither private mount can be made). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>
#include <sys/syscall.h>

#include "cgroup.h"
#include "cgroup_test.h"

/* ---- part 2: a private cgroup2 mount ------------------------------------------- */

static int v2_part(const char *dir, const char *id) {
  tp_cgroup_root_t root = {0};
  tp_cgroup_limits_t lim = {0};
  tp_cgroup_stats_t st;
  tp_cgroup_t cg = {0}, bad = {0};
  tp_error_t err = {0};
  int r;

  r = tp_cgroup_detect(dir, &root, &err);
  check(r == 0 && root.version == 2, "a cgroup2 mount is detected as v2 (controllers: %s%s%s)",
        root.avail & 1u << TP_CG_MEMORY ? "memory " : "", root.avail & 1u << TP_CG_PIDS ? "pids " : "",
        root.avail & 1u << TP_CG_CPU ? "cpu" : "");
  if (r < 0) {
    diag("detect", &err);
    return -1;
  }
  if (!(root.avail & (1u << TP_CG_MEMORY))) {
    lim.memory = 64 << 20;
    r = tp_cgroup_create(&root, id, &lim, &bad, &err);
    check(r < 0 && err.code == EOPNOTSUPP && strstr(err.msg, "memory controller") != NULL,
          "a memory limit without the memory controller fails: %s", err.msg);
    check(tp_cgroup_open(&root, id, &bad, NULL) < 0, "and creates nothing");
    lim.memory = 0;
  }
  if (!(root.avail & (1u << TP_CG_PIDS))) {
    lim.pids = 10;
    r = tp_cgroup_create(&root, id, &lim, &bad, &err);
    check(r < 0 && err.code == EOPNOTSUPP && strstr(err.msg, "pids") != NULL, "so does a pids limit");
    lim.pids = 0;
  }
  r = tp_cgroup_create(&root, id, &lim, &cg, &err);
  if (r < 0)
    diag("create", &err);
  check(r == 0, "create %s on the cgroup2 mount (no limits)", id);
  if (r == 0) {
    t_list_open(&root, &cg);
    pid_t by;
    t_freeze(&cg);
    t_freeze_vfork(&cg);
    by = t_tree_kill(&cg);
    r = tp_cgroup_stats(&cg, &st, &err);
    check(r == 0 && st.cpu_usage_usec >= 0 &&
              (root.avail & (1u << TP_CG_MEMORY) || st.memory_current == -1),
          "stats: cpu %" PRId64 " us; memory %" PRId64 " (-1 without the controller)",
          st.cpu_usage_usec, st.memory_current);
    t_destroy(&root, &cg, by);
  }
  tp_cgroup_free(&cg);
  r = tp_cgroup_prune(&root, &err);
  check(r == 0 && !listed(&root, id), "prune");
  tp_cgroup_root_free(&root);
  return 0;
}

/* Runs part 2 in a child: private mount namespace, fresh cgroup2 mount. */
static int v2_private(const char *id) {
  pid_t pid = fork();
  int st;
  if (pid < 0)
    return -1;
  if (pid == 0) {
    char dir[] = "/tmp/tp-cgroup2-XXXXXX";
    int r;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mkdtemp(dir) == NULL) {
      printf("# private mount namespace: %s\n", strerror(errno));
      _exit(77);
    }
    if (mount("cgroup2", dir, "cgroup2", 0, NULL) < 0) {
      printf("# mount cgroup2: %s\n", strerror(errno));
      rmdir(dir);
      _exit(77);
    }
    r = v2_part(dir, id);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    fflush(stdout);
    _exit(r < 0 ? 1 : 0);
  }
  if (wait_pid(pid, 120000, &st) < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- part 3: v1 hierarchies below a private root ------------------------------- */

/* A root holding only the pids and freezer hierarchies, at a path with a
 * space (mountinfo escapes it): the memory and cpu hierarchies mounted under
 * /sys/fs/cgroup are outside the root and must be left alone. */
static int v1_part(const char *dir, const char *id) {
  tp_cgroup_root_t root = {0};
  tp_cgroup_limits_t lim = {0};
  tp_cgroup_t cg = {0}, bad = {0};
  tp_error_t err = {0};
  char p[4096];
  pid_t pid;
  int r, st;

  r = tp_cgroup_detect(dir, &root, &err);
  if (r < 0)
    diag("detect", &err);
  check(r == 0 && root.version == 1 && root.v1[TP_CG_PIDS] && root.v1[TP_CG_FREEZER] &&
            !root.v1[TP_CG_MEMORY] && !root.v1[TP_CG_CPU],
        "a private v1 root has exactly its own pids and freezer hierarchies");
  if (r < 0)
    return -1;
  snprintf(p, sizeof(p), "%s/pids", dir);
  check(strcmp(root.v1[TP_CG_PIDS], p) == 0, "mount point with a space decoded: '%s'", root.v1[TP_CG_PIDS]);
  lim.memory = 1 << 30;
  r = tp_cgroup_create(&root, id, &lim, &bad, &err);
  check(r < 0 && err.code == EOPNOTSUPP && strstr(err.msg, "memory controller") != NULL,
        "a memory limit without a memory hierarchy fails: %s", err.msg);
  lim.memory = 0;
  lim.pids = 8;
  r = tp_cgroup_create(&root, id, &lim, &cg, &err);
  if (r < 0)
    diag("create", &err);
  check(r == 0 && file_is(cg.path_v1[TP_CG_PIDS], "pids.max", "8"), "create with pids 8");
  snprintf(p, sizeof(p), TP_CGROUP_ROOT "/memory/" TP_CGROUP_PARENT "/%s", id);
  check(!exists(p), "nothing written in the host's memory hierarchy outside the root");
  if (r == 0) {
    /* a tree's sub: in the freezer hierarchy only; on a host without one,
     * in pids (the box's freezer path dropped from a copy: the same) */
    tp_cgroup_t sub = {0}, nofr = {0};
    const char *sd[TP_CG_NCTRL];
    r = tp_cgroup_sub(&cg, "t1", &sub, &err);
    check(r == 0 && cg_ndirs(&sub, sd) == 1 && sub.path_v1[TP_CG_FREEZER] != NULL &&
              sub.path_v1[TP_CG_PIDS] == NULL,
          "a tree's sub is in the freezer hierarchy only");
    if (r == 0)
      check(tp_cgroup_destroy(&sub, &err) == 0, "and is removed");
    nofr.version = 1;
    nofr.id = strdup(cg.id);
    nofr.path_v1[TP_CG_PIDS] = strdup(cg.path_v1[TP_CG_PIDS]);
    r = nofr.id != NULL && nofr.path_v1[TP_CG_PIDS] != NULL ? tp_cgroup_sub(&nofr, "t2", &sub, &err) : -1;
    check(r == 0 && cg_ndirs(&sub, sd) == 1 && sub.path_v1[TP_CG_PIDS] != NULL,
          "without a freezer hierarchy, a tree's sub is in pids");
    if (r == 0) {
      pid = spawn_in_tree(&nofr, &sub, body_pause);
      check(pid > 0 && in_cgroup(pid, &sub) == 1 && has_own_pid(&sub, pid) == 1 &&
                has_own_pid(&nofr, pid) == 0,
            "its process is listed there, not as the box's own");
      check(tp_cgroup_kill(&sub, &err) == 0 && pid > 0 && wait_pid(pid, WAIT_MS, &st) == 0 && killed(st),
            "and killed without a freezer");
      check(tp_cgroup_destroy(&sub, &err) == 0, "the sub is removed");
    }
    tp_cgroup_free(&nofr);
    pid = spawn_in(&cg, body_pause);
    check(pid > 0 && in_cgroup(pid, &cg) == 2, "attach in both hierarchies");
    r = tp_cgroup_destroy(&cg, &err);
    if (r < 0)
      diag("destroy", &err);
    check(r == 0 && pid > 0 && wait_pid(pid, WAIT_MS, &st) == 0 && killed(st),
          "destroy kills and removes");
  }
  tp_cgroup_free(&cg);
  tp_cgroup_prune(&root, NULL);
  tp_cgroup_root_free(&root);
  return 0;
}

static int v1_private(const char *id) {
  pid_t pid = fork();
  int st;
  if (pid < 0)
    return -1;
  if (pid == 0) {
    char dir[] = "/tmp/tp-cgroup1 XXXXXX", sub[4096];
    int r;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mkdtemp(dir) == NULL || mount("tmpfs", dir, "tmpfs", 0, "mode=0755") < 0) {
      printf("# private v1 root: %s\n", strerror(errno));
      _exit(77);
    }
    r = 0;
    for (int i = 0; i < 2 && r == 0; i++) {
      const char *c = i ? "freezer" : "pids";
      snprintf(sub, sizeof(sub), "%s/%s", dir, c);
      r = mkdir(sub, 0755) == 0 && mount("cgroup", sub, "cgroup", 0, c) == 0 ? 0 : -1;
    }
    if (r < 0)
      printf("# mount v1 pids/freezer: %s\n", strerror(errno));
    else
      r = v1_part(dir, id);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    fflush(stdout);
    _exit(r < 0 ? 77 : 0);
  }
  if (wait_pid(pid, 120000, &st) < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
  tp_cgroup_root_t root = {0};
  char id3[32], id4[32];
  char *ids[] = {id3, id4};
  int r, v1_host, v1 = 77, v2;

  if ((r = cg_test_begin()) != 0)
    return r;
  snprintf(id3, sizeof(id3), "t%d-v2", (int) getpid());
  snprintf(id4, sizeof(id4), "t%d-v1", (int) getpid());
  v1_host = tp_cgroup_detect(NULL, &root, NULL) == 0 && root.version == 1;
  tp_cgroup_root_free(&root);

  v2 = v2_private(id3);
  if (v2 == 77)
    skip("cgroup2 cannot be mounted here");
  else
    check(v2 == 0, "the cgroup2 part ran to the end");

  if (v1_host) {
    v1 = v1_private(id4);
    if (v1 == 77)
      skip("no private v1 root (pids and freezer hierarchies)");
    else
      check(v1 == 0, "the private v1 part ran to the end");
  }

  cg_test_end(ids, 2);
  if (v2 == 77 && v1 == 77)
    return 77;
  return S->failed ? 1 : 0;
}
