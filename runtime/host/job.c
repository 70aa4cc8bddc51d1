/* tp_job_queue: a request of its own to the loop's workers around the
 * caller's data; long jobs wait in a lane of their own for their turn
 * (job.h). */
#include <stdlib.h>

#include "job.h"
#include "workers.h"

typedef struct tp__job_s tp__job_t;
struct tp__job_s {
  tp_workers_req_t req; /* first: the request is the job */
  uv_loop_t *loop;
  tp_job_work_fn work;
  tp_job_after_fn after;
  void *data;
  int is_long;
  tp__job_t *next; /* waiting in the long lane */
};

/* The long lane: one for the process (the daemon has one loop). */
static struct {
  tp__job_t *head, *tail;
  int running;
} tp__long;

/* The loop's workers, made at its first job (one loop in the daemon; a
 * test makes a few, one after another). */
static struct tp__job_loop_s {
  uv_loop_t *loop;
  tp_workers_t *w;
  struct tp__job_loop_s *next;
} *tp__loops;

int tp_job_threads(void) {
  /* sized as libuv sized its pool (src/threadpool.c): 1..1024, default 4 */
  const char *v = getenv("UV_THREADPOOL_SIZE");
  long n = v != NULL ? strtol(v, NULL, 10) : 4;
  if (n < 1)
    n = 1;
  if (n > 1024)
    n = 1024;
  return (int) n;
}

int tp_job_long_max(void) {
  int n = tp_job_threads();
  return n / 2 > 0 ? n / 2 : 1;
}

static int tp__job_submit(tp__job_t *j) {
  struct tp__job_loop_s *l = tp__loops;
  int err = 0;
  while (l != NULL && l->loop != j->loop)
    l = l->next;
  if (l == NULL) {
    if ((l = malloc(sizeof(*l))) == NULL)
      return UV_ENOMEM;
    l->w = tp_workers_new(j->loop, tp_job_threads(), TP_JOB_MAX_QUEUED, &err);
    if (l->w == NULL) {
      free(l);
      return err;
    }
    l->loop = j->loop;
    l->next = tp__loops;
    tp__loops = l;
  }
  return tp_workers_submit(l->w, &j->req);
}

void tp_job_stop(uv_loop_t *loop) {
  struct tp__job_loop_s **p = &tp__loops, *l;
  while (*p != NULL && (*p)->loop != loop)
    p = &(*p)->next;
  if ((l = *p) == NULL)
    return;
  *p = l->next;
  tp_workers_close(l->w);
  free(l);
}

static void tp__job_work(tp_workers_req_t *req) {
  tp__job_t *j = (tp__job_t *) req;
  j->work(j->data);
}

static void tp__job_after(tp_workers_req_t *req, int status);

/* The next long jobs that may run now, to the pool; one that cannot be
 * queued there is answered with that error (its caller was told 0). */
static void tp__long_next(void) {
  while (tp__long.head != NULL && tp__long.running < tp_job_long_max()) {
    tp__job_t *j = tp__long.head;
    int r;
    tp__long.head = j->next;
    if (tp__long.head == NULL)
      tp__long.tail = NULL;
    j->next = NULL;
    tp__long.running++;
    if ((r = tp__job_submit(j)) < 0)
      tp__job_after(&j->req, r);
  }
}

static void tp__job_after(tp_workers_req_t *req, int status) {
  tp__job_t *j = (tp__job_t *) req;
  tp_job_after_fn after = j->after;
  void *data = j->data;
  int is_long = j->is_long;
  free(j); /* before after(): it may queue the next job */
  if (is_long) {
    tp__long.running--;
    tp__long_next();
  }
  after(data, status);
}

static tp__job_t *tp__job_new(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after,
                              void *data, int is_long) {
  tp__job_t *j = malloc(sizeof(*j));
  if (j == NULL)
    return NULL;
  j->req.work = tp__job_work;
  j->req.done = tp__job_after;
  j->loop = loop;
  j->work = work;
  j->after = after;
  j->data = data;
  j->is_long = is_long;
  j->next = NULL;
  return j;
}

int tp_job_queue(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data) {
  tp__job_t *j = tp__job_new(loop, work, after, data, 0);
  int r;
  if (j == NULL)
    return UV_ENOMEM;
  if ((r = tp__job_submit(j)) < 0)
    free(j);
  return r;
}

int tp_job_queue_long(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data) {
  tp__job_t *j;
  int r;
  if (tp__long.running < tp_job_long_max() && tp__long.head == NULL) {
    if ((j = tp__job_new(loop, work, after, data, 1)) == NULL)
      return UV_ENOMEM;
    if ((r = tp__job_submit(j)) < 0) {
      free(j);
      return r;
    }
    tp__long.running++;
    return 0;
  }
  if ((j = tp__job_new(loop, work, after, data, 1)) == NULL)
    return UV_ENOMEM;
  if (tp__long.tail != NULL)
    tp__long.tail->next = j;
  else
    tp__long.head = j;
  tp__long.tail = j;
  return 0;
}
