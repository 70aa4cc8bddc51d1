/* tupper-agent: cgroups of a microVM guest (backend "microvm",
 * docs/microvm.md).  In a linux-backend box the host puts each process in
 * a cgroup of its own (TP_F_EXEC_HOLD, then RELEASE) and the box's cgroup
 * holds its limits.  A guest has its own kernel, so the agent, its PID 1,
 * does both itself:
 *
 *   <cgroup2 root>      the agent and the guest kernel's threads
 *     box/              pids.max (VM_LIMITS); every process of the API
 *       t<N>/           one per process started by EXEC, with its whole tree
 *
 * The hierarchy is mounted at /cgroup of the initramfs, before the agent
 * moves the image's root over it: the box's processes cannot reach it (no
 * path leads there, and they have no capability to mount or chroot); the
 * agent keeps directory fds.  It is set up at boot, so a snapshot's clones
 * have it too.  A child joins its tree (writes its pid to t<N>/cgroup.procs)
 * first thing after fork, before it can fork itself.  The agent stays in the
 * root cgroup: a box at its pids limit cannot stop it from starting
 * processes or answering, and with the cpu controller on, the box as a whole
 * competes with the agent for CPU as one group.
 *
 * A tree's cgroup goes when its process is reaped, or, when background
 * processes keep it populated, at a later reap once it is empty (its last
 * process is then an orphan, reparented to the agent: its end is a SIGCHLD
 * here). */
#define _GNU_SOURCE
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "utils.h"

#define CG_MOUNT "/cgroup"
#define CG_BOX "box"
#define CG_KILL_WAIT_MS 5000      /* for a killed tree to be empty */
#define CG_PROCS_MAX (1u << 20)   /* bytes of a cgroup.procs list (pid_max is 32768 here) */
#define CG_PIN_BATCH 256
#define CG_PIDS_MAX 4194304       /* the schema's most */

static int cg_root = -1; /* the hierarchy's root, and box/: directory fds, CLOEXEC */
static int cg_box = -1;
static uint32_t cg_next;   /* the last tree number given out */
static int cg_linger;      /* trees whose process was reaped while others lived on */

int agent_cg_active(void) { return cg_box >= 0; }

/* Writes s to file `name` under directory fd dir. */
static int cg_write(int dir, const char *name, const char *s, tp_error_t *err) {
  cleanup_close int fd = openat(dir, name, O_WRONLY | O_CLOEXEC);
  size_t len = strlen(s);
  ssize_t n;
  if (fd < 0)
    return tp_error_errno(err, errno, "cgroup: open %s", name);
  do
    n = write(fd, s, len);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t) len)
    return tp_error_errno(err, n < 0 ? errno : EIO, "cgroup: write '%s' to %s", s, name);
  return 0;
}

