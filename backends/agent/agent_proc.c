/* tupper-agent: processes.  EXEC starts a child in its own session and
 * process group with stdout/stderr pipes (and a stdin pipe on request); the
 * child drops every privilege (agent_cred.c) and reports a failed set-up or
 * execve over a close-on-exec status pipe, so the host gets ERR instead of
 * OK.  With TP_F_EXEC_HOLD the child stops right before execve, all its
 * set-up done, until RELEASE: the host meanwhile moves it into a cgroup of
 * its own, so nothing it will ever run starts outside.  With TP_F_EXEC_TREE
 * the host made that cgroup ahead and sent its cgroup.procs (v1: tasks) fds with the
 * EXEC frame (opened by the host: the kernel judges a write by the opener's
 * credentials, so the box needs no right to any cgroup file): the child
 * writes itself there first thing after fork, and EXEC alone starts it in
 * its tree, one round trip instead of two.  In a microVM guest
 * the child joins such a cgroup of the guest itself, first thing after its
 * fork (agent_cgroup.c), and SIGNAL goes to that whole tree.  The loop streams
 * OUTPUT as the pipes fill, writes queued STDIN as the child reads, and
 * sends EXIT when the child is reaped, without waiting for grandchildren
 * that keep a pipe open. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent_acct.h"
#include "utils.h"

#define EXEC_ID_MAX TP_ID_MAX
#define STATUS_TICK_MS 50          /* how often a wait for a child checks it is not stopped */
#define STAGE_STOPPED 0            /* parent side only: we killed a stopped child */
/* PS: each ENTRY is one top-level field (one more for FLAGS); an ENTRY is at
 * least a group header and a PID. */
#define PS_MAX (TP_LIST_MAX < TP_FIELDS_MAX - 1 ? TP_LIST_MAX : TP_FIELDS_MAX - 1)
#define PS_PAYLOAD_MAX (TP_FRAME_MAX - 64u * 1024u)
#define PS_ENTRY_MIN (6u + 6u + 8u)

/* What a child writes on its status pipe: a failure, or (held) that it is
 * ready and waiting. */
typedef struct exec_status_s {
  int stage;                 /* enum agent_stage */
  int err;
} exec_status_t;

/* Everything the child needs, prepared before fork: between fork and execve
 * the child only makes async-signal-safe calls. */
typedef struct exec_spec_s {
  const char *path;   /* resolved program */
  char **argv;
  char **envp;
  const char *cwd;
  int in_fd;          /* child's stdin */
  int out_fd;         /* child's stdout */
  int err_fd;         /* child's stderr */
  int status_fd;      /* write end of the status pipe (CLOEXEC) */
  int hold_fd;        /* read end of the hold pipe (CLOEXEC), or -1 */
  int cg_fd;          /* microVM guest: its tree's cgroup.procs (CLOEXEC), or -1 */
  const agent_fdset_t *tree; /* TP_F_EXEC_TREE: the host's cgroup.procs fds, or NULL */
  int pty;            /* in/out/err are a terminal's slave: make it the controlling one */
  uid_t uid;
  gid_t gid;
  int ngroups;
  const gid_t *groups;
  const struct rlimit *nofile;
  mode_t umask;
  int bset_empty;     /* the agent's bounding set is empty: the child's is too */
  uint64_t sig_reset; /* the signals not at SIG_DFL in the agent, bit sig - 1 */
  int oom_zero;       /* its oom_score_adj is 0 already: no reset (vm_start) */
} exec_spec_t;

/* ---- process table --------------------------------------------------------- */

static agent_proc_t *proc_find(agent_t *a, int64_t pid) {
  if (pid <= 0)
    return NULL;
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid == pid)
      return &a->procs[i];
  return NULL;
}

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

static void stdin_drop(agent_proc_t *p) {
  p->in_acked += p->queued; /* credit: dropped counts as taken (the next STDIN is EPIPE) */
  while (p->q_head != NULL) {
    agent_chunk_t *c = p->q_head;
    p->q_head = c->next;
    free(c);
  }
  p->q_tail = NULL;
  p->queued = 0;
  close_fd(&p->in_fd);
}

static void strv_free(char **v) {
  if (v == NULL)
    return;
  for (char **s = v; *s != NULL; s++)
    free(*s);
  free(v);
}

static void proc_free(agent_t *a, agent_proc_t *p) {
  stdin_drop(p);
  close_fd(&p->out_fd);
  close_fd(&p->err_fd);
  close_fd(&p->hold_fd);
  close_fd(&p->status_fd);
  strv_free(p->argv);
  *p = (agent_proc_t){.out_fd = -1, .err_fd = -1, .in_fd = -1, .hold_fd = -1, .status_fd = -1};
  a->nprocs--;
}

static agent_proc_t *proc_lookup(agent_t *a, const agent_req_t *r, const char *what, tp_error_t *err) {
  int64_t pid;
  agent_proc_t *p;
  if (agent_req_get(r, TP_TAG_PID) == NULL) {
    tp_error_set(err, EINVAL, "%s: no PID", what);
    return NULL;
  }
  pid = agent_req_int(r, TP_TAG_PID, 0);
  p = proc_find(a, pid);
  if (p == NULL)
    tp_error_set(err, ESRCH, "%s: no process %lld", what, (long long) pid);
  return p;
}

/* ---- exec ------------------------------------------------------------------ */

static void strv_freep(char ***v) { strv_free(*v); }
#define cleanup_strv __attribute__((cleanup(strv_freep)))

/* The string fields `tag` of r as a NULL-terminated vector. */
static char **strv_from(const agent_req_t *r, uint16_t tag, int extra, tp_error_t *err) {
  int n = tp_fields_count(r->fields, r->n, tag), k = 0;
  char **v = calloc((size_t) n + (size_t) extra + 1, sizeof(*v));
  if (v == NULL)
    goto oom;
  for (int i = 0; i < r->n; i++) {
    if (r->fields[i].tag != tag)
      continue;
    v[k] = tp_field_strdup(&r->fields[i]);
    if (v[k++] == NULL)
      goto oom;
  }
  return v;
oom:
  strv_free(v);
  tp_error_set(err, ENOMEM, "exec: out of memory");
  return NULL;
}

/* argv[0] as given when it holds a '/', else the first executable regular
 * file of that name in PATH (from envp, or the default).  Empty PATH entries
 * are skipped rather than meaning the current directory. */
static char *resolve_program(const char *prog, char *const *envp, tp_error_t *err) {
  const char *path = AGENT_DEFAULT_PATH;
  int eacces = 0;

  if (strchr(prog, '/') != NULL) {
    char *s = strdup(prog);
    if (s == NULL)
      tp_error_set(err, ENOMEM, "exec: out of memory");
    return s;
  }
  for (char *const *e = envp; *e != NULL; e++)
    if (strncmp(*e, "PATH=", 5) == 0) {
      path = *e + 5;
      break;
    }
  for (const char *d = path; *d != '\0';) {
    size_t dlen = strcspn(d, ":");
    char cand[TP_PATH_MAX + 1];
    struct stat st;
    if (dlen > 0 && dlen + 1 + strlen(prog) <= TP_PATH_MAX) {
      memcpy(cand, d, dlen);
      cand[dlen] = '/';
      strcpy(cand + dlen + 1, prog);
      if (stat(cand, &st) < 0) {
        eacces |= errno == EACCES;
      } else if (S_ISREG(st.st_mode)) {
        if (access(cand, X_OK) == 0) {
          char *s = strdup(cand);
          if (s == NULL)
            tp_error_set(err, ENOMEM, "exec: out of memory");
          return s;
        }
        eacces = 1;
      }
    }
    d += dlen;
    if (*d == ':')
      d++;
  }
  tp_error_errno(err, eacces ? EACCES : ENOENT, "exec '%s'", prog);
  return NULL;
}

