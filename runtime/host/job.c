/* tp_job_queue: a uv_work_t of its own around the caller's data; long
 * jobs wait in a lane of their own for their turn (job.h). */
#include <stdlib.h>

#include "job.h"

typedef struct tp__job_s tp__job_t;
struct tp__job_s {
  uv_work_t req;
  uv_loop_t *loop;
  tp_job_work_fn work;
  tp_job_after_fn after;
  void *data;
  int is_long;
  tp__job_t *next; /* waiting in the long lane */
};

/* The long lane: what libuv's pool is, one for the process. */
static struct {
  tp__job_t *head, *tail;
  int running;
} tp__long;

int tp_job_long_max(void) {
  /* as libuv sizes its pool (src/threadpool.c): 1..1024, default 4 */
  const char *v = getenv("UV_THREADPOOL_SIZE");
  long n = v != NULL ? strtol(v, NULL, 10) : 4;
  if (n < 1)
    n = 1;
  if (n > 1024)
    n = 1024;
  return n / 2 > 0 ? (int) (n / 2) : 1;
}

static void tp__job_work(uv_work_t *req) {
  tp__job_t *j = req->data;
  j->work(j->data);
}

static void tp__job_after(uv_work_t *req, int status);

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
    r = uv_queue_work(j->loop, &j->req, tp__job_work, tp__job_after);
    if (r < 0)
      tp__job_after(&j->req, r);
  }
}

static void tp__job_after(uv_work_t *req, int status) {
  tp__job_t *j = req->data;
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
  j->req.data = j;
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
  r = uv_queue_work(loop, &j->req, tp__job_work, tp__job_after);
  if (r < 0)
    free(j);
  return r;
}

int tp_job_queue_long(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data) {
  tp__job_t *j;
  int r;
  if (tp__long.running < tp_job_long_max() && tp__long.head == NULL) {
    if ((j = tp__job_new(loop, work, after, data, 1)) == NULL)
      return UV_ENOMEM;
    r = uv_queue_work(loop, &j->req, tp__job_work, tp__job_after);
    if (r < 0) {
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
