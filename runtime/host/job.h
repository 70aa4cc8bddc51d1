/* tupper: one way to run blocking work off the loop.
 *
 * work(data) runs on one of the loop's worker threads (workers.h, made at
 * the loop's first job: tp_job_threads() of them); after(data, status)
 * then runs on the loop (status UV_ECANCELED if the work never ran).  The
 * job's request is the helper's: callers keep only their own data, which
 * after() owns. */
#ifndef TP_JOB_H
#define TP_JOB_H

#include <uv.h>

typedef void (*tp_job_work_fn)(void *data);
typedef void (*tp_job_after_fn)(void *data, int status);

/* Jobs that may wait for a thread at once, a loop's: past that a queue
 * is refused with UV_EAGAIN. */
#define TP_JOB_MAX_QUEUED 16384

/* 0, or a negative uv error (ENOMEM, EAGAIN included): then neither
 * callback runs and data is still the caller's. */
int tp_job_queue(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data);

/* The same for a long job (a download, a layer's unpack, a blob's hash: a
 * second to minutes, where a box's work takes milliseconds).  At most
 * tp_job_long_max() long jobs hold threads at once, half of them, at
 * least one; the others wait here in order and go to the workers as those
 * end.  So pulls and imports, however many one client asks for, always
 * leave threads to every client's box starts, process trees, kills and
 * freezes.  From the loop's thread only (the count is the process's: the
 * daemon has one loop). */
int tp_job_queue_long(uv_loop_t *loop, tp_job_work_fn work, tp_job_after_fn after, void *data);
int tp_job_long_max(void);

/* The worker threads a loop gets: UV_THREADPOOL_SIZE as libuv read it
 * (1..1024, 4 by default). */
int tp_job_threads(void);

/* From the loop's thread at its end: the jobs still waiting for a thread
 * are answered UV_ECANCELED, the running ones end (their after() runs
 * here, status 0), the threads are joined; the loop's next run closes the
 * handle.  A later job makes new workers. */
void tp_job_stop(uv_loop_t *loop);

#endif