/* Closes every fd from 3 up except keep1 and keep2 (either may be -1). */
static int close_fds_except(int keep1, int keep2) {
  int keep[2] = {keep1 < keep2 ? keep1 : keep2, keep1 < keep2 ? keep2 : keep1};
  unsigned lo = 3;
  for (int i = 0; i < 2; i++) {
    if (keep[i] < (int) lo)
      continue;
    if ((unsigned) keep[i] > lo && syscall(SYS_close_range, lo, (unsigned) keep[i] - 1, 0) < 0)
      return -1;
    lo = (unsigned) keep[i] + 1;
  }
  return (int) syscall(SYS_close_range, lo, ~0u, 0); /* musl has no wrapper */
}

static void status_write(int fd, const exec_status_t *st) {
  while (write(fd, st, sizeof(*st)) < 0 && errno == EINTR)
    ;
}

/* The order matters: credentials before chdir and the access check, so both
 * are judged as the user the program will run as; signals reset before the
 * hold, so a held child dies of a signal like any other process. */
__attribute__((noreturn)) static void child_exec(const exec_spec_t *s) {
  exec_status_t st = {.stage = AGENT_STAGE_SETUP};
  sigset_t none;

  /* Into its tree's cgroup first, before anything it runs can fork. */
  if (s->cg_fd >= 0 && write(s->cg_fd, "0", 1) != 1)
    goto fail;
  for (int i = 0; s->tree != NULL && i < s->tree->n; i++) {
    st.stage = AGENT_STAGE_TREE;
    if (write(s->tree->fd[i], "0", 1) != 1)
      goto fail;
  }
  st.stage = AGENT_STAGE_SETUP;
  if (setsid() < 0)
    goto fail;
  /* A new session has no terminal: the slave becomes its controlling one. */
  if (s->pty && ioctl(s->in_fd, TIOCSCTTY, 0) < 0)
    goto fail;
  if (dup2(s->in_fd, 0) < 0 || dup2(s->out_fd, 1) < 0 || dup2(s->err_fd, 2) < 0)
    goto fail;
  /* Only 0-2 reach the program.  Closed now, not at exec: a held child must
   * not keep the channel, the listener or other processes' pipes open. */
  if (close_fds_except(s->status_fd, s->hold_fd) < 0)
    goto fail;
  if (agent_cred_drop(s->uid, s->gid, s->ngroups, s->groups, s->bset_empty, s->oom_zero, &st.stage) < 0)
    goto fail;
  st.stage = AGENT_STAGE_CHDIR;
  if (chdir(s->cwd) < 0)
    goto fail;
  /* With no capability left, access() judges as execve will: a program this
   * user cannot run fails here, in EXEC's reply, even when held. */
  st.stage = AGENT_STAGE_EXEC;
  if (access(s->path, X_OK) < 0)
    goto fail;
  /* exec resets a handler, not SIG_IGN; both go now (one system call for
   * each signal not at SIG_DFL in the agent, not one for every signal), so
   * that nothing of the agent's runs once the mask is lifted */
  for (int sig = 1; sig < NSIG; sig++)
    if (sig <= 64 && (s->sig_reset >> (sig - 1) & 1))
      agent_sig_default(sig); /* glibc's own 32 and 33 too (agent_cred.c) */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  umask(s->umask);
  setrlimit(RLIMIT_NOFILE, s->nofile);
  if (s->hold_fd >= 0) {
    exec_status_t held = {.stage = AGENT_STAGE_HELD, .err = 0};
    char c;
    ssize_t n;
    status_write(s->status_fd, &held);
    do
      n = read(s->hold_fd, &c, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1) /* the agent is gone without releasing us: never exec */
      _exit(127);
  }
  execve(s->path, s->argv, s->envp);
fail:
  st.err = errno;
  status_write(s->status_fd, &st);
  _exit(127);
}

/* ---- a child in the agent's memory ------------------------------------------
 * A child started with clone(CLONE_VM) on a stack of its own, as
 * posix_spawn does, spares the copy of the agent's page tables at the fork
 * and their teardown at the execve.  Without CLONE_VFORK: the agent goes on
 * and waits on the status pipe as for a fork, so a child stopped before its
 * execve is still found and killed (status_wait), where a vfork parent
 * would wait in the kernel for good.  The child only reads what the agent
 * prepared (the spec on the agent's stack, the strings on its heap) and
 * writes its own stack; the agent touches neither until the status pipe's
 * EOF (the child's fd table is its own and goes at the exec, after its
 * memory, or at its exit) or, on a failure, until it reaped the child.  No
 * handler can run in the child: the agent installs none (SIG_IGN and SIG_DFL
 * only; SIGCHLD is blocked and read from a signalfd).  errno is the one
 * word both write (a thread-local of the one thread): each reads it right
 * after its own failed call only.
 *
 * What is shared per memory and not per process is taken only when it
 * changes nothing:
 * - oom_score_adj: a CLONE_VM child marks the memory multi-process, and a
 *   write to its value then sets every process of that memory (the agent
 *   too).  The child inherits the agent's, so this way is taken only while
 *   the agent's is 0, and the child skips its reset;
 * - dumpable: a change of ids sets the memory's to fs.suid_dumpable until
 *   the child's PR_SET_DUMPABLE 0; only 1 (SUID_DUMP_USER) would let a
 *   process running as the box's uid 0 attach to the agent in between, so
 *   this way is taken only when the ids stay the agent's or that setting
 *   is 0 or 2.
 * HOLD keeps fork (a held child waits while the agent runs on); so does a
 * microVM guest, whose agent is the guest's init. */
#define VM_STACK_SIZE (64u * 1024u)
#define VM_GUARD 4096u

