/* tupper: the box's seccomp filter.
 *
 * One policy for every box (docs/security-seccomp.md): an allowlist for the
 * x86_64 ABI, every other syscall answers EPERM, a handful of kernel-attack
 * calls kill the process, and any other ABI (i386 via int 0x80, x32) kills the
 * process.  The daemon builds the program once and hands it to every box in
 * tp_box_spec_t.seccomp; the box's first process loads it with no_new_privs
 * just before it execs the agent.
 *
 * Not named seccomp.h: backends/linux is on every target's -I path, which
 * comes before /usr/include, so that name would hide libseccomp's header. */
#ifndef TP_SECCOMP_H
#define TP_SECCOMP_H

#include <linux/filter.h>

#include "error.h"

/* Builds the box filter once; *prog owns a malloc'ed array of sock_filter
 * (free with tp_seccomp_free).  Deterministic: two builds give the same
 * program.  Fails, naming the syscall, if any rule cannot be added. */
int tp_seccomp_build(struct sock_fprog *prog, tp_error_t *err);
void tp_seccomp_free(struct sock_fprog *prog);

/* Internal, for tests: what the policy decided for x86_64 syscall nr. */
enum {
  TP__SC_ALLOW = 1, /* allowed, whatever the arguments */
  TP__SC_ALLOW_IF,  /* allowed for some argument values only, else EPERM */
  TP__SC_EPERM,     /* refused with EPERM (the default action) */
  TP__SC_ENOSYS,    /* refused with ENOSYS, so that libc falls back */
  TP__SC_KILL,      /* the calling process is killed (SIGSYS) */
};
/* Returns one of TP__SC_* and sets *name, or 0 when the table does not list
 * nr (then the default, EPERM, applies). */
int tp__seccomp_verdict(int nr, const char **name);

#endif
