/* tupper-agent: internal API shared by agent.c (main loop, channel, request
 * dispatch, detaching and re-attaching), agent_proc.c (exec, stdin, signals,
 * reaping), agent_cred.c (what a child drops before it execs) and agent_fs.c
 * (file operations).
 *
 * The agent is single threaded: one poll() loop over the channel, a signalfd
 * for SIGCHLD, the listening socket (if the box has one) and the pipes of the
 * processes it started.  All its state lives in one agent_t owned by main().
 * A request handler adds its reply fields to a->out, where the dispatcher has
 * already begun an OK frame; on failure it fills err and returns -1, and the
 * dispatcher answers ERR instead.  Events (OUTPUT, EXIT) are only sent from
 * the loop, never while a handler runs, so the OK carrying a pid always
 * precedes that pid's events.
 *
 * Detached: with a listening socket at TP_AGENT_LISTEN_FD, or as a microVM
 * guest (whose port's host end QEMU keeps for the next daemon: vm_port),
 * losing the channel does not end the box.  chan is then -1: processes keep
 * running, output is read and dropped (so no child blocks on a full pipe),
 * EXIT events are queued, and the first connection within the grace period
 * (the port's host end reopening, for a guest) becomes the new channel
 * (READY, then the queued EXITs). */
#ifndef TP_AGENT_H
#define TP_AGENT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "error.h"
#include "frame.h"

#define AGENT_CHAN_FD TP_AGENT_FD
#define AGENT_PROC_MAX 1024                 /* live (unreaped) processes */
#define AGENT_OUTPUT_CHUNK (64u * 1024u)    /* DATA bytes per OUTPUT frame */
#define AGENT_CREDIT_READ (TP_OUT_WINDOW / 4) /* a credit process's read: 4 frames in flight */
#define AGENT_DRAIN_MAX TP_CHUNK_MAX        /* per stream, once its process exited */
/* A pipe that sent OUTPUT less than AGENT_REST_US ago and holds less than
 * AGENT_REST_BELOW bytes is not read again before that time is up: a
 * writer of small pieces makes one frame a millisecond, not one a write
 * (each frame wakes the agent, the daemon and the client).  The first
 * output after a quiet moment goes at once.  64 KiB is what a pipe of the
 * default size holds when full, so a full pipe never rests (a box whose
 * pipe-max-size kept it there is not slowed to 64 KiB a millisecond). */
#define AGENT_REST_US 1000
#define AGENT_REST_BELOW (64u * 1024u)
#define AGENT_SPLICE_MIN (64u * 1024u)      /* a smaller frame is read and written in one piece */
#define AGENT_POLL_FIRST 3                  /* channel, signalfd, listener; then pipes */
#define AGENT_NET_POLL_MAX (4 + TP_NET_STREAMS_MAX) /* agent_net.c: listeners, streams */
#define AGENT_WATCH_MAX 64                  /* live watches (one inotify instance each) */
#define AGENT_WATCH_DIRS_MAX 8192           /* directories per watch (recursive) */
#define AGENT_POLL_MAX (AGENT_POLL_FIRST + 3 * AGENT_PROC_MAX + AGENT_WATCH_MAX + AGENT_NET_POLL_MAX)
#define AGENT_EXITQ_MAX 1024                /* EXIT events kept while detached */
#define AGENT_HELD_MAX (64u * 1024u)        /* frames held for one write (agent_hold) */
#define AGENT_HELD_EXITS 64                 /* EXITs among them, requeued should the write fail */
#define AGENT_GRACE_DEFAULT_S 60            /* detached: wait this long for a daemon */
#define AGENT_GRACE_MAX_S 86400
#define AGENT_CHAN_SNDBUF (4u * 1024u * 1024u) /* the channel socket's send buffer (agent.c) */
#define AGENT_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* The account a request acts as (UID GID GROUPS?, see proto.h). */
typedef struct agent_as_s {
  int active;                 /* UID and GID were given: switch, then switch back */
  uid_t uid;
  gid_t gid;
  int ngroups;
  gid_t groups[TP_GROUPS_MAX];
} agent_as_t;

/* UID, GID and GROUPS of every FS_* and WATCH_ADD request */
#define AGENT_AS_TAGS (AGENT_TAG(TP_TAG_UID) | AGENT_TAG(TP_TAG_GID) | AGENT_TAG(TP_TAG_GROUPS))