static int proc_read_int(int *fd, const char *path, long *v) {
  char buf[32], *end;
  ssize_t n;
  if (*fd == -2)
    return -1;
  if (*fd < 0 && (*fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
    *fd = -2; /* not there (no /proc yet, a mask): fork from now on */
    return -1;
  }
  n = pread(*fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  *v = strtol(buf, &end, 10);
  return end == buf ? -1 : 0;
}

/* The stack the child runs on, mapped once (its lowest page a guard), or
 * NULL. */
static char *vm_stack(void) {
  static char *stack;
  void *m;
  if (stack != NULL)
    return stack;
  m = mmap(NULL, VM_STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  if (mprotect(m, VM_GUARD, PROT_NONE) < 0) {
    munmap(m, VM_STACK_SIZE);
    return NULL;
  }
  stack = m;
  return stack;
}

/* 1 when this child may start in the agent's memory (above). */
static int vm_start_ok(int hold, uid_t uid, gid_t gid) {
  static int oom_fd = -1, dump_fd = -1;
  long oom, dump;
  if (hold || agent_vm_guest)
    return 0;
  if (proc_read_int(&oom_fd, "/proc/self/oom_score_adj", &oom) < 0 || oom != 0)
    return 0;
  if (uid != geteuid() || gid != getegid()) {
    if (proc_read_int(&dump_fd, "/proc/sys/fs/suid_dumpable", &dump) < 0 || dump == 1)
      return 0;
  }
  return vm_stack() != NULL;
}

static int vm_child(void *arg) { child_exec(arg); }

/* The child as clone(CLONE_VM) (vm) or fork: its pid in the agent, 0 in
 * the child (fork only), -1 with errno. */
static pid_t child_start(exec_spec_t *spec, int vm) {
  if (!vm)
    return fork();
  return clone(vm_child, vm_stack() + VM_STACK_SIZE, CLONE_VM | SIGCHLD, spec);
}

static int pipe_cloexec(int *rd, int *wr, tp_error_t *err) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "exec: pipe");
  *rd = p[0];
  *wr = p[1];
  return 0;
}

static void set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* The child's stdin when the host sends none: /dev/null, opened once and
 * kept (close-on-exec: the child gets it by its dup2 to 0), so a start
 * walks no path for it; *own is -1 then.  Else, while the box has no
 * /dev/null, a pipe whose write end is already closed, the caller's to
 * close (*own). */
static int null_stdin(int *own, tp_error_t *err) {
  static int null_fd = -1;
  int wr = -1;
  *own = -1;
  if (null_fd < 0)
    null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd >= 0)
    return null_fd;
  if (pipe_cloexec(own, &wr, err) < 0)
    return -1;
  close(wr);
  return *own;
}

/* Reads the child's next status record into *st: 1 when one arrived, 0 on
 * EOF (it exec'd, or died).  A child stopped meanwhile (anything in the box
 * running as the same user can send it SIGSTOP) would block the agent for
 * good: it is killed instead, and this returns 1 with STAGE_STOPPED. */
static int status_wait(pid_t pid, int status_fd, exec_status_t *st) {
  for (;;) {
    struct pollfd pfd = {.fd = status_fd, .events = POLLIN};
    siginfo_t si;
    ssize_t n;
    int r = poll(&pfd, 1, STATUS_TICK_MS);
    if (r < 0 && errno != EINTR) {
      *st = (exec_status_t){.stage = AGENT_STAGE_SETUP, .err = errno};
      kill(pid, SIGKILL);
      return 1;
    }
    if (r > 0) {
      do
        n = read(status_fd, st, sizeof(*st));
      while (n < 0 && errno == EINTR);
      if (n == 0)
        return 0;
      if (n != (ssize_t) sizeof(*st)) {
        *st = (exec_status_t){.stage = AGENT_STAGE_SETUP, .err = n < 0 ? errno : EIO};
        kill(pid, SIGKILL);
      }
      return 1;
    }
    si.si_pid = 0;
    if (waitid(P_PID, (id_t) pid, &si, WSTOPPED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid &&
        (si.si_code == CLD_STOPPED || si.si_code == CLD_TRAPPED)) {
      kill(pid, SIGKILL);
      *st = (exec_status_t){.stage = STAGE_STOPPED, .err = ECANCELED};
      return 1;
    }
  }
}

static const char *stage_name(int stage) {
  switch (stage) {
  case STAGE_STOPPED: return "stopped before exec, killed";
  case AGENT_STAGE_OOM: return "reset oom_score_adj";
  case AGENT_STAGE_SECUREBITS: return "set securebits";
  case AGENT_STAGE_IDS: return "switch uid/gid";
  case AGENT_STAGE_CAPS: return "drop capabilities";
  case AGENT_STAGE_NNP: return "set no_new_privs";
  case AGENT_STAGE_HELD: return "held without HOLD";
  case AGENT_STAGE_TREE: return "join its cgroup";
  default: return "child set-up";
  }
}

/* err from a child's failure record. */
static int status_error(const exec_status_t *st, const char *what, const char *prog, const char *cwd,
                        tp_error_t *err) {
  if (st->stage == AGENT_STAGE_EXEC)
    return tp_error_errno(err, st->err, "%s '%s'", what, prog);
  if (st->stage == AGENT_STAGE_CHDIR)
    return tp_error_errno(err, st->err, "%s '%s': chdir '%s'", what, prog, cwd);
  return tp_error_errno(err, st->err ? st->err : EIO, "%s '%s': %s", what, prog,
                        stage_name(st->stage));
}

/* An integer field in 0..EXEC_ID_MAX, or 0 when absent. */
static int exec_id(const agent_req_t *r, uint16_t tag, const char *name, unsigned *out,
                   tp_error_t *err) {
  int64_t v = agent_req_int(r, tag, 0);
  if (v < 0 || v > EXEC_ID_MAX)
    return tp_error_set(err, EINVAL, "exec: %s %lld out of range 0..%d", name, (long long) v,
                        EXEC_ID_MAX);
  *out = (unsigned) v;
  return 0;
}

/* COLS and ROWS of r, both required, each in 1..TP_PTY_DIM_MAX. */
static int pty_size(const agent_req_t *r, const char *what, struct winsize *ws, tp_error_t *err) {
  int64_t cols = agent_req_int(r, TP_TAG_COLS, 0), rows = agent_req_int(r, TP_TAG_ROWS, 0);
  if (agent_req_get(r, TP_TAG_COLS) == NULL || agent_req_get(r, TP_TAG_ROWS) == NULL)
    return tp_error_set(err, EINVAL, "%s: a terminal needs COLS and ROWS", what);
  if (cols < 1 || cols > TP_PTY_DIM_MAX || rows < 1 || rows > TP_PTY_DIM_MAX)
    return tp_error_set(err, EINVAL, "%s: terminal size %lldx%lld out of range 1..%d", what,
                        (long long) cols, (long long) rows, TP_PTY_DIM_MAX);
  *ws = (struct winsize){.ws_col = (unsigned short) cols, .ws_row = (unsigned short) rows};
  return 0;
}

/* A new terminal of the box's devpts: *master and *slave (both CLOEXEC).
 * The slave belongs to uid (group tty, 0620) as login would leave it, so
 * that the program can use it after it dropped to that uid. */
static int pty_open(int *master, int *slave, uid_t uid, const struct winsize *ws, tp_error_t *err) {
  char name[64];
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC), sl;
  if (m < 0)
    return tp_error_errno(err, errno, "exec: open a terminal (posix_openpt)");
  if (unlockpt(m) < 0 || ptsname_r(m, name, sizeof(name)) != 0) {
    int e = errno;
    close(m);
    return tp_error_errno(err, e, "exec: unlock the terminal");
  }
  sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (sl < 0) {
    int e = errno;
    close(m);
    return tp_error_errno(err, e, "exec: open %s", name);
  }
  /* gid 5 (tty) when the box maps it; failing that the slave stays root's,
   * still usable through the fds the program inherits */
  if (fchown(sl, uid, 5) < 0)
    (void) fchown(sl, uid, (gid_t) -1);
  (void) fchmod(sl, 0620);
  if (ioctl(m, TIOCSWINSZ, ws) < 0) {
    int e = errno;
    close(m);
    close(sl);
    return tp_error_errno(err, e, "exec: set the terminal size");
  }
  *master = m;
  *slave = sl;
  return 0;
}

