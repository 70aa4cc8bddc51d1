/* tupper microvm backend: one QEMU `microvm` machine per sandbox
 * (docs/microvm.md).
 *
 * The Lua side (lua/tupper/microvm.lua) prepares everything that is data:
 * the kernel and initramfs (vmkernel.lua), the disks, QEMU's command line.
 * This file does the privileged part: it starts QEMU as an unprivileged host
 * user inside the sandbox's cgroups.  QEMU reaches nothing by path: the
 * agent channel is a unix socket the daemon bound at <dir>/agent.sock (dir
 * is root's, 0700) and passes listening at QEMU's fd 3 (`-chardev
 * socket,fd=3,server=on,wait=off`); the daemon connects to it before the
 * guest boots, and a restarted daemon connects to it again
 * (tp_microvm_adopt).  The files QEMU needs (kernel, initramfs, disks) are
 * opened by the daemon and passed as fds 4, 5, ... (QEMU opens them as
 * /proc/self/fd/N).  So the state and cache dirs stay private to root.
 *
 * The result is a tp_box_t like the linux backend's: pid/pidfd are QEMU's,
 * chan_fd carries the agent's frames, and tp_box_destroy (SIGKILL, reap,
 * remove the dir) destroys it. */
#ifndef TP_MICROVM_H
#define TP_MICROVM_H

#include <stdint.h>
#include <sys/types.h>

#include "backend.h" /* tp_box_t */
#include "error.h"

typedef struct tp_vm_spec_s {
  const char *const *argv; /* QEMU's argv; argv[0] an absolute path */
  const int *pass_fds;     /* become QEMU's fds 4, 5, ...; the caller keeps and closes them */
  int npass;
  uid_t uid;               /* QEMU runs as uid:gid, no supplementary groups */
  gid_t gid;
  /* NULL-terminated cgroup.procs files QEMU joins before its exec, or NULL */
  const char *const *cgroup_procs;
  int console_fd;          /* QEMU's stdout and stderr (the serial console), or -1 */
  const char *dir;         /* the VM's dir (root's, 0700): agent.sock is bound there */
  int die_with_parent;     /* a VM that is never re-adopted (a snapshot's template): QEMU gets
                              a parent-death signal; a sandbox's QEMU outlives a crashed daemon */
} tp_vm_spec_t;

/* Starts QEMU.  On failure no process is left; the caller removes its
 * directory. */
int tp_microvm_start(const tp_vm_spec_t *spec, tp_box_t *box, tp_error_t *err);

/* What a restarted daemon knows of a VM from its record: hostile input. */
typedef struct tp_vm_adopt_s {
  const char *dir;          /* the VM's dir, derived from its id (never from the record) */
  pid_t pid;                /* QEMU's pid, uid and start time (clock ticks since boot) */
  uid_t uid;
  unsigned long long start_time;
  const char *cgroup_procs; /* the VM's cgroup.procs, which must list pid; NULL without cgroups */
} tp_vm_adopt_t;

/* Re-adopts a VM a previous daemon started: pid must be a live process of
 * uid, started at start_time, in the VM's cgroup, and the listener of
 * <dir>/agent.sock (SO_PEERCRED); box gets QEMU's pid and pidfd and a new
 * connection to the agent's port.  Nothing is signalled on failure. */
int tp_microvm_adopt(const tp_vm_adopt_t *a, tp_box_t *box, tp_error_t *err);

/* The start time of pid (field 22 of /proc/<pid>/stat, clock ticks since
 * boot) into *out: with the pid, what tells a process from a later one. */
int tp_microvm_start_time(pid_t pid, unsigned long long *out, tp_error_t *err);

/* A sealed memfd (no writes, no resize, no further seals) holding the guest
 * memory file at path (size bytes), its zero pages left as holes: what
 * every VM started from a snapshot maps privately (QEMU's
 * memory-backend-file with share=off, opening /proc/self/fd/N).  A VM's
 * writes are copy-on-write pages of its own; none reaches the memfd, which
 * all VMs of the snapshot share.  Returns the fd (close-on-exec) or -1. */
int tp_microvm_ram_memfd(const char *path, uint64_t size, tp_error_t *err);

/* A memfd of size bytes (close-on-exec, sealable, not sealed): the guest
 * memory of the VM a snapshot is made of (memory-backend-file, share=on), so
 * that its memory is not part of the migration stream.  Returns the fd or -1. */
int tp_microvm_ram_new(uint64_t size, tp_error_t *err);

/* Writes memfd's non-zero pages to a new file at path (0600, sparse, of the
 * memfd's size), fsynced: the snapshot's guest memory on disk. */
int tp_microvm_ram_save(int memfd, const char *path, tp_error_t *err);

/* Copies the file at src_path to a new file at dst_path (0600, same size),
 * writing only the non-zero pages of src's data extents: a sparse copy of a
 * snapshot's writable disk, without a cp process. */
int tp_microvm_copy_sparse(const char *src_path, const char *dst_path, tp_error_t *err);

/* The microvm backend's vtable (backend.c): no per-daemon state. */
extern const tp_backend_t tp_backend_microvm;

#endif
