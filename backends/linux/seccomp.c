/* tupper: the box's seccomp filter, built with libseccomp and exported as a
 * classic BPF program (see tp_seccomp.h and docs/security-seccomp.md).
 *
 * The policy is data: one table entry per x86_64 syscall, each with its
 * verdict and a one-line reason.  In the spirit of Docker's default profile,
 * but our own decisions.  Shape of the program:
 *   - arch != x86_64 (i386 via int 0x80)            -> kill the process
 *   - nr >= 0x40000000 (the x32 ABI), other than -1 -> kill the process
 *     (libseccomp adds this check to a filter that holds x86_64 without x32;
 *     -1 stays out of it because a tracer uses it to skip a syscall)
 *   - a syscall the table allows                    -> allow
 *   - clone3 and a few new calls                    -> ENOSYS, libc falls back
 *   - kernel-attack calls                           -> kill the process
 *   - everything else                               -> EPERM
 * The table uses the kernel's numbers, not libseccomp's names, so that calls
 * newer than the installed libseccomp (2.5.4 knows up to futex_requeue) are
 * decided too; where libseccomp does know a name, the build checks that it
 * agrees with our number. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tp_seccomp.h"
#include "utils.h"

#if defined(__x86_64__) && !defined(__ILP32__)

#include <asm/unistd.h>
#include <seccomp.h>

/* x86_64 numbers newer than the build host's kernel headers (Debian 12 ships
 * 6.1's); from arch/x86/entry/syscalls/syscall_64.tbl. */
#ifndef __NR_uretprobe
#define __NR_uretprobe 335
#endif
#ifndef __NR_uprobe
#define __NR_uprobe 336
#endif
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
#ifndef __NR_fchmodat2
#define __NR_fchmodat2 452
#endif
#ifndef __NR_map_shadow_stack
#define __NR_map_shadow_stack 453
#endif
#ifndef __NR_futex_wake
#define __NR_futex_wake 454
#endif
#ifndef __NR_futex_wait
#define __NR_futex_wait 455
#endif
#ifndef __NR_futex_requeue
#define __NR_futex_requeue 456
#endif
#ifndef __NR_statmount
#define __NR_statmount 457
#endif
#ifndef __NR_listmount
#define __NR_listmount 458
#endif
#ifndef __NR_lsm_get_self_attr
#define __NR_lsm_get_self_attr 459
#endif
#ifndef __NR_lsm_set_self_attr
#define __NR_lsm_set_self_attr 460
#endif
#ifndef __NR_lsm_list_modules
#define __NR_lsm_list_modules 461
#endif
#ifndef __NR_mseal
#define __NR_mseal 462
#endif
#ifndef __NR_setxattrat
#define __NR_setxattrat 463
#endif
#ifndef __NR_getxattrat
#define __NR_getxattrat 464
#endif
#ifndef __NR_listxattrat
#define __NR_listxattrat 465
#endif
#ifndef __NR_removexattrat
#define __NR_removexattrat 466
#endif
#ifndef __NR_open_tree_attr
#define __NR_open_tree_attr 467
#endif
#ifndef __NR_file_getattr
#define __NR_file_getattr 468
#endif
#ifndef __NR_file_setattr
#define __NR_file_setattr 469
#endif
#ifndef __NR_listns
#define __NR_listns 470
#endif

#define SC_MAX_NR 1024 /* every x86_64 syscall number is below this */

/* ------------------------------------------------------------ conditions */

/* An ALLOW_IF syscall is allowed when any of its alternatives holds; each
 * alternative is (arg & mask) == value, one libseccomp rule.  Arguments the
 * kernel reads as int are compared on their low 32 bits only (mask
 * 0xffffffff), exactly as the kernel sees them: garbage in the high half
 * neither bypasses nor wrongly trips a rule. */
typedef struct {
  unsigned arg;
  uint64_t mask;
  uint64_t value;
} sc_alt_t;

#define LO32 0xffffffffull

/* Every namespace a clone or unshare could create.  CLONE_NEWTIME (0x80)
 * lies inside clone()'s exit-signal byte, where no valid signal sets it, so
 * masking it there only refuses an invalid call; for unshare() it is the time
 * namespace. */
