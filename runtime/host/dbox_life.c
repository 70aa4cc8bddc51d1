/* tp_dbox_t: start, adopt and destroy, through the backend registry's
 * vtables.  The sequence is the daemon's and the same for every backend:
 * the box cgroup first (its PID 1 joins it before anything of the box runs),
 * then the backend, then what the backend's flags ask for. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dbox_int.h"
#include "job.h"
#include "rmtree.h"

/* A box start in flight: everything the pool thread needs, owned. */
typedef struct tp__start_job_s {
  tp_start_spec_t spec; /* points into the copies below */
  void *state;          /* the backend's daemon state */
  int has_cgroups;
  const tp_cgroup_root_t *cgroot;
  tp_cgroup_limits_t lim;
  char *id, *dir, *cgname, *pool;
  char **layers, **argv, **volumes; /* NULL-terminated copies, or NULL */
  int *fds;
  char procs[TP_CG_NCTRL][TP__DBOX_PATH_MAX + 16];
  const char *procs_list[TP_CG_NCTRL + 1];
  tp_dbox_t *b;
  tp_error_t err;
  int ret;
  tp_dbox_start_cb cb;
  void *data;
} tp__start_job_t;

static void tp__strv_free(char **v) {
  for (char **a = v; a != NULL && *a != NULL; a++)
    free(*a);
  free(v);
}

/* A NULL-terminated copy of v[0..n), or NULL (*oom set when v was given). */
static char **tp__strv_dup(const char *const *v, int n, int *oom) {
  char **c;
  if (v == NULL)
    return NULL;
  c = calloc((size_t) n + 1, sizeof(*c));
  if (c == NULL) {
    *oom = 1;
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    if ((c[i] = strdup(v[i])) == NULL) {
      tp__strv_free(c);
      *oom = 1;
      return NULL;
    }
  }
  return c;
}

static void tp__start_job_free(tp__start_job_t *j) {
  tp__strv_free(j->layers);
  tp__strv_free(j->argv);
  tp__strv_free(j->volumes);
  free(j->fds);
  free(j->id);
  free(j->dir);
  free(j->cgname);
  free(j->pool);
  free(j);
}

/* Copies req into a new job; NULL on ENOMEM. */
static tp__start_job_t *tp__start_job_new(const tp_dbox_start_t *req) {
  const tp_start_spec_t *s = &req->spec;
  tp__start_job_t *j = calloc(1, sizeof(*j));
  int oom = 0;
  if (j == NULL)
    return NULL;
  j->spec = *s;
  j->lim = req->limits;
  j->id = strdup(s->id);
  j->dir = strdup(s->dir);
  j->cgname = strdup(req->cgroup != NULL ? req->cgroup : s->id);
  if (s->pool != NULL && (j->pool = strdup(s->pool)) == NULL)
    oom = 1;
  j->layers = tp__strv_dup(s->layers, s->n_layers, &oom);
  j->argv = tp__strv_dup(s->argv, s->argc, &oom);
  j->volumes = tp__strv_dup(s->volumes, s->n_volumes, &oom);
  if (s->fds != NULL) {
    j->fds = calloc((size_t) s->nfds + 1, sizeof(int));
    if (j->fds != NULL)
      memcpy(j->fds, s->fds, sizeof(int) * (size_t) s->nfds);
    else
      oom = 1;
  }
  if (oom || j->id == NULL || j->dir == NULL || j->cgname == NULL) {
    tp__start_job_free(j);
    return NULL;
  }
  j->spec.id = j->id;
  j->spec.dir = j->dir;
  j->spec.pool = j->pool;
  j->spec.layers = (const char *const *) j->layers;
  j->spec.argv = (const char *const *) j->argv;
  j->spec.volumes = (const char *const *) j->volumes;
  j->spec.fds = j->fds;
  j->spec.cgroup_procs = NULL;
  return j;
}

/* In the thread pool: the box's cgroup, then the box (a clone blocks its
 * thread until the child execs: never the loop's). */
