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

/* The same for a long job (a download, a layer's unpack, a blob's hash: a
 * second to minutes, where a box's work takes milliseconds).  At most
 * tp_job_long_max() long jobs hold pool threads at once, half of libuv's
 * pool (UV_THREADPOOL_SIZE, 4 by default), at least one; the others wait
 * here in order and go to the pool as those end.  So pulls and imports,
 * however many one client asks for, always leave threads to every
 * client's box starts, process trees, kills and freezes.  From the loop's
 * thread only (the count is the process's, as the pool is). */
int tp_job_queue_long(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data);
int tp_job_long_max(void);

#endif