#define SC_NS_FLAGS                                                                    \
  ((uint64_t) (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | \
               CLONE_NEWNET | CLONE_NEWCGROUP | CLONE_NEWTIME))

/* clone (x86_64: flags is argument 0) and unshare: no namespace bit. */
static const sc_alt_t alt_no_ns[] = {{0, SC_NS_FLAGS, 0}};

/* personality: only the values Docker allows.  PER_LINUX (0), PER_LINUX32
 * (8: uname says i686, for `linux32` builds), UNAME26 (0x20000), both
 * (0x20008), and 0xffffffff, which only queries.  Refused: READ_IMPLIES_EXEC,
 * ADDR_NO_RANDOMIZE and the other ASLR and exec-permission tricks. */
static const sc_alt_t alt_personality[] = {
    {0, LO32, 0x0}, {0, LO32, 0x8}, {0, LO32, 0x20000}, {0, LO32, 0x20008}, {0, LO32, LO32},
};

/* socket: the families a box has a use for.  The box's network namespace
 * holds only lo; AF_VSOCK especially must stay closed, since vsock is not
 * network-namespaced and reaches the hypervisor's host when tupper runs in a
 * VM; the rest (packet, alg, tipc, rds, bluetooth...) is attack surface. */
static const sc_alt_t alt_socket[] = {
    {0, LO32, AF_UNIX}, {0, LO32, AF_INET}, {0, LO32, AF_INET6}, {0, LO32, AF_NETLINK},
};

/* socketpair: AF_UNIX only (AF_TIPC would be the other taker). */
static const sc_alt_t alt_socketpair[] = {{0, LO32, AF_UNIX}};

typedef struct {
  const sc_alt_t *alts;
  size_t n;
} sc_cond_t;

enum { C_NONE, C_NO_NS, C_PERSONALITY, C_SOCKET, C_SOCKETPAIR };

static const sc_cond_t conds[] = {
    [C_NONE] = {NULL, 0},
    [C_NO_NS] = {alt_no_ns, TP_ARRAY_SIZE(alt_no_ns)},
    [C_PERSONALITY] = {alt_personality, TP_ARRAY_SIZE(alt_personality)},
    [C_SOCKET] = {alt_socket, TP_ARRAY_SIZE(alt_socket)},
    [C_SOCKETPAIR] = {alt_socketpair, TP_ARRAY_SIZE(alt_socketpair)},
};

/* ------------------------------------------------------------ the table */

typedef struct {
  int nr;
  const char *name;
  uint8_t verdict; /* TP__SC_* */
  uint8_t cond;    /* C_*, for TP__SC_ALLOW_IF */
} sc_rule_t;

#define ALLOW(n) {__NR_##n, #n, TP__SC_ALLOW, C_NONE}
#define ALLOW_IF(n, c) {__NR_##n, #n, TP__SC_ALLOW_IF, c}
#define EPERM_(n) {__NR_##n, #n, TP__SC_EPERM, C_NONE}
#define ENOSYS_(n) {__NR_##n, #n, TP__SC_ENOSYS, C_NONE}
#define KILL(n) {__NR_##n, #n, TP__SC_KILL, C_NONE}

/* Every x86_64 syscall up to 470 (Linux 6.18) appears once.  A syscall not
 * listed answers EPERM, like the EPERM_ entries, which add no rule (they are
 * the default) but record the decision.  Keep one entry per syscall:
 * libseccomp silently drops a second rule for a syscall that already has an
 * unconditional one, so the build refuses duplicates. */
