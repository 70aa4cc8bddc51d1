/* tupper: what one daemon holds for all its boxes: the cgroup filesystems
 * it found and each backend's state (built on first use: the linux
 * backend's agent memfd and seccomp filter).  One per Lua state; no
 * globals. */
#ifndef TP_DAEMON_H
#define TP_DAEMON_H

#include "backend.h"
#include "cgroup.h"
#include "error.h"

#define TP_DAEMON_BACKENDS_MAX 16

typedef struct tp_daemon_s {
  tp_backend_env_t env;
  int has_cgroups;
  tp_cgroup_root_t cgroot;
  struct {
    const tp_backend_t *be;
    void *state;
  } be[TP_DAEMON_BACKENDS_MAX];
  int n_be;
} tp_daemon_t;

/* agent: the static agent binary, kept by the caller for the daemon's life. */
void tp_daemon_init(tp_daemon_t *d, const void *agent, size_t agent_len);
/* Frees the backends' states and the cgroup root; idempotent. */
void tp_daemon_close(tp_daemon_t *d);

/* Finds the cgroup filesystems below root_dir (NULL: /sys/fs/cgroup):
 * boxes started after it get a cgroup each.  On failure the daemon has no
 * cgroups. */
int tp_daemon_cgroup_init(tp_daemon_t *d, const char *root_dir, tp_error_t *err);

/* be's per-daemon state into *state, made by be->init on first use (on the
 * loop).  A failed init is retried at the next call. */
int tp_daemon_backend_state(tp_daemon_t *d, const tp_backend_t *be, void **state,
                            tp_error_t *err);

#endif
