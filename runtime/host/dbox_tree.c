/* tp_dbox_t: process trees, each in a sub cgroup of the box so that it can
 * be signalled or killed whole, setsid and double-fork included. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dbox_int.h"
#include "nspid.h"
#include "utils.h"

tp_dbox_tree_t *tp_dbox_tree_find(tp_dbox_t *b, const char *name) {
  for (tp_dbox_tree_t *t = b->trees; t != NULL; t = t->next)
    if (strcmp(t->name, name) == 0)
      return t;
  return NULL;
}

int tp_dbox_tree(tp_dbox_t *b, const char *name, pid_t box_pid, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  size_t n = 0;
  pid_t host;
  tp_dbox_tree_t *t;
  if (!tp_dbox_has_cgroup(b))
    return tp_error_set(err, ENOENT, "box has no cgroup");
  if (!(b->be->flags & TP_BACKEND_CG_BOX))
    return tp_error_set(err, EOPNOTSUPP, "tree: the box's processes are not in its cgroup (%s)",
                        b->be->name);
  if (strlen(name) >= sizeof(t->name) || !tp_cgroup_valid_name(name))
    return tp_error_set(err, EINVAL, "tree: bad name");
  if (tp_dbox_tree_find(b, name) != NULL)
    return tp_error_set(err, EEXIST, "tree '%s' exists", name);
  if (tp_cgroup_pids(&b->cg, &pids, &n, err) < 0 ||
      tp_nspid_host_pid(pids, n, box_pid, &host, err) < 0)
    return -1;
  t = calloc(1, sizeof(*t));
  if (t == NULL)
    return tp_error_set(err, ENOMEM, "tree: out of memory");
  snprintf(t->name, sizeof(t->name), "%s", name);
  if (tp_cgroup_sub(&b->cg, name, &t->cg, err) < 0) {
    free(t);
    return -1;
  }
  if (tp_cgroup_attach(&t->cg, host, err) < 0) {
    tp_error_t e2 = {0};
    tp_cgroup_destroy(&t->cg, &e2);
    tp_cgroup_free(&t->cg);
    free(t);
    return -1;
  }
  t->next = b->trees;
  b->trees = t;
  return 0;
}

int tp_dbox_tree_signal(tp_dbox_t *b, tp_dbox_tree_t *t, int sig, size_t *n, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  (void) b;
  *n = 0;
  if (tp_cgroup_pids(&t->cg, &pids, n, err) < 0)
    return -1;
  if (sig == SIGKILL)
    return tp_cgroup_kill(&t->cg, err);
  for (size_t i = 0; i < *n; i++)
    kill(pids[i], sig);
  return 0;
}

int tp_dbox_tree_count(tp_dbox_t *b, tp_dbox_tree_t *t, size_t *n, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  (void) b;
  *n = 0;
  return tp_cgroup_pids(&t->cg, &pids, n, err);
}

int tp_dbox_tree_remove(tp_dbox_t *b, tp_dbox_tree_t *t, tp_error_t *err) {
  for (tp_dbox_tree_t **pp = &b->trees; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == t) {
      /* v1 counts an OOM kill in the sub only: the box keeps the count */
      int64_t oom = t->cg.version == 1 ? tp_cgroup_oom_kills(&t->cg) : -1;
      if (tp_cgroup_destroy(&t->cg, err) < 0)
        return -1;
      if (oom > 0)
        b->oom_gone += oom;
      *pp = t->next;
      free(t);
      return 0;
    }
  }
  return tp_error_set(err, ENOENT, "no such tree");
}