int agent_cg_setup(tp_error_t *err) {
  if (mkdir(CG_MOUNT, 0700) < 0 && errno != EEXIST)
    return tp_error_errno(err, errno, "mkdir %s", CG_MOUNT);
  if (mount("cgroup2", CG_MOUNT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    return tp_error_errno(err, errno, "mount cgroup2 on %s", CG_MOUNT);
  cg_root = open(CG_MOUNT, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg_root < 0)
    return tp_error_errno(err, errno, "open %s", CG_MOUNT);
  if (cg_write(cg_root, "cgroup.subtree_control", "+pids", err) < 0)
    return -1;
  /* CPU: the box competes with the agent as one group.  Not a limit of the
   * API (the vCPUs are): the guest boots without it if it must. */
  if (cg_write(cg_root, "cgroup.subtree_control", "+cpu", NULL) < 0)
    agent_log("cgroup: no cpu controller in the guest");
  if (mkdirat(cg_root, CG_BOX, 0700) < 0 && errno != EEXIST)
    return tp_error_errno(err, errno, "mkdir cgroup %s", CG_BOX);
  cg_box = openat(cg_root, CG_BOX, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg_box < 0)
    return tp_error_errno(err, errno, "open cgroup %s", CG_BOX);
  return 0;
}

int agent_cg_tree_new(uint32_t *tree, int *procs_fd, tp_error_t *err) {
  char name[32], path[48];
  uint32_t n = ++cg_next;
  if (n == 0)
    n = ++cg_next;
  snprintf(name, sizeof(name), "t%" PRIu32, n);
  if (mkdirat(cg_box, name, 0700) < 0)
    return tp_error_errno(err, errno, "exec: make the process's cgroup");
  snprintf(path, sizeof(path), "%s/cgroup.procs", name);
  *procs_fd = openat(cg_box, path, O_WRONLY | O_CLOEXEC);
  if (*procs_fd < 0) {
    int e = errno;
    unlinkat(cg_box, name, AT_REMOVEDIR);
    return tp_error_errno(err, e, "exec: open the process's cgroup");
  }
  *tree = n;
  return 0;
}

void agent_cg_tree_done(uint32_t tree) {
  char name[32];
  if (tree == 0 || cg_box < 0)
    return;
  snprintf(name, sizeof(name), "t%" PRIu32, tree);
  if (unlinkat(cg_box, name, AT_REMOVEDIR) < 0 && errno == EBUSY)
    cg_linger++;
}

void agent_cg_sweep(agent_t *a) {
  DIR *d;
  struct dirent *e;
  int fd, left = 0;
  if (cg_linger == 0 || cg_box < 0)
    return;
  fd = openat(cg_box, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (d = fdopendir(fd)) == NULL) {
    if (fd >= 0)
      close(fd);
    return;
  }
  /* Every empty tree goes but those of processes not reaped yet (their
   * tree_done removes them). */
  while ((e = readdir(d)) != NULL) {
    unsigned long n;
    int live = 0;
    if (e->d_name[0] != 't' || e->d_type != DT_DIR)
      continue;
    n = strtoul(e->d_name + 1, NULL, 10);
    for (int i = 0; i < AGENT_PROC_MAX && !live; i++)
      live = a->procs[i].pid > 0 && a->procs[i].tree == n;
    if (live)
      continue;
    if (unlinkat(cg_box, e->d_name, AT_REMOVEDIR) < 0 && errno == EBUSY)
      left++;
  }
  closedir(d);
  cg_linger = left;
}

/* The pids listed in dir's cgroup.procs, in the kernel's order: *pids
 * (malloc'd), *n. */
static int cg_pids(int dir, pid_t **pids, size_t *n, tp_error_t *err) {
  cleanup_close int fd = openat(dir, "cgroup.procs", O_RDONLY | O_CLOEXEC);
  size_t cap = 4096, len = 0, k = 0;
  char *buf;
  pid_t *out;
  if (fd < 0)
    return tp_error_errno(err, errno, "cgroup: open cgroup.procs");
  buf = malloc(cap + 1);
  if (buf == NULL)
    return tp_error_set(err, ENOMEM, "cgroup: out of memory");
  for (;;) {
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return tp_error_errno(err, e, "cgroup: read cgroup.procs");
    }
    if (r == 0)
      break;
    len += (size_t) r;
    if (len == cap) {
      char *nb;
      if (cap >= CG_PROCS_MAX) {
        free(buf);
        return tp_error_set(err, E2BIG, "cgroup: more than %u bytes of pids", CG_PROCS_MAX);
      }
      nb = realloc(buf, cap * 2 + 1);
      if (nb == NULL) {
        free(buf);
        return tp_error_set(err, ENOMEM, "cgroup: out of memory");
      }
      buf = nb;
      cap *= 2;
    }
  }
  buf[len] = '\0';
  out = malloc((len / 2 + 1) * sizeof(*out));
  if (out == NULL) {
    free(buf);
    return tp_error_set(err, ENOMEM, "cgroup: out of memory");
  }
  for (char *p = buf; *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p)
      break;
    if (v > 0)
      out[k++] = (pid_t) v;
    p = end;
    while (*p == '\n')
      p++;
  }
  free(buf);
  *pids = out;
  *n = k;
  return 0;
}

static int listed(const pid_t *pids, size_t n, pid_t pid) {
  for (size_t i = 0; i < n; i++)
    if (pids[i] == pid)
      return 1;
  return 0;
}

/* sig to every process listed in the tree.  A listed process may exit and
 * be reaped (by its parent, in the tree) and its pid reused before the
 * signal: each is pinned with a pidfd first, and signalled only if it is
 * still listed after that (as the host's cgroup code does). */
static int signal_listed(int dir, int sig, tp_error_t *err) {
  cleanup_free pid_t *pids = NULL;
  size_t n;
  if (cg_pids(dir, &pids, &n, err) < 0)
    return -1;
  for (size_t i = 0; i < n; i += CG_PIN_BATCH) {
    size_t m = n - i < CG_PIN_BATCH ? n - i : CG_PIN_BATCH, again_n = 0;
    cleanup_free pid_t *again = NULL;
    int fd[CG_PIN_BATCH];
    for (size_t j = 0; j < m; j++)
      fd[j] = (int) syscall(SYS_pidfd_open, pids[i + j], 0);
    if (cg_pids(dir, &again, &again_n, NULL) < 0)
      again_n = 0;
    for (size_t j = 0; j < m; j++) {
      if (fd[j] < 0)
        continue;
      if (listed(again, again_n, pids[i + j]))
        syscall(SYS_pidfd_send_signal, fd[j], sig, NULL, 0);
      close(fd[j]);
    }
  }
  return 0;
}

/* Waits until dir's cgroup.events says populated 0 (the kernel raises
 * POLLPRI on each change). */
