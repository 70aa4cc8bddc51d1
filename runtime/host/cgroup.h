/* tupper linux backend: one cgroup per box, on cgroup v2 or v1.
 *
 * Layout.  Every box gets "tupper/<id>" below the mount point of each
 * hierarchy we use: on v2 the one cgroup2 mount, on v1 the memory, pids, cpu,
 * cpuacct and freezer hierarchies (whichever are mounted; cpu and cpuacct may
 * share one).  The box cgroup carries the limits.  "tupper/<id>/<name>" (a
 * "sub") groups one process tree so that the tree can be killed whole, setsid
 * and double-fork included.
 *
 * Where processes live.  The agent (the box's PID 1) stays in the box cgroup
 * itself; each process tree the daemon wants to kill as a unit goes in a sub.
 * On v2 this is allowed because the box's cgroup.subtree_control stays empty:
 * the "no internal processes" rule only forbids a cgroup to hold processes
 * while it enables controllers for its children.  The subs therefore have no
 * controllers of their own; everything in them is charged to, and limited by,
 * the box (cgroup.freeze and cgroup.kill are core files and work on them).
 * On v1 a sub exists in the freezer hierarchy of its box only (which lists
 * and freezes a tree; without a freezer, the first of pids and memory the
 * box has): in memory, pids, cpu and cpuacct the process stays in the box
 * cgroup itself, under its limits and counted there, as a v2 sub without
 * controllers is (a sub in those would only cost each tree a mkdir, an
 * rmdir and an attach more in each).
 *
 * Writes.  Nothing is written outside the cgroup root given to
 * tp_cgroup_detect() (/sys/fs/cgroup by default): v1 hierarchies mounted
 * elsewhere are ignored.  Only tp_oom_protect() writes to /proc.
 *
 * Out of memory.  A box's memory limit is enforced by the kernel's OOM killer
 * inside the box cgroup (left enabled; memory.oom.group stays 0 so only the
 * offender dies).  The agent must not be the victim: the daemon calls
 * tp_oom_protect(agent) (oom_score_adj -999) right after the box starts, and
 * each child of the agent is set back to 0 (a forked one before its exec, a
 * CLONE_VM one by the agent right after it: agent_proc.c).  Lowering
 * oom_score_adj needs CAP_SYS_RESOURCE; without it tp_oom_protect fails with
 * EACCES (and from then on at once, without trying: the daemon's
 * capabilities do not come back), and the daemon carries on: the agent is
 * small, so it is rarely the
 * largest process in its box anyway.  -999, not -1000 (the OOM killer's
 * "never"): a value set by a privileged writer becomes the floor every box
 * process may lower itself back to (oom_score_adj_min is inherited), and a
 * box of processes at -1000 would hang on OOM instead of losing one.  At
 * -999 the agent's score is about its size minus 99.9% of the limit, so the
 * OOM killer takes any process at 0 first, and of the processes that went
 * down to -999 the one using the most memory; the agent only when nothing
 * else is left to take.
 *
 * Every function taking `err` returns < 0 and sets it on failure. */
#ifndef TP_CGROUP_H
#define TP_CGROUP_H

#include <stdint.h>
#include <sys/types.h>

#include "error.h"

#define TP_CGROUP_ROOT "/sys/fs/cgroup" /* default for tp_cgroup_detect() */
#define TP_CGROUP_PARENT "tupper"        /* every box cgroup lives below this dir */
#define TP_CGROUP_TIMEOUT_MS 5000        /* bound of freeze, thaw and kill waits */

/* Controllers we use; on v1 each may be its own hierarchy. */
enum tp_cgroup_ctrl {
  TP_CG_MEMORY,
  TP_CG_PIDS,
  TP_CG_CPU,
  TP_CG_CPUACCT, /* v1 only: cpu usage (on v2 cpu.stat is always there) */
  TP_CG_FREEZER, /* v1 only: on v2 cgroup.freeze is a core file */
  TP_CG_NCTRL
};

/* Where the cgroup filesystems are: detected once by the daemon at start. */
typedef struct tp_cgroup_root_s {
  int version;            /* 1 or 2 */
  char *dir;              /* the root given to tp_cgroup_detect, resolved */
  char *v2;               /* v2: the cgroup2 mount point */
  char *v1[TP_CG_NCTRL];  /* v1: mount point of each controller's hierarchy, NULL if none */
  unsigned avail;         /* bit (1u << ctrl) per usable controller; v2: memory, pids and cpu
                             as the root's cgroup.controllers lists them (freeze and kill
                             always work on v2, cpu usage is always in cpu.stat) */
} tp_cgroup_root_t;

