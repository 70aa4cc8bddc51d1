/* Box cgroups on v1: the hierarchies of our controllers found in
 * mountinfo, the v1 limit files, the freezer (the kernel offers no event:
 * freezer.state is polled with short, growing naps), v1 counters. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cgroup_int.h"
#include "utils.h"

/* ---- detection -------------------------------------------------------------------- */

/* Decodes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s) {
  char *o = s;
  for (; *s; s++) {
    if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
        s[3] >= '0' && s[3] <= '7') {
      *o++ = (char) ((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
      s += 3;
    } else {
      *o++ = *s;
    }
  }
  *o = '\0';
}

static int under(const char *path, const char *dir) {
  size_t n = strlen(dir);
  if (strcmp(dir, "/") == 0)
    return 1;
  return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* One mountinfo line: if it is a v1 cgroup mount below dir, take its controllers. */
static int v1_line(char *line, tp_cgroup_root_t *root) {
  char *field[16], *save = NULL, *tok, *opts;
  int n = 0, sep = -1;

  for (tok = strtok_r(line, " \n", &save); tok != NULL && n < 16; tok = strtok_r(NULL, " \n", &save)) {
    if (sep < 0 && n >= 6 && strcmp(tok, "-") == 0)
      sep = n;
    field[n++] = tok;
  }
  if (sep < 0 || sep + 3 >= n || strcmp(field[sep + 1], "cgroup") != 0)
    return 0;
  unescape(field[4]);
  if (!under(field[4], root->dir))
    return 0;
  opts = field[sep + 3];
  for (tok = strtok_r(opts, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save))
    for (int c = 0; c < TP_CG_NCTRL; c++)
      if (strcmp(tok, tp__cg_ctrl_name[c]) == 0 && root->v1[c] == NULL) {
        root->v1[c] = strdup(field[4]);
        if (root->v1[c] == NULL)
          return -1;
        root->avail |= 1u << c;
      }
  return 0;
}

int tp__cg_v1_detect(tp_cgroup_root_t *root, tp_error_t *err) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  char *line = NULL;
  size_t cap = 0;
  int ret = 0;

  if (f == NULL)
    return tp_error_errno(err, errno, "open /proc/self/mountinfo");
  while (getline(&line, &cap, f) > 0)
    if (v1_line(line, root) < 0) {
      ret = tp_error_errno(err, ENOMEM, "parse /proc/self/mountinfo");
      break;
    }
  free(line);
  fclose(f);
  if (ret == 0 && root->avail == 0)
    ret = tp_error_set(err, ENOTSUP,
                       "no cgroup2 mount and no v1 memory, pids, cpu or freezer hierarchy at '%s'",
                       root->dir);
  return ret;
}

int tp__cg_v1_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, int64_t period,
                           tp_error_t *err) {
  char v[32];
  if (lim->memory) {
    /* memsw must stay >= the memory limit: memory first (memsw is unlimited now) */
    snprintf(v, sizeof(v), "%" PRId64, lim->memory);
    if (tp__cg_write(cg->path_v1[TP_CG_MEMORY], "memory.limit_in_bytes", v, 0, err) < 0 ||
        tp__cg_write(cg->path_v1[TP_CG_MEMORY], "memory.memsw.limit_in_bytes", v, 1, err) < 0)
      return -1;
  }
  if (lim->pids) {
    snprintf(v, sizeof(v), "%" PRId64, lim->pids);
    if (tp__cg_write(cg->path_v1[TP_CG_PIDS], "pids.max", v, 0, err) < 0)
      return -1;
  }
  if (lim->cpu_quota) {
    snprintf(v, sizeof(v), "%" PRId64, period);
    if (period != 0 && tp__cg_write(cg->path_v1[TP_CG_CPU], "cpu.cfs_period_us", v, 0, err) < 0)
      return -1;
    snprintf(v, sizeof(v), "%" PRId64, lim->cpu_quota);
    if (tp__cg_write(cg->path_v1[TP_CG_CPU], "cpu.cfs_quota_us", v, 0, err) < 0)
      return -1;
  }
  return 0;
}

/* How often a freeze that still reads FREEZING writes FROZEN again.  A write
 * of FROZEN makes one pass over the cgroup's tasks: a task asleep in a
 * freezable wait is frozen there, one that is running gets a fake signal and
 * freezes on its way back to user space.  A task the pass finds running in
 * the kernel that then goes to sleep in a freezable wait that no signal ends
 * is never looked at again: a vfork() parent (dash runs commands so) caught
 * inside the clone call, that then waits for the child the pass froze before
 * it could exec.  freezer.state stays FREEZING until the next write, which
 * finds it asleep and freezes it (seen here on 4 freezes in 100 of a
 * vforking shell; 10 to 20 ms after a second write). */
