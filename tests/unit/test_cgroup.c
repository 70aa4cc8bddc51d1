/* Drives backends/linux/cgroup.c against the host's own cgroups (v1 on the
 * CI VM, v2 on most desktops): limits are read back and then enforced (a
 * fork bomb stops at pids.max, a memory hog is OOM-killed, a cpu burner is
 * throttled), freeze stops a counter, a sub cgroup is killed whole (setsid
 * + double fork included) while its sibling lives on, destroy leaves
 * nothing.  test_cgroup_private runs the v2 paths on a private cgroup2
 * mount and a private v1 root.  Exit 0 pass, 1 fail, 77 skip (not root, or
 * no cgroups on the host). */
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

static void show(const char *what, const tp_cgroup_stats_t *st) {
  printf("# stats %s: mem %" PRId64 " peak %" PRId64 " cpu %" PRId64 " us, throttled %" PRId64 " / %" PRId64
         " us, pids %" PRId64 ", oom kills %" PRId64 "\n",
         what, st->memory_current, st->memory_peak, st->cpu_usage_usec, st->nr_throttled,
         st->throttled_usec, st->pids_current, st->oom_kills);
}

static void body_forkbomb(void) {
  int n = 0;
  for (;;) {
    pid_t p = fork();
    if (p == 0)
      body_pause();
    if (p < 0) {
      S->fork_errno = errno;
      break;
    }
    if (++n > 10000)
      break;
  }
  S->forks = n;
  __atomic_store_n(&S->done, 1, __ATOMIC_SEQ_CST);
  body_pause();
}

/* Forks short-lived children as fast as it can: a moving target for kill. */
static void body_churn(void) {
  for (;;) {
    pid_t p = fork();
    if (p == 0)
      _exit(0);
    if (p > 0)
      waitpid(p, NULL, 0);
    __atomic_store_n(&S->done, 1, __ATOMIC_SEQ_CST);
  }
}

static void body_memhog(void) {
  size_t len = 200u << 20;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    _exit(2);
  for (size_t i = 0; i < len; i += 4096)
    p[i] = 1;
  _exit(0); /* survived: the limit did not hold */
}

static void body_spin(void) {
  volatile unsigned long x = 0;
  for (;;)
    x++;
}

static int has_cap(int cap) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) < 0)
    return 0;
  return (d[cap / 32].effective >> (cap % 32)) & 1;
}

/* ---- part 1: the host's cgroups ------------------------------------------------ */

static void t_validation(const tp_cgroup_root_t *root) {
  static const char *bad[] = {"", "A", "-a", "a/b", "..", "a.b", "a_b",
                              "0123456789012345678901234567890123456789012345678901234567890123"};
  tp_cgroup_limits_t lim = {0};
  tp_cgroup_t cg = {0};
  tp_error_t err = {0};
  int all = 1;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    all &= tp_cgroup_create(root, bad[i], NULL, &cg, &err) < 0 && err.code == EINVAL;
  check(all, "bad ids are refused");
  check(tp_cgroup_valid_name("a") && tp_cgroup_valid_name("box-1") &&
            tp_cgroup_valid_name("012345678901234567890123456789012345678901234567890123456789012"),
        "good ids pass (up to 63 chars)");
  lim.cpu_quota = 500;
  check(tp_cgroup_create(root, "tvalid", &lim, &cg, &err) < 0 && err.code == EINVAL,
        "a cpu quota below 1 ms is refused");
  lim.cpu_quota = 0;
  lim.memory = -1;
  check(tp_cgroup_create(root, "tvalid", &lim, &cg, &err) < 0 && err.code == EINVAL,
        "a negative limit is refused");
}