typedef struct tp_cgroup_limits_s {
  int64_t memory;     /* bytes, 0 = no limit.  v2: memory.max and memory.swap.max = 0
                         (if the file exists); v1: memory.limit_in_bytes, then
                         memory.memsw.limit_in_bytes = the same (if it exists) */
  int64_t pids;       /* pids.max, 0 = no limit */
  int64_t cpu_quota;  /* microseconds of cpu per period (>= 1000), 0 = no limit;
                         50% of one cpu = 50000 with the default period */
  int64_t cpu_period; /* microseconds, 1000..1000000; 0 = default 100000 */
} tp_cgroup_limits_t;

/* A box cgroup (sub == NULL) or one of its subs.  Owned strings. */
typedef struct tp_cgroup_s {
  int version;                /* 1 or 2 */
  char *id;                   /* box id */
  char *sub;                  /* sub name, NULL for the box itself */
  char *path_v2;              /* v2: <mount>/tupper/<id>[/<sub>] */
  char *path_v1[TP_CG_NCTRL]; /* v1: that dir in each hierarchy, NULL if not mounted;
                                 equal strings when controllers share a hierarchy */
} tp_cgroup_t;

/* Counters of a box (or sub); -1 where the kernel does not provide one. */
typedef struct tp_cgroup_stats_s {
  int64_t memory_current; /* bytes: memory.current / memory.usage_in_bytes */
  int64_t memory_peak;    /* bytes: memory.peak / memory.max_usage_in_bytes */
  int64_t cpu_usage_usec; /* cpu.stat usage_usec / cpuacct.usage / 1000 */
  int64_t nr_throttled;   /* cpu.stat nr_throttled */
  int64_t throttled_usec; /* cpu.stat throttled_usec / throttled_time / 1000 */
  int64_t pids_current;   /* pids.current */
  int64_t oom_kills;      /* v2: memory.events oom_kill (hierarchical: a box's counts its
                             subs'; a sub has no memory controller, so none); v1: the
                             oom_kill of memory.oom_control of cg, plus each sub's for a
                             box (v1 counts a kill in the victim's cgroup only) */
} tp_cgroup_stats_t;

/* Finds the cgroup filesystems below root_dir (NULL: /sys/fs/cgroup).  If
 * root_dir is a cgroup2 mount, that is the hierarchy (v2), with the
 * controllers its cgroup.controllers lists (possibly none).  Otherwise the v1
 * hierarchies of memory, pids, cpu, cpuacct and freezer mounted below root_dir
 * are taken from /proc/self/mountinfo; ENOTSUP if there are none.  Tests pass
 * a private cgroup2 mount.  Free with tp_cgroup_root_free. */
int tp_cgroup_detect(const char *root_dir, tp_cgroup_root_t *root, tp_error_t *err);
void tp_cgroup_root_free(tp_cgroup_root_t *root);

/* 1 if id (or a sub name) matches [a-z0-9][a-z0-9-]{0,62}, else 0. */
int tp_cgroup_valid_name(const char *name);

/* Creates tupper/<id> with the given limits (lim may be NULL: no limits).
 * The "tupper" parent is made on demand.  On v2, memory, pids and cpu are
 * enabled in the root's and tupper's cgroup.subtree_control where available
 * (a failure to enable one that no limit needs is ignored: it only costs its
 * stats).  A nonzero limit whose controller is missing fails with EOPNOTSUPP
 * naming the controller; an existing tupper/<id> fails with EEXIST and is left
 * alone.  On any failure nothing that was made here is left behind. */
int tp_cgroup_create(const tp_cgroup_root_t *root, const char *id,
                     const tp_cgroup_limits_t *lim, tp_cgroup_t *cg, tp_error_t *err);

/* Writes nonzero limits of lim to an existing box cgroup (a box taken from
 * the daemon's pool of ready boxes gets the limits its creator asked for).
 * A limit whose controller is missing fails with EOPNOTSUPP. */
int tp_cgroup_set_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, tp_error_t *err);

/* Re-opens an existing tupper/<id> (a restarted daemon re-adopting a box):
 * ENOENT if it exists in no hierarchy.  On v1, hierarchies where it is
 * missing get a NULL path. */
int tp_cgroup_open(const tp_cgroup_root_t *root, const char *id, tp_cgroup_t *cg,
                   tp_error_t *err);

/* Sorted ids of every tupper/<id> present (in any hierarchy), for crash
 * recovery.  Free with tp_cgroup_list_free. */
int tp_cgroup_list(const tp_cgroup_root_t *root, char ***ids, size_t *n, tp_error_t *err);
void tp_cgroup_list_free(char **ids, size_t n);

/* Creates sub cgroup tupper/<id>/<name> of box cg (v1: in the freezer
 * hierarchy only; EEXIST if present: a tree
 * always gets a fresh one; nesting subs is EINVAL).  Destroy it with
 * tp_cgroup_destroy when its tree is gone (the box's destroy removes it too). */
int tp_cgroup_sub(const tp_cgroup_t *cg, const char *name, tp_cgroup_t *sub, tp_error_t *err);