/* One queued piece of a process's stdin. */
typedef struct agent_chunk_s {
  struct agent_chunk_s *next;
  size_t len;
  size_t off;                 /* bytes already written */
  uint8_t data[];
} agent_chunk_t;

typedef struct agent_proc_s {
  pid_t pid;                  /* 0: free slot; also the process group id */
  int out_fd;                 /* read end of its stdout, -1 once closed */
  int err_fd;                 /* read end of its stderr, -1 once closed */
  int in_fd;                  /* write end of its stdin, -1 if none or closed */
  int in_close;               /* close in_fd once the queue drained */
  int hold_fd;                /* held (TP_F_EXEC_HOLD): write end of its hold pipe, else -1 */
  int pty;                    /* TP_F_EXEC_PTY: out_fd is the terminal's master, in_fd a dup */
  int status_fd;              /* held: read end of its exec status pipe, else -1 */
  uint32_t tree;              /* microVM guest: its tree cgroup box/t<tree>, else 0 */
  char **argv;                /* ARG fields as given (PS, messages) */
  agent_chunk_t *q_head;
  agent_chunk_t *q_tail;
  size_t queued;              /* bytes not yet written */
  int credit;                 /* TP_F_EXEC_CREDIT: output within out_credit, STDIN_ACK sent */
  uint32_t out_credit[2];     /* credit: stdout, stderr bytes it may still send */
  uint64_t in_acked;          /* credit: stdin bytes written but not yet told (STDIN_ACK) */
  long long out_sent_us[2];   /* stdout, stderr: when its last OUTPUT went (agent_now_us) */
} agent_proc_t;

/* An EXIT event that could not be sent (no channel). */
typedef struct agent_exit_s {
  pid_t pid;
  int code;                   /* exit status or -1 */
  int sig;                    /* 0 or signo */
  int oom;                    /* microVM guest: the guest's OOM killer killed it (TP_F_EXIT_OOM) */
} agent_exit_t;

/* A validated request: header fields plus its top-level fields. */
typedef struct agent_req_s {
  uint32_t id;
  uint8_t type;
  int n;
  const tp_field_t *fields;
} agent_req_t;

/* One directory of a watch: its inotify watch descriptor and its path
 * relative to the watched directory ("" for that directory). */
typedef struct agent_wdir_s {
  int wd;
  char *rel;
} agent_wdir_t;

/* A watch (WATCH_ADD): its own inotify instance. */
typedef struct agent_watch_s {
  int64_t id;                 /* 0: free slot */
  int fd;                     /* inotify instance */
  int recursive;
  char *root;                 /* the watched directory, absolute */
  agent_as_t as;              /* the account directories that appear later are added as */
  int ndirs;
  int cap;
  agent_wdir_t *dirs;
} agent_watch_t;

/* What a pollfd entry past the first two refers to. */
typedef struct agent_pollref_s {
  int16_t slot;
  int16_t stream;             /* 0 stdin, 1 stdout, 2 stderr, 3 a watch's inotify fd */
} agent_pollref_t;

/* File descriptors that came over the channel (SCM_RIGHTS) with the frame
 * starting at stream position pos: an EXEC with TP_F_EXEC_TREE takes the
 * set of its own frame, nothing else does. */
#define AGENT_FDSET_FDS 5          /* a tree's cgroup.procs in each hierarchy (TP_CG_NCTRL) */
#define AGENT_FDSETS_MAX 8         /* sets not taken yet (older ones are closed) */
typedef struct agent_fdset_s {
  uint64_t pos;
  int n;
  int fd[AGENT_FDSET_FDS];
} agent_fdset_t;

