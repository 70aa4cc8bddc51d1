/* The limits of a linux box started with the real agent (TUPPER_AGENT):
 * cgroups (a box's processes in the given ones), a seccomp filter and the
 * disk cap (a loop device), in one box; start failures of those steps
 * named and leaving nothing.  TAP-ish output; exit 0 pass, 1 fail, 77 skip
 * (not root, no user namespaces, no busybox, or no agent). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "tap.h"
#include "image.h"
#include "linux.h"
#include "rmtree.h"
#include "linux_box.h"

/* ------------------------------------------------------------ limits */

/* A test filter (the real one is seccomp.c's): mknod and mknodat answer
 * EXFULL, a code nothing else returns; everything else passes. */
static struct sock_filter test_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mknodat, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 133 /* x86_64 mknod */, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EXFULL),
};

/* A throwaway cgroup at the root of the v1 pids hierarchy and one at the
 * root of the cgroup2 hierarchy, whichever exist: their cgroup.procs paths
 * go in procs[] (NULL-terminated), their dirs in dirs[]. */
static int make_test_cgroups(char *dirs[2], char *procs[3]) {
  static const char *const roots[] = {"/sys/fs/cgroup/pids", "/sys/fs/cgroup",
                                      "/sys/fs/cgroup/unified"};
  struct statfs sf;
  int n = 0, v2 = 0;
  for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
    char name[64];
    if (statfs(roots[i], &sf) < 0 || (i > 0 && v2))
      continue;
    if (i == 0 ? sf.f_type != 0x27e0eb /* CGROUP_SUPER_MAGIC */
               : sf.f_type != 0x63677270 /* CGROUP2_SUPER_MAGIC */)
      continue;
    v2 = i > 0;
    snprintf(name, sizeof(name), "tupper-test-%d", (int) getpid());
    dirs[n] = path_in(roots[i], name);
    if (mkdir(dirs[n], 0755) < 0) {
      free(dirs[n]);
      continue;
    }
    procs[n] = path_in(dirs[n], "cgroup.procs");
    n++;
  }
  procs[n] = NULL;
  return n;
}

/* Cgroups, seccomp and the disk cap, in one box. */
static void test_box_limits(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lbox");
  char *dirs[2] = {NULL, NULL}, *procs[3] = {NULL, NULL, NULL};
  struct sock_fprog prog = {sizeof(test_filter) / sizeof(test_filter[0]), test_filter};
  char *o, path[300], want[300];
  tp_box_spec_t s = spec_for(e, "limits", box_dir);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  int n_cg = make_test_cgroups(dirs, procs), r, loops;
  size_t len;

  s.cgroup_procs = (const char *const *) procs;
  s.seccomp = &prog;
  s.disk_bytes = 64 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "limits: box with %d cgroups, seccomp and a 64 MiB disk started (%s)", n_cg,
        r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;

  snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) box.pid);
  o = slurp(path, &len);
  for (int i = 0; i < n_cg; i++) {
    int v1 = strncmp(dirs[i], "/sys/fs/cgroup/pids/", 20) == 0;
    snprintf(want, sizeof(want), "%s/tupper-test-%d\n", v1 ? ":pids:" : "\n0::", (int) getpid());
    check(o != NULL && strstr(o, want) != NULL, "cgroup: PID 1 joined %s", dirs[i]);
  }
  free(o);
  o = box_out(&c, "grep -vc ':/$' /proc/self/cgroup");
  check(strcmp(o, "0") == 0, "cgroup: the box's cgroup namespace is rooted at its cgroups (%s)",
        o);
  free(o);

  o = box_out(&c, "grep -E '^(NoNewPrivs|Seccomp):' /proc/1/status | tr -d '\\t'");
  check(strcmp(o, "NoNewPrivs:1\nSeccomp:2") == 0,
        "seccomp: agent runs filtered, no_new_privs ('%s')", o);
  free(o);
  o = box_out(&c, "mkfifo /tmp/fifo 2>&1; test -e /tmp/fifo || echo absent");
  check(strstr(o, "Exchange full") != NULL && strstr(o, "absent") != NULL,
        "seccomp: the filter answers for the box's processes ('%s')", o);
  free(o);

  loops = loops_backed_by(box_dir);
  check(loops == 1, "disk: one loop device backed by the box's disk.img (%d)", loops);
  o = box_out(&c, "dd if=/dev/zero of=/big bs=1M count=100 2>&1 | grep -o 'No space left on device'"
                  " | head -1; rm /big; head -c 4000000 /dev/zero > /ok && echo ok-after");
  check(strcmp(o, "No space left on device\nok-after") == 0,
        "disk: writing past 64 MiB gets ENOSPC, freeing makes room ('%s')", o);
  free(o);
  snprintf(path, sizeof(path), "%s/disk", box_dir);
  check(mounts_matching(path) == 0, "disk: its mount is not in the host's mount table");

  r = tp_box_destroy(&box, box_dir, &err);
  check(r == 0, "limits: destroyed (%s)", r < 0 ? err.msg : "ok");
  loops = loops_backed_by(box_dir);
  check(loops == 0 && !exists(box_dir), "disk: after destroy no loop device refers to it (%d), "
        "no file left", loops);
out:
  for (int i = 0; i < n_cg; i++) {
    check(rmdir(dirs[i]) == 0, "cgroup: %s empty after destroy, removed", dirs[i]);
    free(dirs[i]);
    free(procs[i]);
  }
  free(c.buf);
  free(box_dir);
}

/* Start failures of the new steps: named, nothing left behind. */
static void test_limits_failures(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lfail");
  char missing[128];
  const char *procs[] = {missing, NULL};
  struct sock_filter ret_kill = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  struct sock_fprog empty = {0, test_filter}, kill_all = {1, &ret_kill};
  tp_box_spec_t s;
  tp_box_t box;
  int r;

  snprintf(missing, sizeof(missing), "/sys/fs/cgroup/pids/tupper-none-%d/cgroup.procs",
           (int) getpid());
  s = spec_for(e, "lfail", box_dir);
  s.cgroup_procs = procs;
  s.disk_bytes = 16 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == ENOENT && strstr(err.msg, "join cgroup") && strstr(err.msg, missing),
        "start: a missing cgroup fails the start, step named (%s)", err.msg);
  check(!exists(box_dir) && no_children_left() && loops_backed_by(box_dir) == 0,
        "start: ...leaving no dir, process or loop device");

  s = spec_for(e, "lfail", box_dir);
  s.disk_bytes = 4096;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: a 4 KiB disk refused (%s)",
        err.msg);
  s = spec_for(e, "lfail", box_dir);
  s.seccomp = &empty;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: an empty filter refused (%s)",
        err.msg);
  /* A filter that kills even execveat: the child dies, no report. */
  s = spec_for(e, "lfail", box_dir);
  s.seccomp = &kill_all;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "exited during start") && !exists(box_dir) && no_children_left(),
        "start: a filter that forbids the exec fails the start cleanly (%s)",
        r < 0 ? err.msg : "started");
  if (r == 0)
    tp_box_destroy(&box, box_dir, &err);
  free(box_dir);
}

int main(void) {
  env_t env = {NULL, {NULL, NULL}, -1};
  int r = box_env_begin(&env, 0);

  if (r == 0) {
    test_box_limits(&env);
    test_limits_failures(&env);
  }
  return r > 0 ? r : linux_test_end(&env, 0);
}