static void tp__start_work(void *data) {
  tp__start_job_t *j = data;
  tp_dbox_t *b = j->b;
  j->ret = -1;
  if (j->has_cgroups) {
    const char *dirs[TP_CG_NCTRL];
    int n;
    if (tp_cgroup_create(j->cgroot, j->cgname, &j->lim, &b->cg, &j->err) < 0)
      return;
    b->has_cg = 1;
    n = tp_cgroup_dirs(&b->cg, dirs);
    for (int i = 0; i < n; i++) {
      snprintf(j->procs[i], sizeof(j->procs[i]), "%s/cgroup.procs", dirs[i]);
      j->procs_list[i] = j->procs[i];
    }
    j->procs_list[n] = NULL;
    j->spec.cgroup_procs = j->procs_list;
  }
  j->ret = b->be->start(j->state, &j->spec, &b->box, &j->err);
  if (j->ret == 0 && (b->be->flags & TP_BACKEND_OOM_PROTECT)) {
    /* the OOM killer should take a process of the box, never its agent;
     * without CAP_SYS_RESOURCE (EACCES) the agent, being tiny, is rarely
     * its pick anyway */
    tp_error_t oerr = {0};
    tp_oom_protect(b->box.pid, &oerr);
  }
  if (j->ret == 0 && b->has_cg && (b->be->flags & TP_BACKEND_CG_BOX)) {
    /* One spare process cgroup, made in this job (the loop knows nothing
     * of b yet): the box's first process takes it, one EXEC whose child
     * the agent starts in its own memory, instead of a child held (a fork
     * of the agent, then its copy-on-write faults) while its tree is made
     * and attached, then a RELEASE.  None made: the first start takes the
     * held way. */
    tp_error_t serr = {0};
    if (tp__dbox_spares_make(b, 1, &serr) < 0)
      fprintf(stderr, "tupper: box %s: a spare process cgroup: %s\n", j->id, serr.msg);
  }
  if (j->ret < 0 && b->has_cg) {
    tp_error_t e2 = {0};
    if (tp_cgroup_destroy(&b->cg, &e2) < 0)
      tp_cgroup_free(&b->cg);
    b->has_cg = 0;
  }
}

static void tp__start_after(void *data, int status) {
  tp__start_job_t *j = data;
  tp_dbox_t *b = j->b;
  if (status < 0 && j->ret == 0) {
    /* the work never ran (UV_ECANCELED): nothing was started */
    j->ret = tp_error_set(&j->err, ECANCELED, "start: %s", uv_strerror(status));
  }
  if (j->ret < 0) {
    tp__dbox_free(b);
    b = NULL;
  }
  j->cb(j->data, b, &j->err);
  tp__start_job_free(j);
}

int tp_dbox_start(tp_daemon_t *d, uv_loop_t *loop, const tp_backend_t *be, tp_dbox_start_t *req,
                  tp_dbox_start_cb cb, void *data, tp_error_t *err) {
  const tp_cgroup_limits_t *l = &req->limits;
  tp__start_job_t *j;
  void *state;
  int r;
  if (req->spec.id == NULL || req->spec.dir == NULL)
    return tp_error_set(err, EINVAL, "start: id and dir are required");
  if (be->check_start(&req->spec, err) < 0)
    return -1;
  if ((be->flags & TP_BACKEND_CG_BOX) && (l->memory || l->pids || l->cpu_quota) &&
      !d->has_cgroups)
    return tp_error_set(err, EOPNOTSUPP, "limits need cgroups, and none are usable on this host");
  /* once per daemon, on the loop: the backend's state (linux: the agent's
   * memfd and the seccomp filter) */
  if (tp_daemon_backend_state(d, be, &state, err) < 0)
    return -1;
  j = tp__start_job_new(req);
  if (j == NULL || (j->b = tp__dbox_new(be, loop, req->spec.dir)) == NULL) {
    if (j != NULL)
      tp__start_job_free(j);
    return tp_error_set(err, ENOMEM, "start %s: out of memory", be->name);
  }
  j->state = state;
  j->has_cgroups = d->has_cgroups;
  j->cgroot = &d->cgroot;
  j->cb = cb;
  j->data = data;
  j->ret = 0;
  r = tp_job_queue(loop, tp__start_work, tp__start_after, j);
  if (r < 0) {
    tp__dbox_free(j->b);
    tp__start_job_free(j);
    return tp_error_set(err, -r, "start %s: %s", be->name, uv_strerror(r));
  }
  return 0;
}

tp_dbox_t *tp_dbox_adopt(tp_daemon_t *d, uv_loop_t *loop, const tp_backend_t *be,
                         tp_adopt_spec_t *spec, const char *cgroup, tp_error_t *err) {
  tp_dbox_t *b;
  char procs[TP__DBOX_PATH_MAX + 16];
  void *state;
  if (be->check_adopt(spec, err) < 0)
    return NULL;
  if (tp_daemon_backend_state(d, be, &state, err) < 0)
    return NULL;
  b = tp__dbox_new(be, loop, spec->dir);
  if (b == NULL) {
    tp_error_set(err, ENOMEM, "adopt %s: out of memory", be->name);
    return NULL;
  }
  spec->cgroup_procs = NULL;
  if (d->has_cgroups) {
    const char *dirs[TP_CG_NCTRL];
    if (tp_cgroup_open(&d->cgroot, cgroup != NULL ? cgroup : spec->id, &b->cg, err) < 0) {
      tp__dbox_free(b);
      return NULL;
    }
    b->has_cg = 1;
    if (tp_cgroup_dirs(&b->cg, dirs) > 0) {
      snprintf(procs, sizeof(procs), "%s/cgroup.procs", dirs[0]);
      spec->cgroup_procs = procs;
    }
  }
  if (be->adopt(state, spec, &b->box, err) < 0) {
    if (b->has_cg)
      tp_cgroup_free(&b->cg);
    tp__dbox_free(b);
    return NULL;
  }
  spec->cgroup_procs = NULL; /* it pointed here */
  return b;
}

