/* Drives backends/linux/cgroup.c against the real kernel.
 *
 * Part 1 uses the host's own cgroups (v1 on the CI VM, v2 on most desktops):
 * limits are read back and then enforced (a fork bomb stops at pids.max, a
 * memory hog is OOM-killed, a cpu burner is throttled), freeze stops a
 * counter, a sub cgroup is killed whole (setsid + double fork included) while
 * its sibling lives on, destroy leaves nothing.
 * Part 2 mounts a cgroup2 filesystem in a private mount namespace (a forked
 * child) and runs the v2 paths there: no controllers are bound to it on a v1
 * host, so it checks that a limit is refused by name, and exercises attach,
 * cgroup.freeze, cgroup.kill and destroy.
 * Part 3 (v1 hosts) mounts only the pids and freezer hierarchies under a
 * private root whose path has a space, and checks that the host's other
 * hierarchies, outside that root, are left alone.
 *
 * Every wait is bounded (polls with short naps or the module's own bounded
 * waits); the one fixed interval is the 100 ms window in which a frozen
 * counter must not move.  The test is a child subreaper, so orphans come back
 * to it.  Exit 0 pass, 1 fail, 77 skip (not root, or no cgroups at all). */
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

#define WAIT_MS 10000

/* Shared with forked children, so the v2 part (in its own process) and the
 * workloads can report. */
typedef struct shared_s {
  int num, failed, skipped;
  volatile long counter;   /* the freeze workload's progress */
  volatile int forks;      /* the fork bomb's successes */
  volatile int fork_errno; /* and the errno that stopped it */
  volatile int done;
  volatile pid_t gpid;     /* the setsid'd grandchild of a tree */
} shared_t;

static shared_t *S;

static void check(int ok, const char *fmt, ...) TP_PRINTF(2, 3);
static void check(int ok, const char *fmt, ...) {
  va_list ap;
  printf("%s %d - ", ok ? "ok" : "not ok", ++S->num);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
  if (!ok)
    S->failed++;
}

static void skip(const char *why) {
  printf("ok %d - # SKIP %s\n", ++S->num, why);
  fflush(stdout);
  S->skipped++;
}

static void diag(const char *what, const tp_error_t *err) {
  printf("# %s: [%d] %s\n", what, err->code, err->msg);
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Waits (bounded) until *flag becomes nonzero. */
static int wait_flag(volatile int *flag, long ms) {
  long long end = now_ms() + ms;
  while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST)) {
    if (now_ms() > end)
      return -1;
    nap_ms(1);
  }
  return 0;
}

/* Reaps pid (bounded): 0 and *status, or -1. */
static int wait_pid(pid_t pid, long ms, int *status) {
  long long end = now_ms() + ms;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid)
      return 0;
    if (r < 0 && errno != ECHILD && errno != EINTR)
      return -1;
    if (now_ms() > end)
      return -1;
    nap_ms(2); /* an orphan may not have been handed to us yet (ECHILD) */
  }
}

static void show(const char *what, const tp_cgroup_stats_t *st) {
  printf("# stats %s: mem %" PRId64 " peak %" PRId64 " cpu %" PRId64 " us, throttled %" PRId64 " / %" PRId64
         " us, pids %" PRId64 ", oom kills %" PRId64 "\n",
         what, st->memory_current, st->memory_peak, st->cpu_usage_usec, st->nr_throttled,
         st->throttled_usec, st->pids_current, st->oom_kills);
}

static int killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

/* Reaps up to n orphans (bounded); returns how many, all SIGKILLed in *all_killed. */
static int reap_orphans(int n, long ms, int *all_killed) {
  long long end = now_ms() + ms;
  int got = 0, st;
  *all_killed = 1;
  while (got < n && now_ms() <= end) {
    pid_t r = waitpid(-1, &st, WNOHANG);
    if (r > 0) {
      got++;
      *all_killed &= killed(st);
    } else {
      nap_ms(2);
    }
  }
  return got;
}