static const sc_rule_t rules[] = {
    /* --- processes and threads ------------------------------------------ */
    ALLOW_IF(clone, C_NO_NS),     /* fork, posix_spawn, threads; no new namespace */
    ENOSYS_(clone3),              /* flags in memory BPF cannot read; glibc falls back to clone */
    ALLOW(fork),
    ALLOW(vfork),
    ALLOW(execve),
    ALLOW(execveat),              /* fexecve */
    ALLOW(exit),
    ALLOW(exit_group),
    ALLOW(wait4),
    ALLOW(waitid),
    ALLOW(kill),                  /* only the box's own PID namespace is visible */
    ALLOW(tkill),
    ALLOW(tgkill),
    ALLOW(getpid),
    ALLOW(getppid),
    ALLOW(gettid),
    ALLOW(set_tid_address),
    ALLOW(set_robust_list),
    ALLOW(get_robust_list),       /* another process's needs ptrace access */
    ALLOW(rseq),
    ALLOW(restart_syscall),
    ALLOW(arch_prctl),            /* TLS (ARCH_SET_FS), CET shadow stacks */
    ALLOW(prctl),                 /* dumpable, subreaper, cap drops; PR_SET_MM needs host caps */
    ALLOW_IF(personality, C_PERSONALITY), /* see alt_personality */
    ALLOW(seccomp),               /* a process can only add filters, never remove ours */
    ALLOW(capget),
    ALLOW(capset),                /* can only lower, within the box's user namespace */
    ALLOW(setsid),
    ALLOW(setpgid),
    ALLOW(getpgid),
    ALLOW(getpgrp),
    ALLOW(getsid),
    ALLOW(pidfd_open),
    ALLOW(pidfd_send_signal),
    ALLOW_IF(unshare, C_NO_NS),   /* CLONE_FILES/FS/SYSVSEM only: no new namespace */
    EPERM_(setns),                /* joining a namespace is never a box's business */
    ALLOW(membarrier),
    ALLOW(getcpu),
    ALLOW(sched_yield),
    ALLOW(sched_setparam),        /* real-time classes need CAP_SYS_NICE on the host */
    ALLOW(sched_getparam),
    ALLOW(sched_setscheduler),
    ALLOW(sched_getscheduler),
    ALLOW(sched_get_priority_max),
    ALLOW(sched_get_priority_min),
    ALLOW(sched_rr_get_interval),
    ALLOW(sched_setaffinity),     /* cgroup cpusets still bound it */
    ALLOW(sched_getaffinity),
    ALLOW(sched_setattr),
    ALLOW(sched_getattr),
    ALLOW(getpriority),
    ALLOW(setpriority),
    ALLOW(ioprio_get),
    ALLOW(ioprio_set),            /* the RT class needs host capabilities */
    EPERM_(ptrace),               /* not worth its kernel surface: no gdb or strace in boxes */
    EPERM_(process_vm_readv),     /* ptrace-class access to another process's memory */
    EPERM_(process_vm_writev),
    EPERM_(kcmp),                 /* ptrace-class: compares kernel objects of two processes */
    EPERM_(pidfd_getfd),          /* ptrace-class: steals a descriptor from another process */
    EPERM_(process_madvise),      /* acts on another process's memory */
    EPERM_(process_mrelease),     /* for OOM killers, not for boxes */

    /* --- credentials: all within the box's user namespace ---------------- */
    ALLOW(getuid),
    ALLOW(geteuid),
    ALLOW(getgid),
    ALLOW(getegid),
    ALLOW(getresuid),
    ALLOW(getresgid),
    ALLOW(getgroups),
    ALLOW(setuid),
    ALLOW(setgid),
    ALLOW(setreuid),
    ALLOW(setregid),
    ALLOW(setresuid),
    ALLOW(setresgid),
    ALLOW(setfsuid),
    ALLOW(setfsgid),
    ALLOW(setgroups),

    /* --- signals and timers --------------------------------------------- */
    ALLOW(rt_sigaction),
    ALLOW(rt_sigprocmask),
    ALLOW(rt_sigreturn),
    ALLOW(rt_sigpending),
    ALLOW(rt_sigtimedwait),
    ALLOW(rt_sigqueueinfo),
    ALLOW(rt_tgsigqueueinfo),
    ALLOW(rt_sigsuspend),
    ALLOW(sigaltstack),
    ALLOW(pause),
    ALLOW(signalfd),
    ALLOW(signalfd4),
    ALLOW(alarm),
    ALLOW(getitimer),
    ALLOW(setitimer),
    ALLOW(timer_create),
    ALLOW(timer_settime),
    ALLOW(timer_gettime),
    ALLOW(timer_getoverrun),
    ALLOW(timer_delete),
    ALLOW(timerfd_create),
    ALLOW(timerfd_settime),
    ALLOW(timerfd_gettime),

    /* --- time ----------------------------------------------------------- */
    ALLOW(nanosleep),
    ALLOW(clock_nanosleep),
    ALLOW(clock_gettime),
    ALLOW(clock_getres),
    ALLOW(gettimeofday),
    ALLOW(time),
    ALLOW(times),
    EPERM_(settimeofday),         /* the clock is the host's */
    EPERM_(clock_settime),
    EPERM_(clock_adjtime),
    EPERM_(adjtimex),             /* even read-only use is only for NTP daemons */

    /* --- memory --------------------------------------------------------- */
    ALLOW(brk),
    ALLOW(mmap),
    ALLOW(munmap),
    ALLOW(mremap),
    ALLOW(mprotect),
    ALLOW(msync),
    ALLOW(mincore),
    ALLOW(madvise),
    ALLOW(mlock),                 /* RLIMIT_MEMLOCK and the memory cgroup bound it */
    ALLOW(mlock2),
    ALLOW(munlock),
    ALLOW(mlockall),
    ALLOW(munlockall),
    ALLOW(remap_file_pages),      /* deprecated, emulated with plain mappings */
    ALLOW(memfd_create),
    ALLOW(pkey_mprotect),
    ALLOW(pkey_alloc),
    ALLOW(pkey_free),
    ALLOW(map_shadow_stack),      /* glibc's CET shadow stacks for threads */
    ALLOW(mseal),                 /* only ever restricts the caller's own mappings */
    ALLOW(mbind),                 /* NUMA policy of the caller's own memory */
    ALLOW(set_mempolicy),
    ALLOW(get_mempolicy),
    ALLOW(set_mempolicy_home_node),
    EPERM_(migrate_pages),        /* moves another process's pages */
    EPERM_(move_pages),           /* ditto, by pid */
    EPERM_(memfd_secret),         /* pulls pages out of the kernel's direct map; no common user */
    EPERM_(userfaultfd),          /* a classic tool to win kernel races */
    EPERM_(modify_ldt),           /* 16-bit segments, for Wine and DOSEMU; old exploit surface */
    EPERM_(set_thread_area),      /* 32-bit TLS; 64-bit code uses arch_prctl */
    EPERM_(get_thread_area),

    /* --- files: paths resolve inside the box's own root ----------------- */
    ALLOW(read),
    ALLOW(write),
    ALLOW(open),
    ALLOW(openat),
    ALLOW(openat2),
    ALLOW(creat),
    ALLOW(close),
    ALLOW(close_range),
    ALLOW(stat),
    ALLOW(fstat),
    ALLOW(lstat),
    ALLOW(newfstatat),
    ALLOW(statx),
    ALLOW(statfs),
    ALLOW(fstatfs),
    ALLOW(lseek),
    ALLOW(pread64),
    ALLOW(pwrite64),
    ALLOW(readv),
    ALLOW(writev),
    ALLOW(preadv),
    ALLOW(pwritev),
    ALLOW(preadv2),
    ALLOW(pwritev2),
    ALLOW(access),
    ALLOW(faccessat),
    ALLOW(faccessat2),
    ALLOW(dup),
    ALLOW(dup2),
    ALLOW(dup3),
    ALLOW(fcntl),
    ALLOW(flock),
    ALLOW(fsync),
    ALLOW(fdatasync),
    ALLOW(sync),                  /* costs the host some I/O, harms nothing */
    ALLOW(syncfs),
    ALLOW(sync_file_range),
    ALLOW(truncate),
    ALLOW(ftruncate),
    ALLOW(fallocate),             /* the disk cap still bounds it */
    ALLOW(fadvise64),
    ALLOW(readahead),
    ALLOW(getdents),
    ALLOW(getdents64),
    ALLOW(getcwd),
    ALLOW(chdir),
    ALLOW(fchdir),
    ALLOW(chroot),                /* stays inside the pivoted root; needs CAP_SYS_CHROOT anyway */
    ALLOW(rename),
    ALLOW(renameat),
    ALLOW(renameat2),
    ALLOW(mkdir),
    ALLOW(mkdirat),
    ALLOW(rmdir),
    ALLOW(link),
    ALLOW(linkat),
    ALLOW(unlink),
    ALLOW(unlinkat),
    ALLOW(symlink),
    ALLOW(symlinkat),
    ALLOW(readlink),
    ALLOW(readlinkat),
    ALLOW(chmod),
    ALLOW(fchmod),
    ALLOW(fchmodat),
    ALLOW(fchmodat2),
    ALLOW(chown),
    ALLOW(fchown),
    ALLOW(lchown),
    ALLOW(fchownat),
    ALLOW(umask),
    ALLOW(utime),
    ALLOW(utimes),
    ALLOW(utimensat),
    ALLOW(futimesat),
    ALLOW(mknod),                 /* devices need CAP_MKNOD on the host: FIFOs, sockets, files */
    ALLOW(mknodat),
    ALLOW(setxattr),              /* trusted.* and security.* need host capabilities */
    ALLOW(lsetxattr),
    ALLOW(fsetxattr),
    ALLOW(getxattr),
    ALLOW(lgetxattr),
    ALLOW(fgetxattr),
    ALLOW(listxattr),
    ALLOW(llistxattr),
    ALLOW(flistxattr),
    ALLOW(removexattr),
    ALLOW(lremovexattr),
    ALLOW(fremovexattr),
    ALLOW(setxattrat),
    ALLOW(getxattrat),
    ALLOW(listxattrat),
    ALLOW(removexattrat),
    ALLOW(sendfile),
    ALLOW(splice),
    ALLOW(tee),
    ALLOW(vmsplice),
    ALLOW(copy_file_range),
    ALLOW(cachestat),             /* page-cache state of a file the caller has open */
    ALLOW(ioctl),                 /* see docs: TIOCSTI can only reach the box's own terminals */
    ALLOW(inotify_init),
    ALLOW(inotify_init1),
    ALLOW(inotify_add_watch),
    ALLOW(inotify_rm_watch),
    EPERM_(name_to_handle_at),    /* half of the open_by_handle_at escape; no ordinary user */
    KILL(open_by_handle_at),      /* the "shocker" escape: opens any inode of a host filesystem */
    EPERM_(fanotify_init),        /* filesystem-wide monitoring */
    EPERM_(fanotify_mark),
    ENOSYS_(file_getattr),        /* 6.17, no user yet; falls back to the FS_IOC_FSGETXATTR ioctl */
    ENOSYS_(file_setattr),

    /* --- polling, events, futexes --------------------------------------- */
    ALLOW(poll),
    ALLOW(ppoll),
    ALLOW(select),
    ALLOW(pselect6),
    ALLOW(epoll_create),
    ALLOW(epoll_create1),
    ALLOW(epoll_ctl),
    ALLOW(epoll_wait),
    ALLOW(epoll_pwait),
    ALLOW(epoll_pwait2),
    EPERM_(epoll_ctl_old),        /* never implemented */
    EPERM_(epoll_wait_old),
    ALLOW(eventfd),
    ALLOW(eventfd2),
    ALLOW(pipe),
    ALLOW(pipe2),
    ALLOW(futex),
    ALLOW(futex_waitv),
    ALLOW(futex_wake),
    ALLOW(futex_wait),
    ALLOW(futex_requeue),

    /* --- asynchronous I/O ----------------------------------------------- */
    ALLOW(io_setup),              /* classic AIO: small, old, bounded by fs.aio-max-nr */
    ALLOW(io_destroy),
    ALLOW(io_submit),
    ALLOW(io_cancel),
    ALLOW(io_getevents),
    ALLOW(io_pgetevents),
    EPERM_(io_uring_setup),       /* many recent kernel exploits; libuv falls back to epoll */
    EPERM_(io_uring_enter),
    EPERM_(io_uring_register),

    /* --- sockets: the box's network namespace holds only lo ------------- */
    ALLOW_IF(socket, C_SOCKET),   /* see alt_socket */
    ALLOW_IF(socketpair, C_SOCKETPAIR),
    ALLOW(connect),
    ALLOW(accept),
    ALLOW(accept4),
    ALLOW(bind),
    ALLOW(listen),
    ALLOW(shutdown),
    ALLOW(sendto),
    ALLOW(recvfrom),
    ALLOW(sendmsg),
    ALLOW(recvmsg),
    ALLOW(sendmmsg),
    ALLOW(recvmmsg),
    ALLOW(getsockname),
    ALLOW(getpeername),
    ALLOW(setsockopt),            /* netfilter and friends need CAP_NET_ADMIN on the host */
    ALLOW(getsockopt),

    /* --- IPC: the box has its own IPC namespace ------------------------- */
    ALLOW(shmget),
    ALLOW(shmat),
    ALLOW(shmctl),
    ALLOW(shmdt),
    ALLOW(semget),
    ALLOW(semop),
    ALLOW(semctl),
    ALLOW(semtimedop),
    ALLOW(msgget),
    ALLOW(msgsnd),
    ALLOW(msgrcv),
    ALLOW(msgctl),
    ALLOW(mq_open),
    ALLOW(mq_unlink),
    ALLOW(mq_timedsend),
    ALLOW(mq_timedreceive),
    ALLOW(mq_notify),
    ALLOW(mq_getsetattr),

    /* --- the system at large -------------------------------------------- */
    ALLOW(uname),                 /* the box's own UTS namespace */
    ALLOW(sysinfo),
    ALLOW(getrlimit),
    ALLOW(setrlimit),             /* raising a hard limit needs CAP_SYS_RESOURCE on the host */
    ALLOW(prlimit64),
    ALLOW(getrusage),
    ALLOW(getrandom),
    ALLOW(landlock_create_ruleset), /* self-sandboxing only ever takes rights away */
    ALLOW(landlock_add_rule),
    ALLOW(landlock_restrict_self),
    ALLOW(uretprobe),             /* the kernel's own uprobe trampolines; it checks the caller */
    ALLOW(uprobe),
    EPERM_(sethostname),          /* the UTS namespace belongs to the host's user namespace */
    EPERM_(setdomainname),
    EPERM_(syslog),               /* the kernel log is the host's */
    EPERM_(acct),                 /* process accounting is host-wide */
    EPERM_(vhangup),
    EPERM_(quotactl),
    EPERM_(quotactl_fd),
    EPERM_(sysfs),                /* obsolete filesystem-type query */
    EPERM_(ustat),                /* obsolete */
    EPERM_(lookup_dcookie),       /* profiling, removed in 6.10 */
    EPERM_(perf_event_open),      /* profiling: kernel surface and side channels */
    EPERM_(bpf),                  /* eBPF: verifier bugs; libraries probe it and carry on */
    EPERM_(keyctl),               /* keyrings are not namespaced: the host's keys */
    EPERM_(add_key),
    EPERM_(request_key),
    ENOSYS_(lsm_get_self_attr),   /* 6.8; LSM libraries fall back to /proc/self/attr */
    ENOSYS_(lsm_set_self_attr),
    ENOSYS_(lsm_list_modules),

    /* --- mounts and namespaces: the box's are set up before the agent --- */
    EPERM_(mount),
    EPERM_(umount2),
    EPERM_(pivot_root),
    EPERM_(open_tree),
    EPERM_(open_tree_attr),
    EPERM_(move_mount),
    EPERM_(fsopen),
    EPERM_(fsconfig),
    EPERM_(fsmount),
    EPERM_(fspick),
    EPERM_(mount_setattr),
    EPERM_(swapon),
    EPERM_(swapoff),
    ENOSYS_(statmount),           /* 6.8; tools fall back to /proc/self/mountinfo */
    ENOSYS_(listmount),
    ENOSYS_(listns),              /* 6.18; tools fall back to /proc/<pid>/ns */

    /* --- the kernel itself: a box has no business here; hostile -> kill -- */
    KILL(kexec_load),
    KILL(kexec_file_load),
    KILL(init_module),
    KILL(finit_module),
    KILL(delete_module),
    KILL(iopl),                   /* raw port I/O */
    KILL(ioperm),
    EPERM_(reboot),               /* busybox `reboot -f`: a mistake more often than an attack */
    EPERM_(create_module),        /* removed in 2.6 */
    EPERM_(get_kernel_syms),
    EPERM_(query_module),
    EPERM_(uselib),               /* a.out shared libraries */
    EPERM_(_sysctl),              /* removed in 5.5 */
    EPERM_(nfsservctl),           /* removed in 3.1 */
    EPERM_(getpmsg),              /* the rest were never implemented */
    EPERM_(putpmsg),
    EPERM_(afs_syscall),
    EPERM_(tuxcall),
    EPERM_(security),
    EPERM_(vserver),
};

