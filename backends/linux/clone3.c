/* tp__clone3: clone3(2) for the box's set-up child, born in its cgroup2
 * cgroup (CLONE_INTO_CGROUP) rather than moved there by a cgroup.procs
 * write, whose kernel write lock waits for an RCU grace period.  glibc
 * (2.36) has no clone3 wrapper, and a child on a stack of its own cannot
 * return through C code into the caller's frames: a few instructions per
 * architecture do what clone(3) does, the child calling fn(arg) on its new
 * stack and exiting with its result.  Elsewhere, ENOSYS: the caller clones
 * as before. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>

#include "linux_int.h"

#if defined(__x86_64__)
/* long tp__clone3_raw(args, size, fn, arg): rdi, rsi, rdx, rcx.  r8 and r9
 * survive the syscall in both; rsp is the new stack's top in the child,
 * 16-byte aligned, as the call wants it. */
__asm__(".text\n"
        ".globl tp__clone3_raw\n"
        ".hidden tp__clone3_raw\n"
        ".type tp__clone3_raw, @function\n"
        "tp__clone3_raw:\n"
        "  .cfi_startproc\n"
        "  mov %rdx, %r8\n"
        "  mov %rcx, %r9\n"
        "  mov $435, %eax\n" /* __NR_clone3 */
        "  syscall\n"
        "  test %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  .cfi_undefined %rip\n"
        "  xor %ebp, %ebp\n"
        "  mov %r9, %rdi\n"
        "  call *%r8\n"
        "  mov %eax, %edi\n"
        "  mov $60, %eax\n" /* __NR_exit */
        "  syscall\n"
        "  hlt\n"
        "  .cfi_endproc\n"
        ".size tp__clone3_raw, .-tp__clone3_raw\n");
#define TP__HAVE_CLONE3_RAW 1
#elif defined(__aarch64__)
/* x0-x3 in; x4 and x5 survive the svc in both; sp is the new top. */
__asm__(".text\n"
        ".globl tp__clone3_raw\n"
        ".hidden tp__clone3_raw\n"
        ".type tp__clone3_raw, %function\n"
        "tp__clone3_raw:\n"
        "  mov x4, x2\n"
        "  mov x5, x3\n"
        "  mov x8, #435\n" /* __NR_clone3 */
        "  svc #0\n"
        "  cbz x0, 1f\n"
        "  ret\n"
        "1:\n"
        "  mov x29, xzr\n"
        "  mov x30, xzr\n"
        "  mov x0, x5\n"
        "  blr x4\n"
        "  mov x8, #93\n" /* __NR_exit */
        "  svc #0\n"
        "  brk #0\n"
        ".size tp__clone3_raw, .-tp__clone3_raw\n");
#define TP__HAVE_CLONE3_RAW 1
#endif

#ifdef TP__HAVE_CLONE3_RAW
long tp__clone3_raw(tp__clone_args_t *args, size_t size, int (*fn)(void *), void *arg);
#endif

pid_t tp__clone3(tp__clone_args_t *args, int (*fn)(void *), void *arg) {
#ifdef TP__HAVE_CLONE3_RAW
  long r = tp__clone3_raw(args, sizeof(*args), fn, arg);
  if (r < 0 && r > -4096) {
    errno = (int) -r;
    return -1;
  }
  return (pid_t) r;
#else
  (void) args;
  (void) fn;
  (void) arg;
  errno = ENOSYS;
  return -1;
#endif
}
