/* The linux backend's vtable: a box is a set of namespaces around the agent
 * (linux.h).  Its per-daemon state is what every box shares and the daemon
 * builds once: the agent as a sealed memfd and the seccomp filter. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "linux_int.h"
#include "rmtree.h"
#include "tp_seccomp.h"

typedef struct tp__linux_state_s {
  int agent_fd;
  struct sock_fprog seccomp;
} tp__linux_state_t;

static void linux_fini(void *state) {
  tp__linux_state_t *s = state;
  if (s == NULL)
    return;
  tp_seccomp_free(&s->seccomp);
  if (s->agent_fd >= 0)
    close(s->agent_fd);
  free(s);
}

static int linux_init(const tp_backend_env_t *env, void **state, tp_error_t *err) {
  tp__linux_state_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return tp_error_set(err, ENOMEM, "linux backend: out of memory");
  s->agent_fd = tp_agent_memfd(env->agent, env->agent_len, err);
  if (s->agent_fd < 0) {
    free(s);
    return -1;
  }
  if (tp_seccomp_build(&s->seccomp, err) < 0) { /* no box runs without its filter */
    close(s->agent_fd);
    free(s);
    return -1;
  }
  *state = s;
  return 0;
}

static int linux_check_start(tp_start_spec_t *spec, tp_error_t *err) {
  if (spec->layers == NULL)
    return tp_error_set(err, EINVAL, "box_start: layers must be a list of dirs");
  if (spec->n_layers < 1 || spec->n_layers > TP_LAYERS_MAX)
    return tp_error_set(err, EINVAL, "box_start: 1 to %d layers, not %d", TP_LAYERS_MAX,
                        spec->n_layers);
  if (spec->uid_base == TP_SPEC_UNSET)
    return tp_error_set(err, EINVAL, "box_start: uid_base is required");
  if (spec->gid_base == TP_SPEC_UNSET)
    spec->gid_base = spec->uid_base;
  if (spec->id_count == TP_SPEC_UNSET)
    spec->id_count = 65536;
  if (spec->disk_bytes == TP_SPEC_UNSET)
    spec->disk_bytes = 0;
  return 0;
}

static int linux_start(void *state, const tp_start_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  const tp__linux_state_t *s = state;
  tp_box_volume_t vols[TP_VOLUMES_MAX];
  int nv = spec->volumes != NULL ? spec->n_volumes / 2 : 0;
  if (nv > TP_VOLUMES_MAX || (spec->volumes != NULL && spec->n_volumes % 2 != 0))
    return tp_error_set(err, EINVAL, "box_start: volumes must be at most %d image, target pairs",
                        TP_VOLUMES_MAX);
  for (int i = 0; i < nv; i++) {
    vols[i].image = spec->volumes[2 * i];
    vols[i].target = spec->volumes[2 * i + 1];
  }
  tp_box_spec_t bs = {
      .id = spec->id,
      .layers = spec->layers,
      .box_dir = spec->dir,
      .agent_fd = s->agent_fd,
      .uid_base = (uid_t) spec->uid_base,
      .gid_base = (gid_t) spec->gid_base,
      .id_count = (uint32_t) spec->id_count,
      .cgroup_procs = spec->cgroup_procs,
      .disk_bytes = spec->disk_bytes,
      .pool = spec->pool,
      .seccomp = &s->seccomp,
      .volumes = vols,
      .n_volumes = nv,
      .resolv = spec->resolv ? TP_RESOLV_CONF : NULL,
  };
  return tp_linux_box_start(&bs, box, err);
}

static int linux_check_adopt(const tp_adopt_spec_t *spec, tp_error_t *err) {
  if (spec->pid < 1 || spec->pid > 0x7fffffff)
    return tp_error_set(err, EINVAL, "adopt box: bad pid in its record");
  return 0;
}

static int linux_adopt(void *state, const tp_adopt_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  (void) state;
  return tp_linux_box_adopt(spec->dir, (pid_t) spec->pid, box, err);
}

ssize_t tp__pool_name(const char *box_dir, char *buf, size_t len) {
  char path[TP__PATH_MAX_LEN + 96];
  ssize_t n;
  /* box.c's xattr, else its link (a filesystem without trusted xattrs,
   * or a box of an older daemon) */
  n = lgetxattr(box_dir, TP__POOL_XATTR, buf, len - 1);
  if (n < 0) {
    snprintf(path, sizeof(path), "%s/" TP__POOL_LINK, box_dir);
    n = readlink(path, buf, len - 1);
  }
  if (n > 0)
    buf[n] = '\0';
  return n;
}

int tp_linux_box_destroy(tp_box_t *box, const char *box_dir, tp_error_t *err) {
  char link[TP__PATH_MAX_LEN + 80], path[TP__PATH_MAX_LEN + 96];
  ssize_t n = -1;
  char *name = NULL;

  if (box_dir != NULL) {
    snprintf(path, sizeof(path), "%s", box_dir);
    n = tp__pool_name(box_dir, link, sizeof(link));
  }
  if (n > 0) {
    /* <pool>/boxes/<id>, as box.c wrote it */
    name = strrchr(link, '/');
    if (name == NULL || name - link < 7 || strncmp(name - 6, "/boxes", 6) != 0)
      return tp_error_set(err, EINVAL, "destroy box: bad pool link '%s'", path);
    *name++ = '\0';
    name[-7] = '\0'; /* link is the pool dir now */
  }
  if (tp_box_destroy(box, NULL, err) < 0)
    return -1;
  /* every process of the box is gone: nothing writes to its subvolume,
   * kept as a spare where the box left nothing in it, else deleted */
  if (name != NULL && tp__pool_box_keep(link, name, err) < 0 && err->code != ENOENT)
    return tp_error_prefix(err, "destroy box");
  /* emptied and kept for the next start where it can be, else removed */
  if (box_dir != NULL && tp__spare_dir_keep(box_dir) < 0 && tp_rmtree(box_dir, err) < 0)
    return tp_error_prefix(err, "destroy box");
  return 0;
}

const tp_backend_t tp_backend_linux = {
    .name = "linux",
    .flags = TP_BACKEND_CG_BOX | TP_BACKEND_OOM_PROTECT,
    .init = linux_init,
    .fini = linux_fini,
    .check_start = linux_check_start,
    .start = linux_start,
    .check_adopt = linux_check_adopt,
    .adopt = linux_adopt,
    .destroy = tp_linux_box_destroy,
};
