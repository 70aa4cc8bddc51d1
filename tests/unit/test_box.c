/* Boxes of the linux backend (backends/linux) started with the real agent
 * (TUPPER_AGENT) on the default image, asserting isolation and hardening
 * from inside (masked /proc, mount flags, rlimits), start failures that
 * leave nothing, and layered images (whiteouts, opaque dirs, 40 layers);
 * then a clean host after destroy (no mount, loop device, process or file
 * left).  Limits are test_box_limits', daemon death and adoption
 * test_box_adopt's.  TAP-ish output; exit 0 pass, 1 fail, 77 skip (not
 * root, no user namespaces, no busybox, or no agent). */
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

/* ------------------------------------------------------------ mountinfo */

typedef struct mnt_s {
  char mp[256];
  char opts[256];  /* per-mount options */
  char fstype[64];
  char super[512]; /* superblock options */
} mnt_t;

static int parse_mnt(const char *line, mnt_t *m) {
  const char *sep = strstr(line, " - ");
  memset(m, 0, sizeof(*m));
  if (sep == NULL || sscanf(line, "%*s %*s %*s %*s %255s %255s", m->mp, m->opts) != 2 ||
      sscanf(sep + 3, "%63s %*s %511s", m->fstype, m->super) < 1)
    return -1;
  return 0;
}

/* 1 if the comma-separated list has `opt` (exactly, or as "opt=..."). */
static int has_opt(const char *opts, const char *opt) {
  size_t n = strlen(opt);
  for (const char *p = opts; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (strncmp(p, opt, n) == 0 && (p[n] == ',' || p[n] == '\0' || p[n] == '='))
      return 1;
  return 0;
}

/* The topmost mount at `mp` in mountinfo text; 0 if found. */
static int find_mnt(const char *mi, const char *mp, mnt_t *out) {
  char *text = strdup(mi), *save = NULL;
  int found = -1;
  memset(out, 0, sizeof(*out));
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    mnt_t m;
    if (parse_mnt(line, &m) == 0 && strcmp(m.mp, mp) == 0) {
      *out = m;
      found = 0;
    }
  }
  free(text);
  return found;
}

/* Every writable mount must be nosuid and nodev; only the device-node binds
 * of /dev (nodes of the host's /dev) and devpts (the box's ptys, nosuid and
 * noexec) may carry devices.  Offenders are listed in bad. */
static int audit_mounts(const char *mi, char *bad, size_t cap) {
  static const char *const dev_nodes[] = {"/dev/null",   "/dev/zero",    "/dev/full",
                                          "/dev/random", "/dev/urandom", "/dev/tty"};
  char *text = strdup(mi), *save = NULL;
  int n_bad = 0, n = 0;
  bad[0] = '\0';
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    mnt_t m;
    int ok, dev = 0;
    if (parse_mnt(line, &m) < 0) {
      n_bad++;
      continue;
    }
    n++;
    for (size_t i = 0; i < sizeof(dev_nodes) / sizeof(dev_nodes[0]); i++)
      dev |= strcmp(m.mp, dev_nodes[i]) == 0;
    if (strcmp(m.fstype, "devpts") == 0)
      ok = has_opt(m.opts, "nosuid") && has_opt(m.opts, "noexec");
    else if (dev)
      ok = 1;
    else
      ok = has_opt(m.opts, "ro") || (has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev"));
    if (!ok) {
      n_bad++;
      snprintf(bad + strlen(bad), cap - strlen(bad), "%s(%s %s) ", m.mp, m.fstype, m.opts);
    }
  }
  free(text);
  return n < 10 ? -1 : n_bad; /* a box has well over 10 mounts: else parsing failed */
}


/* The host pid of the box process whose parent is `ppid` and name `comm`. */
static pid_t find_child(pid_t ppid, const char *comm) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = -1;
  while (d != NULL && found < 0 && (e = readdir(d)) != NULL) {
    char path[300], *text, *s;
    size_t len;
    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
    text = slurp(path, &len);
    if (text == NULL)
      continue;
    s = strstr(text, "\nPPid:\t");
    if (s != NULL && atoi(s + 7) == ppid && strncmp(text + 6, comm, strlen(comm)) == 0)
      found = atoi(e->d_name);
    free(text);
  }
  if (d != NULL)
    closedir(d);
  return found;
}

/* /proc masks, read-only kernel knobs, mount flags and rlimits, from
 * inside a box with default settings. */