typedef struct agent_s {
  int chan;                   /* the channel (SOCK_STREAM), -1 while detached */
  int sigfd;                  /* signalfd for SIGCHLD */
  int dead;                   /* the channel reached EOF or failed */
  int broken;                 /* could not return to root's filesystem ids: the agent stops */
  agent_as_t as;              /* the account of the request being handled */
  int listen_fd;              /* listening socket for a new daemon, or -1 */
  int vm_port;                /* a microVM guest: the virtio-serial port, kept while detached
                                 (the host end reopens on the same port); else -1 */
  long long grace_ms;         /* how long to stay detached */
  long long deadline;         /* detached: when to give up (CLOCK_MONOTONIC ms) */
  long long listen_pause;     /* accept failed for want of resources: retry after this */
  uint8_t *rbuf;              /* TP_FRAME_HDR + TP_FRAME_MAX bytes */
  size_t rlen;
  uint64_t rpos;              /* stream position of rbuf[0] on this channel */
  uint64_t fpos;              /* stream position of the frame being dispatched */
  int nfdsets;
  agent_fdset_t fdsets[AGENT_FDSETS_MAX];
  tp_buf_t out;               /* the frame being built and sent */
  int holding;                /* agent_hold: whole frames wait in held for one write */
  tp_buf_t held;
  int held_nexits;            /* the EXITs in held, in order */
  agent_exit_t held_exits[AGENT_HELD_EXITS];
  struct rlimit nofile;       /* RLIMIT_NOFILE as inherited, restored in children */
  mode_t umask;               /* umask as inherited, restored in children */
  int bset_empty;             /* agent_cred_init: our bounding set is empty, so a child's is */
  uint64_t sig_reset;         /* agent_sig_init: signals not at SIG_DFL (bit sig - 1), reset in children */
  int nprocs;
  agent_proc_t procs[AGENT_PROC_MAX];
  int exitq_head;             /* oldest queued EXIT */
  int exitq_len;
  agent_exit_t exitq[AGENT_EXITQ_MAX];
  long long guest_oom_seen;   /* microVM guest: /proc/vmstat oom_kill at the last OOM-killed exit */
  int64_t next_watch;         /* the last watch id given out */
  agent_watch_t watches[AGENT_WATCH_MAX];
  tp_field_t fields[TP_FIELDS_MAX];
  struct pollfd pfds[AGENT_POLL_MAX];
  agent_pollref_t prefs[AGENT_POLL_MAX];
  long long rest_until_us;    /* the earliest end of a pipe's rest (agent_proc_poll_fill), 0: none */
  int out_nosplice;           /* the kernel refused to splice a pipe onto the channel:
                                 output is read and written (agent_proc.c) */
  uint8_t iobuf[TP_CHUNK_MAX];      /* AGENT_OUTPUT_CHUNK a read, TP_CHUNK_MAX for a credit process */
  struct agent_net_s *net;    /* the network relay, once NET_LISTEN made it (agent_net.c) */
} agent_t;

/* agent.c: logging, the channel and request helpers. */
void agent_log(const char *fmt, ...) TP_PRINTF(1, 2);
/* Begins an event frame (id 0) in a->out. */
void agent_event_begin(agent_t *a, uint8_t type);
/* Ends the frame in a->out and writes it whole; on a channel error marks
 * the agent dead.  Returns 0, or -1 (also while detached: the frame is
 * dropped). */
int agent_send(agent_t *a);
/* Writes n bytes on the channel, whole (part of a frame whose rest the
 * caller sends); on a channel error marks the agent dead.  0 or -1. */
int agent_write_chan(agent_t *a, const uint8_t *p, size_t n);
/* agent_hold: agent_send appends whole frames to a->held instead of writing
 * them (past AGENT_HELD_MAX it writes what waits first, then the frame);
 * anything written on the channel directly (agent_write_chan, a spliced
 * frame's head) writes what waits first, so order holds.  agent_release
 * writes what waits, in one write, and stops holding.  An EXIT sent while
 * held is noted (held_exits): should the write fail, it is queued for the
 * next daemon as one that could not be sent (agent_proc_requeue_held). */
void agent_hold(agent_t *a);
int agent_release(agent_t *a);
/* 0, or -1 when the write of what was held failed. */
int agent_held_flush(agent_t *a);
/* CLOCK_MONOTONIC in milliseconds, in microseconds. */
long long agent_now_ms(void);
long long agent_now_us(void);

/* Checks that every field of r has a tag in `allowed` (a bit per tag) and that
 * only tags in `repeated` occur more than once. */
int agent_req_check(const agent_req_t *r, uint64_t allowed, uint64_t repeated, const char *what,
                    tp_error_t *err);
const tp_field_t *agent_req_get(const agent_req_t *r, uint16_t tag);
/* The integer field `tag`, or def when absent. */
int64_t agent_req_int(const agent_req_t *r, uint16_t tag, int64_t def);
/* Copies the string field `tag` into buf (TP_PATH_MAX + 1 bytes): required,
 * absolute, at most TP_PATH_MAX bytes. */
int agent_req_path(const agent_req_t *r, uint16_t tag, const char *what, char *buf, tp_error_t *err);

#define AGENT_TAG(t) (UINT64_C(1) << (t))

