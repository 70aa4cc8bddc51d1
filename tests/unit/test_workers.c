/* The daemon's worker threads (runtime/host/workers.c) on a real loop:
 * many requests, each done once whatever order they finish in, the
 * bounded queue, a done() that submits more, a close with requests still
 * queued and one running, and a request whose requester went away before
 * it finished.  Run it under valgrind or ASan for the leaks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <uv.h>

#include "tap.h"
#include "workers.h"

typedef struct {
  tp_workers_req_t req; /* first */
  int id, sleep_us;
  atomic_int ran;
  int done, status;
} job_t;

static atomic_int total_runs;
static int done_order[2000], n_done;

static void job_work(tp_workers_req_t *r) {
  job_t *j = (job_t *) r;
  if (j->sleep_us > 0)
    usleep((useconds_t) j->sleep_us);
  atomic_fetch_add(&j->ran, 1);
  atomic_fetch_add(&total_runs, 1);
}

static void job_done(tp_workers_req_t *r, int status) {
  job_t *j = (job_t *) r;
  j->done++;
  j->status = status;
  if (n_done < 2000)
    done_order[n_done++] = j->id;
}

static tp_workers_t *make(uv_loop_t *loop, int n, size_t max) {
  int err = 0;
  tp_workers_t *w = tp_workers_new(loop, n, max, &err);
  check(w != NULL, "new: %d threads, %zu queued at most (%s)", n, max, w ? "ok" : uv_strerror(err));
  return w;
}

/* 2000 requests on 4 threads, the first ones slower so they finish late:
 * each runs once and is done once, with status 0, and the loop's run ends
 * when the last is done (the workers hold the loop only while busy). */
static void test_many(void) {
  uv_loop_t loop;
  static job_t jobs[2000];
  tp_workers_t *w;
  int ok = 1, once = 1, out_of_order = 0;
  uv_loop_init(&loop);
  if ((w = make(&loop, 4, 4096)) == NULL)
    return;
  n_done = 0;
  for (int i = 0; i < 2000; i++) {
    jobs[i].req.work = job_work;
    jobs[i].req.done = job_done;
    jobs[i].id = i;
    jobs[i].sleep_us = i < 8 ? 20000 - i * 2000 : 0;
    ok &= tp_workers_submit(w, &jobs[i].req) == 0;
  }
  check(ok && tp_workers_pending(w) == 2000, "many: 2000 submitted, 2000 pending");
  uv_run(&loop, UV_RUN_DEFAULT);
  for (int i = 0; i < 2000; i++)
    once &= atomic_load(&jobs[i].ran) == 1 && jobs[i].done == 1 && jobs[i].status == 0;
  for (int i = 1; i < n_done; i++)
    out_of_order |= done_order[i] < done_order[i - 1];
  check(once && n_done == 2000 && atomic_load(&total_runs) == 2000,
        "many: each ran once on a thread and was done once on the loop (status 0)");
  check(out_of_order, "many: they were done in the order they finished, not submitted");
  check(tp_workers_pending(w) == 0, "many: none pending, and uv_run returned");
  tp_workers_close(w);
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "many: after close the loop closes");
}

/* a request that holds its thread until released */
static atomic_int gate, gate_taken;
static void gate_work(tp_workers_req_t *r) {
  atomic_store(&gate_taken, 1);
  for (int i = 0; i < 10000 && !atomic_load(&gate); i++) /* 10 s at most */
    usleep(1000);
  job_work(r);
}

static void *release_later(void *arg) {
  usleep(50000);
  atomic_store(&gate, 1);
  return arg;
}

/* one thread, two may wait: the third waiting is refused, then the
 * close cancels the two and lets the running one finish */