static int wait_empty(int dir, tp_error_t *err) {
  cleanup_close int fd = openat(dir, "cgroup.events", O_RDONLY | O_CLOEXEC);
  long long deadline = agent_now_ms() + CG_KILL_WAIT_MS;
  if (fd < 0)
    return tp_error_errno(err, errno, "cgroup: open cgroup.events");
  for (;;) {
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    long long left = deadline - agent_now_ms();
    struct pollfd p = {.fd = fd, .events = POLLPRI};
    if (n < 0)
      return tp_error_errno(err, errno, "cgroup: read cgroup.events");
    buf[n] = '\0';
    if (strstr(buf, "populated 0") != NULL)
      return 0;
    if (left <= 0)
      return tp_error_set(err, ETIMEDOUT, "processes still alive after %d ms", CG_KILL_WAIT_MS);
    if (poll(&p, 1, (int) left) < 0 && errno != EINTR)
      return tp_error_errno(err, errno, "cgroup: poll cgroup.events");
  }
}

int agent_cg_tree_signal(uint32_t tree, int sig, tp_error_t *err) {
  char name[32];
  cleanup_close int dir = -1;
  snprintf(name, sizeof(name), "t%" PRIu32, tree);
  dir = openat(cg_box, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) /* swept: everything of the tree has ended */
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "signal: the process's cgroup");
  if (sig == SIGKILL) {
    if (cg_write(dir, "cgroup.kill", "1", err) < 0)
      return -1;
    return wait_empty(dir, err);
  }
  return signal_listed(dir, sig, err);
}

void agent_cg_kill_all(void) {
  if (cg_box >= 0 && cg_write(cg_box, "cgroup.kill", "1", NULL) == 0)
    wait_empty(cg_box, NULL);
}

/* VM_LIMITS: PIDS? (absent: no limit).  Sent by the host after VM_INIT. */
int agent_vm_limits(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char v[32] = "max";
  int64_t pids;
  (void) a;
  if (!agent_vm_guest)
    return tp_error_set(err, EOPNOTSUPP, "VM_LIMITS: not a microVM guest");
  if (cg_box < 0)
    return tp_error_set(err, EOPNOTSUPP, "VM_LIMITS: the guest has no cgroups");
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PIDS), 0, "VM_LIMITS", err) < 0)
    return -1;
  if (agent_req_get(r, TP_TAG_PIDS) != NULL) {
    if (tp_field_int(agent_req_get(r, TP_TAG_PIDS), &pids) < 0 || pids < 1 || pids > CG_PIDS_MAX)
      return tp_error_set(err, EINVAL, "VM_LIMITS: PIDS out of range 1..%d", CG_PIDS_MAX);
    snprintf(v, sizeof(v), "%lld", (long long) pids);
  }
  return cg_write(cg_box, "pids.max", v, err);
}

/* ---- cgroups the host made ahead (linux backend, TP_F_EXEC_TREE) ---------- */

static void fdset_close(agent_fdset_t *s) {
  for (int i = 0; i < s->n; i++)
    close(s->fd[i]);
  s->n = 0;
}

void agent_fdsets_add(agent_t *a, uint64_t pos, const int *fds, int n) {
  agent_fdset_t s = {.pos = pos};
  if (n > AGENT_FDSET_FDS) { /* not the host's: none is taken */
    for (int i = 0; i < n; i++)
      close(fds[i]);
    agent_log("channel: %d fds with one frame, closed", n);
    return;
  }
  s.n = n;
  memcpy(s.fd, fds, (size_t) n * sizeof(int));
  if (a->nfdsets == AGENT_FDSETS_MAX) {
    fdset_close(&a->fdsets[0]);
    memmove(&a->fdsets[0], &a->fdsets[1], (AGENT_FDSETS_MAX - 1) * sizeof(a->fdsets[0]));
    a->nfdsets--;
  }
  a->fdsets[a->nfdsets++] = s;
}

int agent_fdsets_take(agent_t *a, uint64_t pos, agent_fdset_t *out) {
  int i = 0, found = -1;
  /* positions only grow: a set older than this frame's was never taken */
  while (i < a->nfdsets && a->fdsets[i].pos <= pos) {
    if (a->fdsets[i].pos == pos) {
      *out = a->fdsets[i];
      found = 0;
    } else {
      fdset_close(&a->fdsets[i]);
    }
    i++;
  }
  memmove(&a->fdsets[0], &a->fdsets[i], (size_t) (a->nfdsets - i) * sizeof(a->fdsets[0]));
  a->nfdsets -= i;
  return found;
}

void agent_fdsets_clear(agent_t *a) {
  for (int i = 0; i < a->nfdsets; i++)
    fdset_close(&a->fdsets[i]);
  a->nfdsets = 0;
}