/* A write the kernel refuses, after the dirs were made: all of it is undone. */
static void t_rollback(const tp_cgroup_root_t *root, const char *id) {
  tp_cgroup_limits_t lim = {0};
  tp_cgroup_t cg = {0}, probe = {0};
  tp_error_t err = {0};
  char parent[4096];
  const char *mnt = root->version == 2 ? root->v2 : root->v1[TP_CG_CPU];
  int had_parent, r;

  if (!(root->avail & (1u << TP_CG_CPU))) {
    skip("rollback: no cpu controller");
    return;
  }
  snprintf(parent, sizeof(parent), "%s/" TP_CGROUP_PARENT, mnt);
  had_parent = exists(parent);
  lim.cpu_quota = 1000000000000000LL; /* beyond what the kernel takes */
  r = tp_cgroup_create(root, id, &lim, &cg, &err);
  printf("# %s\n", err.msg);
  check(r < 0 && err.code == EINVAL && strstr(err.msg, "cpu") != NULL,
        "a quota the kernel refuses fails create, naming the file");
  check(tp_cgroup_open(root, id, &probe, NULL) < 0, "and leaves no box dir behind");
  tp_cgroup_free(&probe);
  /* (another test may have made the parent meanwhile: then it is not empty) */
  check(had_parent || !exists(parent) || rmdir(parent) < 0, "nor the tupper parent it made");
}

/* A key of the cgroup's cpu.stat (v1: the cpu hierarchy's), or -1. */
static int64_t cpu_stat(const tp_cgroup_t *cg, const char *key) {
  const char *dir = cg->version == 2 ? cg->path_v2 : cg->path_v1[TP_CG_CPU];
  const char *s = dir ? slurp(dir, "cpu.stat") : NULL;
  size_t n = strlen(key);
  for (; s != NULL && *s; s = strchr(s, '\n') ? strchr(s, '\n') + 1 : "")
    if (strncmp(s, key, n) == 0 && s[n] == ' ')
      return strtoll(s + n + 1, NULL, 10);
  return -1;
}

/* The cpu quota is enforced, asserted from the cgroup's own accounting, not
 * from wall time: a loaded host may give the box less than its quota, and
 * then it is never throttled.  So the quota is 1% of one cpu (1 ms in each
 * 100 ms period), which more burners than cpus exceed on any host that
 * runs them at all; they spin until the kernel has throttled the box in
 * THROTTLE_PERIODS periods (bounded by WAIT_MS).  Then their cpu time must
 * stay within the quota of the periods the kernel counted (nr_periods),
 * plus one period's (the runtime at hand when the period timer started)
 * and a scheduler tick on each cpu (a task runs to the next tick past the
 * quota; the debt is paid from the next periods).  Without the quota the
 * box is never throttled and the wait fails.  The box gets its 50% back
 * before the spinners are killed. */
#define THROTTLE_PERIODS 5
#define THROTTLE_QUOTA_US 1000
#define TICK_MAX_US 10000 /* HZ=100 */
static void t_throttle(const tp_cgroup_t *cg) {
  tp_cgroup_limits_t lim = {.cpu_quota = THROTTLE_QUOTA_US, .cpu_period = 100000};
  tp_cgroup_stats_t st0 = {0}, st = {0};
  tp_error_t err = {0};
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int k = ncpu < 1 ? 2 : ncpu > 4 ? 8 : (int) ncpu * 2, ok = 1, status, r;
  int64_t p0, p1, t0, t1 = -1, used, budget;
  pid_t burners[8];
  long long end;

  r = tp_cgroup_set_limits(cg, &lim, &err);
  if (r < 0)
    diag("set_limits", &err);
  check(r == 0, "the cpu quota set to %d us in 100 ms", THROTTLE_QUOTA_US);
  tp_cgroup_stats(cg, &st0, NULL);
  p0 = cpu_stat(cg, "nr_periods");
  t0 = cpu_stat(cg, "nr_throttled");
  for (int i = 0; i < k; i++) {
    burners[i] = spawn_in(cg, body_spin);
    ok &= burners[i] > 0;
  }
  check(ok, "%d children spin in the box", k);
  end = now_ms() + WAIT_MS;
  while (ok && now_ms() < end && (t1 = cpu_stat(cg, "nr_throttled")) >= 0 && t1 - t0 < THROTTLE_PERIODS)
    nap_ms(20);
  /* the counters while they still spin; then the quota goes back first, so
   * that the throttled spinners get the cpu to die at once */
  p1 = cpu_stat(cg, "nr_periods");
  r = tp_cgroup_stats(cg, &st, &err);
  lim.cpu_quota = 50000;
  if (tp_cgroup_set_limits(cg, &lim, &err) < 0) {
    diag("set_limits", &err);
    ok = 0;
  }
  check(ok, "the cpu quota is back at 50000 us");
  for (int i = 0; i < k; i++)
    if (burners[i] > 0) {
      kill(burners[i], SIGKILL);
      ok &= wait_pid(burners[i], WAIT_MS, &status) == 0 && killed(status);
    }
  check(ok, "the spinners are killed");
  show("before the spin", &st0);
  show("while they spun", &st);
  check(t0 >= 0 && t1 - t0 >= THROTTLE_PERIODS && st.throttled_usec > st0.throttled_usec,
        "the kernel throttled the box in %" PRId64 " periods (>= %d), for %" PRId64 " us", t1 - t0,
        THROTTLE_PERIODS, st.throttled_usec - st0.throttled_usec);
  if (st.cpu_usage_usec >= 0 && st0.cpu_usage_usec >= 0 && p0 >= 0 && p1 >= p0) {
    used = st.cpu_usage_usec - st0.cpu_usage_usec;
    budget = (p1 - p0 + 1) * THROTTLE_QUOTA_US + (ncpu < 1 ? 1 : ncpu) * TICK_MAX_US;
    check(r == 0 && used > 0 && used <= budget,
          "they used %" PRId64 " us of cpu in %" PRId64 " periods (at most %" PRId64 ")", used, p1 - p0,
          budget);
  }
}