static void fdset_closep(agent_fdset_t *s) {
  for (int i = 0; i < s->n; i++)
    close(s->fd[i]);
  s->n = 0;
}

/* The set that came with this EXEC frame: each a cgroup.procs open for
 * writing (a cgroup file, write-only), at least one. */
static int tree_fds(const agent_fdset_t *set, tp_error_t *err) {
  if (set->n == 0)
    return tp_error_set(err, EBADF, "exec: FLAGS TREE, but no cgroup came with the request");
  for (int i = 0; i < set->n; i++) {
    struct statfs sf;
    int fl = fcntl(set->fd[i], F_GETFL);
    if (fstatfs(set->fd[i], &sf) < 0 || fl < 0 ||
        (sf.f_type != CGROUP_SUPER_MAGIC && sf.f_type != CGROUP2_SUPER_MAGIC) ||
        (fl & O_ACCMODE) != O_WRONLY)
      return tp_error_set(err, EBADF, "exec: FLAGS TREE: fd %d is not a cgroup file open for writing", i);
  }
  return 0;
}

/* HOME, USER and LOGNAME of acct appended to envp (room for 3 made by
 * strv_from) where ENV did not set them: the defaults the daemon gives an
 * account it resolved itself (Sandbox:exec). */
static int env_defaults(char **envp, const agent_acct_t *acct, tp_error_t *err) {
  static const char *const keys[] = {"HOME=", "USER=", "LOGNAME="};
  int n = 0;
  while (envp[n] != NULL)
    n++;
  for (int k = 0; k < 3; k++) {
    size_t kl = strlen(keys[k]);
    const char *v = k == 0 ? acct->home : acct->name;
    int set = 0;
    for (int i = 0; envp[i] != NULL && !set; i++)
      set = strncmp(envp[i], keys[k], kl) == 0;
    if (set)
      continue;
    if ((envp[n] = malloc(kl + strlen(v) + 1)) == NULL)
      return tp_error_set(err, ENOMEM, "exec: out of memory");
    memcpy(envp[n], keys[k], kl);
    strcpy(envp[n] + kl, v);
    envp[++n] = NULL;
  }
  return 0;
}

/* USER: the account named so in the box's own files (agent_acct.c), read
 * inside the box's root as it is now. */