/* ------------------------------------------------------------ building */

int tp__seccomp_verdict(int nr, const char **name) {
  for (size_t i = 0; i < TP_ARRAY_SIZE(rules); i++)
    if (rules[i].nr == nr) {
      if (name)
        *name = rules[i].name;
      return rules[i].verdict;
    }
  return 0;
}

/* The table must be sound before it becomes rules: numbers in range, no
 * syscall twice, and our numbers agree with libseccomp's where it knows the
 * name (a typo or a wrong fallback number would otherwise allow or deny the
 * wrong syscall silently). */
static int check_table(tp_error_t *err) {
  uint8_t seen[SC_MAX_NR / 8] = {0};
  for (size_t i = 0; i < TP_ARRAY_SIZE(rules); i++) {
    const sc_rule_t *r = &rules[i];
    if (r->nr < 0 || r->nr >= SC_MAX_NR)
      return tp_error_set(err, EINVAL, "seccomp: %s has number %d, out of range", r->name, r->nr);
    if (seen[r->nr / 8] & (1u << (r->nr % 8)))
      return tp_error_set(err, EINVAL, "seccomp: %s (%d) listed twice", r->name, r->nr);
    seen[r->nr / 8] |= (uint8_t) (1u << (r->nr % 8));
    int known = seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, r->name);
    if (known != __NR_SCMP_ERROR && known != r->nr)
      return tp_error_set(err, EINVAL, "seccomp: %s is %d in our table but %d for libseccomp",
                          r->name, r->nr, known);
    if ((r->verdict == TP__SC_ALLOW_IF) != (r->cond != C_NONE))
      return tp_error_set(err, EINVAL, "seccomp: %s: a condition goes with ALLOW_IF only", r->name);
  }
  return 0;
}