static void test_box_hardening(conn_t *c, const char *id) {
  static const char *const masked[] = {"kcore", "keys", "key-users", "timer_list", "sched_debug",
                                       "kmsg", "latency_stats", "sysrq-trigger", "config.gz"};
  static const char *const emptied[] = {"acpi", "scsi", "asound", "firmware"};
  char want[1024] = "", path[64], bad[2048], *o, *mi;
  struct stat st;
  struct rlimit nofile;
  mnt_t m;
  int code, n_masked = 0;

  for (size_t i = 0; i < sizeof(masked) / sizeof(masked[0]); i++) {
    snprintf(path, sizeof(path), "/proc/%s", masked[i]);
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
      snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s 0 1:3 denied\n", masked[i]);
      n_masked++;
    }
  }
  o = box_out(c, "for f in kcore keys key-users timer_list sched_debug kmsg latency_stats "
                 "sysrq-trigger config.gz; do [ -e /proc/$f ] || continue; "
                 "echo \"$f $(cat /proc/$f 2>/dev/null | wc -c) $(stat -c %t:%T /proc/$f) "
                 "$( (echo 1 >/proc/$f) 2>/dev/null && echo written || echo denied)\"; done");
  want[strlen(want) > 0 ? strlen(want) - 1 : 0] = '\0';
  check(strcmp(o, want) == 0 && n_masked > 0,
        "inside: %d masked /proc files are /dev/null, read nothing, refuse writes ('%s')",
        n_masked, o);
  free(o);

  want[0] = '\0';
  for (size_t i = 0; i < sizeof(emptied) / sizeof(emptied[0]); i++) {
    snprintf(path, sizeof(path), "/proc/%s", emptied[i]);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
      snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s 0 denied\n", emptied[i]);
  }
  want[strlen(want) > 0 ? strlen(want) - 1 : 0] = '\0';
  o = box_out(c, "for d in acpi scsi asound firmware; do [ -d /proc/$d ] || continue; "
                 "echo \"$d $(ls -A /proc/$d | wc -l) "
                 "$(touch /proc/$d/x 2>/dev/null && echo written || echo denied)\"; "
                 "done");
  check(strcmp(o, want) == 0, "inside: /proc hardware dirs empty and read-only ('%s')", o);
  free(o);

  code = box_sh(c, "echo evil > /proc/sys/kernel/hostname", NULL, NULL);
  o = box_out(c, "cat /proc/sys/kernel/hostname; hostname");
  snprintf(want, sizeof(want), "%s\n%s", id, id);
  check(code != 0 && strcmp(o, want) == 0,
        "inside: writing /proc/sys/kernel/hostname fails (exit %d, '%s')", code, o);
  free(o);

  mi = box_out(c, "cat /proc/self/mountinfo");
  code = audit_mounts(mi, bad, sizeof(bad));
  check(code == 0, "inside: every writable mount is nosuid,nodev (%d offenders: %s)", code, bad);
  for (const char *const *d = (const char *const[]){"/proc/sys", "/proc/bus", "/proc/fs",
                                                    "/proc/irq", "/sys", NULL};
       *d; d++) {
    if (strncmp(*d, "/proc/", 6) == 0 && stat(*d, &st) < 0)
      continue; /* this kernel has none (the box's /proc is the host kernel's) */
    check(find_mnt(mi, *d, &m) == 0 && has_opt(m.opts, "ro") && has_opt(m.opts, "nosuid") &&
              has_opt(m.opts, "nodev") && has_opt(m.opts, "noexec"),
          "inside: %s mounted ro,nosuid,nodev,noexec ('%s')", *d, m.opts);
  }
  /* each mask takes its flags from a read-only source (box_plan.c) */
  for (size_t i = 0; i < sizeof(masked) / sizeof(masked[0]) + sizeof(emptied) / sizeof(emptied[0]);
       i++) {
    int is_dir = i >= sizeof(masked) / sizeof(masked[0]);
    const char *name = is_dir ? emptied[i - sizeof(masked) / sizeof(masked[0])] : masked[i];
    snprintf(path, sizeof(path), "/proc/%s", name);
    if (stat(path, &st) < 0 || (S_ISDIR(st.st_mode) != 0) != is_dir)
      continue;
    check(find_mnt(mi, path, &m) == 0 && has_opt(m.opts, "ro") && has_opt(m.opts, "nosuid") &&
              has_opt(m.opts, "nodev") && has_opt(m.opts, "noexec"),
          "inside: %s masked ro,nosuid,nodev,noexec ('%s')", path, m.opts);
  }
  check(find_mnt(mi, "/dev/shm", &m) == 0 && has_opt(m.opts, "rw") &&
            has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev") &&
            has_opt(m.opts, "noexec") && strstr(m.super, "size=65536k") != NULL,
        "inside: /dev/shm rw,nosuid,nodev,noexec, 64 MiB ('%s' '%s')", m.opts, m.super);
  check(find_mnt(mi, "/dev", &m) == 0 && has_opt(m.opts, "noexec") && has_opt(m.opts, "nodev"),
        "inside: /dev nodev,noexec ('%s')", m.opts);
  check(find_mnt(mi, "/", &m) == 0 && strcmp(m.fstype, "overlay") == 0 &&
            has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev"),
        "inside: / (overlay) nosuid,nodev ('%s')", m.opts);
  free(mi);

  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_max > 1048576)
    nofile.rlim_max = 1048576;
  o = box_out(c, "ulimit -c; ulimit -Hc; ulimit -n; ulimit -Hn; "
                 "grep '^Max core' /proc/1/limits | tr -s ' '");
  snprintf(want, sizeof(want), "0\n0\n%llu\n%llu\nMax core file size 0 0 bytes ",
           (unsigned long long) nofile.rlim_max, (unsigned long long) nofile.rlim_max);
  check(strcmp(o, want) == 0, "inside: RLIMIT_CORE 0 (agent too), RLIMIT_NOFILE %llu ('%s')",
        (unsigned long long) nofile.rlim_max, o);
  free(o);
  o = box_out(c, "grep '^Seccomp:' /proc/1/status | tr -d '\\t'");
  check(strcmp(o, "Seccomp:0") == 0, "inside: no seccomp filter unless asked ('%s')", o);
  free(o);
}

/* A second box while the first runs: both see /sys through one superblock
 * (mounted from the daemon's lo-only namespace, sysfs_net.c), yet each
 * runs in a network namespace of its own, neither the host's. */