static char *slurp(const char *dir, const char *file) {
  static char buf[8192];
  char p[4096];
  int fd;
  ssize_t n;
  snprintf(p, sizeof(p), "%s/%s", dir, file);
  fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n < 0)
    return NULL;
  buf[n] = '\0';
  if (n > 0 && buf[n - 1] == '\n')
    buf[n - 1] = '\0';
  return buf;
}

static int file_is(const char *dir, const char *file, const char *want) {
  const char *got = dir ? slurp(dir, file) : NULL;
  if (got == NULL || strcmp(got, want) != 0) {
    printf("# %s/%s: want '%s', got '%s'\n", dir ? dir : "(none)", file, want, got ? got : "(unreadable)");
    return 0;
  }
  return 1;
}

static int file_has(const char *dir, const char *file, const char *needle) {
  const char *got = dir ? slurp(dir, file) : NULL;
  if (got == NULL || strstr(got, needle) == NULL) {
    printf("# %s/%s: want '%s' in '%s'\n", dir ? dir : "(none)", file, needle, got ? got : "(unreadable)");
    return 0;
  }
  return 1;
}

static int exists(const char *p) {
  struct stat st;
  return p != NULL && lstat(p, &st) == 0;
}

/* The distinct dirs of cg (as the module counts hierarchies). */
static int cg_ndirs(const tp_cgroup_t *cg, const char *d[TP_CG_NCTRL]) {
  int n = 0;
  if (cg->version == 2) {
    d[n++] = cg->path_v2;
    return n;
  }
  for (int c = 0; c < TP_CG_NCTRL; c++) {
    int dup = cg->path_v1[c] == NULL;
    for (int i = 0; i < n && !dup; i++)
      dup = strcmp(d[i], cg->path_v1[c]) == 0;
    if (!dup)
      d[n++] = cg->path_v1[c];
  }
  return n;
}

static int all_exist(int n, const char *const d[]) {
  for (int i = 0; i < n; i++)
    if (!exists(d[i]))
      return 0;
  return n > 0;
}

static int any_dir_left(int n, const char *const d[]) {
  for (int i = 0; i < n; i++)
    if (exists(d[i])) {
      printf("# left behind: %s\n", d[i]);
      return 1;
    }
  return 0;
}

/* How many lines of /proc/<pid>/cgroup put pid in cgroup "/tupper/<id>[/<sub>]". */
static int in_cgroup(pid_t pid, const tp_cgroup_t *cg) {
  char p[64], want[256], line[1024];
  FILE *f;
  int n = 0;
  snprintf(p, sizeof(p), "/proc/%d/cgroup", (int) pid);
  snprintf(want, sizeof(want), "/" TP_CGROUP_PARENT "/%s%s%s", cg->id, cg->sub ? "/" : "",
           cg->sub ? cg->sub : "");
  f = fopen(p, "re");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    char *path = strchr(line, ':');
    path = path ? strchr(path + 1, ':') : NULL;
    if (path == NULL)
      continue;
    path[1 + strcspn(path + 1, "\n")] = '\0';
    n += strcmp(path + 1, want) == 0;
  }
  fclose(f);
  return n;
}