static int add_rule(scmp_filter_ctx ctx, const sc_rule_t *r, tp_error_t *err) {
  int rc = 0;
  switch (r->verdict) {
  case TP__SC_ALLOW:
    rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ALLOW, r->nr, 0);
    break;
  case TP__SC_ALLOW_IF:
    for (size_t i = 0; i < conds[r->cond].n && rc == 0; i++) {
      const sc_alt_t *a = &conds[r->cond].alts[i];
      struct scmp_arg_cmp cmp = {
          .arg = a->arg, .op = SCMP_CMP_MASKED_EQ, .datum_a = a->mask, .datum_b = a->value};
      rc = seccomp_rule_add_exact_array(ctx, SCMP_ACT_ALLOW, r->nr, 1, &cmp);
    }
    break;
  case TP__SC_EPERM:
    return 0; /* the default action; libseccomp refuses it as a rule (EACCES) */
  case TP__SC_ENOSYS:
    rc = seccomp_rule_add_exact(ctx, SCMP_ACT_ERRNO(ENOSYS), r->nr, 0);
    break;
  case TP__SC_KILL:
    rc = seccomp_rule_add_exact(ctx, SCMP_ACT_KILL_PROCESS, r->nr, 0);
    break;
  default:
    return tp_error_set(err, EINVAL, "seccomp: %s: unknown verdict %d", r->name, r->verdict);
  }
  if (rc < 0)
    return tp_error_errno(err, -rc, "seccomp: add the rule for %s (%d)", r->name, r->nr);
  return 0;
}