static void test_box_shared_sysfs(const env_t *e, const tp_box_t *first) {
  tp_error_t err = {0};
  char *dir2 = path_in(tmp_root, "box-sys2");
  tp_box_spec_t s = spec_for(e, "tp-test-sys2", dir2);
  tp_box_t b2;
  struct stat sys1, sys2, net0, net1, net2;
  char p[64];
  int r = tp_linux_box_start(&s, &b2, &err);
  check(r == 0, "sysfs: a second box started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0) {
    free(dir2);
    return;
  }
  snprintf(p, sizeof(p), "/proc/%d/root/sys", (int) first->pid);
  r = stat(p, &sys1);
  snprintf(p, sizeof(p), "/proc/%d/root/sys", (int) b2.pid);
  r = r < 0 ? r : stat(p, &sys2);
  check(r == 0 && sys1.st_dev == sys2.st_dev,
        "sysfs: two boxes share /sys's superblock (one shrinker, not one a box)");
  snprintf(p, sizeof(p), "/proc/%d/ns/net", (int) first->pid);
  r = stat(p, &net1);
  snprintf(p, sizeof(p), "/proc/%d/ns/net", (int) b2.pid);
  r = r < 0 ? r : stat(p, &net2);
  r = r < 0 ? r : stat("/proc/self/ns/net", &net0);
  check(r == 0 && net1.st_ino != net2.st_ino && net1.st_ino != net0.st_ino &&
            net2.st_ino != net0.st_ino,
        "sysfs: each box still runs in a network namespace of its own");
  r = tp_box_destroy(&b2, dir2, &err);
  check(r == 0, "sysfs: second box destroyed (%s)", r < 0 ? err.msg : "ok");
  free(dir2);
}