static int has_pid(const tp_cgroup_t *cg, pid_t pid) {
  pid_t *pids;
  size_t n;
  int found = 0;
  tp_error_t err = {0};
  if (tp_cgroup_pids(cg, &pids, &n, &err) < 0) {
    diag("pids", &err);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    found |= pids[i] == pid;
  free(pids);
  return found;
}

static size_t npids(const tp_cgroup_t *cg) {
  pid_t *pids;
  size_t n;
  if (tp_cgroup_pids(cg, &pids, &n, NULL) < 0)
    return (size_t) -1;
  free(pids);
  return n;
}

static int listed(const tp_cgroup_root_t *root, const char *id) {
  char **ids;
  size_t n;
  int found = 0;
  tp_error_t err = {0};
  if (tp_cgroup_list(root, &ids, &n, &err) < 0) {
    diag("list", &err);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    found |= strcmp(ids[i], id) == 0;
  tp_cgroup_list_free(ids, n);
  return found;
}

/* ---- workloads (run in children, end with _exit) ------------------------------ */

static void body_pause(void) {
  for (;;)
    pause();
}

static void body_counter(void) {
  for (;;)
    __atomic_add_fetch(&S->counter, 1, __ATOMIC_SEQ_CST);
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

/* Burns 60 ms of cpu time (at most 5 s of wall time). */
static void body_cpuburn(void) {
  long long start = now_ms();
  volatile unsigned long x = 0;
  struct timespec cpu;
  do {
    for (int i = 0; i < 100000; i++)
      x++;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  } while ((cpu.tv_sec * 1000 + cpu.tv_nsec / 1000000) < 60 && now_ms() - start < 5000);
  _exit(0);
}

/* A tree that tries to escape: a grandchild that setsid()s, forks again and
 * lets its parent exit, so the great-grandchild is orphaned in its own session. */
static void body_tree(void) {
  pid_t p = fork();
  if (p == 0) {
    setsid();
    if (fork() == 0) {
      S->gpid = getpid();
      __atomic_store_n(&S->done, 1, __ATOMIC_SEQ_CST);
      body_pause();
    }
    _exit(0);
  }
  body_pause();
}

/* Forks a child that runs body once it has been attached to cg. */
static pid_t spawn_in(const tp_cgroup_t *cg, void (*body)(void)) {
  int p[2];
  pid_t pid;
  char c = 'x';
  tp_error_t err = {0};

  if (pipe2(p, O_CLOEXEC) < 0)
    return -1;
  pid = fork();
  if (pid == 0) {
    close(p[1]);
    if (read(p[0], &c, 1) != 1)
      _exit(99);
    body();
    _exit(0);
  }
  close(p[0]);
  if (pid < 0 || tp_cgroup_attach(cg, pid, &err) < 0) {
    if (pid > 0) {
      diag("attach", &err);
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
    }
    close(p[1]);
    return -1;
  }
  if (write(p[1], &c, 1) != 1)
    c = 0;
  close(p[1]);
  return pid;
}

static void reset_shared(void) {
  S->counter = 0;
  S->forks = 0;
  S->fork_errno = 0;
  S->done = 0;
  S->gpid = 0;
}

static int has_cap(int cap) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) < 0)
    return 0;
  return (d[cap / 32].effective >> (cap % 32)) & 1;
}

/* ---- shared scenarios (v1 and v2) -------------------------------------------- */

static void t_freeze(const tp_cgroup_t *cg) {
  tp_error_t err = {0};
  pid_t pid;
  long c1, c2;
  int st, r;

  reset_shared();
  pid = spawn_in(cg, body_counter);
  check(pid > 0, "a counting child is attached");
  if (pid <= 0)
    return;
  check(wait_flag((volatile int *) &S->counter, WAIT_MS) == 0, "the counter runs");
  r = tp_cgroup_freeze(cg, 1, &err);
  if (r < 0)
    diag("freeze", &err);
  check(r == 0, "freeze returns once the kernel reports frozen");
  if (cg->version == 2)
    check(file_is(cg->path_v2, "cgroup.freeze", "1") && file_has(cg->path_v2, "cgroup.events", "frozen 1"),
          "cgroup.freeze is 1, cgroup.events says frozen 1");
  else
    check(file_is(cg->path_v1[TP_CG_FREEZER], "freezer.state", "FROZEN"), "freezer.state is FROZEN");
  c1 = __atomic_load_n(&S->counter, __ATOMIC_SEQ_CST);
  nap_ms(100);
  c2 = __atomic_load_n(&S->counter, __ATOMIC_SEQ_CST);
  check(c1 == c2, "frozen: the counter stays at %ld for 100 ms (now %ld)", c1, c2);
  r = tp_cgroup_freeze(cg, 0, &err);
  if (r < 0)
    diag("thaw", &err);
  check(r == 0, "thaw");
  {
    long long end = now_ms() + WAIT_MS;
    while (__atomic_load_n(&S->counter, __ATOMIC_SEQ_CST) == c2 && now_ms() < end)
      nap_ms(1);
  }
  check(S->counter != c2, "thawed: the counter moves again");
  r = tp_cgroup_freeze(cg, 1, &err) == 0 ? tp_cgroup_kill(cg, &err) : -1;
  if (r < 0)
    diag("freeze + kill", &err);
  check(r == 0, "kill a frozen box");
  check(wait_pid(pid, WAIT_MS, &st) == 0 && killed(st), "the frozen child died of SIGKILL");
  if (cg->version == 2)
    check(file_is(cg->path_v2, "cgroup.freeze", "0"), "the box is thawed after the kill");
  else
    check(file_is(cg->path_v1[TP_CG_FREEZER], "freezer.state", "THAWED"), "the box is thawed after the kill");
}

