/* Box cgroups on v2 or v1: see cgroup.h for the layout and the rules.
 *
 * A cgroup object is a set of directories, one per hierarchy (one on v2, up
 * to five on v1, fewer when controllers share a mount).  Most operations are
 * "for each distinct directory, do X", so cg_dirs() lists them once.
 * Waits are bounded by TP_CGROUP_TIMEOUT_MS: on v2 they sleep in poll() on
 * cgroup.events (the kernel signals POLLPRI on change), on v1 the kernel
 * offers no event and they poll the file with short, growing naps. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cgroup_int.h"
#include "utils.h"

#define CG_MAX_DEPTH 8      /* subs are one level deep; anything deeper is refused */
#define CG_BUSY_RETRIES 100 /* rmdir EBUSY right after the last exit: retry, 1 ms apart */
#define CG_PIN_BATCH 128    /* pidfds held at once while killing */

const char *const tp__cg_ctrl_name[TP_CG_NCTRL] = {"memory", "pids", "cpu", "cpuacct", "freezer"};

typedef struct cg_dirs_s {
  const char *d[TP_CG_NCTRL];
  int n;
} cg_dirs_t;

static void dirs_add(cg_dirs_t *ds, const char *d) {
  if (d == NULL)
    return;
  for (int i = 0; i < ds->n; i++)
    if (strcmp(ds->d[i], d) == 0)
      return;
  ds->d[ds->n++] = d;
}

int tp_cgroup_dirs(const tp_cgroup_t *cg, const char *dirs[TP_CG_NCTRL]) {
  cg_dirs_t ds = {.n = 0};
  if (cg->version == 2) {
    dirs_add(&ds, cg->path_v2);
  } else {
    for (int c = 0; c < TP_CG_NCTRL; c++)
      dirs_add(&ds, cg->path_v1[c]);
  }
  for (int i = 0; i < ds.n; i++)
    dirs[i] = ds.d[i];
  return ds.n;
}

/* The distinct directories of cg, one per hierarchy. */
static void cg_dirs(const tp_cgroup_t *cg, cg_dirs_t *ds) { ds->n = tp_cgroup_dirs(cg, ds->d); }

/* The distinct mount points of root. */
static void root_mounts(const tp_cgroup_root_t *root, cg_dirs_t *ds) {
  ds->n = 0;
  if (root->version == 2) {
    dirs_add(ds, root->v2);
    return;
  }
  for (int c = 0; c < TP_CG_NCTRL; c++)
    dirs_add(ds, root->v1[c]);
}

int tp_cgroup_valid_name(const char *name) { return tp_name_valid(name); }

void tp_cgroup_root_free(tp_cgroup_root_t *root) {
  free(root->dir);
  free(root->v2);
  for (int c = 0; c < TP_CG_NCTRL; c++)
    free(root->v1[c]);
  memset(root, 0, sizeof(*root));
}

int tp_cgroup_detect(const char *root_dir, tp_cgroup_root_t *root, tp_error_t *err) {
  struct statfs sfs;
  memset(root, 0, sizeof(*root));
  if (root_dir == NULL)
    root_dir = TP_CGROUP_ROOT;
  root->dir = realpath(root_dir, NULL);
  if (root->dir == NULL)
    return tp_error_errno(err, errno, "cgroup root '%s'", root_dir);
  if (statfs(root->dir, &sfs) < 0) {
    tp_error_errno(err, errno, "statfs '%s'", root->dir);
    tp_cgroup_root_free(root);
    return -1;
  }
  if (sfs.f_type == CGROUP2_SUPER_MAGIC) {
    if (tp__cg_v2_detect(root, err) < 0) {
      tp_cgroup_root_free(root);
      return -1;
    }
    return 0;
  }
  root->version = 1;
  if (tp__cg_v1_detect(root, err) < 0) {
    tp_cgroup_root_free(root);
    return -1;
  }
  return 0;
}

/* ---- objects ---------------------------------------------------------------------- */

void tp_cgroup_free(tp_cgroup_t *cg) {
  free(cg->id);
  free(cg->sub);
  free(cg->path_v2);
  for (int c = 0; c < TP_CG_NCTRL; c++)
    free(cg->path_v1[c]);
  memset(cg, 0, sizeof(*cg));
}

/* out's paths = each base that is set + "/" + rel. */
static int set_paths(tp_cgroup_t *out, const char *base_v2, char *const base_v1[TP_CG_NCTRL],
                     const char *rel, tp_error_t *err) {
  if (out->version == 2) {
    if (asprintf(&out->path_v2, "%s/%s", base_v2, rel) < 0) {
      out->path_v2 = NULL;
      return tp_error_errno(err, ENOMEM, "cgroup path");
    }
    return 0;
  }
  for (int c = 0; c < TP_CG_NCTRL; c++)
    if (base_v1[c] != NULL && asprintf(&out->path_v1[c], "%s/%s", base_v1[c], rel) < 0) {
      out->path_v1[c] = NULL;
      return tp_error_errno(err, ENOMEM, "cgroup path");
    }
  return 0;
}