static void test_box(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "box");
  char *secret = path_in(tmp_root, "host-secret");
  char id[64], script[512], *o, *p;
  tp_box_spec_t s;
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  int r, code;
  int64_t sleep_pid = -1;
  pid_t sleep_host = -1;
  int sleep_pidfd = -1;

  snprintf(id, sizeof(id), "tp-test-%d", (int) getpid());
  write_text(secret, "secret\n", 0644);
  s = spec_for(e, id, box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "box: started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  check(box.pid > 0 && box.pidfd >= 0 && box.chan_fd >= 0, "box: pid, pidfd and channel set");
  check((fcntl(box.chan_fd, F_GETFL) & O_NONBLOCK) && (fcntl(box.chan_fd, F_GETFD) & FD_CLOEXEC) &&
            (fcntl(box.pidfd, F_GETFD) & FD_CLOEXEC),
        "box: channel non-blocking, fds close-on-exec");
  c.fd = box.chan_fd;

  r = conn_next(&c, &m);
  check(r == 1 && m.type == TP_MSG_READY && msg_int(&m, TP_TAG_PID, 0) == 1,
        "box: agent says READY as PID 1");
  if (r == 1)
    free(m.payload);

  o = box_out(&c, "hostname");
  check(strcmp(o, id) == 0, "inside: hostname is the box id ('%s')", o);
  free(o);
  o = box_out(&c, "id -u; id -g");
  check(strcmp(o, "0\n0") == 0, "inside: uid and gid 0 ('%s')", o);
  free(o);
  o = box_out(&c, "cat /proc/self/uid_map /proc/self/gid_map | tr -s ' ' | sed 's/^ //'");
  snprintf(script, sizeof(script), "0 %u %u\n0 %u %u", UID_BASE, ID_COUNT, UID_BASE, ID_COUNT);
  check(strcmp(o, script) == 0, "inside: root maps to the host range, not host root ('%s')", o);
  free(o);
  o = box_out(&c, "grep -c : /proc/net/dev; grep -o '^ *lo:' /proc/net/dev | tr -d ' '");
  check(strcmp(o, "1\nlo:") == 0, "inside: only lo in the netns ('%s')", o);
  free(o);
  o = box_out(&c, "cat /sys/class/net/lo/operstate /sys/class/net/lo/flags; ls /sys/class/net");
  check(strcmp(o, "unknown\n0x9\nlo") == 0, "inside: lo is up, /sys shows only lo ('%s')",
        o);
  free(o);
  test_box_shared_sysfs(e, &box);
  o = box_out(&c, "ls /proc | grep -c '^[0-9]'; tr '\\0' ' ' < /proc/1/cmdline");
  check(strcmp(o, "3\ntupper-agent ") == 0 || strcmp(o, "4\ntupper-agent ") == 0,
        "inside: host processes invisible, PID 1 is the agent ('%s')", o);
  free(o);
  snprintf(script, sizeof(script), "test -e /proc/%d; echo $?; test -e '%s'; echo $?",
           (int) getpid(), secret);
  o = box_out(&c, script);
  check(strcmp(o, "1\n1") == 0, "inside: host pid and host file invisible ('%s')", o);
  free(o);
  o = box_out(&c, "echo $(ls -A /dev)");
  check(strcmp(o, "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero") == 0,
        "inside: minimal /dev ('%s')", o);
  free(o);
  o = box_out(&c, "head -c 4 /dev/zero | od -An -tx1 | tr -d ' '; "
                  "echo x > /dev/null && echo null-ok");
  check(strcmp(o, "00000000\nnull-ok") == 0, "inside: /dev/zero and /dev/null work ('%s')", o);
  free(o);
  code = box_sh(&c, "echo > /dev/tty", NULL, NULL);
  check(code != 0, "inside: no controlling terminal (/dev/tty fails, exit %d)", code);
  o = box_out(&c, "stat -c '%a' /dev/pts/ptmx; stat -c '%U %a' /dev/shm /tmp");
  check(strcmp(o, "666\nroot 1777\nroot 1777") == 0,
        "inside: ptmx 0666, /dev/shm and /tmp 1777 owned by root ('%s')", o);
  free(o);

  code = box_sh(&c, "mkdir -p /mnt && mount -t tmpfs x /mnt", NULL, NULL);
  check(code != 0, "inside: mount denied (exit %d)", code);
  code = box_sh(&c, "hostname evil", NULL, NULL);
  o = box_out(&c, "hostname");
  check(code != 0 && strcmp(o, id) == 0, "inside: sethostname denied (exit %d)", code);
  free(o);
  code = box_sh(&c, "ip link set lo down || ifconfig lo down", NULL, NULL);
  check(code != 0, "inside: network config denied (exit %d)", code);
  code = box_sh(&c, "echo 1 > /proc/sys/kernel/panic", NULL, NULL);
  check(code != 0, "inside: /proc/sys not writable (exit %d)", code);
  test_box_hardening(&c, id);

  p = path_in(box_dir, "agent.sock");
  {
    struct stat st;
    char fd4[300], link[64] = "";
    ssize_t n;
    check(lstat(p, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0600 &&
              st.st_uid == 0 && st.st_gid == 0,
          "box: agent.sock in box_dir, a socket, 0600, host root's");
    snprintf(fd4, sizeof(fd4), "/proc/%d/fd/%d", (int) box.pid, TP_AGENT_LISTEN_FD);
    n = readlink(fd4, link, sizeof(link) - 1);
    link[n > 0 ? n : 0] = '\0';
    diag("the agent %s fd %d (%s)", strncmp(link, "socket:", 7) == 0 ? "keeps" : "closed",
         TP_AGENT_LISTEN_FD, link);
  }
  free(p);

  code = box_sh(&c, "echo data > /newfile", NULL, NULL);
  p = path_in(box_dir, "upper/newfile");
  {
    size_t len;
    char *text = slurp(p, &len);
    struct stat st;
    check(code == 0 && text && strcmp(text, "data\n") == 0 && stat(p, &st) == 0 &&
              st.st_uid == UID_BASE,
          "box: writes land in upper/, owned by the box's root on the host");
    free(text);
  }
  free(p);
  code = box_sh_as(&c, "echo more > /home/user/f", 1000, NULL, NULL);
  p = path_in(box_dir, "upper/home/user/f");
  {
    struct stat st;
    check(code == 0 && stat(p, &st) == 0 && st.st_uid == UID_BASE + 1000 &&
              st.st_gid == UID_BASE + 1000,
          "box: copy-up works, uid 1000 inside is base+1000 on the host");
  }
  free(p);
  p = path_in(e->image, "newfile");
  check(!exists(p), "box: the image is untouched");
  free(p);

  /* A background process: it must die with the box. */
  box_sh(&c, "exec sleep 1000", NULL, &sleep_pid);
  for (int i = 0; i < 200 && sleep_host < 0; i++) {
    sleep_host = find_child(box.pid, "sleep");
    if (sleep_host < 0)
      usleep(5000);
  }
  if (sleep_host > 0)
    sleep_pidfd = (int) syscall(SYS_pidfd_open, sleep_host, 0);
  check(sleep_pid > 0 && sleep_pidfd >= 0, "box: background process started (host pid %d)",
        (int) sleep_host);

  {
    pid_t pid = box.pid;
    double t0 = now_ms();
    /* as uv_poll leaves it: destroy must still wait for the exit */
    fcntl(box.pidfd, F_SETFL, fcntl(box.pidfd, F_GETFL) | O_NONBLOCK);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0, "destroy: ok in %.2f ms (%s)", now_ms() - t0, r < 0 ? err.msg : "ok");
    check(box.pidfd == -1 && box.chan_fd == -1, "destroy: fds closed and reset");
    check(kill(pid, 0) < 0 && errno == ESRCH, "destroy: PID 1 gone");
    if (sleep_pidfd >= 0) {
      struct pollfd pf = {.fd = sleep_pidfd, .events = POLLIN};
      check(poll(&pf, 1, 0) == 1, "destroy: every process of the box gone");
      close(sleep_pidfd);
    }
    check(mounts_matching(box_dir) == 0, "destroy: no mount under box_dir left");
    check(!exists(box_dir), "destroy: box_dir removed");
    check(no_children_left(), "destroy: no zombie");
    check(tp_box_destroy(&box, box_dir, &err) == 0, "destroy: idempotent");
  }
out:
  free(c.buf);
  unlink(secret);
  free(secret);
  free(box_dir);
}