static void ctx_releasep(scmp_filter_ctx *ctx) {
  if (*ctx != NULL)
    seccomp_release(*ctx);
}

/* libseccomp 2.5 exports only to a descriptor: write the program to a memfd,
 * read it back. */
static int export_prog(scmp_filter_ctx ctx, struct sock_fprog *prog, tp_error_t *err) {
  cleanup_close int fd = memfd_create("tupper-seccomp", MFD_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "seccomp: memfd_create");
  int rc = seccomp_export_bpf(ctx, fd);
  if (rc < 0)
    return tp_error_errno(err, -rc, "seccomp: seccomp_export_bpf");
  struct stat st;
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "seccomp: fstat of the exported program");
  size_t size = (size_t) st.st_size;
  if (size == 0 || size % sizeof(struct sock_filter) != 0 ||
      size / sizeof(struct sock_filter) > BPF_MAXINSNS)
    return tp_error_set(err, E2BIG, "seccomp: exported program has %zu bytes (limit %d insns)",
                        size, BPF_MAXINSNS);
  cleanup_free struct sock_filter *insns = malloc(size);
  if (insns == NULL)
    return tp_error_errno(err, ENOMEM, "seccomp: allocate %zu bytes", size);
  for (size_t done = 0; done < size;) {
    ssize_t n = pread(fd, (char *) insns + done, size - done, (off_t) done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return tp_error_errno(err, n < 0 ? errno : EIO, "seccomp: read back the exported program");
    done += (size_t) n;
  }
  prog->len = (unsigned short) (size / sizeof(struct sock_filter));
  prog->filter = insns;
  insns = NULL;
  return 0;
}