/* Fills cg for box id under root (no kernel access). */
static int box_init(tp_cgroup_t *cg, const tp_cgroup_root_t *root, const char *id,
                    tp_error_t *err) {
  cleanup_free char *rel = NULL;
  memset(cg, 0, sizeof(*cg));
  if (!tp_cgroup_valid_name(id))
    return tp_error_set(err, EINVAL, "invalid box id '%s' (want [a-z0-9][a-z0-9-]{0,62})",
                        id ? id : "(null)");
  if (root == NULL || (root->version != 1 && root->version != 2))
    return tp_error_set(err, EINVAL, "cgroup root not detected");
  cg->version = root->version;
  cg->id = strdup(id);
  if (cg->id == NULL || asprintf(&rel, TP_CGROUP_PARENT "/%s", id) < 0) {
    rel = NULL;
    tp_cgroup_free(cg);
    return tp_error_errno(err, ENOMEM, "cgroup %s", id);
  }
  if (set_paths(cg, root->v2, root->v1, rel, err) < 0) {
    tp_cgroup_free(cg);
    return -1;
  }
  return 0;
}

/* dir's parent, as a fresh string. */
static char *parent_of(const char *dir) {
  const char *slash = strrchr(dir, '/');
  return strndup(dir, slash && slash != dir ? (size_t) (slash - dir) : 1);
}

/* ---- create ----------------------------------------------------------------------- */

static int check_limits(const tp_cgroup_limits_t *lim, tp_error_t *err) {
  if (lim->memory < 0 || lim->pids < 0 || lim->cpu_quota < 0 || lim->cpu_period < 0)
    return tp_error_set(err, EINVAL, "negative cgroup limit");
  if (lim->cpu_period != 0 && (lim->cpu_period < 1000 || lim->cpu_period > 1000000))
    return tp_error_set(err, EINVAL, "cpu period %" PRId64 " us out of 1000..1000000",
                        lim->cpu_period);
  if (lim->cpu_quota != 0 && lim->cpu_quota < 1000)
    return tp_error_set(err, EINVAL, "cpu quota %" PRId64 " us below 1000", lim->cpu_quota);
  return 0;
}

/* Controllers the nonzero limits need. */
static unsigned limits_need(const tp_cgroup_limits_t *lim) {
  return (lim->memory ? 1u << TP_CG_MEMORY : 0) | (lim->pids ? 1u << TP_CG_PIDS : 0) |
         (lim->cpu_quota ? 1u << TP_CG_CPU : 0);
}

/* mkdir that reports whether it made the dir (1) or found it (0). */
static int mkdir_made(const char *p, tp_error_t *err) {
  if (mkdir(p, 0755) == 0)
    return 1;
  if (errno == EEXIST && tp__cg_is_dir(p))
    return 0;
  return tp_error_errno(err, errno, "mkdir '%s'", p);
}

/* Makes dir ds->d[i]; with made_parent (a box), its parent on demand too, on
 * v2 with controllers `want` enabled for its children.  err->code is ENOENT
 * if a concurrent prune removed the parent under us. */
static int make_one(const cg_dirs_t *ds, int i, int version, unsigned want, unsigned need,
                    int made_parent[], int made[], tp_error_t *err) {
  cleanup_free char *parent = parent_of(ds->d[i]);
  int r;
  if (parent == NULL)
    return tp_error_errno(err, ENOMEM, "mkdir '%s'", ds->d[i]);
  /* v1, a box: the parent is nearly always there already, and needs no
   * controllers enabled; it is made (and the mkdir retried) only when the
   * box's mkdir finds it missing.  Saves a mkdir and an lstat on each of
   * the hierarchies a box. */
  if (made_parent != NULL && version == 1) {
    if (mkdir(ds->d[i], 0755) == 0) {
      made[i] = 1;
      return 0;
    }
    if (errno != ENOENT)
      return tp_error_errno(err, errno, "mkdir '%s'", ds->d[i]);
  }
  if (made_parent != NULL) {
    r = mkdir_made(parent, err);
    if (r < 0)
      return -1;
    made_parent[i] |= r;
    if (version == 2 && tp__cg_v2_enable(parent, want, need, err) < 0)
      return -1;
  }
  if (mkdir(ds->d[i], 0755) < 0)
    return tp_error_errno(err, errno, "mkdir '%s'", ds->d[i]);
  made[i] = 1;
  return 0;
}

/* Makes every dir of ds (see make_one), recording what it made; an existing
 * one is EEXIST.  The empty "tupper" parent may be pruned by another process
 * between its mkdir and ours: that is retried. */
