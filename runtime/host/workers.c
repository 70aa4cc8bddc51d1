/* The daemon's worker threads (workers.h): a bounded queue under one
 * mutex, N threads, completions on a lock-free list and one eventfd the
 * loop polls. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "workers.h"

struct tp_workers_s {
  uv_loop_t *loop;
  uv_poll_t poll;
  int efd;
  /* the loop's alone */
  size_t pending; /* submitted, done() not yet run */
  int refd;
  /* under mu */
  pthread_mutex_t mu;
  /* one post a request queued, nthreads at close: the loop wakes a
   * worker with sem_post, which never waits (a condition variable's
   * signal can: glibc 2.36's waits in __condvar_quiesce_and_switch_g1
   * for woken waiters that have not run yet, and libuv's pool held the
   * loop 27.7 ms there once, docs/benchmarks.md) */
  sem_t ready;
  tp_workers_req_t *head, *tail; /* queued, oldest first */
  size_t queued, max_queued;
  int closing; /* the threads leave; nothing more is queued */
  /* finished, newest first: a worker pushes with a compare-and-swap and
   * writes the eventfd when the list was empty; the loop takes the whole
   * list at once.  No lock that the loop could wait on for a worker that
   * is descheduled holding it. */
  _Atomic(tp_workers_req_t *) done;
  int nthreads;
  pthread_t threads[];
};

static void tp__workers_ring(tp_workers_t *w) {
  uint64_t one = 1;
  ssize_t r;
  do
    r = write(w->efd, &one, sizeof(one));
  while (r < 0 && errno == EINTR);
  /* EAGAIN: the counter is full, so the loop is woken anyway */
}

static void *tp__workers_main(void *arg) {
  tp_workers_t *w = arg;
  for (;;) {
    tp_workers_req_t *req, *old;
    while (sem_wait(&w->ready) < 0 && errno == EINTR)
      ;
    pthread_mutex_lock(&w->mu);
    if (w->closing) {
      pthread_mutex_unlock(&w->mu);
      break; /* what is still queued is the closer's to cancel */
    }
    if ((req = w->head) == NULL) {
      pthread_mutex_unlock(&w->mu);
      continue;
    }
    w->head = req->next;
    if (w->head == NULL)
      w->tail = NULL;
    w->queued--;
    pthread_mutex_unlock(&w->mu);

    req->work(req);

    old = atomic_load(&w->done);
    do
      req->next = old;
    while (!atomic_compare_exchange_weak(&w->done, &old, req));
    if (old == NULL)
      tp__workers_ring(w); /* wakes the loop; this thread holds nothing */
  }
  return NULL;
}

/* The loop keeps running while a request is out, and only then. */
static void tp__workers_ref(tp_workers_t *w) {
  int want = w->pending > 0;
  if (want == w->refd)
    return;
  if (want)
    uv_ref((uv_handle_t *) &w->poll);
  else
    uv_unref((uv_handle_t *) &w->poll);
  w->refd = want;
}

/* The finished requests' done(), in the order they finished. */
static void tp__workers_drain(tp_workers_t *w) {
  tp_workers_req_t *req, *next, *oldest = NULL;
  uint64_t n;
  ssize_t r;
  do
    r = read(w->efd, &n, sizeof(n));
  while (r < 0 && errno == EINTR);
  /* newest first: turned round, they are done in the order they finished */
  for (req = atomic_exchange(&w->done, NULL); req != NULL; req = next) {
    next = req->next;
    req->next = oldest;
    oldest = req;
  }
  req = oldest;
  while (req != NULL) {
    next = req->next;
    w->pending--;
    req->done(req, 0);
    req = next;
  }
  tp__workers_ref(w);
}

static void tp__workers_poll_cb(uv_poll_t *h, int status, int events) {
  tp__workers_drain(h->data);
}

