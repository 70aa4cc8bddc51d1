/* tp_dbox_t: process trees, each in a sub cgroup of the box so that it can
 * be signalled or killed whole, setsid and double-fork included. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "dbox_int.h"
#include "job.h"
#include "nspid.h"
#include "utils.h"

tp_dbox_tree_t *tp_dbox_tree_find(tp_dbox_t *b, const char *name) {
  for (tp_dbox_tree_t *t = b->trees; t != NULL; t = t->next)
    if (!t->spare && strcmp(t->name, name) == 0)
      return t;
  return NULL;
}

/* The checks of a new tree, on the loop. */
static int tree_check(tp_dbox_t *b, const char *name, tp_error_t *err) {
  if (!tp_dbox_has_cgroup(b))
    return tp_error_set(err, ENOENT, "box has no cgroup");
  if (!(b->be->flags & TP_BACKEND_CG_BOX))
    return tp_error_set(err, EOPNOTSUPP, "tree: the box's processes are not in its cgroup (%s)",
                        b->be->name);
  if (strlen(name) >= sizeof(((tp_dbox_tree_t *) 0)->name) || !tp_cgroup_valid_name(name))
    return tp_error_set(err, EINVAL, "tree: bad name");
  if (tp_dbox_tree_find(b, name) != NULL)
    return tp_error_set(err, EEXIST, "tree '%s' exists", name);
  return 0;
}

/* Makes t's sub of box cgroup cg and moves box_pid there: file work only,
 * safe in the pool (cg is read, t is the caller's).  The process the agent
 * holds is in the box's own cgroup: its cgroup.procs is read first, the
 * whole tree of subs only if it is not there. */
static int tree_make(const tp_cgroup_t *cg, tp_dbox_tree_t *t, pid_t box_pid, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  size_t n = 0;
  pid_t host;
  if (tp_cgroup_own_pids(cg, &pids, &n, err) < 0)
    return -1;
  if (tp_nspid_host_pid(pids, n, box_pid, &host, NULL) < 0) {
    free(pids);
    pids = NULL;
    if (tp_cgroup_pids(cg, &pids, &n, err) < 0 || tp_nspid_host_pid(pids, n, box_pid, &host, err) < 0)
      return -1;
  }
  if (tp_cgroup_sub(cg, t->name, &t->cg, err) < 0)
    return -1;
  if (tp_cgroup_attach(&t->cg, host, err) < 0) {
    tp_error_t e2 = {0};
    tp_cgroup_destroy(&t->cg, &e2);
    tp_cgroup_free(&t->cg);
    return -1;
  }
  return 0;
}

static tp_dbox_tree_t *tree_new(const char *name, tp_error_t *err) {
  tp_dbox_tree_t *t = calloc(1, sizeof(*t));
  if (t == NULL) {
    tp_error_set(err, ENOMEM, "tree: out of memory");
    return NULL;
  }
  snprintf(t->name, sizeof(t->name), "%s", name);
  return t;
}

int tp_dbox_tree(tp_dbox_t *b, const char *name, pid_t box_pid, tp_error_t *err) {
  tp_dbox_tree_t *t;
  if (tree_check(b, name, err) < 0 || (t = tree_new(name, err)) == NULL)
    return -1;
  if (tree_make(&b->cg, t, box_pid, err) < 0) {
    free(t);
    return -1;
  }
  t->next = b->trees;
  b->trees = t;
  return 0;
}

/* ---- jobs in the pool with a caller's callback ------------------------------------ */

/* The part the tree, kill and freeze jobs share, first in each: the box
 * (whose destroy waits while tree_jobs counts the job), the result, and
 * the job's own halves.  work runs in the pool; after runs on the loop
 * (a job that never ran has ret and err set from its status, named by
 * what), calls the caller's callback unless the box was released, and
 * leaves the job to be freed here. */
typedef struct box_job_s box_job_t;
struct box_job_s {
  tp_dbox_t *b;
  int ret;
  tp_error_t err;
  const char *what;
  void (*work)(box_job_t *j);
  void (*after)(box_job_t *j);
};

static void box_job_work(void *data) {
  box_job_t *j = data;
  j->work(j);
}

static void box_job_after(void *data, int status) {
  box_job_t *j = data;
  tp_dbox_t *b = j->b;
  if (status < 0 && j->ret == 0)
    j->ret = tp_error_set(&j->err, -status, "%s: %s", j->what, uv_strerror(status));
  j->after(j);
  free(j);
  b->tree_jobs--;
  tp__dbox_jobs_done(b); /* may free b */
}