static int make_dirs(const cg_dirs_t *ds, int version, unsigned want, unsigned need,
                     int made_parent[], int made[], tp_error_t *err) {
  for (int i = 0; i < ds->n; i++) {
    tp_error_t e = {0};
    int r, tries = 0;
    while ((r = make_one(ds, i, version, want, need, made_parent, made, &e)) < 0 &&
           e.code == ENOENT && made_parent != NULL && ++tries < 3)
      ;
    if (r < 0) {
      if (err != NULL)
        *err = e;
      return -1;
    }
  }
  return 0;
}

static void unmake_dirs(const cg_dirs_t *ds, const int made_parent[], const int made[]) {
  int saved = errno;
  for (int i = ds->n - 1; i >= 0; i--) {
    if (made[i])
      rmdir(ds->d[i]);
    if (made_parent && made_parent[i]) {
      char *parent = parent_of(ds->d[i]);
      if (parent != NULL)
        rmdir(parent);
      free(parent);
    }
  }
  errno = saved;
}

int tp_cgroup_set_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, tp_error_t *err) {
  int64_t period;
  if (cg->sub != NULL)
    return tp_error_set(err, EINVAL, "limits belong to a box, not to a sub");
  if (check_limits(lim, err) < 0)
    return tp_error_prefix(err, "limits of cgroup %s", cg->id);
  period = lim->cpu_period ? lim->cpu_period : 100000;
  if (cg->version == 1) {
    static const int ctrl_of[] = {TP_CG_MEMORY, TP_CG_PIDS, TP_CG_CPU};
    unsigned need = limits_need(lim);
    for (size_t i = 0; i < sizeof(ctrl_of) / sizeof(ctrl_of[0]); i++)
      if ((need & (1u << ctrl_of[i])) && cg->path_v1[ctrl_of[i]] == NULL)
        return tp_error_set(err, EOPNOTSUPP, "a %s limit needs the %s controller",
                            tp__cg_ctrl_name[ctrl_of[i]], tp__cg_ctrl_name[ctrl_of[i]]);
  }
  if ((cg->version == 2 ? tp__cg_v2_limits(cg, lim, period, err)
                        : tp__cg_v1_limits(cg, lim, period, err)) < 0)
    return tp_error_prefix(err, "limits of cgroup %s", cg->id);
  return 0;
}

int tp_cgroup_create(const tp_cgroup_root_t *root, const char *id, const tp_cgroup_limits_t *lim,
                     tp_cgroup_t *cg, tp_error_t *err) {
  static const tp_cgroup_limits_t none;
  unsigned need, want = 0;
  int made_parent[TP_CG_NCTRL] = {0}, made[TP_CG_NCTRL] = {0};
  int64_t period;
  cg_dirs_t ds;

  if (lim == NULL)
    lim = &none;
  if (box_init(cg, root, id, err) < 0)
    return -1;
  if (check_limits(lim, err) < 0)
    goto fail;
  /* v1: a new cgroup's period is the kernel's default, 100 ms, whatever
   * its parent's: the default is not written (0), one write a box fewer,
   * each a bandwidth update of the kernel's.  v2's cpu.max takes both in
   * one write. */
  period = lim->cpu_period ? lim->cpu_period : root->version == 2 ? 100000 : 0;
  need = limits_need(lim);
  for (int c = TP_CG_MEMORY; c <= TP_CG_CPU; c++)
    if ((need & (1u << c)) && !(root->avail & (1u << c))) {
      tp_error_set(err, EOPNOTSUPP, "a %s limit needs the %s controller, which %s '%s' lacks",
                   tp__cg_ctrl_name[c], tp__cg_ctrl_name[c], root->version == 2 ? "the cgroup2 mount" : "the v1 root",
                   root->dir);
      goto fail;
    }
  if (root->version == 2) {
    want = root->avail & ((1u << TP_CG_MEMORY) | (1u << TP_CG_PIDS) | (1u << TP_CG_CPU));
    if (tp__cg_v2_enable(root->v2, want, need, err) < 0)
      goto fail;
  }
  cg_dirs(cg, &ds);
  if (make_dirs(&ds, root->version, want, need, made_parent, made, err) < 0)
    goto undo;
  if ((root->version == 2 ? tp__cg_v2_limits(cg, lim, period, err)
                          : tp__cg_v1_limits(cg, lim, period, err)) < 0)
    goto undo;
  return 0;

undo:
  unmake_dirs(&ds, made_parent, made);
fail:
  tp_error_prefix(err, "create cgroup %s", id);
  tp_cgroup_free(cg);
  return -1;
}