static int exec_account(const agent_req_t *r, agent_acct_t *acct, tp_error_t *err) {
  const tp_field_t *f = agent_req_get(r, TP_TAG_USER);
  int rootfd, rc;
  if (agent_req_get(r, TP_TAG_UID) != NULL || agent_req_get(r, TP_TAG_GID) != NULL ||
      agent_req_get(r, TP_TAG_GROUPS) != NULL)
    return tp_error_set(err, EINVAL, "exec: USER goes with neither UID, GID nor GROUPS");
  if ((rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
    return tp_error_errno(err, errno, "exec: open /");
  rc = agent_acct_resolve(rootfd, (const char *) f->val, f->len, TP_ID_MAX, acct, err);
  close(rootfd);
  return rc;
}

int agent_proc_exec(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed = AGENT_TAG(TP_TAG_ARG) | AGENT_TAG(TP_TAG_ENV) | AGENT_TAG(TP_TAG_CWD) |
                           AGENT_TAG(TP_TAG_FLAGS) | AGENT_TAG(TP_TAG_UID) | AGENT_TAG(TP_TAG_GID) |
                           AGENT_TAG(TP_TAG_COLS) | AGENT_TAG(TP_TAG_ROWS) | AGENT_TAG(TP_TAG_GROUPS) |
                           AGENT_TAG(TP_TAG_USER);
  gid_t groups[TP_GROUPS_MAX];
  agent_acct_t acct;
  int acct_by_name = agent_req_get(r, TP_TAG_USER) != NULL;
  int ngroups = 0;
  cleanup_strv char **argv = NULL;
  cleanup_strv char **envp = NULL;
  cleanup_free char *path = NULL;
  cleanup_close int in_r = -1, in_w = -1, out_r = -1, out_w = -1, err_r = -1, err_w = -1;
  cleanup_close int st_r = -1, st_w = -1, hold_r = -1, hold_w = -1, cg_fd = -1;
  int in_fd = -1; /* the kept /dev/null (not ours to close), or -1 */
  char cwd[TP_PATH_MAX + 1] = "/";
  int nargs = tp_fields_count(r->fields, r->n, TP_TAG_ARG);
  int nenv = tp_fields_count(r->fields, r->n, TP_TAG_ENV);
  int64_t flags = agent_req_int(r, TP_TAG_FLAGS, 0);
  int hold = (flags & TP_F_EXEC_HOLD) != 0;
  int pty = (flags & TP_F_EXEC_PTY) != 0;
  __attribute__((cleanup(fdset_closep))) agent_fdset_t tree_set = {0};
  int with_tree = (flags & TP_F_EXEC_TREE) != 0;
  struct winsize ws = {0};
  unsigned uid = 0, gid = 0;
  uint32_t tree = 0;
  agent_proc_t *p = NULL;
  exec_status_t st;
  exec_spec_t spec;
  pid_t pid;
  int rc, vm;

  /* first: the set is this frame's, whatever becomes of the request */
  if (with_tree && agent_fdsets_take(a, a->fpos, &tree_set) < 0)
    tree_set.n = 0;
  if (agent_req_check(r, allowed, AGENT_TAG(TP_TAG_ARG) | AGENT_TAG(TP_TAG_ENV), "exec", err) < 0)
    return -1;
  if (nargs == 0)
    return tp_error_set(err, EINVAL, "exec: no ARG");
  if (nargs + nenv > TP_ARGS_MAX)
    return tp_error_set(err, E2BIG, "exec: more than %d ARG and ENV fields", TP_ARGS_MAX);
  if (flags & ~(int64_t) (TP_F_EXEC_STDIN | TP_F_EXEC_HOLD | TP_F_EXEC_PTY | TP_F_EXEC_TREE | TP_F_EXEC_CREDIT))
    return tp_error_set(err, EINVAL, "exec: unknown FLAGS 0x%llx", (unsigned long long) flags);
  if (with_tree && (hold || agent_cg_active()))
    return tp_error_set(err, EINVAL, "exec: FLAGS TREE goes with neither HOLD nor a guest's cgroups");
  if (with_tree && tree_fds(&tree_set, err) < 0)
    return -1;
  if (!pty && (agent_req_get(r, TP_TAG_COLS) != NULL || agent_req_get(r, TP_TAG_ROWS) != NULL))
    return tp_error_set(err, EINVAL, "exec: COLS and ROWS need FLAGS PTY");
  if (pty && pty_size(r, "exec", &ws, err) < 0)
    return -1;
  if (acct_by_name) {
    if (exec_account(r, &acct, err) < 0)
      return -1;
    uid = acct.uid;
    gid = acct.gid;
    ngroups = acct.ngroups;
    memcpy(groups, acct.groups, sizeof(gid_t) * (size_t) ngroups);
    /* without CWD, the account's home (the daemon's rule) */
    strcpy(cwd, acct.home);
  } else if (exec_id(r, TP_TAG_UID, "UID", &uid, err) < 0 || exec_id(r, TP_TAG_GID, "GID", &gid, err) < 0 ||
             (ngroups = agent_groups_parse(r, "exec", (gid_t) gid, groups, err)) < 0) {
    return -1;
  }
  if (agent_req_get(r, TP_TAG_CWD) != NULL && agent_req_path(r, TP_TAG_CWD, "exec", cwd, err) < 0)
    return -1;
  for (int i = 0; i < AGENT_PROC_MAX && p == NULL; i++)
    if (a->procs[i].pid == 0)
      p = &a->procs[i];
  if (p == NULL)
    return tp_error_set(err, EAGAIN, "exec: too many processes (%d)", AGENT_PROC_MAX);

  argv = strv_from(r, TP_TAG_ARG, 0, err);
  envp = argv ? strv_from(r, TP_TAG_ENV, acct_by_name ? 3 : 0, err) : NULL;
  if (envp == NULL || (acct_by_name && env_defaults(envp, &acct, err) < 0))
    return -1;
  if (argv[0][0] == '\0')
    return tp_error_set(err, EINVAL, "exec: empty program name");
  path = resolve_program(argv[0], envp, err);
  if (path == NULL)
    return -1;

  if (pty) {
    /* stdin, stdout and stderr are the slave; the master is both our
     * stdin writer (in_w, a dup) and the output reader (out_r) */
    if (pty_open(&out_r, &in_r, (uid_t) uid, &ws, err) < 0)
      return -1;
    if ((in_w = fcntl(out_r, F_DUPFD_CLOEXEC, 3)) < 0 || (out_w = fcntl(in_r, F_DUPFD_CLOEXEC, 3)) < 0 ||
        (err_w = fcntl(in_r, F_DUPFD_CLOEXEC, 3)) < 0)
      return tp_error_errno(err, errno, "exec: dup terminal");
  } else if (flags & TP_F_EXEC_STDIN) {
    if (pipe_cloexec(&in_r, &in_w, err) < 0)
      return -1;
  } else if ((in_fd = null_stdin(&in_r, err)) < 0) {
    return -1;
  }
  if ((!pty && (pipe_cloexec(&out_r, &out_w, err) < 0 || pipe_cloexec(&err_r, &err_w, err) < 0)) ||
      pipe_cloexec(&st_r, &st_w, err) < 0 || (hold && pipe_cloexec(&hold_r, &hold_w, err) < 0))
    return -1;

  /* In a microVM guest the agent gives the process its tree's cgroup itself
   * (agent_cgroup.c); the host's hold is for a linux box's host cgroups. */
  if (agent_cg_active() && agent_cg_tree_new(&tree, &cg_fd, err) < 0)
    return -1;

  spec = (exec_spec_t){.path = path, .argv = argv, .envp = envp, .cwd = cwd, .in_fd = in_fd >= 0 ? in_fd : in_r,
                       .out_fd = out_w, .err_fd = err_w, .status_fd = st_w, .hold_fd = hold_r,
                       .cg_fd = cg_fd, .tree = with_tree ? &tree_set : NULL, .uid = (uid_t) uid, .gid = (gid_t) gid,
                       .ngroups = ngroups, .groups = groups, .nofile = &a->nofile,
                       .umask = a->umask, .pty = pty, .bset_empty = a->bset_empty,
                       .sig_reset = a->sig_reset};
  /* the child in the agent's memory where nothing shared changes (above);
   * it inherits the agent's oom_score_adj, 0 then */
  vm = vm_start_ok(hold, (uid_t) uid, (gid_t) gid);
  spec.oom_zero = vm;
  pid = child_start(&spec, vm);
  if (pid < 0) {
    int e = errno;
    agent_cg_tree_done(tree);
    return tp_error_errno(err, e, "exec '%s': fork", argv[0]);
  }
  if (pid == 0)
    child_exec(&spec);

  close_fd(&cg_fd);
  close_fd(&st_w); /* so that the read below sees EOF once the child exec'd */
  close_fd(&hold_r);
  /* Ours no longer: the master sees EOF (EIO) once the child's side is all closed. */
  close_fd(&in_r);
  close_fd(&out_w);
  close_fd(&err_w);
  /* Our ends made ready while the child sets itself up (on another core,
   * where there is one), not between its exec and the reply: fd flags and
   * the pipes' size only, nothing in the memory a CLONE_VM child reads
   * (spec, tree_set) changes before its exec. */
  set_nonblock(out_r);
  if (err_r >= 0)
    set_nonblock(err_r);
  if (in_w >= 0)
    set_nonblock(in_w);
  if ((flags & TP_F_EXEC_CREDIT) && !pty) {
    /* its output is read in frames of up to TP_CHUNK_MAX: a pipe that holds
     * as much (best effort: a box with a lower pipe-max-size keeps 64 KiB) */
    (void) fcntl(out_r, F_SETPIPE_SZ, (int) TP_CHUNK_MAX);
    (void) fcntl(err_r, F_SETPIPE_SZ, (int) TP_CHUNK_MAX);
  }
  /* Without HOLD, EOF means it exec'd; with HOLD, it must say it is held. */
  rc = status_wait(pid, st_r, &st);
  if (hold ? rc != 1 || st.stage != AGENT_STAGE_HELD : rc != 0) {
    if (rc == 0) /* held, but EOF: it died before it got there */
      st = (exec_status_t){.stage = AGENT_STAGE_SETUP, .err = ECHILD};
    kill(pid, SIGKILL); /* a failed child exits anyway; never wait on a stopped one */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    agent_cg_tree_done(tree);
    return status_error(&st, "exec", argv[0], cwd, err);
  }

  *p = (agent_proc_t){.pid = pid, .out_fd = out_r, .err_fd = err_r, .in_fd = in_w,
                      .hold_fd = hold_w, .status_fd = hold ? st_r : -1, .argv = argv, .pty = pty,
                      .tree = tree, .credit = (flags & TP_F_EXEC_CREDIT) != 0,
                      .out_credit = {TP_OUT_WINDOW, TP_OUT_WINDOW}};
  out_r = err_r = in_w = hold_w = -1;
  if (hold)
    st_r = -1;
  argv = NULL;
  a->nprocs++;
  tp_frame_add_int(&a->out, TP_TAG_PID, pid);
  if (acct_by_name) {
    /* what it runs as, and where: the host records them */
    tp_frame_add_int(&a->out, TP_TAG_UID, uid);
    tp_frame_add_str(&a->out, TP_TAG_CWD, cwd);
  }
  return 0;
}

int agent_proc_release(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  exec_status_t st;
  agent_proc_t *p;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID), 0, "release", err) < 0)
    return -1;
  if ((p = proc_lookup(a, r, "release", err)) == NULL)
    return -1;
  if (p->hold_fd < 0)
    return tp_error_set(err, EINVAL, "release: process %d is not held", (int) p->pid);
  /* EPIPE: it died while held; its EXIT follows as for any process. */
  while (write(p->hold_fd, "r", 1) < 0 && errno == EINTR)
    ;
  close_fd(&p->hold_fd);
  if (status_wait(p->pid, p->status_fd, &st) == 0) {
    close_fd(&p->status_fd);
    return 0;
  }
  close_fd(&p->status_fd);
  /* The child exits 127 (or was killed): EXIT comes from the loop. */
  return status_error(&st, "release: exec", p->argv[0], "", err);
}