/* A sub cgroup holding a tree with a setsid'd, double-forked grandchild is
 * killed whole; a sibling in the box itself lives on. */
static pid_t t_tree_kill(const tp_cgroup_t *cg) {
  tp_cgroup_t sub = {0}, bad = {0};
  tp_error_t err = {0};
  pid_t by = -1, top = -1, gp;
  const char *d[TP_CG_NCTRL];
  int n, st, all, r;

  r = tp_cgroup_sub(cg, "../x", &bad, &err);
  check(r < 0 && err.code == EINVAL, "a sub named '../x' is refused (%s)", err.msg);
  r = tp_cgroup_sub(cg, "p1", &sub, &err);
  if (r < 0)
    diag("sub", &err);
  check(r == 0, "sub cgroup p1");
  if (r < 0)
    return -1;
  n = cg_ndirs(&sub, d);
  check(all_exist(n, d), "p1 exists in all %d hierarchies", n);
  r = tp_cgroup_sub(cg, "p1", &bad, &err);
  check(r < 0 && err.code == EEXIST, "a second p1 is EEXIST");
  r = tp_cgroup_sub(&sub, "p2", &bad, &err);
  check(r < 0 && err.code == EINVAL, "a sub of a sub is refused");

  reset_shared();
  by = spawn_in(cg, body_pause);
  top = spawn_in(&sub, body_tree);
  check(by > 0 && top > 0, "a bystander in the box, a tree in p1");
  if (by <= 0 || top <= 0)
    goto out;
  check(in_cgroup(top, &sub) == n, "/proc/<pid>/cgroup puts the tree in p1 in all %d hierarchies", n);
  check(wait_flag(&S->done, WAIT_MS) == 0, "the tree's grandchild setsid'd and double-forked");
  gp = S->gpid;
  check(getsid(gp) > 0 && getsid(gp) != getsid(0) && has_pid(&sub, gp) == 1,
        "the orphan (pid %d) is in another session, and in p1", (int) gp);
  check(has_pid(cg, gp) == 1 && has_pid(&sub, by) == 0, "box pids include p1's; p1's exclude the box's");
  r = tp_cgroup_kill(&sub, &err);
  if (r < 0)
    diag("kill", &err);
  check(r == 0, "kill p1");
  check(npids(&sub) == 0, "p1 is empty");
  check(wait_pid(top, WAIT_MS, &st) == 0 && killed(st), "the tree's root died of SIGKILL");
  check(wait_pid(gp, WAIT_MS, &st) == 0 && killed(st), "the escaped grandchild died of SIGKILL");
  reap_orphans(1, 1000, &all); /* the intermediate, exited 0 */
  check(kill(by, 0) == 0 && waitpid(by, &st, WNOHANG) == 0, "the bystander in the box lives");
  r = tp_cgroup_destroy(&sub, &err);
  check(r == 0 && !any_dir_left(n, d) && sub.id == NULL, "destroy p1 removes it");
  check(has_pid(cg, by) == 1, "the bystander is still in the box");
out:
  tp_cgroup_free(&sub);
  return by; /* the caller's t_destroy kills it */
}

