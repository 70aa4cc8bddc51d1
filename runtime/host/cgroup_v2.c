/* Box cgroups on v2: the one cgroup2 mount and its controllers, enabling
 * them for children, the v2 limit files, cgroup.freeze (waits sleep in
 * poll() on cgroup.events: the kernel signals POLLPRI on change), v2
 * counters. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cgroup_int.h"
#include "utils.h"

int tp__cg_v2_detect(tp_cgroup_root_t *root, tp_error_t *err) {
  cleanup_free char *ctl = tp__cg_read(root->dir, "cgroup.controllers", err);
  root->version = 2;
  root->v2 = strdup(root->dir);
  if (ctl == NULL || root->v2 == NULL) {
    if (root->v2 == NULL)
      tp_error_errno(err, ENOMEM, "cgroup root");
    return -1;
  }
  for (int c = TP_CG_MEMORY; c <= TP_CG_CPU; c++)
    if (tp__cg_has_word(ctl, tp__cg_ctrl_name[c]))
      root->avail |= 1u << c;
  return 0;
}

/* v2: enables controllers `want` for dir's children; a failure matters only
 * for those in `need`. */
int tp__cg_v2_enable(const char *dir, unsigned want, unsigned need, tp_error_t *err) {
  cleanup_free char *avail = tp__cg_read(dir, "cgroup.controllers", err);
  cleanup_free char *on = avail ? tp__cg_read(dir, "cgroup.subtree_control", err) : NULL;
  char val[16];

  if (on == NULL)
    return -1;
  for (int c = TP_CG_MEMORY; c <= TP_CG_CPU; c++) {
    if (!(want & (1u << c)) || tp__cg_has_word(on, tp__cg_ctrl_name[c]))
      continue;
    if (!tp__cg_has_word(avail, tp__cg_ctrl_name[c])) {
      if (need & (1u << c))
        return tp_error_set(err, EOPNOTSUPP, "the %s controller is not available in '%s'",
                            tp__cg_ctrl_name[c], dir);
      continue;
    }
    snprintf(val, sizeof(val), "+%s", tp__cg_ctrl_name[c]);
    if (tp__cg_write(dir, "cgroup.subtree_control", val, 0, err) < 0 && (need & (1u << c))) {
      if (err != NULL && err->code == EBUSY)
        tp_error_prefix(err, "'%s' holds processes of its own, move them to a child cgroup first",
                        dir);
      return -1;
    }
  }
  return 0;
}

int tp__cg_v2_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, int64_t period,
                           tp_error_t *err) {
  char v[64];
  if (lim->memory) {
    snprintf(v, sizeof(v), "%" PRId64, lim->memory);
    if (tp__cg_write(cg->path_v2, "memory.max", v, 0, err) < 0 ||
        tp__cg_write(cg->path_v2, "memory.swap.max", "0", 1, err) < 0)
      return -1;
  }
  if (lim->pids) {
    snprintf(v, sizeof(v), "%" PRId64, lim->pids);
    if (tp__cg_write(cg->path_v2, "pids.max", v, 0, err) < 0)
      return -1;
  }
  if (lim->cpu_quota) {
    snprintf(v, sizeof(v), "%" PRId64 " %" PRId64, lim->cpu_quota, period);
    if (tp__cg_write(cg->path_v2, "cpu.max", v, 0, err) < 0)
      return -1;
  }
  return 0;
}

/* v2: waits until cgroup.events of dir says key == want. */
int tp__cg_v2_wait_event(const char *dir, const char *key, int64_t want, long long deadline,
                         tp_error_t *err) {
  cleanup_free char *p = NULL;
  cleanup_close int fd = -1;
  char buf[512];

  if (asprintf(&p, "%s/cgroup.events", dir) < 0) {
    p = NULL;
    return tp_error_errno(err, ENOMEM, "wait on '%s'", dir);
  }
  fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return tp_error_errno(err, errno, "open '%s'", p);
  for (;;) {
    struct pollfd pfd = {fd, POLLPRI, 0};
    ssize_t r = pread(fd, buf, sizeof(buf) - 1, 0);
    long long left;
    if (r < 0)
      return tp_error_errno(err, errno, "read '%s'", p);
    buf[r] = '\0';
    if (tp__cg_keyed(buf, key) == want)
      return 0;
    left = deadline - tp__cg_now_ms();
    if (left <= 0)
      return tp_error_set(err, ETIMEDOUT, "'%s' still not %s %" PRId64 " after %d ms", p, key,
                          want, TP_CGROUP_TIMEOUT_MS);
    /* woken by the kernel's notification; re-read at least every 50 ms anyway */
    if (poll(&pfd, 1, left < 50 ? (int) left : 50) < 0 && errno != EINTR)
      return tp_error_errno(err, errno, "poll '%s'", p);
  }
}

int tp__cg_v2_freeze(const char *dir, int frozen, long long deadline, tp_error_t *err) {
  if (tp__cg_write(dir, "cgroup.freeze", frozen ? "1" : "0", 0, err) < 0 ||
      tp__cg_v2_wait_event(dir, "frozen", frozen ? 1 : 0, deadline, err) < 0) {
    if (frozen) /* do not leave it half frozen */
      tp__cg_write(dir, "cgroup.freeze", "0", 0, NULL);
    return -1;
  }
  return 0;
}

void tp__cg_v2_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st) {
  const char *d = cg->path_v2;
  cleanup_free char *cpu = tp__cg_read(d, "cpu.stat", NULL);
  st->memory_current = tp__cg_read_num(d, "memory.current");
  st->memory_peak = tp__cg_read_num(d, "memory.peak");
  st->cpu_usage_usec = cpu ? tp__cg_keyed(cpu, "usage_usec") : -1;
  st->nr_throttled = cpu ? tp__cg_keyed(cpu, "nr_throttled") : -1;
  st->throttled_usec = cpu ? tp__cg_keyed(cpu, "throttled_usec") : -1;
  st->pids_current = tp__cg_read_num(d, "pids.current");
  st->oom_kills = tp__cg_read_keyed(d, "memory.events", "oom_kill");
}