static void test_bound_and_close(void) {
  uv_loop_t loop;
  job_t held = {0}, q[3] = {0};
  tp_workers_t *w;
  pthread_t t;
  uv_loop_init(&loop);
  if ((w = make(&loop, 1, 2)) == NULL)
    return;
  atomic_store(&gate, 0);
  held.req.work = gate_work;
  held.req.done = job_done;
  check(tp_workers_submit(w, &held.req) == 0, "bound: the first holds the thread");
  for (int i = 0; i < 5000 && !atomic_load(&gate_taken); i++) /* off the queue */
    usleep(1000);
  for (int i = 0; i < 3; i++) {
    q[i].req.work = job_work;
    q[i].req.done = job_done;
  }
  check(tp_workers_submit(w, &q[0].req) == 0 && tp_workers_submit(w, &q[1].req) == 0,
        "bound: two wait");
  check(tp_workers_submit(w, &q[2].req) == UV_EAGAIN, "bound: a third waiting is refused (EAGAIN)");
  pthread_create(&t, NULL, release_later, NULL);
  tp_workers_close(w); /* joins: waits for the held one */
  pthread_join(t, NULL);
  check(held.done == 1 && held.status == 0 && atomic_load(&held.ran) == 1,
        "close: the running one finished and was done with 0");
  check(q[0].done == 1 && q[0].status == UV_ECANCELED && q[1].done == 1 &&
            q[1].status == UV_ECANCELED && atomic_load(&q[0].ran) == 0 &&
            atomic_load(&q[1].ran) == 0,
        "close: the queued ones never ran and were done with ECANCELED");
  check(q[2].done == 0, "close: the refused one was never done");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "close: the loop closes (threads joined, handle closed)");
}

/* A requester (a box, a connection) that goes away while its request
 * runs: the request is a heap object of its own that done() frees; the
 * requester only had a pointer to it, cleared as it went. */
typedef struct requester_s requester_t;
typedef struct {
  tp_workers_req_t req;
  requester_t *owner; /* NULL once the requester is gone */
} orphan_t;
struct requester_s {
  orphan_t *pending;
};
static int orphan_done, orphan_owner_seen;

static void orphan_work(tp_workers_req_t *r) { usleep(20000); (void) r; }
static void orphan_after(tp_workers_req_t *r, int status) {
  orphan_t *o = (orphan_t *) r;
  orphan_done += status == 0;
  orphan_owner_seen += o->owner != NULL;
  free(o);
}

/* and a done() that submits another request (a chain of 5) */
static int chain_left = 5, chain_done;
static tp_workers_t *chain_w;
static void chain_after(tp_workers_req_t *r, int status) {
  chain_done += status == 0;
  if (--chain_left > 0 && tp_workers_submit(chain_w, r) == 0)
    return;
  free(r);
}
static void noop_work(tp_workers_req_t *r) { (void) r; }

static void test_orphan_and_chain(void) {
  uv_loop_t loop;
  requester_t *who = malloc(sizeof(*who));
  orphan_t *o = malloc(sizeof(*o));
  tp_workers_req_t *c = malloc(sizeof(*c));
  uv_loop_init(&loop);
  if ((chain_w = make(&loop, 2, 16)) == NULL || who == NULL || o == NULL || c == NULL)
    return;
  o->req.work = orphan_work;
  o->req.done = orphan_after;
  o->owner = who;
  who->pending = o;
  check(tp_workers_submit(chain_w, &o->req) == 0, "orphan: submitted");
  /* the requester goes away at once: it lets go of the request */
  who->pending->owner = NULL;
  free(who);
  c->work = noop_work;
  c->done = chain_after;
  check(tp_workers_submit(chain_w, c) == 0, "chain: the first submitted");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(orphan_done == 1 && orphan_owner_seen == 0,
        "orphan: done once after its requester went away, which it did not touch");
  check(chain_done == 5 && chain_left == 0, "chain: each done() submitted the next, 5 in all");
  tp_workers_close(chain_w);
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "chain: the loop closes");
}

static void test_bad_args(void) {
  uv_loop_t loop;
  int err = 0;
  uv_loop_init(&loop);
  check(tp_workers_new(&loop, 0, 1, &err) == NULL && err == UV_EINVAL, "new: 0 threads is EINVAL");
  check(tp_workers_new(&loop, 1025, 1, &err) == NULL && err == UV_EINVAL,
        "new: 1025 threads is EINVAL");
  check(tp_workers_new(&loop, 1, 0, &err) == NULL && err == UV_EINVAL, "new: no queue is EINVAL");
  check(uv_loop_close(&loop) == 0, "new: a refused one leaves nothing on the loop");
}

int main(void) {
  test_many();
  test_bound_and_close();
  test_orphan_and_chain();
  test_bad_args();
  return tap_done();
}