/* Destroy with a live process; nothing remains; again is a no-op. */
static void t_destroy(const tp_cgroup_root_t *root, tp_cgroup_t *cg, pid_t live) {
  tp_cgroup_t again = {0};
  tp_error_t err = {0};
  const char *d[TP_CG_NCTRL];
  char *dirs[TP_CG_NCTRL] = {0};
  char id[64];
  int n, r, st;

  snprintf(id, sizeof(id), "%s", cg->id);
  n = cg_ndirs(cg, d);
  for (int i = 0; i < n; i++)
    dirs[i] = strdup(d[i]);
  r = tp_cgroup_destroy(cg, &err);
  if (r < 0)
    diag("destroy", &err);
  check(r == 0 && cg->id == NULL, "destroy the box");
  if (live > 0)
    check(wait_pid(live, WAIT_MS, &st) == 0 && killed(st), "its last process died of SIGKILL");
  check(!any_dir_left(n, (const char *const *) dirs), "no directory left in any of %d hierarchies", n);
  check(tp_cgroup_destroy(cg, &err) == 0, "destroy again is a no-op");
  r = tp_cgroup_open(root, id, &again, &err);
  check(r < 0 && err.code == ENOENT, "open after destroy is ENOENT");
  check(listed(root, id) == 0, "list no longer has it");
  for (int i = 0; i < n; i++)
    free(dirs[i]);
}

static void t_list_open(const tp_cgroup_root_t *root, const tp_cgroup_t *cg) {
  tp_cgroup_t o = {0};
  tp_error_t err = {0};
  int r;
  check(listed(root, cg->id) == 1, "list finds %s", cg->id);
  r = tp_cgroup_open(root, cg->id, &o, &err);
  check(r == 0 && o.version == cg->version &&
            strcmp(cg->version == 2 ? o.path_v2 : o.path_v1[TP_CG_PIDS] ? o.path_v1[TP_CG_PIDS] : "",
                   cg->version == 2 ? cg->path_v2 : cg->path_v1[TP_CG_PIDS] ? cg->path_v1[TP_CG_PIDS] : "") == 0,
        "open finds it at the same paths");
  tp_cgroup_free(&o);
  r = tp_cgroup_open(root, "no-such-box", &o, &err);
  check(r < 0 && err.code == ENOENT, "open of an absent box is ENOENT");
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
  } else {
    skip("no memory controller");
  }

  /* cpu quota throttles: more burners than cpus, so that the box wants far
   * more than its 50% even on a busy host, and is throttled for it */
  if (has_cpu) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int k = ncpu < 1 ? 2 : ncpu > 4 ? 8 : (int) ncpu * 2, ok = 1;
    pid_t burners[8];
    long long t0, wall;

    tp_cgroup_stats(&cg, &st0, NULL);
    t0 = now_ms();
    for (int i = 0; i < k; i++)
      burners[i] = spawn_in(&cg, body_cpuburn);
    for (int i = 0; i < k; i++)
      ok &= burners[i] > 0 && wait_pid(burners[i], WAIT_MS, &status) == 0 && WIFEXITED(status);
    wall = now_ms() - t0;
    check(ok, "%d children burn 60 ms of cpu time each", k);
    check(wall >= k * 60 * 2 - 150, "at 50%% of one cpu that took %lld ms (>= %d)", wall, k * 60 * 2 - 150);
    r = tp_cgroup_stats(&cg, &st, &err);
    show("before the burn", &st0);
    show("after the burn", &st);
    check(r == 0 && st.nr_throttled > st0.nr_throttled && st.throttled_usec > st0.throttled_usec,
          "they were throttled: nr_throttled %" PRId64 ", throttled %" PRId64 " us", st.nr_throttled,
          st.throttled_usec);
    if (st.cpu_usage_usec >= 0)
      check(st.cpu_usage_usec - st0.cpu_usage_usec >= k * 60000 * 9 / 10,
            "cpu usage grew by %" PRId64 " us (~%d)", st.cpu_usage_usec - st0.cpu_usage_usec, k * 60000);
  } else {
    skip("no cpu controller");
  }

  /* freeze */
  if (cg.version == 2 || cg.path_v1[TP_CG_FREEZER] != NULL)
    t_freeze(&cg);
  else
    skip("no freezer hierarchy");

  /* oom_score_adj */
  pid = spawn_in(&cg, body_pause);
  if (pid > 0) {
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d", (int) pid);
    r = tp_oom_protect(pid, &err);
    if (has_cap(CAP_SYS_RESOURCE))
      check(r == 0 && file_is(p, "oom_score_adj", "-1000"), "tp_oom_protect sets -1000");
    else
      check(r < 0 && err.code == EACCES && strstr(err.msg, "CAP_SYS_RESOURCE") != NULL,
            "without CAP_SYS_RESOURCE tp_oom_protect says so (%s)", err.msg);
    kill(pid, SIGKILL);
    wait_pid(pid, WAIT_MS, &status);
  }

  pid = t_tree_kill(&cg);
  t_destroy(root, &cg, pid);
  tp_cgroup_free(&cg);
}

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