int tp_cgroup_open(const tp_cgroup_root_t *root, const char *id, tp_cgroup_t *cg,
                   tp_error_t *err) {
  int found = 0;
  if (box_init(cg, root, id, err) < 0)
    return -1;
  if (cg->version == 2) {
    found = tp__cg_is_dir(cg->path_v2);
  } else {
    for (int c = 0; c < TP_CG_NCTRL; c++) {
      if (cg->path_v1[c] != NULL && !tp__cg_is_dir(cg->path_v1[c])) {
        free(cg->path_v1[c]);
        cg->path_v1[c] = NULL;
      }
      found |= cg->path_v1[c] != NULL;
    }
  }
  if (!found) {
    tp_cgroup_free(cg);
    return tp_error_set(err, ENOENT, "open cgroup %s: no " TP_CGROUP_PARENT "/%s under '%s'", id,
                        id, root->dir);
  }
  return 0;
}

/* v1: the hierarchy a box's trees are subs in (see tp_cgroup_sub): the
 * freezer's, else the first of pids and memory that cg has. */
static int v1_tree_ctrl(const tp_cgroup_t *cg) {
  return cg->path_v1[TP_CG_FREEZER] != NULL ? TP_CG_FREEZER
         : cg->path_v1[TP_CG_PIDS] != NULL  ? TP_CG_PIDS
                                            : TP_CG_MEMORY;
}

int tp_cgroup_sub(const tp_cgroup_t *cg, const char *name, tp_cgroup_t *sub, tp_error_t *err) {
  int made[TP_CG_NCTRL] = {0};
  cg_dirs_t ds;

  memset(sub, 0, sizeof(*sub));
  if (cg->id == NULL || cg->sub != NULL)
    return tp_error_set(err, EINVAL, "sub cgroup '%s': parent is not a box cgroup",
                        name ? name : "(null)");
  if (!tp_cgroup_valid_name(name))
    return tp_error_set(err, EINVAL, "invalid sub cgroup name '%s'", name ? name : "(null)");
  sub->version = cg->version;
  sub->id = strdup(cg->id);
  sub->sub = strdup(name);
  if (sub->id == NULL || sub->sub == NULL) {
    tp_cgroup_free(sub);
    return tp_error_errno(err, ENOMEM, "sub cgroup %s/%s", cg->id, name);
  }
  if (set_paths(sub, cg->path_v2, cg->path_v1, name, err) < 0)
    goto fail;
  /* v1: a tree is a sub in one hierarchy, the freezer's, which lists it and
   * freezes it for its kill, as a v2 tree is a sub with no controller
   * enabled.  Its processes stay in the box's own memory, pids, cpu and
   * cpuacct cgroups, under the box's limits (all four are hierarchical, so
   * a sub there was under them too) and counted there: an OOM kill in the
   * box's memory.oom_control, as v2 counts it in the box's memory.events.
   * Each tree is one mkdir, one rmdir and one attach, not three, and no
   * memory cgroup (the costliest to make and to free).  Without a freezer
   * hierarchy, the first of pids and memory the box has lists it. */
  if (sub->version == 1) {
    int keep = v1_tree_ctrl(sub);
    for (int c = 0; c < TP_CG_NCTRL; c++) {
      if (c == keep || sub->path_v1[c] == NULL ||
          (sub->path_v1[keep] != NULL && strcmp(sub->path_v1[c], sub->path_v1[keep]) == 0))
        continue; /* a controller mounted with the kept one: the same dir */
      free(sub->path_v1[c]);
      sub->path_v1[c] = NULL;
    }
  }
  cg_dirs(sub, &ds);
  if (make_dirs(&ds, sub->version, 0, 0, NULL, made, err) < 0) {
    unmake_dirs(&ds, NULL, made);
    goto fail;
  }
  return 0;
fail:
  tp_error_prefix(err, "sub cgroup %s/%s", cg->id, name);
  tp_cgroup_free(sub);
  return -1;
}

/* ---- processes -------------------------------------------------------------------- */

int tp_cgroup_attach(const tp_cgroup_t *cg, pid_t pid, tp_error_t *err) {
  char v[24];
  cg_dirs_t ds;
  cg_dirs(cg, &ds);
  if (pid <= 0 || ds.n == 0)
    return tp_error_set(err, EINVAL, "attach pid %d: no such cgroup or pid", (int) pid);
  snprintf(v, sizeof(v), "%d", (int) pid);
  for (int i = 0; i < ds.n; i++)
    if (tp__cg_write(ds.d[i], "cgroup.procs", v, 0, err) < 0)
      return tp_error_prefix(err, "attach pid %d", (int) pid);
  return 0;
}

