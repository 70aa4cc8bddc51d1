/* tupper-probe: a static binary the security specs copy into a box.  It
 * tries what a box must not be able to do and prints one line per check:
 *
 *   <check> ALLOWED [detail]      the kernel let it happen (and it was undone)
 *   <check> DENIED <ERRNO> [...]  the kernel refused it
 *   <check> KILLED SIG<NAME>      the check's process died (seccomp's SIGSYS...)
 *   <check> EMPTY|MASKED|READABLE <n>|OPENED   for files a box should not read
 *   <check> <free form>           fds, caps, dev, ids
 *
 * Usage: tupper-probe all | <check> | forkbomb [MAX] | membomb MB |
 *        diskfill PATH [MAXMB] | cpuburn MS | vforkloop MS | sleep S | list
 *
 * Every check runs in a forked child (with an alarm), so a check that gets
 * the process killed is reported and the next one still runs.  Calls that
 * change something are made so that they change nothing (set the clock to
 * the time it is, write the hostname it has) or fail harmlessly once past
 * the kernel's permission check (an invalid reboot command): for those
 * ("gated" checks) only EPERM, EACCES and ENOSYS count as DENIED, any other
 * errno is reported as ALLOWED <ERRNO>, since the call got through.
 * Syscalls are made with syscall(SYS_...), never through libc wrappers that
 * could hide what the kernel said.  `all` runs the non-destructive checks;
 * forkbomb, membomb, diskfill, cpuburn, vforkloop and sleep run only when
 * named. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <linux/sched.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_ALARM_S 10      /* a check that takes longer is killed (SIGALRM) */
#define X32_BIT 0x40000000L   /* __X32_SYSCALL_BIT */
#define I386_GETPID 20
#define I386_UNSHARE 310
#define X32_GETPID 39
#define X32_UNSHARE 272

enum { PROBE_ALL = 1, PROBE_ARG = 2 };

typedef struct probe_check_s {
  const char *name;
  void (*run)(const char *name, const char *arg);
  int flags;
  const char *help;
} probe_check_t;

/* ------------------------------------------------------------- reporting */

static void say(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const char *name, const char *fmt, ...) {
  va_list ap;
  printf("%s ", name);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
}

static const char *errname(int e) {
  const char *s = strerrorname_np(e);
  return s ? s : "EUNKNOWN";
}

/* ALLOWED when ret >= 0, DENIED <errno> otherwise. */
static void report(const char *name, long ret, int err) {
  if (ret >= 0)
    say(name, "ALLOWED");
  else
    say(name, "DENIED %s", errname(err));
}

/* For calls built to fail harmlessly past the permission check. */
static void report_gate(const char *name, long ret, int err) {
  if (ret >= 0)
    say(name, "ALLOWED");
  else if (err == EPERM || err == EACCES || err == ENOSYS)
    say(name, "DENIED %s", errname(err));
  else
    say(name, "ALLOWED %s", errname(err));
}

static void close_if(long fd) {
  if (fd >= 0)
    close((int) fd);
}

/* Waits for a child a check made, so no zombie is left. */
static void reap(pid_t pid) {
  while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
    ;
}

/* ------------------------------------------------------- the mount APIs */

static void check_mount(const char *name, const char *arg) {
  long r = syscall(SYS_mount, "tupper-probe", "/mnt", "tmpfs", 0L, "size=1m");
  int e = errno;
  if (r == 0)
    syscall(SYS_umount2, "/mnt", (long) MNT_DETACH);
  report(name, r, e);
}

static void check_umount(const char *name, const char *arg) {
  /* /mnt is no mount point: past the permission check this is EINVAL */
  long r = syscall(SYS_umount2, "/mnt", 0L);
  report_gate(name, r, errno);
}

static void check_fsopen(const char *name, const char *arg) {
  long fd = syscall(SYS_fsopen, "tmpfs", (long) FSOPEN_CLOEXEC);
  report(name, fd, errno);
  close_if(fd);
}

static void check_fsmount(const char *name, const char *arg) {
  /* with a context when fsopen works; else -1, which fsmount only sees
   * after its permission check (EBADF = allowed) */
  long ctx = syscall(SYS_fsopen, "tmpfs", (long) FSOPEN_CLOEXEC);
  long mfd;
  int e;
  if (ctx >= 0)
    syscall(SYS_fsconfig, ctx, (long) FSCONFIG_CMD_CREATE, NULL, NULL, 0L);
  mfd = syscall(SYS_fsmount, ctx, (long) FSMOUNT_CLOEXEC, 0L);
  e = errno;
  report_gate(name, mfd, e);
  close_if(mfd); /* a detached mount goes away with its last fd */
  close_if(ctx);
}