/* Queues j (set up by the caller, who keeps it on failure). */
static int box_job_queue(tp_dbox_t *b, box_job_t *j, const char *what,
                         void (*work)(box_job_t *), void (*after)(box_job_t *), tp_error_t *err) {
  int r;
  j->b = b;
  j->what = what;
  j->work = work;
  j->after = after;
  r = tp_job_queue(b->loop, box_job_work, box_job_after, j);
  if (r < 0)
    return tp_error_set(err, -r, "%s: %s", what, uv_strerror(r));
  b->tree_jobs++;
  return 0;
}

/* ---- the same in the pool --------------------------------------------------------- */

typedef struct tree_job_s {
  box_job_t job; /* first */
  tp_dbox_tree_t *t;
  pid_t box_pid;
  tp_dbox_tree_cb cb;
  void *data;
} tree_job_t;

static void tree_work(box_job_t *bj) {
  tree_job_t *j = (tree_job_t *) bj;
  bj->ret = tree_make(&bj->b->cg, j->t, j->box_pid, &bj->err);
}

static void tree_after(box_job_t *bj) {
  tree_job_t *j = (tree_job_t *) bj;
  tp_dbox_t *b = bj->b;
  if (bj->ret == 0 && tp_dbox_tree_find(b, j->t->name) != NULL) {
    /* a synchronous tree of the same name came first */
    tp_error_t e2 = {0};
    tp_cgroup_destroy(&j->t->cg, &e2);
    tp_cgroup_free(&j->t->cg);
    bj->ret = tp_error_set(&bj->err, EEXIST, "tree '%s' exists", j->t->name);
  }
  if (bj->ret == 0) {
    /* linked even if the box went down meanwhile: its destroy (held back
     * until now) removes the sub with the others */
    j->t->next = b->trees;
    b->trees = j->t;
  } else {
    free(j->t);
  }
  if (!b->released && j->cb != NULL)
    j->cb(j->data, bj->ret == 0 ? NULL : &bj->err);
}

int tp_dbox_tree_start(tp_dbox_t *b, const char *name, pid_t box_pid, tp_dbox_tree_cb cb,
                       void *data, tp_error_t *err) {
  tree_job_t *j;
  if (b->destroyed)
    return tp_error_set(err, ENOENT, "box has no cgroup");
  if (tree_check(b, name, err) < 0)
    return -1;
  j = calloc(1, sizeof(*j));
  if (j == NULL || (j->t = tree_new(name, err)) == NULL) {
    free(j);
    return tp_error_set(err, ENOMEM, "tree: out of memory");
  }
  j->box_pid = box_pid;
  j->cb = cb;
  j->data = data;
  if (box_job_queue(b, &j->job, "tree", tree_work, tree_after, err) < 0) {
    free(j->t);
    free(j);
    return -1;
  }
  return 0;
}

int tp_dbox_tree_signal(tp_dbox_t *b, tp_dbox_tree_t *t, int sig, size_t *n, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  (void) b;
  *n = 0;
  if (tp_cgroup_pids(&t->cg, &pids, n, err) < 0)
    return -1;
  if (sig == SIGKILL)
    return tp_cgroup_kill(&t->cg, err);
  for (size_t i = 0; i < *n; i++)
    kill(pids[i], sig);
  return 0;
}

/* One cgroup.procs read, on the loop at each exit: a tree has no sub of its
 * own (only the daemon makes cgroups, and the box sees its hierarchies read
 * only), and on v1 each of its processes is in every hierarchy's sub (the
 * child joins them all before it runs anything, or dies), so one
 * hierarchy's list is the whole tree's.  A sub already gone has none. */
int tp_dbox_tree_count(tp_dbox_t *b, tp_dbox_tree_t *t, size_t *n, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  tp_error_t e = {0};
  (void) b;
  *n = 0;
  if (tp_cgroup_own_pids(&t->cg, &pids, n, &e) == 0 || e.code == ENOENT)
    return 0;
  *err = e;
  return -1;
}

int tp_dbox_tree_remove(tp_dbox_t *b, tp_dbox_tree_t *t, tp_error_t *err) {
  for (tp_dbox_tree_t **pp = &b->trees; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == t) {
      if (t->busy)
        return tp_error_set(err, EBUSY, "tree '%s' is being killed", t->name);
      /* v1 counts an OOM kill in the sub only: the box keeps the count */
      int64_t oom = t->cg.version == 1 ? tp_cgroup_oom_kills(&t->cg) : -1;
      if (tp_cgroup_destroy(&t->cg, err) < 0)
        return -1;
      if (oom > 0)
        b->oom_gone += oom;
      *pp = t->next;
      free(t);
      return 0;
    }
  }
  return tp_error_set(err, ENOENT, "no such tree");
}