static void t_limits(const tp_cgroup_root_t *root, const char *id) {
  tp_cgroup_limits_t lim = {0};
  tp_cgroup_stats_t st0 = {0}, st = {0};
  tp_cgroup_t cg = {0}, dup = {0};
  tp_error_t err = {0};
  const char *d[TP_CG_NCTRL];
  int has_mem = !!(root->avail & (1u << TP_CG_MEMORY));
  int has_pids = !!(root->avail & (1u << TP_CG_PIDS));
  int has_cpu = !!(root->avail & (1u << TP_CG_CPU));
  pid_t pid;
  int r, status, all, n;

  lim.memory = has_mem ? 64 << 20 : 0;
  lim.pids = has_pids ? 32 : 0;
  lim.cpu_quota = has_cpu ? 50000 : 0;
  lim.cpu_period = 100000;
  r = tp_cgroup_create(root, id, &lim, &cg, &err);
  if (r < 0)
    diag("create", &err);
  check(r == 0, "create %s (v%d): memory 64M, pids 32, cpu 50%%", id, root->version);
  if (r < 0)
    return;
  n = cg_ndirs(&cg, d);

  /* the limits as the kernel holds them */
  if (cg.version == 2) {
    if (has_mem)
      check(file_is(cg.path_v2, "memory.max", "67108864") &&
                (slurp(cg.path_v2, "memory.swap.max") == NULL || file_is(cg.path_v2, "memory.swap.max", "0")),
            "memory.max 64M, memory.swap.max 0");
    if (has_pids)
      check(file_is(cg.path_v2, "pids.max", "32"), "pids.max 32");
    if (has_cpu)
      check(file_is(cg.path_v2, "cpu.max", "50000 100000"), "cpu.max 50000 100000");
    check(file_is(cg.path_v2, "cgroup.subtree_control", ""), "the box enables no controllers below it");
  } else {
    const char *m = cg.path_v1[TP_CG_MEMORY], *c = cg.path_v1[TP_CG_CPU];
    if (has_mem)
      check(file_is(m, "memory.limit_in_bytes", "67108864") &&
                (slurp(m, "memory.memsw.limit_in_bytes") == NULL ||
                 file_is(m, "memory.memsw.limit_in_bytes", "67108864")),
            "memory.limit_in_bytes and memsw 64M");
    if (has_mem)
      check(file_has(m, "memory.oom_control", "oom_kill_disable 0"), "the OOM killer stays on");
    if (has_pids)
      check(file_is(cg.path_v1[TP_CG_PIDS], "pids.max", "32"), "pids.max 32");
    if (has_cpu)
      check(file_is(c, "cpu.cfs_period_us", "100000") && file_is(c, "cpu.cfs_quota_us", "50000"),
            "cfs period 100000, quota 50000");
  }
  r = tp_cgroup_create(root, id, NULL, &dup, &err);
  check(r < 0 && err.code == EEXIST, "a second create of %s is EEXIST", id);
  check(all_exist(n, d), "and leaves the first one alone");
  t_list_open(root, &cg);

  /* attach */
  pid = spawn_in(&cg, body_pause);
  check(pid > 0 && in_cgroup(pid, &cg) == n, "attach puts a child in all %d hierarchies", n);
  check(has_pid(&cg, pid) == 1, "tp_cgroup_pids lists it");
  check(has_own_pid(&cg, pid) == 1, "tp_cgroup_own_pids lists it");
  /* own_pids leaves a sub's out, tp_cgroup_pids walks into it */
  {
    tp_cgroup_t sub = {0};
    if (tp_cgroup_sub(&cg, "own", &sub, &err) == 0) {
      pid_t sp = spawn_in_tree(&cg, &sub, body_pause);
      check(sp > 0 && has_own_pid(&cg, sp) == 0 && has_pid(&cg, sp) == 1 && has_own_pid(&sub, sp) == 1,
            "a process in a sub: not the box's own, but in its pids and the sub's own");
      if (cg.version == 1) {
        const char *sd[TP_CG_NCTRL];
        check(cg_ndirs(&sub, sd) == 1 && in_cgroup(sp, &sub) == 1 && in_cgroup(sp, &cg) == n - 1,
              "v1: the sub is in one hierarchy, its process in the box's cgroup in the %d others "
              "(under the box's limits, counted there)", n - 1);
      }
      if (sp > 0) {
        kill(sp, SIGKILL);
        wait_pid(sp, WAIT_MS, &status);
      }
      check(tp_cgroup_destroy(&sub, &err) == 0, "the sub is removed");
    } else {
      diag("sub", &err);
      check(0, "a sub for own_pids");
    }
  }
  if (pid > 0) {
    kill(pid, SIGKILL);
    wait_pid(pid, WAIT_MS, &status);
  }

  /* enter_fds: a child moves itself */
  {
    int fds[TP_CG_NCTRL], p[2], k;
    char c = 0;
    k = tp_cgroup_enter_fds(&cg, fds, &err);
    check(k == n, "enter_fds opens cgroup.procs in %d hierarchies", k);
    if (k > 0 && pipe2(p, O_CLOEXEC) == 0) {
      pid = fork();
      if (pid == 0) {
        int ok = 1;
        for (int i = 0; i < k; i++)
          ok &= write(fds[i], "0", 1) == 1;
        c = ok ? 'y' : 'n';
        if (write(p[1], &c, 1) != 1)
          _exit(1);
        body_pause();
      }
      close(p[1]);
      if (read(p[0], &c, 1) != 1)
        c = 0;
      close(p[0]);
      check(c == 'y' && in_cgroup(pid, &cg) == n, "a child writing \"0\" enters the box itself");
      kill(pid, SIGKILL);
      wait_pid(pid, WAIT_MS, &status);
    }
    for (int i = 0; i < TP_CG_NCTRL; i++)
      if (fds[i] >= 0)
        close(fds[i]);
  }

  /* pids.max stops a fork bomb */
  if (has_pids) {
    reset_shared();
    pid = spawn_in(&cg, body_forkbomb);
    check(pid > 0 && wait_flag(&S->done, WAIT_MS) == 0, "a fork bomb runs until fork fails");
    check(S->fork_errno == EAGAIN, "fork fails with EAGAIN (%s)", strerror(S->fork_errno));
    check(S->forks >= 1 && S->forks + 1 <= 32, "%d forks + the bomb itself <= 32", S->forks);
    r = tp_cgroup_stats(&cg, &st, &err);
    check(r == 0 && st.pids_current == S->forks + 1, "pids.current is %" PRId64, st.pids_current);
    r = tp_cgroup_kill(&cg, &err);
    if (r < 0)
      diag("kill", &err);
    check(r == 0 && npids(&cg) == 0, "kill empties the box");
    check(wait_pid(pid, WAIT_MS, &status) == 0 && killed(status), "the bomb died of SIGKILL");
    check(reap_orphans(S->forks, WAIT_MS, &all) == S->forks && all, "all %d of its children too",
          S->forks);
  } else {
    skip("no pids controller");
  }

  /* kill without a freezer (v1 hosts that lack one): signal until empty */
  if (cg.version == 1) {
    tp_cgroup_t nofrz = cg;
    nofrz.path_v1[TP_CG_FREEZER] = NULL;
    reset_shared();
    pid = spawn_in(&cg, body_churn);
    check(pid > 0 && wait_flag(&S->done, WAIT_MS) == 0, "a child forks and reaps in a loop");
    r = tp_cgroup_kill(&nofrz, &err);
    if (r < 0)
      diag("kill", &err);
    check(r == 0 && npids(&cg) == 0, "kill without the freezer empties the box");
    check(wait_pid(pid, WAIT_MS, &status) == 0 && killed(status), "the churner died of SIGKILL");
    reap_orphans(1, 200, &all); /* a child caught between fork and reap, if any */
  }

  /* memory: a 200 MiB hog dies, the test lives */
  if (has_mem) {
    tp_cgroup_stats(&cg, &st0, NULL);
    show("before the hog", &st0);
    pid = spawn_in(&cg, body_memhog);
    check(pid > 0 && wait_pid(pid, 30000, &status) == 0 && killed(status),
          "a child touching 200 MiB under a 64M limit is OOM-killed");
    r = tp_cgroup_stats(&cg, &st, &err);
    show("after the hog", &st);
    check(r == 0 && st0.oom_kills >= 0 && st.oom_kills > st0.oom_kills,
          "stats count the OOM kill (%" PRId64 ")", st.oom_kills);
    check(st.memory_peak >= (32 << 20) && st.memory_peak <= (64 << 20) + (1 << 20),
          "peak memory %" PRId64 " is near the limit", st.memory_peak);
    {
      char *mine = malloc(8 << 20);
      int ok = mine != NULL && in_cgroup(getpid(), &cg) == 0;
      if (mine)
        memset(mine, 1, 8 << 20);
      free(mine);
      check(ok, "the test process, outside the box, is untouched");
    }
    /* a hog in a process tree's sub: the box's count must include its kill
     * (a v1 sub in the memory hierarchy, made only where the box has neither
     * a freezer nor a pids hierarchy, counts it in the sub only; v2's
     * memory.events is hierarchical) */
    {
      tp_cgroup_t sub = {0};
      tp_cgroup_stats_t st1 = {0};
      int64_t own = -2;
      r = tp_cgroup_sub(&cg, "hog", &sub, &err);
      if (r < 0)
        diag("sub", &err);
      check(r == 0, "a sub for the hog");
      if (r == 0) {
        tp_cgroup_stats(&cg, &st0, NULL);
        pid = spawn_in_tree(&cg, &sub, body_memhog);
        check(pid > 0 && wait_pid(pid, 30000, &status) == 0 && killed(status),
              "a hog in a sub is OOM-killed by the box's limit");
        own = tp_cgroup_oom_kills(&sub);
        r = tp_cgroup_stats(&cg, &st1, &err);
        show("after the hog in a sub", &st1);
        check(r == 0 && st1.oom_kills == st0.oom_kills + 1,
              "the box's count has the sub's kill (%" PRId64 " -> %" PRId64 ")", st0.oom_kills, st1.oom_kills);
        check(sub.version == 2 || sub.path_v1[TP_CG_MEMORY] == NULL ? own < 0 : own == 1,
              "the sub's own counter: %" PRId64 " (none: a sub has no memory controller on v2, "
              "no memory cgroup on v1 where the box has a freezer or pids hierarchy)", own);
        r = tp_cgroup_destroy(&sub, &err);
        check(r == 0, "the hog's sub is removed");
      }
    }
  } else {
    skip("no memory controller");
  }

  /* cpu quota throttles */
  if (has_cpu)
    t_throttle(&cg);
  else
    skip("no cpu controller");

  /* freeze */
  if (cg.version == 2 || cg.path_v1[TP_CG_FREEZER] != NULL) {
    t_freeze(&cg);
    t_freeze_vfork(&cg);
  } else
    skip("no freezer hierarchy");

  /* oom_score_adj */
  pid = spawn_in(&cg, body_pause);
  if (pid > 0) {
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d", (int) pid);
    r = tp_oom_protect(pid, &err);
    if (has_cap(CAP_SYS_RESOURCE))
      check(r == 0 && file_is(p, "oom_score_adj", "-999"), "tp_oom_protect sets -999");
    else
      check(r < 0 && err.code == EACCES && strstr(err.msg, "CAP_SYS_RESOURCE") != NULL,
            "without CAP_SYS_RESOURCE tp_oom_protect says so (%s)", err.msg);
    kill(pid, SIGKILL);
    wait_pid(pid, WAIT_MS, &status);
    /* denied once, never tried again: a pid that is gone says EACCES too,
     * not ENOENT (no open of its /proc file) */
    if (!has_cap(CAP_SYS_RESOURCE)) {
      tp_error_t e2 = {0};
      r = tp_oom_protect(pid, &e2);
      check(r < 0 && e2.code == EACCES && strstr(e2.msg, "not tried again") != NULL,
            "tp_oom_protect does not try again after EACCES (%s)", e2.msg);
    }
  }

  pid = t_tree_kill(&cg);
  t_destroy(root, &cg, pid);
  tp_cgroup_free(&cg);
}