static void check_open_tree(const char *name, const char *arg) {
  long fd = syscall(SYS_open_tree, (long) AT_FDCWD, "/", (long) (OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  report(name, fd, errno);
  close_if(fd);
}

static void check_move_mount(const char *name, const char *arg) {
  /* /mnt onto itself: not a mount, so EINVAL once permitted */
  long r = syscall(SYS_move_mount, (long) AT_FDCWD, "/mnt", (long) AT_FDCWD, "/mnt", 0L);
  report_gate(name, r, errno);
}

static void check_fspick(const char *name, const char *arg) {
  long fd = syscall(SYS_fspick, (long) AT_FDCWD, "/", (long) FSPICK_CLOEXEC);
  report(name, fd, errno);
  close_if(fd);
}

static void check_mount_setattr(const char *name, const char *arg) {
  struct mount_attr attr;
  memset(&attr, 0, sizeof(attr)); /* changes nothing if allowed */
  long r = syscall(SYS_mount_setattr, (long) AT_FDCWD, "/", 0L, &attr, (long) sizeof(attr));
  report(name, r, errno);
}

/* ------------------------------------------------------------ namespaces */

static void check_unshare_flag(const char *name, long flag) {
  long r = syscall(SYS_unshare, flag);
  report(name, r, errno);
}

static void check_unshare_user(const char *name, const char *arg) {
  check_unshare_flag(name, CLONE_NEWUSER);
}
static void check_unshare_mnt(const char *name, const char *arg) {
  check_unshare_flag(name, CLONE_NEWNS);
}
static void check_unshare_net(const char *name, const char *arg) {
  check_unshare_flag(name, CLONE_NEWNET);
}

/* The way around a mount namespace owned by the host: a new one, owned by
 * the box's user namespace, in which box root could mount. */
static void check_unshare_mount(const char *name, const char *arg) {
  long r = syscall(SYS_unshare, (long) CLONE_NEWNS);
  if (r < 0) {
    say(name, "DENIED %s (unshare)", errname(errno));
    return;
  }
  syscall(SYS_mount, "none", "/", NULL, (long) (MS_REC | MS_PRIVATE), NULL);
  r = syscall(SYS_mount, "tupper-probe", "/mnt", "tmpfs", 0L, "size=1m");
  report(name, r, errno); /* the namespace dies with this child */
}

static void check_setns(const char *name, const char *ns) {
  char path[64];
  long fd, r;
  snprintf(path, sizeof(path), "/proc/1/ns/%s", ns);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    say(name, "DENIED %s (open %s)", errname(errno), path);
    return;
  }
  r = syscall(SYS_setns, fd, 0L);
  report(name, r, errno);
  close((int) fd);
}

static void check_setns_mnt(const char *name, const char *arg) { check_setns(name, "mnt"); }
static void check_setns_net(const char *name, const char *arg) { check_setns(name, "net"); }
static void check_setns_pid(const char *name, const char *arg) { check_setns(name, "pid"); }
static void check_setns_user(const char *name, const char *arg) { check_setns(name, "user"); }

static void check_clone_newuser(const char *name, const char *arg) {
  long pid = syscall(SYS_clone, (long) (CLONE_NEWUSER | SIGCHLD), 0L, 0L, 0L, 0L);
  if (pid == 0)
    syscall(SYS_exit_group, 0L);
  report(name, pid, errno);
  if (pid > 0)
    reap((pid_t) pid);
}

static void check_clone3(const char *name, const char *arg) {
  struct clone_args ca;
  long pid;
  memset(&ca, 0, sizeof(ca));
  ca.exit_signal = SIGCHLD;
  pid = syscall(SYS_clone3, &ca, (long) sizeof(ca));
  if (pid == 0)
    syscall(SYS_exit_group, 0L);
  report(name, pid, errno);
  if (pid > 0)
    reap((pid_t) pid);
}

/* ------------------------------------------------------ kernel facilities */

static void check_keyctl(const char *name, const char *arg) {
  long r = syscall(SYS_keyctl, (long) KEYCTL_GET_KEYRING_ID, (long) KEY_SPEC_SESSION_KEYRING, 0L);
  report(name, r, errno);
}

static void check_add_key(const char *name, const char *arg) {
  /* the process keyring dies with this child */
  long r = syscall(SYS_add_key, "user", "tupper-probe", "x", 1L, (long) KEY_SPEC_PROCESS_KEYRING);
  report(name, r, errno);
}

static void check_request_key(const char *name, const char *arg) {
  long r = syscall(SYS_request_key, "user", "tupper-probe-none", NULL, 0L);
  report_gate(name, r, errno); /* ENOKEY: the call went through */
}

static void check_bpf(const char *name, const char *arg) {
  union bpf_attr attr;
  long fd;
  memset(&attr, 0, sizeof(attr));
  attr.map_type = BPF_MAP_TYPE_ARRAY;
  attr.key_size = 4;
  attr.value_size = 4;
  attr.max_entries = 1;
  fd = syscall(SYS_bpf, (long) BPF_MAP_CREATE, &attr, (long) sizeof(attr));
  report(name, fd, errno);
  close_if(fd);
}

static void check_perf_event_open(const char *name, const char *arg) {
  struct perf_event_attr attr;
  long fd;
  memset(&attr, 0, sizeof(attr));
  attr.type = PERF_TYPE_SOFTWARE;
  attr.size = sizeof(attr);
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  attr.disabled = 1;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  fd = syscall(SYS_perf_event_open, &attr, 0L, -1L, -1L, (long) PERF_FLAG_FD_CLOEXEC);
  report(name, fd, errno);
  close_if(fd);
}

static void check_userfaultfd(const char *name, const char *arg) {
  /* the most permissive form: user-mode faults only */
  long fd = syscall(SYS_userfaultfd, (long) (O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  report(name, fd, errno);
  close_if(fd);
}

static void check_io_uring(const char *name, const char *arg) {
  struct io_uring_params p;
  long fd;
  memset(&p, 0, sizeof(p));
  fd = syscall(SYS_io_uring_setup, 1L, &p);
  report(name, fd, errno);
  close_if(fd);
}

static void check_kexec_load(const char *name, const char *arg) {
  /* an unknown flag bit: EINVAL once past the CAP_SYS_BOOT check, so a
   * loaded kexec image is never unloaded */
  long r = syscall(SYS_kexec_load, 0L, 0L, NULL, 0x8000L);
  report_gate(name, r, errno);
}

static void check_kexec_file_load(const char *name, const char *arg) {
  long r = syscall(SYS_kexec_file_load, -1L, -1L, 0L, "", 0x8000L);
  report_gate(name, r, errno);
}

static void check_init_module(const char *name, const char *arg) {
  long r = syscall(SYS_init_module, NULL, 0L, "");
  report_gate(name, r, errno);
}

static void check_finit_module(const char *name, const char *arg) {
  long r = syscall(SYS_finit_module, -1L, "", 0L);
  report_gate(name, r, errno);
}

static void check_delete_module(const char *name, const char *arg) {
  long r = syscall(SYS_delete_module, "tupper_probe_none", (long) O_NONBLOCK);
  report_gate(name, r, errno);
}

static void check_reboot(const char *name, const char *arg) {
  /* the magic is right and the command is not one: never reboots, never
   * kills the box's init (reboot_pid_ns), EINVAL once permitted */
  long r = syscall(SYS_reboot, (long) LINUX_REBOOT_MAGIC1, (long) LINUX_REBOOT_MAGIC2, 0x1badc0deL, NULL);
  report_gate(name, r, errno);
}

static void check_swapon(const char *name, const char *arg) {
  long r = syscall(SYS_swapon, "/tupper-probe-no-such-swap", 0L);
  report_gate(name, r, errno);
}

static void check_settimeofday(const char *name, const char *arg) {
  /* no time and no zone: nothing to set, but the CAP_SYS_TIME check runs */
  long r = syscall(SYS_settimeofday, NULL, NULL);
  report(name, r, errno);
}

static void check_clock_settime(const char *name, const char *arg) {
  struct timespec now;
  long r;
  clock_gettime(CLOCK_REALTIME, &now);
  r = syscall(SYS_clock_settime, (long) CLOCK_REALTIME, &now);
  report(name, r, errno);
}

static void check_sethostname(const char *name, const char *arg) {
  struct utsname u;
  long r;
  uname(&u);
  r = syscall(SYS_sethostname, u.nodename, (long) strlen(u.nodename));
  report(name, r, errno);
}

static void check_ptrace(const char *name, const char *arg) {
  /* SEIZE asks the same permission as ATTACH without stopping the agent;
   * the tracee is let go when this child exits */
  long r = syscall(SYS_ptrace, (long) PTRACE_SEIZE, 1L, NULL, NULL);
  report(name, r, errno);
}

static void check_process_vm_readv(const char *name, const char *arg) {
  char buf[4];
  struct iovec local = {.iov_base = buf, .iov_len = sizeof(buf)};
  struct iovec remote = {.iov_base = (void *) 0x400000, .iov_len = sizeof(buf)}; /* static ELF base */
  long r = syscall(SYS_process_vm_readv, 1L, &local, 1L, &remote, 1L, 0L);
  report_gate(name, r, errno); /* EFAULT: the permission check passed */
}

static void check_open_by_handle_at(const char *name, const char *arg) {
  union {
    struct file_handle fh;
    unsigned char raw[sizeof(struct file_handle) + 16];
  } h;
  long mfd, fd;
  memset(&h, 0, sizeof(h));
  h.fh.handle_bytes = 8;
  h.fh.handle_type = 1;
  mfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  fd = syscall(SYS_open_by_handle_at, mfd, &h.fh, (long) (O_RDONLY | O_CLOEXEC));
  report_gate(name, fd, errno); /* ESTALE/EINVAL: the permission check passed */
  close_if(fd);
  close_if(mfd);
}

static void check_personality(const char *name, unsigned long persona) {
  long old = syscall(SYS_personality, 0xffffffffL); /* a query: never changes anything */
  long r = syscall(SYS_personality, (long) persona);
  int e = errno;
  if (r >= 0 && old >= 0)
    syscall(SYS_personality, old);
  report(name, r, e);
}

static void check_personality_rie(const char *name, const char *arg) {
  check_personality(name, READ_IMPLIES_EXEC);
}
static void check_personality_norandom(const char *name, const char *arg) {
  check_personality(name, ADDR_NO_RANDOMIZE);
}
static void check_personality_linux32(const char *name, const char *arg) {
  check_personality(name, PER_LINUX32);
}

static void check_iopl(const char *name, const char *arg) {
  long r = syscall(SYS_iopl, 3L);
  int e = errno;
  if (r == 0)
    syscall(SYS_iopl, 0L);
  report(name, r, e);
}

static void check_ioperm(const char *name, const char *arg) {
  long r = syscall(SYS_ioperm, 0x80L, 1L, 1L);
  int e = errno;
  if (r == 0)
    syscall(SYS_ioperm, 0x80L, 1L, 0L);
  report(name, r, e);
}

static void check_acct(const char *name, const char *arg) {
  long r = syscall(SYS_acct, "/tupper-probe-no-such-dir/acct");
  report_gate(name, r, errno); /* ENOENT: the permission check passed */
}

static void check_syslog(const char *name, const char *arg) {
  static char buf[1 << 16];
  long r = syscall(SYS_syslog, 3L /* SYSLOG_ACTION_READ_ALL */, buf, (long) sizeof(buf));
  if (r >= 0)
    say(name, "ALLOWED bytes=%ld", r);
  else
    say(name, "DENIED %s", errname(errno));
}

/* ------------------------------------------------------- other syscall ABIs */

static long int80(long nr, long a, long b, long c) {
  long ret;
  __asm__ volatile("int $0x80"
                   : "=a"(ret)
                   : "0"(nr), "b"(a), "c"(b), "d"(c)
                   : "memory", "cc", "r8", "r9", "r10", "r11");
  return ret;
}

static void report_raw(const char *name, long ret) {
  if (ret >= 0)
    say(name, "ALLOWED ret=%ld", ret);
  else if (ret >= -4095)
    say(name, "DENIED %s", errname((int) -ret));
  else
    say(name, "ALLOWED ret=%ld", ret);
}

static void check_int80_getpid(const char *name, const char *arg) {
  report_raw(name, int80(I386_GETPID, 0, 0, 0));
}
static void check_int80_unshare(const char *name, const char *arg) {
  report_raw(name, int80(I386_UNSHARE, CLONE_NEWUSER, 0, 0));
}
static void check_x32_getpid(const char *name, const char *arg) {
  long r = syscall(X32_BIT | X32_GETPID);
  if (r >= 0)
    say(name, "ALLOWED ret=%ld", r);
  else
    say(name, "DENIED %s", errname(errno));
}
static void check_x32_unshare(const char *name, const char *arg) {
  long r = syscall(X32_BIT | X32_UNSHARE, (long) CLONE_NEWUSER);
  report(name, r, errno);
}

/* ----------------------------------------------------------- files, /dev */

static void check_mknod_dev(const char *name, const char *arg) {
  const char *path = "/dev/probe-null";
  long r = syscall(SYS_mknodat, (long) AT_FDCWD, path, (long) (S_IFCHR | 0666), (long) makedev(1, 3));
  int e = errno;
  if (r == 0)
    unlink(path);
  report(name, r, e);
}

static void check_mknod_fifo(const char *name, const char *arg) {
  const char *path = "/tmp/probe-fifo";
  long r = syscall(SYS_mknodat, (long) AT_FDCWD, path, (long) (S_IFIFO | 0600), 0L);
  int e = errno;
  if (r == 0)
    unlink(path);
  report(name, r, e);
}

static void check_proc_sys_write(const char *name, const char *arg) {
  struct utsname u;
  int fd = open("/proc/sys/kernel/hostname", O_WRONLY | O_CLOEXEC);
  ssize_t w;
  if (fd < 0) {
    say(name, "DENIED %s", errname(errno));
    return;
  }
  uname(&u); /* write back the name it has: nothing changes */
  w = write(fd, u.nodename, strlen(u.nodename));
  report(name, w, errno);
  close(fd);
}

static void check_sysrq(const char *name, const char *arg) {
  /* opening for writing is the whole question: nothing is ever written */
  int fd = open("/proc/sysrq-trigger", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    say(name, "DENIED %s", errname(errno));
    return;
  }
  say(name, "ALLOWED opened-for-writing");
  close(fd);
}

static void check_sys_write(const char *name, const char *arg) {
  int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    say(name, "DENIED %s", errname(errno));
    return;
  }
  say(name, "ALLOWED opened-for-writing"); /* never written */
  close(fd);
}

static void check_sys_mkdir(const char *name, const char *arg) {
  const char *path = "/sys/fs/cgroup/tupper-probe";
  long r = syscall(SYS_mkdirat, (long) AT_FDCWD, path, 0755L);
  int e = errno;
  if (r == 0)
    rmdir(path);
  report(name, r, e);
}

/* Files a box must not read: DENIED, MASKED (/dev/null bound over it),
 * EMPTY, READABLE <bytes>, or OPENED when reading would be destructive. */
static void read_check(const char *name, const char *path, int may_read) {
  struct stat st;
  char buf[4096];
  ssize_t n;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    say(name, "DENIED %s", errname(errno));
    return;
  }
  if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
    say(name, "MASKED");
  } else if (!may_read) {
    say(name, "OPENED");
  } else {
    n = read(fd, buf, sizeof(buf));
    if (n < 0)
      say(name, "DENIED %s (read)", errname(errno));
    else if (n == 0)
      say(name, "EMPTY");
    else
      say(name, "READABLE %zd", n);
  }
  close(fd);
}