/* A start that fails leaves no process, no dir and says which step failed. */
static void test_box_failures(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "fbox");
  char *missing = path_in(tmp_root, "no-such-image");
  tp_box_spec_t s;
  tp_box_t box;
  int r, fd;

  s = spec_for(e, "Bad_ID", box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: invalid id refused (%s)", err.msg);
  s = spec_for(e, "ok", box_dir);
  s.uid_base = 0;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: uid_base 0 refused (%s)", err.msg);
  s = spec_for(e, "ok", "relative/dir");
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL, "start: relative box_dir refused");
  {
    const char *inject[] = {"/tmp/a,upperdir=/x", NULL};
    const char *relative[] = {e->image, "rel/layer", NULL};
    const char *none[] = {NULL};
    s = spec_for(e, "ok", box_dir);
    s.layers = inject;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: overlay option injection refused");
    s.layers = relative;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: relative layer refused (%s)",
          err.msg);
    s.layers = none;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: no layers refused (%s)", err.msg);
    s.layers = NULL;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: NULL layers refused");
  }
  {
    const char *many[TP_LAYERS_MAX + 2];
    for (int i = 0; i < TP_LAYERS_MAX + 1; i++)
      many[i] = e->image;
    many[TP_LAYERS_MAX + 1] = NULL;
    s = spec_for(e, "ok", box_dir);
    s.layers = many;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == E2BIG && !exists(box_dir), "start: %d layers refused (%s)",
          TP_LAYERS_MAX + 1, err.msg);
  }

  {
    /* volumes: mount points the plan refuses, an image that is not there
     * or not a regular file; nothing is left behind by any of them */
    static const char *const bad[] = {"rel", "/", "/proc/x", "/sys", "/dev/shm", "/a/../b", "/a//b",
                                      "/a/", "/./a", "/a\001b"};
    tp_box_volume_t v[2];
    char *img = path_in(tmp_root, "vol.img");
    s = spec_for(e, "ok", box_dir);
    s.volumes = v;
    s.n_volumes = 1;
    v[0].image = img;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
      v[0].target = bad[i];
      r = tp_linux_box_start(&s, &box, &err);
      check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: volume at '%s' refused (%s)",
            bad[i], err.msg);
    }
    v[0].target = "/mnt/a";
    v[1] = v[0];
    s.n_volumes = 2;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: two volumes at one point refused (%s)",
          err.msg);
    s.n_volumes = TP_VOLUMES_MAX + 1;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == E2BIG, "start: too many volumes refused (%s)", err.msg);
    s.n_volumes = 1;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == ENOENT && !exists(box_dir), "start: a missing volume image (%s)", err.msg);
    v[0].image = tmp_root; /* a directory */
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && !exists(box_dir), "start: a volume image that is not a file (%s)", err.msg);
    v[0].image = img;
    check(tp_linux_volume_make(img, 1024, &err) < 0 && err.code == EINVAL && !exists(img),
          "volume_make: too small refused (%s)", err.msg);
    check(tp_linux_volume_make(img, 16 << 20, &err) == 0 && exists(img), "volume_make: made (%s)", err.msg);
    check(tp_linux_volume_make(img, 16 << 20, &err) < 0 && err.code == EEXIST, "volume_make: never over an existing file");
    unlink(img);
    free(img);
  }

  mkdir(box_dir, 0700);
  s = spec_for(e, "ok", box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EEXIST && exists(box_dir),
        "start: existing box_dir refused, kept (%s)", err.msg);
  rmdir(box_dir);

  const char *missing_layers[] = {missing, NULL};
  s = spec_for(e, "ok", box_dir);
  s.layers = missing_layers;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "mount overlay") != NULL && err.code == ENOENT,
        "start: a failed step is named (%s)", err.msg);
  check(!exists(box_dir) && no_children_left() && box.pidfd == -1 && box.chan_fd == -1,
        "start: failure leaves no dir, no process, no fds");

  fd = tp_agent_memfd("#!/bin/nothing\n", 15, &err);
  s = spec_for(e, "ok", box_dir);
  s.agent_fd = fd;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "exec agent") != NULL, "start: exec failure reported (%s)",
        err.msg);
  check(!exists(box_dir) && no_children_left() && mounts_matching(box_dir) == 0,
        "start: exec failure leaves nothing");
  if (fd >= 0)
    close(fd);
  free(missing);
  free(box_dir);
}

/* ------------------------------------------------------------ layers */

/* Writes dir/rel (parents made as needed), all owned by the box's root as
 * an image's files are; a NULL text makes rel a whiteout (char 0:0),
 * overlay's mark of a deleted file. */