/* Destroy of an empty box with an empty sub: the box's own rmdir is refused
 * (it has a sub), so the removal goes the long way; nothing is left.  And a
 * second create of a live box's id is EEXIST, not a box made over it. */
static void t_empty_sub(const tp_cgroup_root_t *root, const char *id) {
  tp_cgroup_t cg = {0}, sub = {0}, twice = {0};
  tp_error_t err = {0};
  const char *d[TP_CG_NCTRL], *sd[TP_CG_NCTRL];
  char *dirs[2 * TP_CG_NCTRL] = {0};
  int n, sn, r;

  r = tp_cgroup_create(root, id, NULL, &cg, &err);
  if (r < 0)
    diag("create", &err);
  check(r == 0, "create %s (no limits)", id);
  if (r < 0)
    return;
  r = tp_cgroup_create(root, id, NULL, &twice, &err);
  check(r < 0 && err.code == EEXIST, "a second create of %s is EEXIST (%s)", id, err.msg);
  r = tp_cgroup_sub(&cg, "s1", &sub, &err);
  if (r < 0)
    diag("sub", &err);
  check(r == 0, "an empty sub s1");
  n = cg_ndirs(&cg, d);
  sn = r == 0 ? cg_ndirs(&sub, sd) : 0;
  for (int i = 0; i < n; i++)
    dirs[i] = strdup(d[i]);
  for (int i = 0; i < sn; i++)
    dirs[n + i] = strdup(sd[i]);
  tp_cgroup_free(&sub); /* the box's destroy removes it */
  r = tp_cgroup_destroy(&cg, &err);
  if (r < 0)
    diag("destroy", &err);
  check(r == 0 && cg.id == NULL, "destroy the empty box with its empty sub");
  check(!any_dir_left(n + sn, (const char *const *) dirs), "no directory left of the box or its sub");
  for (int i = 0; i < n + sn; i++)
    free(dirs[i]);
  tp_cgroup_free(&cg);
}

int main(void) {
  tp_cgroup_root_t root = {0};
  tp_error_t err = {0};
  char id1[32], id2[32];
  char *ids[] = {id1, id2};
  int r;

  if ((r = cg_test_begin()) != 0)
    return r;
  snprintf(id1, sizeof(id1), "t%d-limits", (int) getpid());
  snprintf(id2, sizeof(id2), "t%d-rollback", (int) getpid());

  if (tp_cgroup_detect(NULL, &root, &err) < 0) {
    printf("# host cgroups: %s\n", err.msg);
    printf("1..0 # SKIP no host cgroups\n");
    return 77;
  }
  printf("# host cgroups: v%d at %s\n", root.version, root.dir);
  t_validation(&root);
  t_rollback(&root, id2);
  t_limits(&root, id1);
  t_empty_sub(&root, id2);
  check(tp_cgroup_prune(&root, &err) == 0, "prune the tupper parents");
  tp_cgroup_root_free(&root);

  cg_test_end(ids, 2);
  return S->failed ? 1 : 0;
}