int tp_seccomp_build(struct sock_fprog *prog, tp_error_t *err) {
  prog->len = 0;
  prog->filter = NULL;
  if (check_table(err) < 0)
    return -1;
  __attribute__((cleanup(ctx_releasep))) scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (ctx == NULL)
    return tp_error_set(err, ENOMEM, "seccomp: seccomp_init failed");
  /* seccomp_init holds the native arch only: make sure it is x86_64, the
   * one our numbers are for. */
  if (seccomp_arch_native() != SCMP_ARCH_X86_64)
    return tp_error_set(err, ENOTSUP, "seccomp: libseccomp's native arch is not x86_64");
  static const struct {
    enum scmp_filter_attr attr;
    uint32_t value;
    const char *what;
  } attrs[] = {
      /* i386 (int 0x80) and x32 syscalls: kill, never EPERM, since their
       * numbers mean other syscalls than the ones this table decides. */
      {SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS, "bad-arch action"},
      /* a binary search over syscall numbers instead of a linear chain */
      {SCMP_FLTATR_CTL_OPTIMIZE, 2, "binary-tree optimisation"},
      /* errors from the system as they are, not flattened to ECANCELED */
      {SCMP_FLTATR_API_SYSRAWRC, 1, "raw return codes"},
  };
  for (size_t i = 0; i < TP_ARRAY_SIZE(attrs); i++) {
    int rc = seccomp_attr_set(ctx, attrs[i].attr, attrs[i].value);
    if (rc < 0)
      return tp_error_errno(err, -rc, "seccomp: set the %s", attrs[i].what);
  }
  for (size_t i = 0; i < TP_ARRAY_SIZE(rules); i++)
    if (add_rule(ctx, &rules[i], err) < 0)
      return -1;
  return export_prog(ctx, prog, err);
}

#else /* not x86_64 */

int tp__seccomp_verdict(int nr, const char **name) {
  return 0;
}

int tp_seccomp_build(struct sock_fprog *prog, tp_error_t *err) {
  prog->len = 0;
  prog->filter = NULL;
  return tp_error_set(err, ENOTSUP, "seccomp: the box policy is written for x86_64 only");
}

#endif

void tp_seccomp_free(struct sock_fprog *prog) {
  free(prog->filter);
  prog->filter = NULL;
  prog->len = 0;
}