static int cmp_proc_pid(const void *x, const void *y) {
  pid_t a = (*(agent_proc_t *const *) x)->pid, b = (*(agent_proc_t *const *) y)->pid;
  return (a > b) - (a < b);
}

/* One ENTRY (PID ARG*) per live process, by pid.  A reply that would not
 * fit is cut (FLAGS 1, as for FS_LIST): every PID still goes out first,
 * the ARG lists only while there is room. */
int agent_proc_ps(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  agent_proc_t *live[AGENT_PROC_MAX];
  int n = 0, truncated = 0;

  if (agent_req_check(r, 0, 0, "ps", err) < 0)
    return -1;
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid > 0)
      live[n++] = &a->procs[i];
  if (n > 1)
    qsort(live, (size_t) n, sizeof(*live), cmp_proc_pid);
  if (n > PS_MAX) {
    n = PS_MAX;
    truncated = 1;
  }
  for (int i = 0; i < n; i++) {
    size_t g = tp_frame_group_begin(&a->out, TP_TAG_ENTRY);
    size_t reserve = (size_t) (n - i - 1) * PS_ENTRY_MIN;
    tp_frame_add_int(&a->out, TP_TAG_PID, live[i]->pid);
    for (char **s = live[i]->argv; s != NULL && *s != NULL; s++) {
      size_t payload = a->out.len - a->out.frame_start - TP_FRAME_HDR;
      size_t len = strlen(*s);
      if (payload + 6 + len + reserve > PS_PAYLOAD_MAX) {
        truncated = 1;
        break;
      }
      tp_frame_add(&a->out, TP_TAG_ARG, *s, (uint32_t) len);
    }
    tp_frame_group_end(&a->out, g);
  }
  if (truncated)
    tp_frame_add_int(&a->out, TP_TAG_FLAGS, 1);
  return 0;
}

/* The kernel sends SIGWINCH to the terminal's foreground process group. */
int agent_proc_pty_resize(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  struct winsize ws;
  agent_proc_t *p;
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_COLS) | AGENT_TAG(TP_TAG_ROWS), 0,
                      "pty_resize", err) < 0)
    return -1;
  if (pty_size(r, "pty_resize", &ws, err) < 0)
    return -1;
  if ((p = proc_lookup(a, r, "pty_resize", err)) == NULL)
    return -1;
  if (!p->pty)
    return tp_error_set(err, ENOTTY, "pty_resize: process %d has no terminal", (int) p->pid);
  if (p->out_fd < 0)
    return tp_error_set(err, EPIPE, "pty_resize: the terminal of process %d is closed", (int) p->pid);
  if (ioctl(p->out_fd, TIOCSWINSZ, &ws) < 0)
    return tp_error_errno(err, errno, "pty_resize: process %d", (int) p->pid);
  return 0;
}

/* ---- stdin and signals ------------------------------------------------------ */

/* A credit process: tells the host how much more of its stdin the pipe took
 * (or was dropped), so that the host's client may send that much more. */
static void stdin_ack(agent_t *a, agent_proc_t *p) {
  if (!p->credit || p->in_acked == 0)
    return;
  agent_event_begin(a, TP_MSG_STDIN_ACK);
  tp_frame_add_int(&a->out, TP_TAG_PID, p->pid);
  tp_frame_add_int(&a->out, TP_TAG_SIZE, (int64_t) p->in_acked);
  if (agent_send(a) == 0)
    p->in_acked = 0;
}

/* OUTPUT_ACK: the host took SIZE bytes of a credit process's STREAM. */
int agent_proc_output_ack(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  int64_t stream = agent_req_int(r, TP_TAG_STREAM, 0), size = agent_req_int(r, TP_TAG_SIZE, 0);
  agent_proc_t *p;
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_STREAM) | AGENT_TAG(TP_TAG_SIZE), 0,
                      "output_ack", err) < 0)
    return -1;
  if ((p = proc_lookup(a, r, "output_ack", err)) == NULL)
    return -1;
  if (!p->credit)
    return tp_error_set(err, EINVAL, "output_ack: process %d is not flow-controlled", (int) p->pid);
  if ((stream != 1 && stream != 2) || size < 1 ||
      (uint64_t) size > TP_OUT_WINDOW - p->out_credit[stream - 1])
    return tp_error_set(err, EINVAL, "output_ack: bad STREAM %lld or SIZE %lld (credit %u of %u)",
                        (long long) stream, (long long) size, p->out_credit[stream == 2],
                        TP_OUT_WINDOW);
  p->out_credit[stream - 1] += (uint32_t) size;
  return 0;
}

int agent_proc_stdin(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const tp_field_t *data;
  agent_proc_t *p;
  agent_chunk_t *c;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_DATA), 0, "stdin", err) < 0)
    return -1;
  data = agent_req_get(r, TP_TAG_DATA);
  if (data == NULL)
    return tp_error_set(err, EINVAL, "stdin: no DATA");
  if ((p = proc_lookup(a, r, "stdin", err)) == NULL)
    return -1;
  if (p->in_fd < 0 || p->in_close)
    return tp_error_set(err, EPIPE, "stdin: process %d has no open stdin", (int) p->pid);
  if (data->len == 0)
    return 0;
  if (p->queued + data->len > TP_STDIN_QUEUE_MAX)
    return tp_error_set(err, EAGAIN, "stdin: process %d has %zu bytes queued", (int) p->pid,
                        p->queued);
  c = malloc(sizeof(*c) + data->len);
  if (c == NULL)
    return tp_error_set(err, ENOMEM, "stdin: out of memory");
  c->next = NULL;
  c->len = data->len;
  c->off = 0;
  memcpy(c->data, data->val, data->len);
  if (p->q_tail != NULL)
    p->q_tail->next = c;
  else
    p->q_head = c;
  p->q_tail = c;
  p->queued += data->len;
  return 0;
}

int agent_proc_stdin_close(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  agent_proc_t *p;
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID), 0, "stdin_close", err) < 0)
    return -1;
  if ((p = proc_lookup(a, r, "stdin_close", err)) == NULL)
    return -1;
  p->in_close = 1;
  if (p->q_head == NULL)
    close_fd(&p->in_fd);
  return 0;
}

int agent_proc_signal(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  int64_t sig = agent_req_int(r, TP_TAG_SIGNAL, 0);
  agent_proc_t *p;
  int group_rc;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PID) | AGENT_TAG(TP_TAG_SIGNAL), 0, "signal", err) < 0)
    return -1;
  if (agent_req_get(r, TP_TAG_SIGNAL) == NULL)
    return tp_error_set(err, EINVAL, "signal: no SIGNAL");
  if (sig < 1 || sig > 64)
    return tp_error_set(err, EINVAL, "signal: bad signal %lld", (long long) sig);
  if ((p = proc_lookup(a, r, "signal", err)) == NULL)
    return -1;
  /* A microVM guest's process has its tree's cgroup: the signal reaches all
   * of it, setsid and double-forked descendants too, as on a linux box. */
  if (p->tree != 0) {
    if (agent_cg_tree_signal(p->tree, (int) sig, err) < 0)
      return tp_error_prefix(err, "signal %lld to process %d", (long long) sig, (int) p->pid);
    return 0;
  }
  /* The child is unreaped, so neither its pid nor its group id can have
   * been reused. */
  group_rc = kill(-p->pid, (int) sig);
  if (kill(p->pid, (int) sig) < 0 && group_rc < 0)
    return tp_error_errno(err, errno, "signal %lld to process %d", (long long) sig, (int) p->pid);
  return 0;
}

