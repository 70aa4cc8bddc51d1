/* What the tests of backends/linux/cgroup.c (test_cgroup, the host's
 * cgroups; test_cgroup_private, private cgroup mounts) share: the TAP
 * counters in memory shared with forked children (so parts run in their
 * own process, and workloads, can report), bounded waits, reading cgroup
 * files, the workloads every part runs, the scenarios both v1 and v2 run,
 * and the set-up and the sweep of leftovers.
 *
 * Every wait is bounded (polls with short naps or the module's own bounded
 * waits); the one fixed interval is the 100 ms window in which a frozen
 * counter must not move.  A test is a child subreaper, so orphans come back
 * to it.  Include this after the test's include block (the libc headers,
 * cgroup.h); its functions are static, and a test uses the ones it needs. */
#ifndef TP_CGROUP_TEST_H
#define TP_CGROUP_TEST_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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

/* pid in tp_cgroup_own_pids(cg): 1, 0, or -1 on error. */
static int has_own_pid(const tp_cgroup_t *cg, pid_t pid) {
  pid_t *pids;
  size_t n;
  int found = 0;
  tp_error_t err = {0};
  if (tp_cgroup_own_pids(cg, &pids, &n, &err) < 0) {
    diag("own pids", &err);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    found |= pids[i] == pid;
  free(pids);
  return found;
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

/* vfork()s and reaps children that exit at once, as fast as it can (a
 * shell such as dash runs its commands this way): a freeze catches it in
 * the clone call now and then, with its child frozen before the child
 * could release it. */
static void body_vforker(void) {
  for (;;) {
    pid_t p = vfork();
    if (p == 0)
      _exit(0);
    if (p > 0)
      waitpid(p, NULL, 0);
    __atomic_add_fetch(&S->counter, 1, __ATOMIC_SEQ_CST);
  }
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

/* Forks a child that runs body once it has been attached to box (if not
 * NULL: first, as the daemon's trees are made of the box's processes; on v1
 * a sub is in one hierarchy, the process in the box's own in the others)
 * and then to cg. */
static pid_t spawn_in_tree(const tp_cgroup_t *box, const tp_cgroup_t *cg, void (*body)(void)) {
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
  if (pid < 0 || (box != NULL && tp_cgroup_attach(box, pid, &err) < 0) ||
      tp_cgroup_attach(cg, pid, &err) < 0) {
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

/* Forks a child that runs body once it has been attached to cg. */
static pid_t spawn_in(const tp_cgroup_t *cg, void (*body)(void)) { return spawn_in_tree(NULL, cg, body); }

static void reset_shared(void) {
  S->counter = 0;
  S->forks = 0;
  S->fork_errno = 0;
  S->done = 0;
  S->gpid = 0;
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

/* Freezes and thaws a box of vfork()ing children FREEZE_ROUNDS times.  On
 * a v1 freezer, a parent that the freeze's pass over the tasks finds still
 * inside vfork(), and that then sleeps waiting for a child the pass froze,
 * stays unfrozen: freezer.state reads FREEZING until FROZEN is written
 * again.  Each freeze must end (tp_cgroup_freeze writes FROZEN again while
 * it waits); before it did, every run here failed within its first 3
 * freezes (they stayed FREEZING until the 5 s bound). */
#define FREEZE_ROUNDS 100
static void t_freeze_vfork(const tp_cgroup_t *cg) {
  tp_error_t err = {0};
  pid_t pid[2];
  long long t0, worst = 0;
  int st, r = 0, i, n = 0;

  reset_shared();
  for (i = 0; i < 2; i++)
    pid[i] = spawn_in(cg, body_vforker);
  check(pid[0] > 0 && pid[1] > 0, "two vfork()ing children are attached");
  for (i = 0; i < FREEZE_ROUNDS && pid[0] > 0 && pid[1] > 0; i++) {
    long c = __atomic_load_n(&S->counter, __ATOMIC_SEQ_CST);
    long long end = now_ms() + WAIT_MS;
    while (__atomic_load_n(&S->counter, __ATOMIC_SEQ_CST) == c && now_ms() < end)
      nap_ms(1); /* thawed and running again */
    t0 = now_ms();
    r = tp_cgroup_freeze(cg, 1, &err);
    if (now_ms() - t0 > worst)
      worst = now_ms() - t0;
    if (r < 0) {
      diag("freeze", &err);
      break;
    }
    n++;
    r = tp_cgroup_freeze(cg, 0, &err);
    if (r < 0) {
      diag("thaw", &err);
      break;
    }
  }
  check(r == 0 && n == FREEZE_ROUNDS, "%d of %d freezes of vfork()ing children ended (the longest %lld ms)",
        n, FREEZE_ROUNDS, worst);
  r = tp_cgroup_kill(cg, &err);
  if (r < 0)
    diag("kill", &err);
  for (i = 0; i < 2; i++)
    check(pid[i] > 0 && wait_pid(pid[i], WAIT_MS, &st) == 0 && killed(st), "vforker %d died of SIGKILL", i);
  reap_orphans(2, 200, &st); /* a child caught between vfork and reap, if any */
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
  top = spawn_in_tree(cg, &sub, body_tree);
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

/* Root, the shared counters, a child subreaper; 0, or the exit code. */
static int cg_test_begin(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root\n");
    return 77;
  }
  S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (S == MAP_FAILED)
    return 1;
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return 0;
}

/* Sweeps what the test's boxes left (on a v1 host, in the unified
 * hierarchy too) and prints the plan. */
static void cg_test_end(char *const ids[], int n) {
  sweep(NULL, ids, n);
  if (exists(TP_CGROUP_ROOT "/unified"))
    sweep(TP_CGROUP_ROOT "/unified", ids, n);
  printf("1..%d\n", S->num);
}

#pragma GCC diagnostic pop

#endif