static int layer_put(const char *dir, const char *rel, const char *text) {
  char path[2048], *slash;
  snprintf(path, sizeof(path), "%s/%s", dir, rel);
  for (slash = strchr(path + strlen(dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    if ((mkdir(path, 0755) < 0 && errno != EEXIST) || lchown(path, UID_BASE, UID_BASE) < 0)
      return -1;
    *slash = '/';
  }
  if (text == NULL ? mknod(path, S_IFCHR | 0000, makedev(0, 0)) : write_text(path, text, 0644))
    return -1;
  return lchown(path, UID_BASE, UID_BASE);
}

/* Three layers (the busybox image at the bottom): the merged view, the
 * upper layer winning, a whiteout and an opaque dir hiding what is below;
 * then 40 layers at long paths, whose options would pass the page the
 * kernel copies if they were spelt out. */
static void test_box_layers(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lbox");
  char *l1 = path_in(tmp_root, "layer1"), *l2 = path_in(tmp_root, "layer2");
  char *many_root = path_in(tmp_root, "many");
  const char *three[] = {e->image, l1, l2, NULL};
  const char *many[42];
  char *many_dirs[40];
  tp_box_spec_t s;
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  char *o, *p;
  size_t total = 0;
  int r, ok;

  mkdir(l1, 0755);
  mkdir(l2, 0755);
  ok = lchown(l1, UID_BASE, UID_BASE) == 0 && lchown(l2, UID_BASE, UID_BASE) == 0 &&
       layer_put(l1, "etc/a", "one\n") == 0 && layer_put(l1, "etc/b", "one-b\n") == 0 &&
       layer_put(l1, "d/x", "x\n") == 0 && layer_put(l1, "d/keep/k", "k\n") == 0 &&
       layer_put(l2, "etc/a", "two\n") == 0 && layer_put(l2, "etc/b", NULL) == 0 &&
       layer_put(l2, "d/y", "y\n") == 0;
  p = path_in(l2, "d");
  ok = ok && setxattr(p, "trusted.overlay.opaque", "y", 1, 0) == 0;
  free(p);
  check(ok, "layers: three layers laid out (whiteout, opaque dir)");

  s = spec_for(e, "layers", box_dir);
  s.layers = three;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "layers: a 3-layer box started (%s)", r < 0 ? err.msg : "ok");
  if (r == 0) {
    c.fd = box.chan_fd;
    if (conn_next(&c, &m) == 1)
      free(m.payload);
    o = box_out(&c, "cat /etc/a; [ -e /etc/b ] && echo b-seen; ls /d | tr '\\n' ' '; "
                    "[ -x /bin/busybox ] && echo busybox");
    check(strcmp(o, "two\ny busybox") == 0,
          "layers: upper wins, whiteout hides, opaque dir hides, bottom seen ('%s')", o);
    free(o);
    o = box_out(&c, "rm /etc/a && cat /etc/a 2>/dev/null; echo new > /d/z; ls /d | tr '\\n' ' '");
    check(strcmp(o, "y z ") == 0, "layers: deleting a merged file hides every copy ('%s')", o);
    free(o);
    p = path_in(l1, "etc/a");
    {
      size_t len;
      char *t = slurp(p, &len);
      check(t != NULL && strcmp(t, "one\n") == 0, "layers: lower layers untouched");
      free(t);
    }
    free(p);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0 && !exists(box_dir), "layers: destroyed (%s)", r < 0 ? err.msg : "ok");
  }

  /* 40 layers, each at a path of about 230 bytes: 9 KB of paths. */
  mkdir(many_root, 0755);
  many[0] = e->image;
  for (int i = 0; i < 40; i++) {
    char name[256], text[16];
    memset(name, 'a' + i % 26, 200);
    snprintf(name + 200, sizeof(name) - 200, "-%02d", i);
    many_dirs[i] = path_in(many_root, name);
    mkdir(many_dirs[i], 0755);
    snprintf(name, sizeof(name), "m/f%02d", i);
    snprintf(text, sizeof(text), "%d\n", i);
    layer_put(many_dirs[i], name, text);
    layer_put(many_dirs[i], "m/top", text);
    many[i + 1] = many_dirs[i];
    total += strlen(many_dirs[i]) + 1;
  }
  many[41] = NULL;
  s = spec_for(e, "many", box_dir);
  s.layers = many;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "layers: 41 layers with %zu bytes of paths start (%s)", total,
        r < 0 ? err.msg : "ok");
  if (r == 0) {
    c.fd = box.chan_fd;
    c.len = 0;
    if (conn_next(&c, &m) == 1)
      free(m.payload);
    o = box_out(&c, "ls /m | wc -l; cat /m/top");
    check(strcmp(o, "41\n39") == 0, "layers: 40 layers merged, the last on top ('%s')", o);
    free(o);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0 && !exists(box_dir), "layers: many-layer box destroyed");
  }
  for (int i = 0; i < 40; i++)
    free(many_dirs[i]);
  tp_rmtree(many_root, NULL);
  tp_rmtree(l1, NULL);
  tp_rmtree(l2, NULL);
  free(c.buf);
  free(many_root);
  free(l1);
  free(l2);
  free(box_dir);
}


/* ------------------------------------------------------------ /etc/resolv.conf */

#define RESOLV_TEXT "nameserver 127.0.0.1\n"

/* lays one hostile (or plain) /etc out in layer dir l; host: a dir of the
 * host the links point at */
typedef struct {
  const char *name;
  int want; /* box.resolv expected */
} resolv_case_t;

static int resolv_lay(const char *l, int i, const char *host) {
  char path[1024], target[1024];
  mkdir(l, 0755);
  if (lchown(l, UID_BASE, UID_BASE) < 0)
    return -1;
  switch (i) {
  case 0: /* the image's own file */
    return 0;
  case 1: /* a link to a host file */
    snprintf(path, sizeof(path), "%s/etc", l);
    snprintf(target, sizeof(target), "%s/host-file", host);
    return mkdir(path, 0755) == 0 && strcat(path, "/resolv.conf") != NULL &&
                   symlink(target, path) == 0
               ? 0
               : -1;
  case 2: /* a link to the box's /etc/shadow */
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", l);
    return layer_put(l, "etc/shadow", "root:secret\n") == 0 && symlink("/etc/shadow", path) == 0
               ? 0
               : -1;
  case 3: /* dangling, to a host path that does not exist */
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", l);
    snprintf(target, sizeof(target), "%s/made-by-box", host);
    return layer_put(l, "etc/x", "x\n") == 0 && symlink(target, path) == 0 ? 0 : -1;
  case 4: /* /etc a link to a host dir */
    snprintf(path, sizeof(path), "%s/etc", l);
    return symlink(host, path);
  case 5: /* /etc a file */
    return layer_put(l, "etc", "not a dir\n");
  case 6: /* a FIFO: no open may hang */
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", l);
    return layer_put(l, "etc/x", "x\n") == 0 && mkfifo(path, 0644) == 0 &&
                   lchown(path, UID_BASE, UID_BASE) == 0
               ? 0
               : -1;
  case 7: /* no file (a whiteout) */
    return layer_put(l, "etc/resolv.conf", NULL);
  case 8: /* no /etc at all */
    return layer_put(l, "etc", NULL);
  }
  return -1;
}