/* ---- the loop's side ------------------------------------------------------- */

static void send_output(agent_t *a, pid_t pid, int stream, const uint8_t *data, size_t n) {
  agent_event_begin(a, TP_MSG_OUTPUT);
  tp_frame_add_int(&a->out, TP_TAG_PID, pid);
  tp_frame_add_int(&a->out, TP_TAG_STREAM, stream);
  tp_frame_add(&a->out, TP_TAG_DATA, data, (uint32_t) n);
  agent_send(a);
}

/* Splices n bytes of the pipe fd (which holds at least that many: only the
 * agent reads it) onto the channel after the OUTPUT head already written,
 * so that the frame's DATA never passes through the agent: the kernel
 * hands the pipe's pages to the channel socket.  What a splice does not
 * move (a channel that is no socket, or a kernel that refuses) is read and
 * written instead, and splicing stops for good.  Returns 0, or -1 when the
 * frame could not be completed (the channel is then marked dead: a frame
 * cut short would desynchronise it). */
static int splice_output(agent_t *a, int fd, size_t n) {
  while (n > 0 && !a->out_nosplice) {
    ssize_t k = splice(fd, NULL, a->chan, NULL, n, SPLICE_F_MOVE);
    if (k > 0) {
      n -= (size_t) k;
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
      a->out_nosplice = 1;
    } else if (k < 0 && errno == EAGAIN) {
      break; /* a non-blocking channel that is full: the copy below waits for it */
    } else {
      if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) {
        agent_log("channel write: %s", strerror(errno));
        a->dead = 1;
        return -1;
      }
      break; /* 0 or an odd error: copy the rest */
    }
  }
  while (n > 0) {
    size_t want = n < sizeof(a->iobuf) ? n : sizeof(a->iobuf);
    ssize_t k = read(fd, a->iobuf, want);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      agent_log("output pipe: %zu bytes of a frame missing: %s", n, k < 0 ? strerror(errno) : "EOF");
      a->dead = 1;
      return -1;
    }
    if (agent_write_chan(a, a->iobuf, (size_t) k) < 0)
      return -1;
    n -= (size_t) k;
  }
  return 0;
}

/* One OUTPUT frame of what p's pipe fd holds now, at most `want` bytes,
 * spliced (splice_output).  Returns the DATA bytes sent, 0 when the pipe
 * holds nothing (it may be at EOF: the caller reads to know), or -1 when
 * the frame was lost with the channel. */
static ssize_t send_output_spliced(agent_t *a, agent_proc_t *p, int stream, int fd, size_t want) {
  int avail = 0;
  if (ioctl(fd, FIONREAD, &avail) < 0 || avail < (int) AGENT_SPLICE_MIN)
    return 0; /* a small frame: one write wakes the daemon once */
  if ((size_t) avail < want)
    want = (size_t) avail;
  agent_event_begin(a, TP_MSG_OUTPUT);
  tp_frame_add_int(&a->out, TP_TAG_PID, p->pid);
  tp_frame_add_int(&a->out, TP_TAG_STREAM, stream);
  tp_frame_add_head(&a->out, TP_TAG_DATA, (uint32_t) want); /* the last field: its bytes follow */
  if (tp_frame_end_tail(&a->out, (uint32_t) want) < 0) {
    tp_buf_reset(&a->out);
    return 0; /* out of memory: the read path below tells */
  }
  if (agent_write_chan(a, a->out.data, a->out.len) < 0)
    return -1;
  tp_buf_reset(&a->out);
  return splice_output(a, fd, want) < 0 ? -1 : (ssize_t) want;
}

/* Reads one of p's output pipes (non-blocking) until at least `limit` bytes
 * were sent as OUTPUT (so 1 means a single read), the pipe is empty, or it
 * reached EOF or failed (then it is closed).  A credit process's reads stay
 * within its credit unless `drain` (its exit: the pipe's last bytes). */
static void read_output(agent_t *a, agent_proc_t *p, int stream, size_t limit, int drain) {
  int *fd = stream == 1 ? &p->out_fd : &p->err_fd;
  uint32_t *credit = &p->out_credit[stream - 1];
  size_t total = 0;
  while (*fd >= 0 && total < limit) {
    /* a credit process's reader keeps up by credit, not by small frames; a
     * quarter of the window a read keeps four frames in flight (one would
     * wait for each ack) */
    size_t want = p->credit ? (drain ? sizeof(a->iobuf) : AGENT_CREDIT_READ) : AGENT_OUTPUT_CHUNK;
    if (p->credit && !drain) {
      if (*credit == 0)
        break;
      if (want > *credit)
        want = *credit;
    }
    ssize_t n = 0;
    /* a pipe goes to a socket channel by splice; a terminal, output
     * while detached and a microVM's port are read and copied */
    if (!p->pty && !a->out_nosplice && !a->dead && a->chan >= 0 && a->chan != a->vm_port) {
      n = send_output_spliced(a, p, stream, *fd, want);
      if (n < 0)
        break;
    }
    if (n > 0) {
      /* sent */
    } else if ((n = read(*fd, a->iobuf, want)) > 0) {
      send_output(a, p->pid, stream, a->iobuf, (size_t) n);
    }
    if (n > 0) {
      p->out_sent_us[stream - 1] = agent_now_us();
      total += (size_t) n;
      if (p->credit)
        *credit = (size_t) n > *credit ? 0 : *credit - (uint32_t) n;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      break;
    } else {
      close_fd(fd);
    }
  }
}

/* Writes queued stdin until the pipe is full.  EPIPE (the child closed its
 * stdin or died) drops the queue silently. */
