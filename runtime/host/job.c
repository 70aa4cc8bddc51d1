/* tp_job_queue: a uv_work_t of its own around the caller's data. */
#include <stdlib.h>

#include "job.h"

typedef struct tp__job_s {
  uv_work_t req;
  tp_job_work_fn work;
  tp_job_after_fn after;
  void *data;
} tp__job_t;

static void tp__job_work(uv_work_t *req) {
  tp__job_t *j = req->data;
  j->work(j->data);
}

static void tp__job_after(uv_work_t *req, int status) {
  tp__job_t *j = req->data;
  tp_job_after_fn after = j->after;
  void *data = j->data;
  free(j); /* before after(): it may queue the next job */
  after(data, status);
}

int tp_job_queue(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data) {
  tp__job_t *j = malloc(sizeof(*j));
  int r;
  if (j == NULL)
    return UV_ENOMEM;
  j->req.data = j;
  j->work = work;
  j->after = after;
  j->data = data;
  r = uv_queue_work(loop, &j->req, tp__job_work, tp__job_after);
  if (r < 0)
    free(j);
  return r;
}