void tp__dbox_drop_cgroups(tp_dbox_t *b, tp_error_t *err) {
  while (b->trees != NULL) {
    tp_dbox_tree_t *t = b->trees;
    b->trees = t->next;
    tp_cgroup_destroy(&t->cg, err);
    tp_cgroup_free(&t->cg);
    free(t);
  }
  if (b->has_cg) {
    if (tp_cgroup_destroy(&b->cg, err) < 0)
      tp_cgroup_free(&b->cg);
    b->has_cg = 0;
  }
}

/* The backend's destroy; with keep_upper, once every process of the box is
 * gone (the overlay is unmounted with its mount namespace), its upper dir is
 * moved to keep_upper (same filesystem) before the rest is removed. */
static int tp__dbox_destroy_dir(tp_dbox_t *b, tp_error_t *err) {
  char upper[TP__DBOX_PATH_MAX];
  if (b->keep_upper == NULL)
    return b->be->destroy(&b->box, b->dir, err);
  if (b->be->destroy(&b->box, NULL, err) < 0)
    return -1;
  if (snprintf(upper, sizeof(upper), "%s/upper", b->dir) >= (int) sizeof(upper)) {
    tp_rmtree(b->dir, NULL);
    return tp_error_set(err, ENAMETOOLONG, "destroy box: path too long");
  }
  if (rename(upper, b->keep_upper) < 0) {
    int e = errno;
    tp_rmtree(b->dir, NULL);
    return tp_error_errno(err, e, "destroy box: keep %s", upper);
  }
  return tp_rmtree(b->dir, err);
}

static void tp__destroy_work(void *data) {
  tp_dbox_t *b = data;
  tp_error_t cgerr = {0};
  b->wret = tp__dbox_destroy_dir(b, b->werr);
  tp__dbox_drop_cgroups(b, &cgerr);
  if (b->wret == 0 && cgerr.code != 0) {
    *b->werr = cgerr;
    b->wret = -1;
  }
}

static void tp__destroy_after(void *data, int status) {
  tp_dbox_t *b = data;
  (void) status;
  /* the callback may run code that releases b: work_pending, still set,
   * keeps b alive through it */
  if (!b->released && b->on_done != NULL)
    b->on_done(b, b->wret, b->werr);
  b->on_done = NULL;
  b->work_pending = 0;
  tp__dbox_maybe_free(b);
}

/* Queues the removal (tp__destroy_work), after the tree jobs that read the
 * box's cgroup; done here if it cannot be queued. */
static void tp__destroy_queue(tp_dbox_t *b) {
  b->work_pending = 1;
  if (b->tree_jobs > 0) { /* they read the cgroup this removes: after them */
    b->held_destroy = 1;
    return;
  }
  if (tp_job_queue(b->loop, tp__destroy_work, tp__destroy_after, b) < 0) {
    tp__destroy_work(b);
    tp__destroy_after(b, 0);
  }
}

static void tp__dbox_deadp_closed(uv_handle_t *h) {
  tp_dbox_t *b = h->data;
  b->open_handles--;
  tp__dbox_maybe_free(b);
}

/* PID 1 of the box has exited: every other process of the box was reaped
 * before it (its PID namespace's end), and its mount namespace is gone. */
static void tp__dbox_dead_cb(uv_poll_t *p, int status, int events) {
  tp_dbox_t *b = p->data;
  tp_dbox_done_cb dead = b->on_dead;
  (void) events;
  /* p: the exit poll, taken over by the destroy, or deadp */
  uv_close((uv_handle_t *) p, tp__dbox_deadp_closed);
  b->on_dead = NULL;
  /* uv_poll made the pidfd non-blocking: the reap in the pool waits on it */
  int fl = fcntl(b->box.pidfd, F_GETFL);
  if (fl >= 0)
    fcntl(b->box.pidfd, F_SETFL, fl & ~O_NONBLOCK);
  /* a failed poll: the removal's reap waits, and done is the first word */
  if (status == 0 && !b->released && dead != NULL)
    dead(b, 0, NULL);
  b->work_pending = 0; /* the queue below sets it again */
  tp__destroy_queue(b);
}