static void stdin_flush(agent_t *a, agent_proc_t *p) {
  while (p->q_head != NULL) {
    agent_chunk_t *c = p->q_head;
    ssize_t n = write(p->in_fd, c->data + c->off, c->len - c->off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    if (n < 0) {
      stdin_drop(p);
      stdin_ack(a, p);
      return;
    }
    c->off += (size_t) n;
    p->queued -= (size_t) n;
    p->in_acked += (size_t) n;
    if (c->off == c->len) {
      p->q_head = c->next;
      if (p->q_head == NULL)
        p->q_tail = NULL;
      free(c);
    }
  }
  stdin_ack(a, p);
  if (p->in_close)
    close_fd(&p->in_fd);
}

/* Whether stream s (0, 1) of p rests now (AGENT_REST_US): then the end of
 * its rest is noted in a->rest_until_us. */
static int out_rests(agent_t *a, const agent_proc_t *p, int s, int fd, long long now) {
  long long until = p->out_sent_us[s] + AGENT_REST_US;
  int avail = 0;
  if (p->pty || until <= now || ioctl(fd, FIONREAD, &avail) < 0 || avail >= (int) AGENT_REST_BELOW)
    return 0;
  if (a->rest_until_us == 0 || until < a->rest_until_us)
    a->rest_until_us = until;
  return 1;
}

int agent_proc_poll_fill(agent_t *a, int first) {
  int n = first;
  long long now = agent_now_us();
  a->rest_until_us = 0;
  for (int i = 0, live = 0; i < AGENT_PROC_MAX && live < a->nprocs; i++) {
    const agent_proc_t *p = &a->procs[i];
    if (p->pid == 0)
      continue;
    live++;
    if (p->out_fd >= 0 && (!p->credit || p->out_credit[0] > 0) && !out_rests(a, p, 0, p->out_fd, now)) {
      a->pfds[n] = (struct pollfd){.fd = p->out_fd, .events = POLLIN};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 1};
    }
    if (p->err_fd >= 0 && (!p->credit || p->out_credit[1] > 0) && !out_rests(a, p, 1, p->err_fd, now)) {
      a->pfds[n] = (struct pollfd){.fd = p->err_fd, .events = POLLIN};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 2};
    }
    if (p->in_fd >= 0 && p->q_head != NULL) {
      a->pfds[n] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 0};
    }
  }
  return n;
}

void agent_proc_poll_handle(agent_t *a, int first, int n) {
  for (int i = first; i < n; i++) {
    agent_proc_t *p = &a->procs[a->prefs[i].slot];
    int stream = a->prefs[i].stream;
    if (a->pfds[i].revents == 0 || p->pid == 0)
      continue;
    if (stream == 0 && p->in_fd == a->pfds[i].fd)
      stdin_flush(a, p);
    else if (stream == 1 && p->out_fd == a->pfds[i].fd)
      read_output(a, p, 1, 1, 0);
    else if (stream == 2 && p->err_fd == a->pfds[i].fd)
      read_output(a, p, 2, 1, 0);
  }
}

static int send_exit(agent_t *a, const agent_exit_t *e) {
  int rc;
  if (a->holding && a->held_nexits == AGENT_HELD_EXITS && agent_held_flush(a) < 0)
    return -1;
  agent_event_begin(a, TP_MSG_EXIT);
  tp_frame_add_int(&a->out, TP_TAG_PID, e->pid);
  tp_frame_add_int(&a->out, TP_TAG_CODE, e->code);
  tp_frame_add_int(&a->out, TP_TAG_SIGNAL, e->sig);
  if (e->oom)
    tp_frame_add_int(&a->out, TP_TAG_FLAGS, TP_F_EXIT_OOM);
  rc = agent_send(a);
  if (rc == 0 && a->held.len > 0) /* held, not yet written */
    a->held_exits[a->held_nexits++] = *e;
  return rc;
}

/* OOM kills in a microVM guest.  The guest's kernel, not the host's
 * cgroup, kills there, so the agent tells: /proc/vmstat's oom_kill counts
 * every kill of the guest since boot (all of them the box's: the guest runs
 * nothing else).  A process that died of SIGKILL (or exited 137, a shell's
 * report of its child's SIGKILL) while that count rose since the last
 * process found so was OOM-killed; two killed at once may be told apart
 * wrongly, never missed. */

/* The guest's oom_kill count, or -1 when /proc/vmstat does not say. */
static long long guest_oom_kills(void) {
  char buf[8192];
  size_t got = 0;
  cleanup_close int fd = open("/proc/vmstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  while (got < sizeof(buf) - 1) {
    ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t) n;
  }
  buf[got] = 0;
  for (char *line = buf; line != NULL && *line != 0;) {
    char *nl = strchr(line, '\n');
    if (strncmp(line, "oom_kill ", 9) == 0) {
      char *end;
      long long v;
      errno = 0;
      v = strtoll(line + 9, &end, 10);
      if (errno == 0 && end != line + 9 && v >= 0 && (*end == '\n' || *end == 0))
        return v;
      return -1;
    }
    line = nl != NULL ? nl + 1 : NULL;
  }
  return -1;
}

static int guest_oom_killed(agent_t *a, const agent_exit_t *e) {
  long long n;
  if (!agent_vm_guest || !(e->sig == SIGKILL || (e->sig == 0 && e->code == 128 + SIGKILL)))
    return 0;
  n = guest_oom_kills();
  if (n <= a->guest_oom_seen)
    return 0;
  a->guest_oom_seen = n;
  return 1;
}

/* Keeps an EXIT for the next daemon; when full, the oldest goes. */
static void exit_queue(agent_t *a, const agent_exit_t *e) {
  if (a->exitq_len == AGENT_EXITQ_MAX) {
    agent_log("dropping the EXIT of process %d: queue full", (int) a->exitq[a->exitq_head].pid);
    a->exitq_head = (a->exitq_head + 1) % AGENT_EXITQ_MAX;
    a->exitq_len--;
  }
  a->exitq[(a->exitq_head + a->exitq_len) % AGENT_EXITQ_MAX] = *e;
  a->exitq_len++;
}

void agent_proc_requeue_held(agent_t *a) {
  for (int i = 0; i < a->held_nexits; i++)
    exit_queue(a, &a->held_exits[i]);
  a->held_nexits = 0;
}

void agent_proc_flush_exits(agent_t *a) {
  while (a->exitq_len > 0 && send_exit(a, &a->exitq[a->exitq_head]) == 0) {
    a->exitq_head = (a->exitq_head + 1) % AGENT_EXITQ_MAX;
    a->exitq_len--;
  }
}

/* The child is gone: send what its pipes still hold (a grandchild keeping
 * them open must not delay EXIT, hence non-blocking and bounded), then EXIT,
 * or queue it when there is no channel to send it on. */
static void proc_exited(agent_t *a, agent_proc_t *p, int status) {
  agent_exit_t e = {.pid = p->pid, .code = WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                    .sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0};
  e.oom = guest_oom_killed(a, &e);
  read_output(a, p, 1, AGENT_DRAIN_MAX, 1);
  read_output(a, p, 2, AGENT_DRAIN_MAX, 1);
  /* Earlier ones first: EXIT order is reap order. */
  if (a->exitq_len > 0)
    agent_proc_flush_exits(a);
  if (a->exitq_len > 0 || send_exit(a, &e) < 0)
    exit_queue(a, &e);
  agent_cg_tree_done(p->tree);
  proc_free(a, p);
}

void agent_proc_reap(agent_t *a) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    agent_proc_t *p;
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0)
      break;
    p = proc_find(a, pid);
    if (p != NULL) /* else an orphan we inherited: reaped silently */
      proc_exited(a, p, status);
  }
  agent_cg_sweep(a); /* the end of a tree's last process is a reap here */
}

void agent_proc_kill_all(agent_t *a) {
  agent_cg_kill_all(); /* a guest: every tree, whatever left its group */
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid > 0) {
      kill(-a->procs[i].pid, SIGKILL);
      kill(a->procs[i].pid, SIGKILL);
    }
  for (int i = 0; i < AGENT_PROC_MAX; i++)
    if (a->procs[i].pid > 0) {
      while (waitpid(a->procs[i].pid, NULL, 0) < 0 && errno == EINTR)
        ;
      proc_free(a, &a->procs[i]);
    }
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}
