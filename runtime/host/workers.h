/* tupper: the daemon's worker threads, in place of libuv's thread pool.
 *
 * A request's work() runs on one of N threads; its done() then runs on the
 * loop.  A worker hands a finished request back on a lock-free list (a
 * compare-and-swap) and writes one eventfd that the loop polls when that
 * list was empty: the loop takes the whole list with one atomic exchange,
 * and never waits on a lock that a worker holds, nor on a signal half
 * sent.  (libuv 1.44's pool signals with uv_async_send while holding the
 * loop's completion mutex, and its loop spins in uv__async_spin while a
 * signal is half sent: on a loaded host a worker preempted by the very
 * wake-up it sent held the loop for milliseconds, docs/benchmarks.md.)
 * The queue of requests waiting for a thread is under a mutex that a
 * worker holds only to take one off; the loop wakes a worker with a
 * semaphore's post, which never waits.
 *
 * The request is the caller's, untouched by the workers but for `next`,
 * until done() runs; done() may free it and may submit more. */
#ifndef TP_WORKERS_H
#define TP_WORKERS_H

#include <stddef.h>
#include <uv.h>

typedef struct tp_workers_s tp_workers_t;
typedef struct tp_workers_req_s tp_workers_req_t;

/* work on a worker thread; done on the loop, status 0 after work, or
 * UV_ECANCELED for a request that was still queued at tp_workers_close */
typedef void (*tp_workers_work_fn)(tp_workers_req_t *req);
typedef void (*tp_workers_done_fn)(tp_workers_req_t *req, int status);

struct tp_workers_req_s {
  tp_workers_work_fn work;
  tp_workers_done_fn done;
  tp_workers_req_t *next; /* the workers' */
};

/* nthreads 1..1024, max_queued >= 1 (requests waiting for a thread); the
 * threads start now.  NULL with *err a negative uv error. */
tp_workers_t *tp_workers_new(uv_loop_t *loop, int nthreads, size_t max_queued, int *err);

/* From the loop's thread: 0, UV_EAGAIN when max_queued wait already,
 * UV_ECANCELED once closing.  The loop stays alive while a request is out. */
int tp_workers_submit(tp_workers_t *w, tp_workers_req_t *req);

/* Requests submitted and not yet done (the loop's view). */
size_t tp_workers_pending(const tp_workers_t *w);

/* From the loop's thread, not from a done(): the queued requests are done
 * with UV_ECANCELED, the running ones finish (the threads are joined) and
 * are done with 0, then the poll handle closes; the memory goes in its
 * close callback (the next uv_run).  w is gone after this call. */
void tp_workers_close(tp_workers_t *w);

#endif
