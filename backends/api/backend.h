/* tupper: the backend interface.
 *
 * A backend turns a start spec into a running box: a host process (the
 * box's PID 1, or the engine that runs the box, such as QEMU) with a pidfd,
 * and a channel to the agent inside.  Everything around that is the
 * daemon's and the same for every backend (runtime/host): the box's cgroup
 * and its limits, the channel's frames, process trees, destroy in the thread
 * pool.  Backends are registered by name in registry.c; no code outside a
 * backend's own folder asks which backend a box runs on: what differs is in
 * the vtable and its flags.
 *
 * Threat model at this interface: a start spec comes from the daemon's own
 * Lua code (trusted, but checked: check_start); an adopt spec comes from a
 * record on disk that a box may have influenced (hostile: check_adopt, and
 * adopt proves the process is the box's before it touches it).
 *
 * Includes nothing of ours but backends/common. */
#ifndef TP_BACKEND_H
#define TP_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"

/* A running box, whichever backend started it. */
typedef struct tp_box_s {
  pid_t pid;   /* host pid of the box's PID 1 (linux: the agent; microvm: QEMU) */
  int pidfd;   /* pidfd of pid (CLOEXEC); readable when it exits */
  int chan_fd; /* host end of the agent channel (CLOEXEC, non-blocking) */
  int resolv;  /* 1: the box's set-up wrote its /etc/resolv.conf (tp_start_spec_t.resolv) */
} tp_box_t;

/* A box's /etc/resolv.conf: names resolve through the agent's DNS port
 * (docs/network.md) */
#define TP_RESOLV_CONF "nameserver 127.0.0.1\n"


#define TP_SPEC_UNSET INT64_MIN /* an integer field the caller did not give */
#define TP_SPEC_LIST_MAX 512    /* items of one list field (layers, argv, fds) */

/* Everything a box start may say: the union of every backend's fields.
 * Strings and lists are borrowed (the daemon copies them before the start
 * leaves the loop); a list is NULL when absent, else n items.  check_start
 * validates the fields its backend uses and fills their defaults; the
 * others are ignored. */
typedef struct tp_start_spec_s {
  const char *id;  /* sandbox id: [a-z0-9-]{1,63} */
  const char *dir; /* the box's own dir (root's, 0700) */
  /* NULL-terminated cgroup.procs files the box's PID 1 joins before anything
   * of the box runs, or NULL: set by the daemon, not the caller */
  const char *const *cgroup_procs;
  /* linux */
  const char *const *layers; /* read-only layers, lowest first */
  int n_layers;
  int64_t uid_base, gid_base, id_count; /* the mapped range of root in the box */
  int64_t disk_bytes;                   /* 0: no disk cap */
  const char *pool; /* the btrfs pool the box's upper dir goes on (with a disk cap), or NULL */
  /* 1: the set-up writes TP_RESOLV_CONF to the box's /etc/resolv.conf where
   * it can do so without following a link (tp_box_t.resolv says if it did) */
  int resolv;
  /* volumes mounted in the box: pairs image, target ("/abs/path" in the
   * box), n_volumes strings in all (even), or NULL */
  const char *const *volumes;
  int n_volumes;
  /* microvm */
  const char *const *argv; /* the engine's argv (argv[0] absolute) */
  int argc;
  const int *fds; /* become the engine's fds 4, 5, ... */
  int nfds;
  int64_t uid, gid;      /* the engine runs as uid:gid */
  int64_t console_fd;    /* the engine's stdout and stderr, or -1 */
  int die_with_parent;   /* a box that is never adopted: dies with the daemon */
} tp_start_spec_t;

/* What a restarted daemon knows of a box it did not start: hostile but for
 * id and dir, which the daemon derives from the box's id. */
typedef struct tp_adopt_spec_s {
  const char *id;
  const char *dir;
  int64_t pid;               /* the box's PID 1 as recorded */
  int64_t uid;               /* microvm: the engine's uid, as recorded */
  int64_t start_time;        /* microvm: its start time, clock ticks since boot */
  const char *cgroup_procs;  /* the box cgroup's cgroup.procs, or NULL: set by the daemon */
} tp_adopt_spec_t;

/* What the daemon hands every backend's init. */
typedef struct tp_backend_env_s {
  const void *agent; /* the static agent binary (embedded in tupper) */
  size_t agent_len;
} tp_backend_env_t;

enum {
  /* The box's own processes live in its cgroup (not only an engine that
   * runs them): limits need cgroups (a start with limits fails without
   * them), and process trees (sub cgroups) can be made of them. */
  TP_BACKEND_CG_BOX = 1u << 0,
  /* PID 1 on the host is the box's agent: the OOM killer must never pick it
   * (tp_oom_protect right after the start). */
  TP_BACKEND_OOM_PROTECT = 1u << 1,
};

typedef struct tp_backend_s {
  const char *name; /* what core.start(name, ...) says */
  unsigned flags;   /* TP_BACKEND_* */
  /* Builds the per-daemon state (on the loop, before the first start; NULL:
   * none), and frees it at the daemon's end. */
  int (*init)(const tp_backend_env_t *env, void **state, tp_error_t *err);
  void (*fini)(void *state);
  /* On the loop, before anything is taken: validates the fields this
   * backend uses and fills their defaults.  EINVAL naming the field. */
  int (*check_start)(tp_start_spec_t *spec, tp_error_t *err);
  /* In libuv's thread pool (it may block until the box runs).  On failure
   * no process is left; the caller removes dir. */
  int (*start)(void *state, const tp_start_spec_t *spec, tp_box_t *box, tp_error_t *err);
  /* Validates a record's values (they are hostile): an expected failure. */
  int (*check_adopt)(const tp_adopt_spec_t *spec, tp_error_t *err);
  /* Takes over a live box an earlier daemon started, once it proved to be
   * that box; nothing is signalled on failure. */
  int (*adopt)(void *state, const tp_adopt_spec_t *spec, tp_box_t *box, tp_error_t *err);
  /* Kills the box, waits for its end, closes its fds and removes dir (NULL:
   * kept).  Blocking: the thread pool, or a last resort on the loop. */
  int (*destroy)(tp_box_t *box, const char *dir, tp_error_t *err);
} tp_backend_t;

/* The registry (registry.c): the backend of that name, or NULL. */
const tp_backend_t *tp_backend_find(const char *name);
/* The registered names, NULL-terminated, in registration order. */
const char *const *tp_backend_names(void);

/* The destroy of a box whose PID 1 is a host process with a pidfd (box.c):
 * SIGKILL through the pidfd, reap it (or, when it is not our child, wait at
 * most 10 s for its pidfd to turn readable: ETIMEDOUT, the box left as it
 * was for a retry), close the fds, remove dir if not NULL.  Safe on a box
 * whose PID 1 already exited. */
int tp_box_destroy(tp_box_t *box, const char *dir, tp_error_t *err);

#endif
