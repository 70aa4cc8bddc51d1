/* The microvm backend's vtable: a box is a QEMU microvm machine whose
 * guest runs the agent as init (microvm.h).  QEMU is what lives on the
 * host, in the box's cgroup: its limits fence QEMU, the guest kernel
 * bounds the box's own processes.  No per-daemon state. */
#include <errno.h>

#include "microvm.h"
#include "utils.h"

#define TP__VM_FDS_MAX 64
#define TP__VM_ARGV_MAX 512

static int vm_check_start(tp_start_spec_t *spec, tp_error_t *err) {
  if (!tp_name_valid(spec->id))
    return tp_error_set(err, EINVAL, "vm_start: bad id");
  if (spec->dir == NULL || spec->dir[0] != '/')
    return tp_error_set(err, EINVAL, "vm_start: dir must be absolute");
  if (spec->gid == TP_SPEC_UNSET)
    spec->gid = spec->uid;
  if (spec->console_fd == TP_SPEC_UNSET)
    spec->console_fd = -1;
  if (spec->uid <= 0 || spec->uid > 0x7fffffff || spec->gid <= 0 || spec->gid > 0x7fffffff)
    return tp_error_set(err, EINVAL, "vm_start: QEMU must run as an unprivileged uid and gid");
  if (spec->console_fd < -1 || spec->console_fd > 0x7fffffff)
    return tp_error_set(err, EINVAL, "vm_start: bad console_fd");
  if (spec->fds == NULL)
    return tp_error_set(err, EINVAL, "vm_start: fds must be a list of file descriptors");
  if (spec->nfds > TP__VM_FDS_MAX)
    return tp_error_set(err, EINVAL, "vm_start: at most %d fds", TP__VM_FDS_MAX);
  if (spec->argv == NULL || spec->argc < 1 || spec->argc > TP__VM_ARGV_MAX)
    return tp_error_set(err, EINVAL, "vm_start: argv must have 1 to %d items", TP__VM_ARGV_MAX);
  return 0;
}

static int vm_start(void *state, const tp_start_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  tp_vm_spec_t vs = {
      .argv = spec->argv,
      .pass_fds = spec->fds,
      .npass = spec->nfds,
      .uid = (uid_t) spec->uid,
      .gid = (gid_t) spec->gid,
      .cgroup_procs = spec->cgroup_procs,
      .console_fd = (int) spec->console_fd,
      .dir = spec->dir,
      .die_with_parent = spec->die_with_parent,
  };
  (void) state;
  return tp_microvm_start(&vs, box, err);
}

static int vm_check_adopt(const tp_adopt_spec_t *spec, tp_error_t *err) {
  if (spec->dir == NULL || spec->dir[0] != '/')
    return tp_error_set(err, EINVAL, "adopt VM: dir must be absolute");
  if (spec->pid < 2 || spec->pid > 0x7fffffff || spec->uid < 1 || spec->uid > 0x7fffffff ||
      spec->start_time < 0)
    return tp_error_set(err, EINVAL, "adopt VM: bad pid, uid or start time in its record");
  return 0;
}

static int vm_adopt(void *state, const tp_adopt_spec_t *spec, tp_box_t *box, tp_error_t *err) {
  tp_vm_adopt_t a = {
      .dir = spec->dir,
      .pid = (pid_t) spec->pid,
      .uid = (uid_t) spec->uid,
      .start_time = (unsigned long long) spec->start_time,
      .cgroup_procs = spec->cgroup_procs,
  };
  (void) state;
  return tp_microvm_adopt(&a, box, err);
}

const tp_backend_t tp_backend_microvm = {
    .name = "microvm",
    .flags = 0, /* its cgroup holds QEMU; PID 1 of the box is the guest's */
    .check_start = vm_check_start,
    .start = vm_start,
    .check_adopt = vm_check_adopt,
    .adopt = vm_adopt,
    .destroy = tp_box_destroy,
};