/* ---- reuse ------------------------------------------------------------------------ */

int tp_dbox_tree_recycle(tp_dbox_t *b, tp_dbox_tree_t *t) {
  int64_t oom;
  /* (a refill under way makes up the count itself) */
  if (b->destroyed || b->released || t->busy || t->rm_pending || t->spare || b->refilling ||
      b->spares >= TP_DBOX_SPARES)
    return 0;
  /* v1 counts an OOM kill in the tree's memory cgroup only: such a count
   * goes to the box's as the tree is removed, and a spare starts at none */
  if (t->cg.version == 1) {
    oom = tp_cgroup_oom_kills(&t->cg);
    if (oom > 0 || (oom < 0 && t->cg.path_v1[TP_CG_MEMORY] != NULL))
      return 0;
  }
  for (tp_dbox_tree_t *x = b->trees; x != NULL; x = x->next)
    if (x == t) {
      t->spare = 1;
      b->spares++;
      return 1;
    }
  return 0;
}

/* ---- removal in the pool ---------------------------------------------------------- */

typedef struct rm_job_s {
  tp_dbox_t *b;
  tp_dbox_tree_t *t; /* unlinked: the job's alone (its OOM kills moved to oom_gone) */
  int ret;
  tp_error_t err;
} rm_job_t;

static void rm_work(void *data) {
  rm_job_t *j = data;
  j->ret = tp_cgroup_destroy(&j->t->cg, &j->err);
}

static void rm_after(void *data, int status) {
  rm_job_t *j = data;
  tp_dbox_t *b = j->b;
  if (status < 0) /* never ran: here, then */
    rm_work(j);
  if (j->ret < 0) { /* the box's destroy removes what is left */
    tp_cgroup_free(&j->t->cg);
  }
  free(j->t);
  free(j);
  b->tree_jobs--;
  tp__dbox_jobs_done(b);
}

/* Removes t here, on the loop (a fallback): its v1 OOM kills go to oom_gone
 * as its cgroup goes. */
static void rm_here(tp_dbox_t *b, tp_dbox_tree_t *t) {
  tp_error_t e = {0};
  int64_t oom = t->cg.version == 1 ? tp_cgroup_oom_kills(&t->cg) : -1;
  if (tp_cgroup_destroy(&t->cg, &e) < 0)
    tp_cgroup_free(&t->cg);
  else if (oom > 0)
    b->oom_gone += oom;
  free(t);
}

/* v1 counts an OOM kill in the victim's own memory cgroup only, and a box's
 * count is its own plus its subs' (tp__cg_v1_oom_kills, which reads subs of
 * valid names only).  A tree about to be removed in the pool whose cgroup
 * counted kills is renamed, here on the loop, to ".gone-<name>" (v1 allows a
 * rename in the same parent) and its count moves to oom_gone in the same
 * step: sandbox.metrics sees each kill exactly once while the pool removes
 * the dir, and the loop never waits for an rmdir.  Returns 0, or -1 when the
 * rename failed (nothing moved: the caller removes t here). */
static int hide_oom(tp_dbox_t *b, tp_dbox_tree_t *t) {
  char *old = t->cg.version == 1 ? t->cg.path_v1[TP_CG_MEMORY] : NULL;
  char path[PATH_MAX], *hidden = NULL;
  const char *slash;
  int64_t oom;

  if (old == NULL)
    return 0;
  oom = tp_cgroup_oom_kills(&t->cg);
  if (oom <= 0) /* nothing to carry: seen or not, it adds 0 */
    return 0;
  /* memory in a hierarchy of its own, as every distribution mounts it (a
   * shared one would need its other paths renamed too): else removed here */
  for (int c = 0; c < TP_CG_NCTRL; c++)
    if (c != TP_CG_MEMORY && t->cg.path_v1[c] != NULL && strcmp(t->cg.path_v1[c], old) == 0)
      return -1;
  slash = strrchr(old, '/');
  if (slash == NULL ||
      snprintf(path, sizeof(path), "%.*s/.gone-%s", (int) (slash - old), old, slash + 1) >= (int) sizeof(path) ||
      (hidden = strdup(path)) == NULL)
    return -1;
  if (rename(old, hidden) < 0) {
    free(hidden);
    return -1;
  }
  free(old);
  t->cg.path_v1[TP_CG_MEMORY] = hidden;
  b->oom_gone += oom;
  return 0;
}