static int enter_fds(const tp_cgroup_t *cg, int fds[TP_CG_NCTRL], const char *file, tp_error_t *err) {
  cg_dirs_t ds;
  cg_dirs(cg, &ds);
  for (int i = 0; i < TP_CG_NCTRL; i++)
    fds[i] = -1;
  for (int i = 0; i < ds.n; i++) {
    cleanup_free char *p = NULL;
    if (asprintf(&p, "%s/%s", ds.d[i], file) < 0) {
      p = NULL;
      errno = ENOMEM;
    } else {
      fds[i] = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fds[i] < 0) {
      tp_error_errno(err, errno, "open '%s/%s'", ds.d[i], file);
      for (int j = 0; j < i; j++) {
        close(fds[j]);
        fds[j] = -1;
      }
      return -1;
    }
  }
  return ds.n;
}

int tp_cgroup_enter_fds(const tp_cgroup_t *cg, int fds[TP_CG_NCTRL], tp_error_t *err) {
  return enter_fds(cg, fds, "cgroup.procs", err);
}

int tp_cgroup_enter_fds_self(const tp_cgroup_t *cg, int fds[TP_CG_NCTRL], tp_error_t *err) {
  return enter_fds(cg, fds, cg->version == 1 ? "tasks" : "cgroup.procs", err);
}

typedef struct pidset_s {
  pid_t *v;
  size_t n, cap;
} pidset_t;

static int pidset_add_text(pidset_t *s, const char *text) {
  const char *p = text;
  while (*p != '\0') {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) {
      p++;
      continue;
    }
    p = end;
    if (v <= 0 || v > INT_MAX)
      continue;
    if (s->n == s->cap) {
      size_t cap = s->cap ? s->cap * 2 : 64;
      pid_t *nv = realloc(s->v, cap * sizeof(*nv));
      if (nv == NULL)
        return -1;
      s->v = nv;
      s->cap = cap;
    }
    s->v[s->n++] = (pid_t) v;
  }
  return 0;
}

/* Adds the pids of dir's cgroup.procs and of every cgroup below it. */
static int collect(pidset_t *s, const char *dir, int depth, tp_error_t *err) {
  cleanup_free char *text = NULL;
  DIR *d;
  struct dirent *e;
  int ret = 0;

  if (depth > CG_MAX_DEPTH)
    return tp_error_set(err, ELOOP, "cgroup tree too deep at '%s'", dir);
  text = tp__cg_read(dir, "cgroup.procs", NULL);
  if (text == NULL)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "read '%s/cgroup.procs'", dir);
  if (pidset_add_text(s, text) < 0)
    return tp_error_errno(err, ENOMEM, "pids of '%s'", dir);
  d = opendir(dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "opendir '%s'", dir);
  while (ret == 0 && (e = readdir(d)) != NULL) {
    char *sub;
    if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (asprintf(&sub, "%s/%s", dir, e->d_name) < 0)
      ret = tp_error_errno(err, ENOMEM, "walk '%s'", dir);
    else {
      ret = collect(s, sub, depth + 1, err);
      free(sub);
    }
  }
  closedir(d);
  return ret;
}

static int pid_cmp(const void *a, const void *b) {
  pid_t x = *(const pid_t *) a, y = *(const pid_t *) b;
  return (x > y) - (x < y);
}

int tp_cgroup_pids(const tp_cgroup_t *cg, pid_t **pids, size_t *n, tp_error_t *err) {
  pidset_t s = {NULL, 0, 0};
  size_t out = 0;
  cg_dirs_t ds;

  *pids = NULL;
  *n = 0;
  cg_dirs(cg, &ds);
  for (int i = 0; i < ds.n; i++)
    if (collect(&s, ds.d[i], 0, err) < 0) {
      free(s.v);
      return -1;
    }
  if (s.n > 0) {
    qsort(s.v, s.n, sizeof(*s.v), pid_cmp);
    for (size_t i = 0; i < s.n; i++)
      if (out == 0 || s.v[out - 1] != s.v[i])
        s.v[out++] = s.v[i];
  }
  *pids = s.v;
  *n = out;
  return 0;
}

int tp_cgroup_own_pids(const tp_cgroup_t *cg, pid_t **pids, size_t *n, tp_error_t *err) {
  pidset_t s = {NULL, 0, 0};
  cleanup_free char *text = NULL;
  cg_dirs_t ds;

  *pids = NULL;
  *n = 0;
  cg_dirs(cg, &ds);
  if (ds.n == 0)
    return tp_error_set(err, EINVAL, "pids: cgroup closed");
  /* v1: the hierarchy of the trees, where a tree's processes are not the
   * box's own (in the others they are) */
  if (cg->version == 1 && cg->path_v1[v1_tree_ctrl(cg)] != NULL)
    ds.d[0] = cg->path_v1[v1_tree_ctrl(cg)];
  text = tp__cg_read(ds.d[0], "cgroup.procs", err);
  if (text == NULL)
    return -1;
  if (pidset_add_text(&s, text) < 0) {
    free(s.v);
    return tp_error_errno(err, ENOMEM, "pids of '%s'", ds.d[0]);
  }
  *pids = s.v;
  *n = s.n;
  return 0;
}