void tp_dbox_on_dead(tp_dbox_t *b, tp_dbox_done_cb dead) { b->on_dead = dead; }

int tp_dbox_destroy(tp_dbox_t *b, const char *keep_upper, tp_dbox_done_cb done, int *queued,
                    tp_error_t *err) {
  int r;
  *queued = 0;
  if (b->destroyed)
    return tp_error_set(err, EBUSY, "box already destroyed");
  if (keep_upper != NULL && (keep_upper[0] != '/' || strlen(keep_upper) >= TP__DBOX_PATH_MAX))
    return tp_error_set(err, EINVAL, "keep_upper must be an absolute path");
  if (b->werr == NULL && (b->werr = calloc(1, sizeof(*b->werr))) == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  if (keep_upper != NULL && (b->keep_upper = strdup(keep_upper)) == NULL)
    return tp_error_set(err, ENOMEM, "out of memory");
  b->destroyed = 1;
  b->down = 1;
  if (b->on_dead != NULL && keep_upper == NULL && b->started && b->box.pidfd >= 0) {
    /* the wait for the box's end on the loop, on the exit poll the box
     * already has: its callback changes, it is not closed and made again
     * on the same pidfd (which cost the kill eight system calls) */
    tp__dbox_stop_chan(b);
    if (b->box.pid > 0)
      kill(b->box.pid, SIGKILL);
    b->on_done = done;
    b->work_pending = 1;
    *queued = 1;
    if ((r = uv_poll_start(&b->exitp, UV_READABLE, tp__dbox_dead_cb)) < 0)
      tp__dbox_dead_cb(&b->exitp, r, 0);
    return 0;
  }
  tp__dbox_stop(b); /* closes the exit poll: the pidfd is free for deadp */
  if (b->box.pid > 0)
    kill(b->box.pid, SIGKILL); /* at once; reaping and rm happen in the pool */
  b->on_done = done;
  if (b->on_dead != NULL && keep_upper == NULL && b->box.pidfd >= 0 &&
      uv_poll_init(b->loop, &b->deadp, b->box.pidfd) == 0) {
    /* the wait for the box's end on the loop; the removal after it */
    b->deadp.data = b;
    b->open_handles++;
    b->work_pending = 1;
    *queued = 1;
    if ((r = uv_poll_start(&b->deadp, UV_READABLE, tp__dbox_dead_cb)) < 0)
      tp__dbox_dead_cb(&b->deadp, r, 0);
    return 0;
  }
  b->on_dead = NULL;
  if (b->tree_jobs > 0) { /* they read the cgroup this removes: after them */
    b->held_destroy = 1;
    b->work_pending = 1;
    *queued = 1;
    return 0;
  }
  r = tp_job_queue(b->loop, tp__destroy_work, tp__destroy_after, b);
  if (r < 0) {
    int r2;
    b->on_done = NULL;
    r2 = tp__dbox_destroy_dir(b, err);
    tp__dbox_drop_cgroups(b, err);
    return r2 < 0 ? -1 : 0;
  }
  b->work_pending = 1;
  *queued = 1;
  return 0;
}

/* The last tree job is done: a destroy or release held back runs now. */
void tp__dbox_jobs_done(tp_dbox_t *b) {
  int held = b->held_destroy;
  if (b->tree_jobs > 0 || held == 0) {
    tp__dbox_maybe_free(b);
    return;
  }
  b->held_destroy = 0;
  if (held == 2) { /* released: done here, as tp_dbox_release does */
    tp_error_t err = {0};
    b->be->destroy(&b->box, b->dir, &err);
    tp__dbox_drop_cgroups(b, &err);
    tp__dbox_maybe_free(b);
    return;
  }
  if (tp_job_queue(b->loop, tp__destroy_work, tp__destroy_after, b) < 0) {
    tp__destroy_work(b);
    tp__destroy_after(b, 0);
  }
}

void tp_dbox_release(tp_dbox_t *b) {
  b->released = 1;
  b->on_frame = NULL;
  b->on_down = NULL;
  b->on_done = NULL;
  if (b->held_destroy) { /* a destroy waits for tree jobs: it frees b, unasked */
    tp__dbox_maybe_free(b);
    return;
  }
  if (!b->destroyed && b->tree_jobs > 0) {
    b->destroyed = 1;
    tp__dbox_stop(b);
    b->held_destroy = 2;
    return;
  }
  if (!b->destroyed) {
    tp_error_t err = {0};
    b->destroyed = 1;
    tp__dbox_stop(b);
    b->be->destroy(&b->box, b->dir, &err);
    tp__dbox_drop_cgroups(b, &err);
  }
  tp__dbox_maybe_free(b);
}