/* The set-up writes /etc/resolv.conf only inside the box's root and never
 * through a link: each hostile image leaves the host and the box's other
 * files as they were, and box.resolv 0 (the daemon then asks the agent). */
static void test_box_resolv(const env_t *e) {
  static const resolv_case_t cases[] = {
      {"the image's file", 1},      {"a link to a host file", 0},
      {"a link to /etc/shadow", 0}, {"a dangling link to a host path", 0},
      {"/etc a link to a host dir", 0}, {"/etc a file", 0},
      {"a FIFO", 0},                {"no file", 1},
      {"no /etc", 1}};
  char *host = path_in(tmp_root, "rhost"), *hfile = path_in(host, "host-file");
  char *made = path_in(host, "made-by-box"), *hres = path_in(host, "resolv.conf");
  char *box_dir = path_in(tmp_root, "rbox");

  mkdir(host, 0755);
  check(write_text(hfile, "host\n", 0644) == 0, "resolv: host file laid out");
  for (int i = 0; i < (int) (sizeof(cases) / sizeof(cases[0])); i++) {
    char lname[32], up[1024];
    char *l;
    const char *layers[3];
    tp_box_spec_t s;
    tp_box_t box;
    tp_error_t err = {0};
    struct stat st;
    size_t len;
    char *t;
    int r;

    snprintf(lname, sizeof(lname), "rlayer%d", i);
    l = path_in(tmp_root, lname);
    layers[0] = e->image;
    layers[1] = l;
    layers[2] = NULL;
    check(resolv_lay(l, i, host) == 0, "resolv (%s): layer laid out", cases[i].name);
    s = spec_for(e, "resolv", box_dir);
    s.layers = layers;
    s.resolv = RESOLV_TEXT;
    r = tp_linux_box_start(&s, &box, &err);
    check(r == 0, "resolv (%s): the box starts (%s)", cases[i].name, r < 0 ? err.msg : "ok");
    if (r == 0) {
      check(box.resolv == cases[i].want, "resolv (%s): written %d, want %d", cases[i].name,
            box.resolv, cases[i].want);
      /* the box's upper dir, seen from the host */
      snprintf(up, sizeof(up), "%s/upper/etc/resolv.conf", box_dir);
      if (cases[i].want) {
        t = slurp(up, &len);
        check(t != NULL && strcmp(t, RESOLV_TEXT) == 0 && lstat(up, &st) == 0 &&
                  S_ISREG(st.st_mode) && st.st_uid == UID_BASE && st.st_gid == UID_BASE &&
                  (st.st_mode & 07777) == 0644,
              "resolv (%s): the box's file, root's, 0644 ('%s')", cases[i].name,
              t != NULL ? t : "?");
        free(t);
        snprintf(up, sizeof(up), "%s/upper/etc", box_dir);
        check(lstat(up, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == UID_BASE,
              "resolv (%s): /etc a dir of the box's root", cases[i].name);
      } else {
        check(lstat(up, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0 ||
                  (i == 2 && st.st_size == 0),
              "resolv (%s): nothing written in the box", cases[i].name);
      }
      t = slurp(hfile, &len);
      check(t != NULL && strcmp(t, "host\n") == 0 && !exists(made) && !exists(hres),
            "resolv (%s): the host's files untouched", cases[i].name);
      free(t);
      if (i == 2) {
        snprintf(up, sizeof(up), "%s/upper/etc/shadow", box_dir);
        check(!exists(up), "resolv (%s): the box's /etc/shadow untouched", cases[i].name);
      }
      r = tp_box_destroy(&box, box_dir, &err);
      check(r == 0 && !exists(box_dir), "resolv (%s): destroyed (%s)", cases[i].name,
            r < 0 ? err.msg : "ok");
    }
    tp_rmtree(l, NULL);
    free(l);
  }
  tp_rmtree(host, NULL);
  free(host);
  free(hfile);
  free(made);
  free(hres);
  free(box_dir);
}

/* An image whose /dev, /proc or /sys is a link (to a host dir) or a file:
 * the start fails at that step, nothing is mounted through it. */
static void test_box_mount_points(const env_t *e) {
  static const char *const names[] = {"dev", "proc", "sys"};
  char *host = path_in(tmp_root, "mhost"), *box_dir = path_in(tmp_root, "mbox");
  mkdir(host, 0755);
  for (int i = 0; i < 6; i++) {
    char *l = path_in(tmp_root, "mlayer"), path[1024], want[64];
    const char *layers[3] = {e->image, l, NULL};
    tp_box_spec_t s = spec_for(e, "mpoints", box_dir);
    tp_box_t box;
    tp_error_t err = {0};
    int r;
    mkdir(l, 0755);
    snprintf(path, sizeof(path), "%s/%s", l, names[i % 3]);
    r = i < 3 ? symlink(host, path) : layer_put(l, names[i % 3], "a file\n");
    s.layers = layers;
    r = r == 0 ? tp_linux_box_start(&s, &box, &err) : 99;
    snprintf(want, sizeof(want), "mkdir /%s", names[i % 3]);
    check(r < 0 && strstr(err.msg, want) != NULL && !exists(box_dir),
          "mount points: /%s a %s refused (%s)", names[i % 3], i < 3 ? "link" : "file",
          r < 0 ? err.msg : "started");
    if (r == 0)
      tp_box_destroy(&box, box_dir, &err);
    tp_rmtree(l, NULL);
    free(l);
  }
  check(rmdir(host) == 0, "mount points: nothing mounted or made in the host dir");
  free(host);
  free(box_dir);
}

/* ------------------------------------------------------------ the set-up child's fds */

typedef struct {
  tp_box_spec_t spec;
  tp_box_t box;
  tp_error_t err;
  int r;
} start_job_t;

static void *start_thread(void *arg) {
  start_job_t *j = arg;
  j->r = tp_linux_box_start(&j->spec, &j->box, &j->err);
  return NULL;
}

/* Does process pid hold an fd whose link is `link`?  1, 0, or -1 when its
 * fd dir cannot be read. */
static int holds_fd(pid_t pid, const char *link) {
  char dir[64], path[330], target[256];
  struct dirent *e;
  DIR *d;
  int found = 0;
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int) pid);
  if ((d = opendir(dir)) == NULL)
    return -1;
  while (!found && (e = readdir(d)) != NULL) {
    ssize_t n;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    n = readlink(path, target, sizeof(target) - 1);
    if (n > 0) {
      target[n] = '\0';
      found = strcmp(target, link) == 0;
    }
  }
  closedir(d);
  return found;
}