/* The distinct directories of cg, one per hierarchy, each of which lists
 * cg's processes in its cgroup.procs: on v2 the one dir, on v1 each mounted
 * hierarchy's once (controllers sharing one count once), in controller
 * order, so dirs[0] is the first controller's.  Returns how many. */
int tp_cgroup_dirs(const tp_cgroup_t *cg, const char *dirs[TP_CG_NCTRL]);

/* Moves process pid (its whole thread group) into cg in every hierarchy.  On
 * failure it may be in some of them: the caller should kill it. */
int tp_cgroup_attach(const tp_cgroup_t *cg, pid_t pid, tp_error_t *err);

/* For a child that must enter cg itself, e.g. before it unshares its cgroup
 * namespace so that the namespace is rooted at the box: opens cgroup.procs of
 * each of cg's hierarchies for writing (O_CLOEXEC).  fds[] gets them, the
 * rest -1; returns how many.  The child writes "0" to each (async-signal-safe:
 * a plain write), the parent closes them all. */
int tp_cgroup_enter_fds(const tp_cgroup_t *cg, int fds[TP_CG_NCTRL], tp_error_t *err);
/* The same for a single-threaded child that writes "0" (itself): on v1 each
 * hierarchy's `tasks`, which moves the writing thread alone, so the kernel
 * takes no lock over every thread group of the host (a write of cgroup.procs
 * takes it, and waits for an RCU grace period when no move came shortly
 * before: 10-20 ms on a loaded machine, against 0.06 ms for `tasks`).  v2's
 * domain cgroups have no such file: cgroup.procs there. */
int tp_cgroup_enter_fds_self(const tp_cgroup_t *cg, int fds[TP_CG_NCTRL], tp_error_t *err);

/* Freezes (frozen != 0) or thaws cg and its subs, waiting until the kernel
 * reports it done (v2: cgroup.events "frozen"; v1: freezer.state), at most
 * TP_CGROUP_TIMEOUT_MS: then ETIMEDOUT, and a freeze is undone.  ENOTSUP on v1
 * without a freezer hierarchy. */
int tp_cgroup_freeze(const tp_cgroup_t *cg, int frozen, tp_error_t *err);

/* SIGKILLs every process in cg and its subs and waits (bounded) until none is
 * left; cg ends up thawed (even if it was frozen) and empty.  v2: cgroup.kill;
 * else (v1, or v2 before 5.14) freeze, signal every pid listed, thaw, and
 * signal what is still listed until nothing is.  Without a freezer (v1) only
 * that last loop runs.  A pid is signalled through a pidfd taken while it is
 * listed, so a pid reused by an unrelated process is never hit.  Exited but
 * unreaped children of the caller (the agent) do not count as left: the
 * caller still reaps them.  On v1, a sub of a frozen box cannot be killed
 * (its tasks stay frozen): thaw the box first, or kill the box. */
int tp_cgroup_kill(const tp_cgroup_t *cg, tp_error_t *err);

/* Sorted, distinct host pids (thread group ids) in cg and its subs. */
int tp_cgroup_pids(const tp_cgroup_t *cg, pid_t **pids, size_t *n, tp_error_t *err);
/* The host pids listed in cg's own cgroup.procs (on v1 the trees' hierarchy),
 * its subs' left out, unsorted: O(1) in the number of subs, where
 * tp_cgroup_pids walks them all (a process the agent just forked is here). */
int tp_cgroup_own_pids(const tp_cgroup_t *cg, pid_t **pids, size_t *n, tp_error_t *err);

int tp_cgroup_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st, tp_error_t *err);

/* The OOM kills counted in cg as stats' oom_kills has them, without the
 * other counters (a process's end asks whether its tree lost one); -1
 * where the kernel keeps no such counter for cg. */
int64_t tp_cgroup_oom_kills(const tp_cgroup_t *cg);

/* Kills everything in cg, removes its subs and then cg itself in every
 * hierarchy (ENOENT counts as removed) and frees cg.  An rmdir is tried
 * first in each: a cgroup the kernel lets go held no process and no sub,
 * and only one it refuses is listed and killed.  Idempotent: a freed cg
 * is a no-op.  On failure cg is left intact for a retry (or tp_cgroup_free).
 * The "tupper" parent stays: see tp_cgroup_prune. */
int tp_cgroup_destroy(tp_cgroup_t *cg, tp_error_t *err);

/* Frees cg's strings without touching the kernel; idempotent. */
void tp_cgroup_free(tp_cgroup_t *cg);

/* Removes the "tupper" parent dirs that are empty (daemon shutdown, tests);
 * a parent still holding boxes is left. */
int tp_cgroup_prune(const tp_cgroup_root_t *root, tp_error_t *err);

/* Writes -999 to /proc/<pid>/oom_score_adj: the OOM killer picks pid last.
 * EACCES (with a hint) without CAP_SYS_RESOURCE.  See the top of this file. */
int tp_oom_protect(pid_t pid, tp_error_t *err);

#endif