static void check_kcore(const char *name, const char *arg) { read_check(name, "/proc/kcore", 1); }
static void check_keys(const char *name, const char *arg) { read_check(name, "/proc/keys", 1); }
static void check_timer_list(const char *name, const char *arg) {
  read_check(name, "/proc/timer_list", 1);
}
static void check_sched_debug(const char *name, const char *arg) {
  read_check(name, "/proc/sched_debug", 1);
}
static void check_latency_stats(const char *name, const char *arg) {
  read_check(name, "/proc/latency_stats", 1);
}
/* reading /proc/kmsg takes the messages away from the host's reader */
static void check_kmsg(const char *name, const char *arg) { read_check(name, "/proc/kmsg", 0); }
static void check_agent_environ(const char *name, const char *arg) {
  read_check(name, "/proc/1/environ", 1);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Descriptors beyond 0-2 that came with the process. */
static void check_fds(const char *name, const char *arg) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  char list[1024] = "", detail[2048] = "";
  int leaks = 0;
  if (d == NULL) {
    say(name, "ERROR %s", errname(errno));
    return;
  }
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    char path[64], target[256];
    ssize_t n;
    if (*end != '\0' || e->d_name[0] == '\0' || fd <= 2 || fd == dirfd(d))
      continue;
    snprintf(path, sizeof(path), "/proc/self/fd/%ld", fd);
    n = readlink(path, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = '\0';
    snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%ld", leaks ? "," : "", fd);
    snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail), " %ld=%s", fd, target);
    leaks++;
  }
  closedir(d);
  if (leaks == 0)
    say(name, "ok");
  else
    say(name, "LEAK %s%s", list, detail);
}

