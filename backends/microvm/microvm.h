/* tupper microvm backend: one QEMU `microvm` machine per sandbox
 * (docs/microvm.md).
 *
 * The Lua side (lua/tupper/microvm.lua) prepares everything that is data:
 * the kernel and initramfs (vmkernel.lua), the disks, QEMU's command line.
 * This file does the privileged part: it starts QEMU as an unprivileged host
 * user inside the sandbox's cgroups.  QEMU reaches nothing by path: the
 * agent channel is one end of a socketpair at QEMU's fd 3 (`-chardev
 * socket,fd=3`), so the host end of the guest's virtio-serial port is open
 * before the guest boots, and the files it needs (kernel, initramfs, disks)
 * are opened by the daemon and passed as fds 4, 5, ... (QEMU opens them as
 * /proc/self/fd/N).  So the state and cache dirs stay private to root.
 *
 * The result is a tp_box_t like the linux backend's: pid/pidfd are QEMU's,
 * chan_fd carries the agent's frames, and tp_linux_box_destroy (SIGKILL,
 * reap, remove the dir) destroys it. */
#ifndef TP_MICROVM_H
#define TP_MICROVM_H

#include <sys/types.h>

#include "error.h"
#include "linux.h"

typedef struct tp_vm_spec_s {
  const char *const *argv; /* QEMU's argv; argv[0] an absolute path */
  const int *pass_fds;     /* become QEMU's fds 4, 5, ...; the caller keeps and closes them */
  int npass;
  uid_t uid;               /* QEMU runs as uid:gid, no supplementary groups */
  gid_t gid;
  /* NULL-terminated cgroup.procs files QEMU joins before its exec, or NULL */
  const char *const *cgroup_procs;
  int console_fd;          /* QEMU's stdout and stderr (the serial console), or -1 */
} tp_vm_spec_t;

/* Starts QEMU.  On failure no process is left; the caller removes its
 * directory. */
int tp_microvm_start(const tp_vm_spec_t *spec, tp_box_t *box, tp_error_t *err);

#endif