static void tp__workers_free(tp_workers_t *w) {
  sem_destroy(&w->ready);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

/* Stops the first n threads: each leaves at its next post (a busy one
 * once its request is done). */
static void tp__workers_join(tp_workers_t *w, int n) {
  pthread_mutex_lock(&w->mu);
  w->closing = 1;
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < n; i++)
    sem_post(&w->ready);
  for (int i = 0; i < n; i++)
    pthread_join(w->threads[i], NULL);
}

tp_workers_t *tp_workers_new(uv_loop_t *loop, int nthreads, size_t max_queued, int *err) {
  tp_workers_t *w;
  int r, started = 0;
  if (nthreads < 1 || nthreads > 1024 || max_queued < 1) {
    *err = UV_EINVAL;
    return NULL;
  }
  w = calloc(1, sizeof(*w) + (size_t) nthreads * sizeof(pthread_t));
  if (w == NULL) {
    *err = UV_ENOMEM;
    return NULL;
  }
  w->loop = loop;
  atomic_init(&w->done, NULL);
  w->max_queued = max_queued;
  w->nthreads = nthreads;
  pthread_mutex_init(&w->mu, NULL);
  sem_init(&w->ready, 0, 0);
  w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->efd < 0) {
    *err = -errno;
    tp__workers_free(w);
    return NULL;
  }
  if ((r = uv_poll_init(loop, &w->poll, w->efd)) < 0) {
    *err = r;
    close(w->efd);
    tp__workers_free(w);
    return NULL;
  }
  w->poll.data = w;
  uv_unref((uv_handle_t *) &w->poll);
  if ((r = uv_poll_start(&w->poll, UV_READABLE, tp__workers_poll_cb)) < 0) {
    *err = r;
    w->closing = 1; /* no thread yet: tp_workers_close only closes */
    tp_workers_close(w);
    return NULL;
  }
  for (; started < nthreads; started++)
    if ((r = pthread_create(&w->threads[started], NULL, tp__workers_main, w)) != 0)
      break;
  if (started < nthreads) {
    tp__workers_join(w, started);
    *err = -r;
    tp_workers_close(w);
    return NULL;
  }
  return w;
}

int tp_workers_submit(tp_workers_t *w, tp_workers_req_t *req) {
  pthread_mutex_lock(&w->mu);
  if (w->closing) {
    pthread_mutex_unlock(&w->mu);
    return UV_ECANCELED;
  }
  if (w->queued >= w->max_queued) {
    pthread_mutex_unlock(&w->mu);
    return UV_EAGAIN;
  }
  req->next = NULL;
  if (w->tail != NULL)
    w->tail->next = req;
  else
    w->head = req;
  w->tail = req;
  w->queued++;
  pthread_mutex_unlock(&w->mu);
  /* after the unlock: the thread it wakes does not wait on the lock */
  sem_post(&w->ready);
  w->pending++;
  tp__workers_ref(w);
  return 0;
}

size_t tp_workers_pending(const tp_workers_t *w) { return w->pending; }

static void tp__workers_close_cb(uv_handle_t *h) {
  tp_workers_t *w = h->data;
  close(w->efd);
  tp__workers_free(w);
}

void tp_workers_close(tp_workers_t *w) {
  tp_workers_req_t *req;
  pthread_mutex_lock(&w->mu);
  if (!w->closing) {
    pthread_mutex_unlock(&w->mu);
    tp__workers_join(w, w->nthreads);
  } else {
    pthread_mutex_unlock(&w->mu); /* tp_workers_new's failure: joined there */
  }
  /* the threads are gone: what finished is done, what waited is cancelled */
  tp__workers_drain(w);
  req = w->head;
  w->head = w->tail = NULL;
  w->queued = 0;
  while (req != NULL) {
    tp_workers_req_t *next = req->next;
    w->pending--;
    req->done(req, UV_ECANCELED);
    req = next;
  }
  uv_close((uv_handle_t *) &w->poll, tp__workers_close_cb);
}