static void check_caps(const char *name, const char *arg) {
  static const char *const keys[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                     "NoNewPrivs", "Seccomp", "Seccomp_filters"};
  char line[256], out[512] = "";
  FILE *f = fopen("/proc/self/status", "re");
  if (f == NULL) {
    say(name, "ERROR %s", errname(errno));
    return;
  }
  while (fgets(line, sizeof(line), f) != NULL) {
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
      size_t k = strlen(keys[i]);
      if (strncmp(line, keys[i], k) == 0 && line[k] == ':') {
        char *v = line + k + 1;
        v += strspn(v, " \t");
        v[strcspn(v, "\n")] = '\0';
        snprintf(out + strlen(out), sizeof(out) - strlen(out), " %s=%s", keys[i], v);
      }
    }
  }
  fclose(f);
  say(name, "%s", out[0] ? out + 1 : "none");
}

static void check_dev(const char *name, const char *arg) {
  DIR *d = opendir("/dev");
  struct dirent *e;
  char *names[256];
  size_t n = 0;
  if (d == NULL) {
    say(name, "ERROR %s", errname(errno));
    return;
  }
  while ((e = readdir(d)) != NULL && n < 256)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, n, sizeof(names[0]), cmp_str);
  printf("%s", name);
  for (size_t i = 0; i < n; i++) {
    printf(" %s", names[i] ? names[i] : "?");
    free(names[i]);
  }
  putchar('\n');
}