static int rm_queue(tp_dbox_t *b, tp_dbox_tree_t *t) {
  rm_job_t *j = calloc(1, sizeof(*j));
  int r;
  if (j == NULL || hide_oom(b, t) < 0) { /* here, then */
    free(j);
    rm_here(b, t);
    return -1;
  }
  j->b = b;
  j->t = t;
  b->tree_jobs++;
  r = tp_job_queue(b->loop, rm_work, rm_after, j);
  if (r < 0)
    rm_after(j, r);
  return 0;
}

int tp_dbox_tree_remove_start(tp_dbox_t *b, tp_dbox_tree_t *t, tp_error_t *err) {
  for (tp_dbox_tree_t **pp = &b->trees; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == t) {
      *pp = t->next;
      t->next = NULL;
      if (t->busy) /* a kill job reads t: the last one queues this */
        t->rm_pending = 1;
      else
        rm_queue(b, t);
      return 0;
    }
  }
  return tp_error_set(err, ENOENT, "no such tree");
}

/* ---- SIGKILL in the pool ---------------------------------------------------------- */

typedef struct kill_job_s {
  box_job_t job; /* first */
  tp_dbox_tree_t *t; /* busy: neither freed nor removed until done */
  size_t n;
  tp_dbox_kill_cb cb;
  void *data;
} kill_job_t;

static void kill_work(box_job_t *bj) {
  kill_job_t *j = (kill_job_t *) bj;
  cleanup_free pid_t *pids = NULL;
  bj->ret = tp_cgroup_pids(&j->t->cg, &pids, &j->n, &bj->err);
  if (bj->ret == 0)
    bj->ret = tp_cgroup_kill(&j->t->cg, &bj->err);
}

static void kill_after(box_job_t *bj) {
  kill_job_t *j = (kill_job_t *) bj;
  tp_dbox_t *b = bj->b;
  tp_dbox_tree_t *t = j->t;
  if (--t->busy == 0 && t->rm_pending)
    rm_queue(b, t);
  if (!b->released && j->cb != NULL)
    j->cb(j->data, j->n, bj->ret == 0 ? NULL : &bj->err);
}

int tp_dbox_tree_kill_start(tp_dbox_t *b, tp_dbox_tree_t *t, tp_dbox_kill_cb cb, void *data,
                            tp_error_t *err) {
  kill_job_t *j = calloc(1, sizeof(*j));
  if (j == NULL)
    return tp_error_set(err, ENOMEM, "tree: out of memory");
  j->t = t;
  j->cb = cb;
  j->data = data;
  if (box_job_queue(b, &j->job, "kill tree", kill_work, kill_after, err) < 0) {
    free(j);
    return -1;
  }
  t->busy++;
  return 0;
}

/* ---- the box's freeze in the pool --------------------------------------------------- */

typedef struct freeze_job_s {
  box_job_t job; /* first */
  int frozen;
  tp_dbox_freeze_cb cb;
  void *data;
} freeze_job_t;

static void freeze_work(box_job_t *bj) {
  freeze_job_t *j = (freeze_job_t *) bj;
  bj->ret = tp_cgroup_freeze(&bj->b->cg, j->frozen, &bj->err);
}

static void freeze_after(box_job_t *bj) {
  freeze_job_t *j = (freeze_job_t *) bj;
  if (!bj->b->released && j->cb != NULL)
    j->cb(j->data, bj->ret == 0 ? NULL : &bj->err);
}

int tp_dbox_freeze_start(tp_dbox_t *b, int frozen, tp_dbox_freeze_cb cb, void *data,
                         tp_error_t *err) {
  freeze_job_t *j;
  if (!tp_dbox_has_cgroup(b)) /* destroyed included */
    return tp_error_set(err, ENOENT, "box has no cgroup");
  if ((j = calloc(1, sizeof(*j))) == NULL)
    return tp_error_set(err, ENOMEM, "freeze: out of memory");
  j->frozen = frozen;
  j->cb = cb;
  j->data = data;
  if (box_job_queue(b, &j->job, frozen ? "freeze" : "thaw", freeze_work, freeze_after, err) < 0) {
    free(j);
    return -1;
  }
  return 0;
}

/* ---- spare trees ------------------------------------------------------------------ */

/* A spare's sub of box cgroup cg, named s<16 hex> (apart from the owner's
 * names, which tree_check lets through: those start with a letter other
 * than s, as the Lua owner's p<pid>-<hex>; a clash would be EEXIST). */