#define CG_V1_REFREEZE_MS 25

/* v1: waits until freezer.state of dir reads want; while a freeze reads
 * FREEZING, writes FROZEN again every CG_V1_REFREEZE_MS. */
int tp__cg_v1_wait_state(const char *dir, const char *want, long long deadline, tp_error_t *err) {
  long ms = 1;
  int freeze = strcmp(want, "FROZEN") == 0, writes = 1;
  long long last = tp__cg_now_ms();
  for (;;) {
    cleanup_free char *st = tp__cg_read(dir, "freezer.state", err);
    long long now;
    if (st == NULL)
      return -1;
    st[strcspn(st, "\n")] = '\0';
    if (strcmp(st, want) == 0)
      return 0;
    now = tp__cg_now_ms();
    if (now >= deadline) {
      if (freeze)
        return tp_error_set(err, ETIMEDOUT,
                            "'%s/freezer.state' still %s after %d ms and %d writes of FROZEN: a "
                            "task in it never reached a point where it could be frozen "
                            "(an uninterruptible sleep, as on a stalled file system)",
                            dir, st, TP_CGROUP_TIMEOUT_MS, writes);
      return tp_error_set(err, ETIMEDOUT, "'%s/freezer.state' still %s after %d ms", dir, st,
                          TP_CGROUP_TIMEOUT_MS);
    }
    if (freeze && strcmp(st, "FREEZING") == 0 && now - last >= CG_V1_REFREEZE_MS) {
      if (tp__cg_write(dir, "freezer.state", "FROZEN", 0, err) < 0)
        return -1;
      last = now;
      writes++;
      continue; /* read at once: the pass may have been all it took */
    }
    tp__cg_nap_ms(ms);
    if (ms < 16)
      ms *= 2;
  }
}

int tp__cg_v1_freeze(const char *dir, int frozen, long long deadline, tp_error_t *err) {
  const char *want = frozen ? "FROZEN" : "THAWED";
  if (tp__cg_write(dir, "freezer.state", want, 0, err) < 0 ||
      tp__cg_v1_wait_state(dir, want, deadline, err) < 0) {
    if (frozen) /* do not leave it half frozen */
      tp__cg_write(dir, "freezer.state", "THAWED", 0, NULL);
    return -1;
  }
  return 0;
}

void tp__cg_v1_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st) {
  int64_t v;
  st->memory_current = tp__cg_read_num(cg->path_v1[TP_CG_MEMORY], "memory.usage_in_bytes");
  st->memory_peak = tp__cg_read_num(cg->path_v1[TP_CG_MEMORY], "memory.max_usage_in_bytes");
  v = tp__cg_read_num(cg->path_v1[TP_CG_CPUACCT], "cpuacct.usage");
  st->cpu_usage_usec = v < 0 ? -1 : v / 1000;
  st->nr_throttled = tp__cg_read_keyed(cg->path_v1[TP_CG_CPU], "cpu.stat", "nr_throttled");
  v = tp__cg_read_keyed(cg->path_v1[TP_CG_CPU], "cpu.stat", "throttled_time");
  st->throttled_usec = v < 0 ? -1 : v / 1000;
  st->pids_current = tp__cg_read_num(cg->path_v1[TP_CG_PIDS], "pids.current");
  st->oom_kills = tp__cg_v1_oom_kills(cg);
}

/* v1 counts an OOM kill in the victim's own memory cgroup only, never in
 * its parents' (v2's memory.events is hierarchical): a box's count is its
 * own plus each of its subs'. */
int64_t tp__cg_v1_oom_kills(const tp_cgroup_t *cg) {
  const char *dir = cg->path_v1[TP_CG_MEMORY];
  struct dirent *e;
  int64_t total, v;
  DIR *d;

  if (dir == NULL)
    return -1;
  total = tp__cg_read_keyed(dir, "memory.oom_control", "oom_kill");
  if (total < 0 || cg->sub != NULL)
    return total;
  d = opendir(dir);
  if (d == NULL)
    return total;
  while ((e = readdir(d)) != NULL) {
    char sub[PATH_MAX];
    if (!tp_cgroup_valid_name(e->d_name) ||
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name) >= (int) sizeof(sub) || !tp__cg_is_dir(sub))
      continue;
    v = tp__cg_read_keyed(sub, "memory.oom_control", "oom_kill");
    if (v > 0)
      total += v;
  }
  closedir(d);
  return total;
}