static void check_ids(const char *name, const char *arg) {
  unsigned long inside = 0, outside = 0, count = 0;
  int n = 0;
  FILE *f = fopen("/proc/self/uid_map", "re");
  if (f != NULL) {
    n = fscanf(f, "%lu %lu %lu", &inside, &outside, &count); /* the first range */
    fclose(f);
  }
  if (n == 3)
    say(name, "uid=%d euid=%d gid=%d egid=%d uid_map=%lu:%lu:%lu", (int) getuid(), (int) geteuid(),
        (int) getgid(), (int) getegid(), inside, outside, count);
  else
    say(name, "uid=%d euid=%d gid=%d egid=%d uid_map=none", (int) getuid(), (int) geteuid(),
        (int) getgid(), (int) getegid());
}

/* ------------------------------------------------------------- destructive */

static void check_forkbomb(const char *name, const char *arg) {
  long max = arg ? strtol(arg, NULL, 10) : 2000;
  pid_t *pids;
  long n = 0;
  int e = 0;
  if (max <= 0)
    max = 2000;
  pids = calloc((size_t) max, sizeof(pid_t));
  if (pids == NULL) {
    say(name, "ERROR ENOMEM");
    return;
  }
  while (n < max) {
    pid_t p = fork();
    if (p < 0) {
      e = errno;
      break;
    }
    if (p == 0) {
      for (;;)
        pause();
    }
    pids[n++] = p;
  }
  for (long i = 0; i < n; i++)
    kill(pids[i], SIGKILL);
  for (long i = 0; i < n; i++)
    reap(pids[i]);
  free(pids);
  if (e)
    say(name, "STOPPED count=%ld errno=%s", n, errname(e));
  else
    say(name, "CAPPED count=%ld", n); /* no limit stopped it before the cap */
}