/* ---- freeze ----------------------------------------------------------------------- */

int tp_cgroup_freeze(const tp_cgroup_t *cg, int frozen, tp_error_t *err) {
  long long deadline = tp__cg_now_ms() + TP_CGROUP_TIMEOUT_MS;
  const char *dir = cg->version == 2 ? cg->path_v2 : cg->path_v1[TP_CG_FREEZER];
  const char *what = frozen ? "freeze" : "thaw";

  if (dir == NULL)
    return tp_error_set(err, ENOTSUP, "%s cgroup %s: no freezer hierarchy", what,
                        cg->id ? cg->id : "(closed)");
  if ((cg->version == 2 ? tp__cg_v2_freeze : tp__cg_v1_freeze)(dir, frozen, deadline, err) < 0)
    return tp_error_prefix(err, "%s cgroup %s", what, cg->id);
  return 0;
}

/* ---- kill ------------------------------------------------------------------------- */

/* A sorted pid list contains pid. */
static int listed_in(const pid_t *pids, size_t n, pid_t pid) {
  return n > 0 && bsearch(&pid, pids, n, sizeof(pid), pid_cmp) != NULL;
}

/* SIGKILLs every pid listed in cg; *left = how many were listed.  A listed
 * process may exit and be reaped, and its pid reused by an unrelated one,
 * before the signal: so each is pinned with a pidfd first and signalled only
 * if its pid is still listed after that (if the pid was reused by then, the
 * pidfd refers to the dead process and the signal goes nowhere). */
static int kill_listed(const tp_cgroup_t *cg, size_t *left, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  size_t n;
  if (tp_cgroup_pids(cg, &pids, &n, err) < 0)
    return -1;
  *left = n;
  for (size_t i = 0; i < n; i += CG_PIN_BATCH) {
    size_t m = n - i < CG_PIN_BATCH ? n - i : CG_PIN_BATCH, again_n;
    cleanup_free pid_t *again = NULL;
    int fd[CG_PIN_BATCH];
    for (size_t j = 0; j < m; j++) {
      fd[j] = (int) syscall(SYS_pidfd_open, pids[i + j], 0);
      if (fd[j] < 0 && errno == ENOSYS) /* before linux 5.3: the racy way */
        kill(pids[i + j], SIGKILL);
    }
    if (tp_cgroup_pids(cg, &again, &again_n, NULL) < 0)
      again_n = 0; /* signal none of this batch: the caller lists and retries */
    for (size_t j = 0; j < m; j++) {
      if (fd[j] < 0)
        continue;
      if (listed_in(again, again_n, pids[i + j]))
        syscall(SYS_pidfd_send_signal, fd[j], SIGKILL, NULL, 0);
      close(fd[j]);
    }
  }
  return 0;
}

/* Without cgroup.kill: freeze so nothing forks under us, signal every
 * listed pid, thaw so v1 tasks can die, then signal whatever is still listed
 * until none is (without a freezer, only this loop). */
static int kill_by_signal(const tp_cgroup_t *cg, long long deadline, tp_error_t *err) {
  pid_t *pids = NULL;
  size_t n = 0;
  /* the common case (a tree that already ended, a box whose PID 1 took its
   * namespace down): nothing to freeze, nothing to wait for */
  if (tp_cgroup_pids(cg, &pids, &n, NULL) == 0) {
    free(pids);
    if (n == 0)
      return 0;
  }
  int frozen = (cg->version == 2 || cg->path_v1[TP_CG_FREEZER] != NULL) &&
               tp_cgroup_freeze(cg, 1, NULL) == 0;
  size_t left;
  long ms = 1;
  int r = kill_listed(cg, &left, err);

  if (frozen && tp_cgroup_freeze(cg, 0, r < 0 ? NULL : err) < 0)
    r = -1;
  while (r == 0) {
    if (kill_listed(cg, &left, err) < 0)
      return -1;
    if (left == 0)
      return 0;
    if (tp__cg_now_ms() >= deadline)
      return tp_error_set(err, ETIMEDOUT, "%zu processes still alive after %d ms", left,
                          TP_CGROUP_TIMEOUT_MS);
    tp__cg_nap_ms(ms);
    if (ms < 16)
      ms *= 2;
  }
  return -1;
}