/* The set-up child (cloned without exec) holds none of the daemon's fds
 * while it sets the box up: not its listening socket (close-on-exec, as
 * libuv makes it), not a client's connection, not a plain file.  The
 * child is held mid-set-up on its first step: its "cgroup.procs" is a FIFO
 * whose pipe the test has filled, so the child's write of its pid waits
 * until the test reads; meanwhile the test reads the child's fds. */
static void test_box_setup_fds(const env_t *e) {
  char *box_dir = path_in(tmp_root, "fdbox");
  char *fifo = path_in(tmp_root, "procs.fifo");
  char *sock_path = path_in(tmp_root, "daemon.sock");
  const char *procs[] = {fifo, NULL};
  char id[64], sock_link[64], conn_link[64], file_link[64], fifo_link[300], buf[65536];
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  start_job_t job;
  pthread_t th;
  pid_t child = -1;
  struct stat st;
  int lsock, conn[2], plain, rd, wr, started, held = -1;

  lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
  if (lsock < 0 || bind(lsock, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(lsock, 4) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, conn) < 0 ||
      (plain = open(sock_path, O_PATH)) < 0 || mkfifo(fifo, 0600) < 0 ||
      (rd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0 ||
      (wr = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0) {
    check(0, "setup fds: the test's sockets and FIFO (%s)", strerror(errno));
    return;
  }
  /* fill the pipe: the child's write will wait */
  while (write(wr, buf, sizeof(buf)) > 0 || errno == EINTR)
    ;
  fstat(lsock, &st);
  snprintf(sock_link, sizeof(sock_link), "socket:[%lu]", (unsigned long) st.st_ino);
  fstat(conn[0], &st);
  snprintf(conn_link, sizeof(conn_link), "socket:[%lu]", (unsigned long) st.st_ino);
  snprintf(file_link, sizeof(file_link), "%s", sock_path);
  snprintf(fifo_link, sizeof(fifo_link), "%s", fifo);

  snprintf(id, sizeof(id), "tp-fds-%d", (int) getpid());
  memset(&job, 0, sizeof(job));
  job.spec = spec_for(e, id, box_dir);
  job.spec.cgroup_procs = procs;
  started = pthread_create(&th, NULL, start_thread, &job) == 0;
  check(started, "setup fds: start in a thread");
  if (!started)
    goto out;
  /* the child, once it has opened the FIFO (and waits to write to it).  A
   * child just cloned holds the FIFO too, through its copy of this
   * process's rd and wr, and the daemon's fds with it until its first step
   * closes them: so the fds are read until they are gone, or for as long
   * as it may take; a child that never closes them waits on the full pipe
   * with them all that time. */
  for (int i = 0; i < 2000 && held != 0; i++) {
    if (child < 0)
      child = find_child(getpid(), "");
    if (child > 0 && holds_fd(child, fifo_link) == 1)
      held = holds_fd(child, sock_link) == 1 || holds_fd(child, conn_link) == 1 ||
             holds_fd(child, file_link) == 1;
    if (held != 0)
      usleep(5000);
  }
  check(held == 0, "setup fds: the set-up child (pid %d) holds no listening socket, connection "
        "or file of the daemon (%s)", (int) child,
        held < 0 ? "never caught it" : held ? "it does" : "none");
  /* let it go on: drain the pipe, the write of "0" goes through */
  while (read(rd, buf, sizeof(buf)) > 0 || errno == EINTR)
    ;
  pthread_join(th, NULL);
  check(job.r == 0, "setup fds: the box started (%s)", job.r < 0 ? job.err.msg : "ok");
  if (job.r == 0)
    check(tp_box_destroy(&job.box, box_dir, &job.err) == 0 && no_children_left(),
          "setup fds: destroyed, no child left");
out:
  close(rd);
  close(wr);
  close(plain);
  close(conn[0]);
  close(conn[1]);
  close(lsock);
  unlink(sock_path);
  unlink(fifo);
  free(sock_path);
  free(fifo);
  free(box_dir);
}

int main(void) {
  env_t env = {NULL, {NULL, NULL}, -1};
  int r = box_env_begin(&env, 1);

  if (r == 0) {
    test_box(&env);
    test_box_failures(&env);
    test_box_layers(&env);
    test_box_resolv(&env);
    test_box_mount_points(&env);
    test_box_setup_fds(&env);
  }
  return r > 0 ? r : linux_test_end(&env, 1);
}