static void check_membomb(const char *name, const char *arg) {
  long mb = arg ? strtol(arg, NULL, 10) : 256;
  long got = 0;
  for (; got < mb; got++) {
    char *p = malloc(1 << 20);
    if (p == NULL) {
      say(name, "STOPPED mb=%ld errno=ENOMEM", got);
      return;
    }
    memset(p, 0x5a, 1 << 20); /* touch every page; never freed */
    if (got % 16 == 15) {
      printf("%s progress mb=%ld\n", name, got + 1);
      fflush(stdout);
    }
  }
  say(name, "ALLOCATED mb=%ld", got);
}

static void check_diskfill(const char *name, const char *arg) {
  static char block[1 << 20];
  const char *path = arg ? arg : "/tmp/probe-fill";
  long maxmb = 1024, mb = 0;
  char *space = arg ? strchr(arg, ' ') : NULL;
  long long bytes = 0;
  int fd, e = 0;
  char file[4096];
  if (space != NULL) {
    maxmb = strtol(space + 1, NULL, 10);
    snprintf(file, sizeof(file), "%.*s", (int) (space - arg), arg);
    path = file;
  }
  memset(block, 0x5a, sizeof(block));
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    say(name, "ERROR open %s", errname(errno));
    return;
  }
  while (mb < maxmb) {
    ssize_t w = write(fd, block, sizeof(block));
    if (w < 0) {
      e = errno;
      break;
    }
    bytes += w;
    if (w < (ssize_t) sizeof(block)) { /* short write: the next one says why */
      continue;
    }
    mb++;
  }
  if (e == 0 && fsync(fd) < 0)
    e = errno;
  if (close(fd) < 0 && e == 0)
    e = errno;
  unlink(path);
  if (e)
    say(name, "STOPPED bytes=%lld errno=%s", bytes, errname(e));
  else
    say(name, "CAPPED bytes=%lld", bytes);
}