/* agent_proc.c */
int agent_proc_exec(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_stdin(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_stdin_close(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_signal(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_release(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_ps(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_pty_resize(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_output_ack(agent_t *a, const agent_req_t *r, tp_error_t *err);
/* Adds the pipes of live processes to a->pfds from index `first`; returns
 * the new count. */
int agent_proc_poll_fill(agent_t *a, int first);
/* Handles readiness of entries first..n-1 (output, stdin writes). */
void agent_proc_poll_handle(agent_t *a, int first, int n);
/* Reaps every exited child: EXIT for ours (queued while detached),
 * silently for orphans. */
void agent_proc_reap(agent_t *a);
/* Sends the EXIT events queued while detached, oldest first. */
void agent_proc_flush_exits(agent_t *a);
/* The EXITs of a held write that failed, queued again (oldest first). */
void agent_proc_requeue_held(agent_t *a);
/* Channel gone: SIGKILLs every process group, reaps what it can. */
void agent_proc_kill_all(agent_t *a);

/* Where a child's set-up stopped, as it reports on its status pipe. */
enum agent_stage {
  AGENT_STAGE_SETUP = 1,      /* session, stdio, closing fds */
  AGENT_STAGE_OOM,            /* oom_score_adj */
  AGENT_STAGE_SECUREBITS,
  AGENT_STAGE_IDS,            /* setgroups, setresgid, setresuid */
  AGENT_STAGE_CAPS,           /* bounding set, ambient set, capset */
  AGENT_STAGE_NNP,            /* no_new_privs */
  AGENT_STAGE_CHDIR,
  AGENT_STAGE_HELD,           /* not a failure: set up, waiting for RELEASE */
  AGENT_STAGE_EXEC,
  AGENT_STAGE_TREE,           /* joining the cgroup of TP_F_EXEC_TREE */
};

/* agent_cred.c: in a forked child, before exec; async-signal-safe only.
 * Resets oom_score_adj (unless oom_zero: the child has 0 already, see
 * agent_proc.c), locks the securebits, switches to uid/gid and the
 * ngroups supplementary groups, empties every capability set (bounding and
 * ambient too) and sets no_new_privs.  Returns 0, or -1 with errno set and
 * *stage naming the step that failed. */
int agent_cred_drop(uid_t uid, gid_t gid, int ngroups, const gid_t *groups, int bset_empty,
                    int oom_zero, int *stage);
/* Empties the agent's own capability bounding set, once at its start: it
 * execs nothing but its children, and they inherit the empty set (nothing
 * can raise a bounding set again), so each child skips the forty-odd drops
 * (bset_empty of agent_cred_drop).  The agent's effective and permitted
 * sets are untouched.  1 when the set is empty; 0 when it could not be
 * emptied (no CAP_SETPCAP): each child then drops, or fails, as before. */
int agent_cred_init(void);
/* The signals whose disposition is not SIG_DFL now (SIG_IGN, inherited or
 * ours, or a handler) into set, bit sig - 1 (not a sigset_t: glibc's
 * sigaddset refuses its own 32 and 33): what a child resets before it execs.
 * Taken once, after the agent set its own signals up: any later change of
 * a disposition must add its signal to the set. */
void agent_sig_init(uint64_t *set);
/* Sets sig to SIG_DFL, glibc's own signals included (a child before exec). */
void agent_sig_default(int sig);
/* The GROUPS field of r into groups (TP_GROUPS_MAX entries); {gid} when
 * absent.  Returns the count, or -1 with err. */
int agent_groups_parse(const agent_req_t *r, const char *what, gid_t gid, gid_t *groups,
                       tp_error_t *err);
/* UID GID GROUPS? of r into as (as->active = 0 without UID and GID). */
int agent_as_parse(const agent_req_t *r, const char *what, agent_as_t *as, tp_error_t *err);
/* Switches the agent's filesystem ids and groups to as (nothing when not
 * active), each switch checked.  On failure the caller still calls
 * agent_as_leave. */
int agent_as_enter(const agent_as_t *as, tp_error_t *err);
/* Back to root's filesystem ids and no supplementary groups; -1 (errno set)
 * when that fails: the agent must not go on. */
int agent_as_leave(const agent_as_t *as);

/* agent_net.c: the network relay (docs/network.md). */
int agent_net_listen(agent_t *a, const agent_req_t *r, tp_error_t *err);
/* NET_LISTEN's work, without a request: a linux box's agent does it before
 * its first READY (TP_F_READY_NET_LISTEN), a round trip a box fewer */
int agent_net_listen_now(agent_t *a, tp_error_t *err);
/* A stream frame from the host (NET_DATA, NET_ACK, ...: id 0, no reply). */
void agent_net_frame(agent_t *a, const tp_frame_t *f);
/* Moves the payloads of relayed downloads' NET_DATA frames from the channel
 * to the box's sockets by splice while such frames come one after another
 * (rbuf empty): 1 when the channel needs no ordinary read this round, 0
 * when it does (another frame is next). */
int agent_net_splice(agent_t *a);
int agent_net_poll_fill(agent_t *a, int first);
void agent_net_poll_handle(agent_t *a, int first, int n);
/* The channel is gone: every stream ends (the listeners stay). */
void agent_net_detach(agent_t *a);

/* agent_vm.c: PID 1 of a microVM guest (see the file's header). */
extern int agent_vm_guest;        /* set by agent_vm_setup */
/* 1 when started by a guest kernel as /init: pid 1 and no channel at fd 3. */
int agent_vm_detect(void);
/* Mounts, modules, the root switch; *chan = the agent's virtio-serial port. */
int agent_vm_setup(int *chan, tp_error_t *err);
/* Syncs and powers the VM off (does not return on success). */
void agent_vm_poweroff(void);
int agent_vm_init(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_vm_attach(agent_t *a, const agent_req_t *r, tp_error_t *err);
/* The port as the channel: non-blocking, SIGIO on host (dis)connection (the
 * caller adds SIGIO to its signalfd).  Returns 0 or -1 (err). */
int agent_vm_port_init(int fd, tp_error_t *err);
/* 1 while the host end of the port is open, else 0. */
int agent_vm_host_connected(int fd);

/* agent_cgroup.c: the guest's cgroups (see the file's header); only in a
 * microVM guest. */
/* Mounts the hierarchy, makes box/ (before the switch to the image's root). */
int agent_cg_setup(tp_error_t *err);
/* 1 once agent_cg_setup succeeded: processes get trees. */
int agent_cg_active(void);
/* A new tree cgroup for a process about to be forked: its number, and its
 * cgroup.procs opened for writing (the child writes "0" there). */
int agent_cg_tree_new(uint32_t *tree, int *procs_fd, tp_error_t *err);
/* The tree's process was reaped (or never ran): removes the tree's cgroup,
 * or leaves it to agent_cg_sweep while other processes of it live. */
void agent_cg_tree_done(uint32_t tree);
/* After reaping: removes lingering trees that are empty now. */
void agent_cg_sweep(agent_t *a);
/* sig to every process of the tree; SIGKILL kills it whole (cgroup.kill)
 * and waits until it is empty. */
int agent_cg_tree_signal(uint32_t tree, int sig, tp_error_t *err);
/* Kills every process of box/ and waits (bounded) until they are gone. */
void agent_cg_kill_all(void);
/* fds (n of them, CLOEXEC) came with the frame at stream position pos: kept
 * for its EXEC (the oldest set goes when there are too many; a set of more
 * than AGENT_FDSET_FDS is closed whole). */
void agent_fdsets_add(agent_t *a, uint64_t pos, const int *fds, int n);
/* The set that came with the frame at pos, moved to *out (0), or -1 if none
 * did; sets of earlier frames, never to be taken, are closed. */
int agent_fdsets_take(agent_t *a, uint64_t pos, agent_fdset_t *out);
/* Closes every set (a new channel: positions start over). */
void agent_fdsets_clear(agent_t *a);
/* VM_LIMITS: the box's pids.max. */
int agent_vm_limits(agent_t *a, const agent_req_t *r, tp_error_t *err);

/* agent_fs.c */
int agent_fs_read(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_write(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_stat(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_list(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_mkdir(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_remove(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_rename(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_setattr(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_symlink(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_open(agent_t *a, const agent_req_t *r, tp_error_t *err);

/* agent_watch.c: inotify.  Each watch has its own instance; a recursive one
 * adds every subdirectory, and new ones as they appear, up to
 * AGENT_WATCH_DIRS_MAX (past it: an OVERFLOW event naming the limit). */
int agent_watch_add(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_watch_remove(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_watch_poll_fill(agent_t *a, int first);
void agent_watch_poll_handle(agent_t *a, int first, int n);
/* Drops every watch (the channel is gone: nobody would get the events). */
void agent_watch_clear(agent_t *a);

#endif