int tp_cgroup_kill(const tp_cgroup_t *cg, tp_error_t *err) {
  long long deadline = tp__cg_now_ms() + TP_CGROUP_TIMEOUT_MS;
  int any = 0, r;
  cg_dirs_t ds;

  cg_dirs(cg, &ds);
  for (int i = 0; i < ds.n; i++)
    any |= tp__cg_is_dir(ds.d[i]);
  if (!any)
    return 0; /* nothing left to kill */
  if (cg->version == 2) {
    r = tp__cg_write(cg->path_v2, "cgroup.kill", "1", 1, err);
    if (r == 0)
      r = tp__cg_v2_wait_event(cg->path_v2, "populated", 0, deadline, err);
    else if (r == 1) /* before linux 5.14 */
      r = kill_by_signal(cg, deadline, err);
    if (r == 0) /* the v1 path ends thawed: so does this one */
      r = tp__cg_write(cg->path_v2, "cgroup.freeze", "0", 1, err) < 0 ? -1 : 0;
  } else {
    r = kill_by_signal(cg, deadline, err);
  }
  return r < 0 ? tp_error_prefix(err, "kill cgroup %s%s%s", cg->id, cg->sub ? "/" : "",
                                 cg->sub ? cg->sub : "")
               : 0;
}

/* ---- stats ------------------------------------------------------------------------ */

int tp_cgroup_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st, tp_error_t *err) {
  cg_dirs_t ds;

  cg_dirs(cg, &ds);
  if (ds.n == 0)
    return tp_error_set(err, EINVAL, "stats: cgroup closed");
  for (int i = 0; i < ds.n; i++)
    if (!tp__cg_is_dir(ds.d[i]))
      return tp_error_set(err, ENOENT, "stats of cgroup %s: '%s' is gone", cg->id, ds.d[i]);
  if (cg->version == 2)
    tp__cg_v2_stats(cg, st);
  else
    tp__cg_v1_stats(cg, st);
  return 0;
}

int64_t tp_cgroup_oom_kills(const tp_cgroup_t *cg) {
  if (cg->version == 2)
    return cg->path_v2 ? tp__cg_read_keyed(cg->path_v2, "memory.events", "oom_kill") : -1;
  return tp__cg_v1_oom_kills(cg);
}

/* ---- destroy ---------------------------------------------------------------------- */

/* rmdir dir after the cgroups below it; ENOENT is success.  The kernel may
 * still be tearing down the last exited task: EBUSY is retried briefly.
 * The rmdir is tried first: a cgroup with no sub left (a box's, once its
 * trees are removed) needs no listing of its dir (about 60 files on v1's
 * memory hierarchy), and one with subs or tasks answers EBUSY. */
static int rmdir_tree(const char *dir, int depth, tp_error_t *err) {
  DIR *d;
  struct dirent *e;
  int ret = 0;

  if (depth > CG_MAX_DEPTH)
    return tp_error_set(err, ELOOP, "cgroup tree too deep at '%s'", dir);
  if (rmdir(dir) == 0 || errno == ENOENT)
    return 0;
  if (errno != EBUSY && errno != ENOTEMPTY)
    return tp_error_errno(err, errno, "rmdir '%s'", dir);
  d = opendir(dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "opendir '%s'", dir);
  while (ret == 0 && (e = readdir(d)) != NULL) {
    char *sub;
    if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (asprintf(&sub, "%s/%s", dir, e->d_name) < 0)
      ret = tp_error_errno(err, ENOMEM, "remove '%s'", dir);
    else {
      ret = rmdir_tree(sub, depth + 1, err);
      free(sub);
    }
  }
  closedir(d);
  for (int i = 0; ret == 0; i++) {
    if (rmdir(dir) == 0 || errno == ENOENT)
      break;
    if (errno != EBUSY || i == CG_BUSY_RETRIES)
      ret = tp_error_errno(err, errno, "rmdir '%s'", dir);
    else
      tp__cg_nap_ms(1);
  }
  return ret;
}

/* The common case of a destroy: cg already empty (its box's PID 1 took its
 * pid namespace down, its tree ended) and without subs.  The kernel refuses
 * to rmdir a cgroup that has a process or a sub (EBUSY), so a dir it
 * removes held nothing to kill: each is tried in turn, and the first that
 * is refused sends the caller the long way (kill, then remove the tree) for
 * the rest.  The freezer, which that way uses, is the last of cg's dirs.
 * Saves the listing of every hierarchy's cgroup.procs and of its dir. */
static int rmdir_empty(const cg_dirs_t *ds) {
  for (int i = 0; i < ds->n; i++)
    if (rmdir(ds->d[i]) < 0 && errno != ENOENT)
      return -1;
  return 0;
}

int tp_cgroup_destroy(tp_cgroup_t *cg, tp_error_t *err) {
  cg_dirs_t ds;
  cg_dirs(cg, &ds);
  if (ds.n == 0 || rmdir_empty(&ds) == 0) {
    tp_cgroup_free(cg);
    return 0;
  }
  if (tp_cgroup_kill(cg, err) < 0)
    return tp_error_prefix(err, "destroy");
  for (int i = 0; i < ds.n; i++)
    if (rmdir_tree(ds.d[i], 0, err) < 0)
      return tp_error_prefix(err, "destroy cgroup %s", cg->id);
  tp_cgroup_free(cg);
  return 0;
}