static tp_dbox_tree_t *spare_new(const tp_cgroup_t *cg, tp_error_t *err) {
  unsigned char r[8];
  tp_dbox_tree_t *t;
  if (getrandom(r, sizeof(r), 0) != (ssize_t) sizeof(r)) {
    tp_error_errno(err, errno, "spare tree: getrandom");
    return NULL;
  }
  t = tree_new("", err);
  if (t == NULL)
    return NULL;
  snprintf(t->name, sizeof(t->name), "s%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3],
           r[4], r[5], r[6], r[7]);
  t->spare = 1;
  if (tp_cgroup_sub(cg, t->name, &t->cg, err) < 0) {
    free(t);
    return NULL;
  }
  return t;
}

/* n spares of cg, chained by next: *out (as many as were made) */
static int spares_make(const tp_cgroup_t *cg, int n, tp_dbox_tree_t **out, int *made,
                       tp_error_t *err) {
  *out = NULL;
  *made = 0;
  for (int i = 0; i < n; i++) {
    tp_dbox_tree_t *t = spare_new(cg, err);
    if (t == NULL)
      return -1;
    t->next = *out;
    *out = t;
    (*made)++;
  }
  return 0;
}

static void spares_link(tp_dbox_t *b, tp_dbox_tree_t *list, int n) {
  while (list != NULL) {
    tp_dbox_tree_t *t = list;
    list = t->next;
    t->next = b->trees;
    b->trees = t;
  }
  b->spares += n;
}

int tp__dbox_spares_make(tp_dbox_t *b, int n, tp_error_t *err) {
  tp_dbox_tree_t *list;
  int made, r = spares_make(&b->cg, n, &list, &made, err);
  spares_link(b, list, made);
  return r;
}

typedef struct spare_job_s {
  tp_dbox_t *b;
  int want, made;
  tp_dbox_tree_t *list;
  tp_error_t err;
} spare_job_t;

static void spare_work(void *data) {
  spare_job_t *j = data;
  if (spares_make(&j->b->cg, j->want, &j->list, &j->made, &j->err) < 0)
    fprintf(stderr, "tupper: box %s: spare process cgroups: %s\n", j->b->cg.id, j->err.msg);
}

static void spare_after(void *data, int status) {
  spare_job_t *j = data;
  tp_dbox_t *b = j->b;
  (void) status; /* never ran: none made */
  /* linked even if the box went down meanwhile: its destroy (held back
   * until now) removes them with the others */
  spares_link(b, j->list, j->made);
  b->refilling = 0;
  /* takes meanwhile left none: make them up (not after a failure: the next
   * take tries again) */
  if (j->made == j->want && b->spares == 0)
    tp_dbox_tree_refill(b);
  free(j);
  b->tree_jobs--;
  tp__dbox_jobs_done(b);
}

void tp_dbox_tree_refill(tp_dbox_t *b) { tp_dbox_tree_refill_to(b, TP_DBOX_SPARES); }

void tp_dbox_tree_refill_to(tp_dbox_t *b, int n) {
  spare_job_t *j;
  if (n > TP_DBOX_SPARES)
    n = TP_DBOX_SPARES;
  if (b->refilling || b->destroyed || b->released || !tp_dbox_has_cgroup(b) ||
      !(b->be->flags & TP_BACKEND_CG_BOX) || b->spares >= n)
    return;
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return; /* the next take tries again */
  j->b = b;
  j->want = n - b->spares;
  if (tp_job_queue(b->loop, spare_work, spare_after, j) < 0) {
    free(j);
    return;
  }
  b->refilling = 1;
  b->tree_jobs++;
}

tp_dbox_tree_t *tp_dbox_tree_take(tp_dbox_t *b) {
  tp_dbox_tree_t *got = NULL;
  if (b->destroyed || !tp_dbox_has_cgroup(b) || !(b->be->flags & TP_BACKEND_CG_BOX))
    return NULL;
  for (tp_dbox_tree_t *t = b->trees; t != NULL && got == NULL; t = t->next)
    if (t->spare)
      got = t;
  if (got != NULL) {
    got->spare = 0;
    b->spares--;
  } else if (b->took) {
    /* a process while another runs: spares for the next ones.  Not at the
     * box's first take, nor at a take that leaves none: a process that
     * ends gives its tree back (tp_dbox_tree_recycle), so one start after
     * another, and a box that runs one process, make no spare at all */
    tp_dbox_tree_refill(b);
  }
  b->took = 1;
  return got;
}
