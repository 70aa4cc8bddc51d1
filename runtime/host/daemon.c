/* tp_daemon_t: the cgroup root and the backends' states of one daemon. */
#include <errno.h>
#include <string.h>

#include "daemon.h"

void tp_daemon_init(tp_daemon_t *d, const void *agent, size_t agent_len) {
  memset(d, 0, sizeof(*d));
  d->env.agent = agent;
  d->env.agent_len = agent_len;
}

void tp_daemon_close(tp_daemon_t *d) {
  if (d->has_cgroups) {
    tp_cgroup_root_free(&d->cgroot);
    d->has_cgroups = 0;
  }
  for (int i = 0; i < d->n_be; i++)
    if (d->be[i].be->fini != NULL)
      d->be[i].be->fini(d->be[i].state);
  d->n_be = 0;
}

int tp_daemon_cgroup_init(tp_daemon_t *d, const char *root_dir, tp_error_t *err) {
  if (d->has_cgroups) {
    tp_cgroup_root_free(&d->cgroot);
    d->has_cgroups = 0;
  }
  if (tp_cgroup_detect(root_dir, &d->cgroot, err) < 0)
    return -1;
  d->has_cgroups = 1;
  return 0;
}

int tp_daemon_backend_state(tp_daemon_t *d, const tp_backend_t *be, void **state,
                            tp_error_t *err) {
  void *s = NULL;
  for (int i = 0; i < d->n_be; i++) {
    if (d->be[i].be == be) {
      *state = d->be[i].state;
      return 0;
    }
  }
  if (d->n_be == TP_DAEMON_BACKENDS_MAX)
    return tp_error_set(err, ENOSPC, "%s: too many backends", be->name);
  if (be->init != NULL && be->init(&d->env, &s, err) < 0)
    return -1;
  d->be[d->n_be].be = be;
  d->be[d->n_be].state = s;
  d->n_be++;
  *state = s;
  return 0;
}