/* ---- the parent dir --------------------------------------------------------------- */

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *) a, *(char *const *) b);
}

void tp_cgroup_list_free(char **ids, size_t n) {
  for (size_t i = 0; ids != NULL && i < n; i++)
    free(ids[i]);
  free(ids);
}

/* Adds the valid names of subdirs of dir to *ids. */
static int list_dir(const char *dir, char ***ids, size_t *n, size_t *cap, tp_error_t *err) {
  DIR *d = opendir(dir);
  struct dirent *e;
  if (d == NULL)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "opendir '%s'", dir);
  while ((e = readdir(d)) != NULL) {
    if (e->d_type != DT_DIR || !tp_cgroup_valid_name(e->d_name))
      continue;
    if (*n == *cap) {
      size_t nc = *cap ? *cap * 2 : 16;
      char **nv = realloc(*ids, nc * sizeof(*nv));
      if (nv == NULL)
        break;
      *ids = nv;
      *cap = nc;
    }
    if (((*ids)[*n] = strdup(e->d_name)) == NULL)
      break;
    (*n)++;
  }
  closedir(d);
  return e == NULL ? 0 : tp_error_errno(err, ENOMEM, "list '%s'", dir);
}

int tp_cgroup_list(const tp_cgroup_root_t *root, char ***ids, size_t *n, tp_error_t *err) {
  size_t cap = 0, out = 0;
  cg_dirs_t ms;

  *ids = NULL;
  *n = 0;
  root_mounts(root, &ms);
  for (int i = 0; i < ms.n; i++) {
    cleanup_free char *p = NULL;
    if (asprintf(&p, "%s/" TP_CGROUP_PARENT, ms.d[i]) < 0) {
      p = NULL;
      tp_error_errno(err, ENOMEM, "list cgroups");
      goto fail;
    }
    if (list_dir(p, ids, n, &cap, err) < 0)
      goto fail;
  }
  if (*n > 0) {
    qsort(*ids, *n, sizeof(**ids), str_cmp);
    for (size_t i = 0; i < *n; i++) {
      if (out > 0 && strcmp((*ids)[out - 1], (*ids)[i]) == 0)
        free((*ids)[i]);
      else
        (*ids)[out++] = (*ids)[i];
    }
    *n = out;
  }
  return 0;
fail:
  tp_cgroup_list_free(*ids, *n);
  *ids = NULL;
  *n = 0;
  return -1;
}

int tp_cgroup_prune(const tp_cgroup_root_t *root, tp_error_t *err) {
  cg_dirs_t ms;
  root_mounts(root, &ms);
  for (int i = 0; i < ms.n; i++) {
    cleanup_free char *p = NULL;
    if (asprintf(&p, "%s/" TP_CGROUP_PARENT, ms.d[i]) < 0) {
      p = NULL;
      return tp_error_errno(err, ENOMEM, "prune cgroups");
    }
    if (rmdir(p) < 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EBUSY)
      return tp_error_errno(err, errno, "rmdir '%s'", p);
  }
  return 0;
}

/* ---- OOM -------------------------------------------------------------------------- */

/* Set once a write failed EACCES: the daemon's capabilities do not come
 * back, and each box's start tried again (an open, a failed write and a
 * close a box: docs/benchmarks.md, "Churn"). */
static atomic_int oom_denied;

int tp_oom_protect(pid_t pid, tp_error_t *err) {
  char p[64];
  cleanup_close int fd = -1;
  ssize_t w;

  snprintf(p, sizeof(p), "/proc/%d/oom_score_adj", (int) pid);
  if (pid <= 0)
    return tp_error_set(err, EINVAL, "oom protect: bad pid %d", (int) pid);
  if (atomic_load_explicit(&oom_denied, memory_order_relaxed))
    return tp_error_set(err, EACCES,
                        "write -999 to '%s': permission denied before (lowering it needs "
                        "CAP_SYS_RESOURCE), not tried again", p);
  fd = open(p, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "open '%s'", p);
  do
    w = write(fd, "-999", 4);
  while (w < 0 && errno == EINTR);
  if (w < 0 && errno == EACCES) {
    atomic_store_explicit(&oom_denied, 1, memory_order_relaxed);
    return tp_error_set(err, EACCES,
                        "write -999 to '%s': permission denied (lowering it needs CAP_SYS_RESOURCE)", p);
  }
  if (w < 0)
    return tp_error_errno(err, errno, "write -999 to '%s'", p);
  if (w != 4)
    return tp_error_set(err, EIO, "short write to '%s'", p);
  return 0;
}