static double now_ms(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static void check_cpuburn(const char *name, const char *arg) {
  long ms = arg ? strtol(arg, NULL, 10) : 1000;
  double start = now_ms(CLOCK_MONOTONIC), cpu0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
  volatile unsigned long spin = 0;
  while (now_ms(CLOCK_MONOTONIC) - start < (double) ms)
    for (int i = 0; i < 100000; i++)
      spin++;
  double wall = now_ms(CLOCK_MONOTONIC) - start, cpu = now_ms(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  say(name, "DONE wall_ms=%.0f cpu_ms=%.0f ratio=%.2f", wall, cpu, wall > 0 ? cpu / wall : 0.0);
}

/* vfork()s children that exit at once, and reaps them, for MS ms: what a
 * shell such as dash does for each command, which a freeze must still
 * catch (docs/testing.md). */
static void check_vforkloop(const char *name, const char *arg) {
  long ms = arg ? strtol(arg, NULL, 10) : 1000;
  volatile long n = 0; /* vfork(): the child shares this frame until it exits */
  double start = now_ms(CLOCK_MONOTONIC);
  while (now_ms(CLOCK_MONOTONIC) - start < (double) ms) {
    pid_t p = vfork();
    if (p == 0)
      _exit(0);
    if (p > 0 && waitpid(p, NULL, 0) == p)
      n++;
  }
  say(name, "DONE n=%ld", (long) n);
}

static void check_sleep(const char *name, const char *arg) {
  long s = arg ? strtol(arg, NULL, 10) : 1;
  struct timespec ts = {.tv_sec = s, .tv_nsec = 0};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
  say(name, "DONE");
}

/* ------------------------------------------------------------------ table */

static const probe_check_t checks[] = {
    /* first: nothing the probe opened itself can be mistaken for a leak */
    {"fds", check_fds, PROBE_ALL, "descriptors beyond 0-2"},
    {"caps", check_caps, PROBE_ALL, "capability sets, no_new_privs, seccomp mode"},
    {"ids", check_ids, PROBE_ALL, "uids, gids and the uid map"},
    {"dev", check_dev, PROBE_ALL, "what /dev holds"},
    {"mount", check_mount, PROBE_ALL, "mount a tmpfs on /mnt"},
    {"umount", check_umount, PROBE_ALL, "umount2 (gated)"},
    {"fsopen", check_fsopen, PROBE_ALL, "new mount API: fs context"},
    {"fsmount", check_fsmount, PROBE_ALL, "new mount API: fsmount (gated)"},
    {"open_tree", check_open_tree, PROBE_ALL, "new mount API: clone the root tree"},
    {"move_mount", check_move_mount, PROBE_ALL, "new mount API: move_mount (gated)"},
    {"fspick", check_fspick, PROBE_ALL, "new mount API: reconfigure /"},
    {"mount_setattr", check_mount_setattr, PROBE_ALL, "new mount API: mount attributes"},
    {"unshare-user", check_unshare_user, PROBE_ALL, "unshare(CLONE_NEWUSER)"},
    {"unshare-mnt", check_unshare_mnt, PROBE_ALL, "unshare(CLONE_NEWNS)"},
    {"unshare-net", check_unshare_net, PROBE_ALL, "unshare(CLONE_NEWNET)"},
    {"unshare-mount", check_unshare_mount, PROBE_ALL, "mount in a mount ns of its own"},
    {"setns-mnt", check_setns_mnt, PROBE_ALL, "setns /proc/1/ns/mnt"},
    {"setns-net", check_setns_net, PROBE_ALL, "setns /proc/1/ns/net"},
    {"setns-pid", check_setns_pid, PROBE_ALL, "setns /proc/1/ns/pid"},
    {"setns-user", check_setns_user, PROBE_ALL, "setns /proc/1/ns/user"},
    {"clone-newuser", check_clone_newuser, PROBE_ALL, "raw clone(CLONE_NEWUSER)"},
    {"clone3", check_clone3, PROBE_ALL, "clone3 (ENOSYS expected)"},
    {"keyctl", check_keyctl, PROBE_ALL, "keyctl"},
    {"add_key", check_add_key, PROBE_ALL, "add_key"},
    {"request_key", check_request_key, PROBE_ALL, "request_key (gated)"},
    {"bpf", check_bpf, PROBE_ALL, "bpf map create"},
    {"perf_event_open", check_perf_event_open, PROBE_ALL, "perf_event_open"},
    {"userfaultfd", check_userfaultfd, PROBE_ALL, "userfaultfd"},
    {"io_uring_setup", check_io_uring, PROBE_ALL, "io_uring_setup"},
    {"kexec_load", check_kexec_load, PROBE_ALL, "kexec_load (gated)"},
    {"kexec_file_load", check_kexec_file_load, PROBE_ALL, "kexec_file_load (gated)"},
    {"init_module", check_init_module, PROBE_ALL, "init_module (gated)"},
    {"finit_module", check_finit_module, PROBE_ALL, "finit_module (gated)"},
    {"delete_module", check_delete_module, PROBE_ALL, "delete_module (gated)"},
    {"reboot", check_reboot, PROBE_ALL, "reboot with an invalid command (gated)"},
    {"swapon", check_swapon, PROBE_ALL, "swapon (gated)"},
    {"settimeofday", check_settimeofday, PROBE_ALL, "settimeofday(NULL, NULL)"},
    {"clock_settime", check_clock_settime, PROBE_ALL, "clock_settime to the current time"},
    {"sethostname", check_sethostname, PROBE_ALL, "sethostname to the current name"},
    {"ptrace", check_ptrace, PROBE_ALL, "ptrace PID 1 (the agent)"},
    {"process_vm_readv", check_process_vm_readv, PROBE_ALL, "read PID 1's memory (gated)"},
    {"open_by_handle_at", check_open_by_handle_at, PROBE_ALL, "open_by_handle_at (gated)"},
    {"personality-rie", check_personality_rie, PROBE_ALL, "personality(READ_IMPLIES_EXEC)"},
    {"personality-norandom", check_personality_norandom, PROBE_ALL, "personality(ADDR_NO_RANDOMIZE)"},
    {"personality-linux32", check_personality_linux32, PROBE_ALL, "personality(PER_LINUX32)"},
    {"iopl", check_iopl, PROBE_ALL, "iopl(3)"},
    {"ioperm", check_ioperm, PROBE_ALL, "ioperm(0x80)"},
    {"acct", check_acct, PROBE_ALL, "acct (gated)"},
    {"syslog", check_syslog, PROBE_ALL, "syslog(SYSLOG_ACTION_READ_ALL)"},
    {"int80-getpid", check_int80_getpid, PROBE_ALL, "i386 getpid through int $0x80"},
    {"int80-unshare", check_int80_unshare, PROBE_ALL, "i386 unshare(CLONE_NEWUSER) through int $0x80"},
    {"x32-getpid", check_x32_getpid, PROBE_ALL, "x32 getpid"},
    {"x32-unshare", check_x32_unshare, PROBE_ALL, "x32 unshare(CLONE_NEWUSER)"},
    {"mknod-dev", check_mknod_dev, PROBE_ALL, "mknod /dev/probe-null c 1 3"},
    {"mknod-fifo", check_mknod_fifo, PROBE_ALL, "mknod a fifo in /tmp"},
    {"proc-sys-write", check_proc_sys_write, PROBE_ALL, "write /proc/sys/kernel/hostname"},
    {"sysrq-trigger", check_sysrq, PROBE_ALL, "open /proc/sysrq-trigger for writing"},
    {"sys-write", check_sys_write, PROBE_ALL, "open a /sys file for writing"},
    {"sys-mkdir", check_sys_mkdir, PROBE_ALL, "mkdir in /sys/fs/cgroup"},
    {"proc-kcore", check_kcore, PROBE_ALL, "read /proc/kcore"},
    {"proc-keys", check_keys, PROBE_ALL, "read /proc/keys"},
    {"proc-timer_list", check_timer_list, PROBE_ALL, "read /proc/timer_list"},
    {"proc-sched_debug", check_sched_debug, PROBE_ALL, "read /proc/sched_debug"},
    {"proc-latency_stats", check_latency_stats, PROBE_ALL, "read /proc/latency_stats"},
    {"proc-kmsg", check_kmsg, PROBE_ALL, "open /proc/kmsg (never read)"},
    {"agent-environ", check_agent_environ, PROBE_ALL, "read /proc/1/environ"},
    {"forkbomb", check_forkbomb, PROBE_ARG, "[MAX]: fork until failure (cap 2000)"},
    {"membomb", check_membomb, PROBE_ARG, "MB: allocate and touch"},
    {"diskfill", check_diskfill, PROBE_ARG, "PATH [MAXMB]: write until error (cap 1024 MB), then delete"},
    {"cpuburn", check_cpuburn, PROBE_ARG, "MS: busy loop; prints the cpu/wall ratio"},
    {"vforkloop", check_vforkloop, PROBE_ARG, "MS: vfork() children that exit at once, in a loop"},
    {"sleep", check_sleep, PROBE_ARG, "S: sleep"},
};

#define NCHECKS (sizeof(checks) / sizeof(checks[0]))

/* Runs one check in a child; reports the child's death by a signal. */
static void run_isolated(const probe_check_t *c, const char *arg) {
  pid_t pid;
  int st = 0;
  fflush(stdout);
  pid = fork();
  if (pid < 0) {
    say(c->name, "ERROR fork %s", errname(errno));
    return;
  }
  if (pid == 0) {
    if (c->flags & PROBE_ALL)
      alarm(PROBE_ALARM_S);
    c->run(c->name, arg);
    fflush(stdout);
    _exit(0);
  }
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) {
      say(c->name, "ERROR wait %s", errname(errno));
      return;
    }
  }
  if (WIFSIGNALED(st)) {
    const char *sig = sigabbrev_np(WTERMSIG(st));
    if (sig != NULL)
      say(c->name, "KILLED SIG%s", sig);
    else
      say(c->name, "KILLED SIG%d", WTERMSIG(st));
  }
  fflush(stdout);
}

static void usage(FILE *to) {
  fprintf(to, "usage: tupper-probe all | list | <check> [ARG]\n");
  for (size_t i = 0; i < NCHECKS; i++)
    fprintf(to, "  %-22s %s%s\n", checks[i].name, checks[i].help,
            checks[i].flags & PROBE_ALL ? "" : " (not in all)");
}

int main(int argc, char **argv) {
  char arg[4096];
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "list") == 0 || strcmp(argv[1], "--help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "all") == 0) {
    for (size_t i = 0; i < NCHECKS; i++)
      if (checks[i].flags & PROBE_ALL)
        run_isolated(&checks[i], NULL);
    return 0;
  }
  /* the rest of argv is the check's argument, joined with spaces */
  arg[0] = '\0';
  for (int i = 2; i < argc; i++)
    snprintf(arg + strlen(arg), sizeof(arg) - strlen(arg), "%s%s", i > 2 ? " " : "", argv[i]);
  for (size_t i = 0; i < NCHECKS; i++)
    if (strcmp(argv[1], checks[i].name) == 0) {
      run_isolated(&checks[i], argc > 2 ? arg : NULL);
      return 0;
    }
  fprintf(stderr, "tupper-probe: unknown check '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