/* Whatever a crashed step left: destroy the test boxes, prune the parents. */
static void sweep(const char *root_dir, char *const ids[], int n) {
  tp_cgroup_root_t root;
  if (tp_cgroup_detect(root_dir, &root, NULL) < 0)
    return;
  for (int i = 0; i < n; i++) {
    tp_cgroup_t cg;
    if (tp_cgroup_open(&root, ids[i], &cg, NULL) == 0) {
      printf("# sweeping leftover %s under %s\n", ids[i], root_dir);
      S->failed++;
      if (tp_cgroup_destroy(&cg, NULL) < 0)
        tp_cgroup_free(&cg);
    }
  }
  tp_cgroup_prune(&root, NULL);
  tp_cgroup_root_free(&root);
}

int main(void) {
  tp_cgroup_root_t root = {0};
  tp_error_t err = {0};
  char id1[32], id2[32], id3[32], id4[32];
  char *ids[] = {id1, id2, id3, id4};
  int have_host, root_version, v1, v2;

  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root\n");
    return 77;
  }
  S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED)
    return 1;
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  snprintf(id1, sizeof(id1), "t%d-limits", (int) getpid());
  snprintf(id2, sizeof(id2), "t%d-rollback", (int) getpid());
  snprintf(id3, sizeof(id3), "t%d-v2", (int) getpid());
  snprintf(id4, sizeof(id4), "t%d-v1", (int) getpid());

  have_host = tp_cgroup_detect(NULL, &root, &err) == 0;
  root_version = root.version;
  if (have_host) {
    printf("# host cgroups: v%d at %s\n", root.version, root.dir);
    t_validation(&root);
    t_rollback(&root, id2);
    t_limits(&root, id1);
    check(tp_cgroup_prune(&root, &err) == 0, "prune the tupper parents");
    tp_cgroup_root_free(&root);
  } else {
    printf("# host cgroups: %s\n", err.msg);
  }

  v2 = v2_private(id3);
  if (v2 == 77)
    skip("cgroup2 cannot be mounted here");
  else
    check(v2 == 0, "the cgroup2 part ran to the end");

  if (have_host && root_version == 1) {
    v1 = v1_private(id4);
    if (v1 == 77)
      skip("no private v1 root (pids and freezer hierarchies)");
    else
      check(v1 == 0, "the private v1 part ran to the end");
  }

  sweep(NULL, ids, 4);
  if (exists(TP_CGROUP_ROOT "/unified"))
    sweep(TP_CGROUP_ROOT "/unified", ids, 4);
  printf("1..%d\n", S->num);
  if (!have_host && v2 == 77)
    return 77;
  return S->failed ? 1 : 0;
}
