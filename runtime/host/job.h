/* tupper: one way to run blocking work in libuv's thread pool.
 *
 * work(data) runs on a pool thread; after(data, status) then runs on the
 * loop (status UV_ECANCELED if the work never ran).  The job's uv_work_t is
 * the helper's: callers keep only their own data, which after() owns. */
#ifndef TP_JOB_H
#define TP_JOB_H

#include <uv.h>

typedef void (*tp_job_work_fn)(void *data);
typedef void (*tp_job_after_fn)(void *data, int status);

/* 0, or a negative uv error (ENOMEM included): then neither callback runs
 * and data is still the caller's. */
int tp_job_queue(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data);

#endif
