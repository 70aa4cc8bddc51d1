/* tupper: the daemon's box object, the same whichever backend runs the box.
 *
 * A tp_dbox_t is a tp_box_t (the backend's: PID 1's pidfd and the agent
 * channel) plus what the daemon keeps around it: the channel on the loop
 * with its frames reassembled in a bounded buffer, validated (frame.c) and
 * handed over as decoded fields; the box cgroup and its process trees (sub
 * cgroups); start, adopt and destroy, whose blocking parts run in the
 * thread pool.  Its owner (the Lua binding, or a C test) gets callbacks and
 * never sees a byte of the stream.
 *
 * From the agent only events, replies and network stream frames are taken:
 * anything else, a frame that does not parse, or a payload the owner
 * rejects, and the box goes down ("agent protocol error").
 *
 * Lifetime (libuv's rules): the object is freed once its owner released it
 * (tp_dbox_release), its handles are closed and no job is pending; after
 * the release no callback runs. */
#ifndef TP_DBOX_H
#define TP_DBOX_H

#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "cgroup.h"
#include "daemon.h"
#include "error.h"
#include "frame.h"

typedef struct tp_dbox_s tp_dbox_t;

/* A frame from the agent: fields[0..n) (nested groups still encoded;
 * scratch has room for scratch_max fields to decode one).  Return < 0 to
 * reject the payload: the box goes down. */
typedef int (*tp_dbox_frame_cb)(tp_dbox_t *b, unsigned type, uint32_t id, const tp_field_t *fields,
                                int n, tp_field_t *scratch, int scratch_max);
/* The box is unusable from now on (its channel closed, PID 1 exited, a
 * protocol error): once. */
typedef void (*tp_dbox_down_cb)(tp_dbox_t *b, const char *reason);
/* A start's end: b, or NULL and err. */
typedef void (*tp_dbox_start_cb)(void *data, tp_dbox_t *b, const tp_error_t *err);
/* A destroy's end: ret 0, or -1 and err. */
typedef void (*tp_dbox_done_cb)(tp_dbox_t *b, int ret, const tp_error_t *err);

/* One process tree of a box: a sub cgroup. */
typedef struct tp_dbox_tree_s {
  struct tp_dbox_tree_s *next;
  char name[32];
  tp_cgroup_t cg;
  int busy;       /* kill jobs in the pool on cg */
  int rm_pending; /* unlinked while busy: the last kill job removes it */
  int spare;      /* made ahead, no process yet: not found by name until taken */
} tp_dbox_tree_t;

/* Spare trees a box keeps made ahead (tp_dbox_tree_take) */
#define TP_DBOX_SPARES 2

struct tp_dbox_s {
  void *data; /* the owner's */
  const tp_backend_t *be;
  tp_box_t box;
  char *dir;
  uv_loop_t *loop;
  uv_pipe_t chan;
  uv_poll_t exitp;
  int open_handles; /* initialised handles whose close callback is pending */
  int work_pending; /* a destroy job is queued */
  int tree_jobs;    /* jobs in the pool that read cg (trees, kills, freezes) */
  int spares;       /* spare trees in trees */
  int refilling;    /* a job making spares is in the pool */
  int took;         /* a take ran: the next one that finds no spare refills */
  int held_destroy; /* tp_dbox_destroy waits for them (0, or 1: queue it; 2: release) */
  int started;      /* tp_dbox_on ran: the handles exist */
  int down;         /* the down callback ran (or the box was destroyed) */
  int destroyed;    /* tp_dbox_destroy or the release ran */
  int released;     /* the owner is gone: never call back */
  tp_dbox_frame_cb on_frame;
  tp_dbox_down_cb on_down;
  tp_dbox_done_cb on_done;
  tp_dbox_done_cb on_dead; /* destroy: the box's processes are all dead (before on_done) */
  uv_poll_t deadp;         /* destroy: waits on the pidfd for that, on the loop */
  uint8_t *rbuf; /* rbuf and fields: made for a burst of reads, dropped
                    after it (dbox.c tp__dbox_buffers_drop): NULL when idle */
  size_t rlen, rcap;
  tp_field_t *fields; /* TP_FIELDS_MAX, then as many for nested groups */
  tp_error_t *werr;   /* the destroy job's (512 bytes: made by tp_dbox_destroy) */
  int wret;
  int has_cg; /* cg is a live box cgroup */
  tp_cgroup_t cg;
  tp_dbox_tree_t *trees;
  int64_t oom_gone; /* v1: OOM kills counted in trees since removed (their subs
                       took their counters with them) */
  char *keep_upper; /* destroy: move <dir>/upper here before removing dir */
  /* C users of the channel (the data plane's relays, stream_fs.c): replies
   * to request ids from TP_DBOX_CID_MIN go to c_frame, not to the owner;
   * c_down runs when the box goes down or is stopped. */
  tp_dbox_frame_cb c_frame;
  void (*c_down)(tp_dbox_t *b, const char *reason);
  void *c_data;
  uint32_t c_next; /* the next such id */
  /* The network relay's C half (netrelay.c): NET_* stream frames go to
   * n_frame first; it returns 1 for a frame of a stream it owns, 0 to leave
   * the frame to the owner, -1 for a payload that breaks the protocol (the
   * box goes down).  n_down runs as c_down does. */
  int (*n_frame)(tp_dbox_t *b, unsigned type, const tp_field_t *fields, int n);
  void (*n_down)(tp_dbox_t *b, const char *reason);
  void *n_data;
  /* The process relays (stream_proc.c): every OUTPUT, EXIT and STDIN_ACK
   * event, and the replies to ids from TP_DBOX_PID_MIN, go to p_frame
   * first; it returns 1 when it took the frame (the owner never sees it),
   * 0 to hand it on, -1 for a protocol error.  p_down as c_down. */
  tp_dbox_frame_cb p_frame;
  void (*p_down)(tp_dbox_t *b, const char *reason);
  void *p_data;
  uint32_t p_next;
};

/* Request ids from here are made in C (the Lua owner's stay below): file
 * relays' below TP_DBOX_PID_MIN, process relays' from it. */
#define TP_DBOX_CID_MIN 0x80000000u
#define TP_DBOX_PID_MIN 0xC0000000u
/* The send buffer of the daemon's end of a box's channel (dbox.c). */
#define TP_DBOX_CHAN_SNDBUF (4u * 1024u * 1024u)

/* A start, as the owner describes it; strings and lists are borrowed until
 * tp_dbox_start returns. */
typedef struct tp_dbox_start_s {
  tp_start_spec_t spec; /* cgroup_procs is set here */
  const char *cgroup;   /* the box cgroup's name (NULL: spec.id) */
  tp_cgroup_limits_t limits;
} tp_dbox_start_t;

/* Checks the start (be->check_start, then: limits on a backend whose box
 * lives in its cgroup need cgroups), makes be's daemon state on first use,
 * copies what the job needs and queues it: in the pool, the box cgroup
 * (tupper/<cgroup>, with the limits) when the daemon has cgroups, then
 * be->start, whose PID 1 joins that cgroup before anything of the box runs,
 * then (TP_BACKEND_OOM_PROTECT) tp_oom_protect, then (TP_BACKEND_CG_BOX)
 * one spare tree for the box's first process (tp_dbox_tree_take).  cb(data, ...) runs on the
 * loop when it is done.  -1 and err (EINVAL from the check) if nothing was
 * queued: then cb never runs.  req->spec is normalised in place. */
int tp_dbox_start(tp_daemon_t *d, uv_loop_t *loop, const tp_backend_t *be, tp_dbox_start_t *req,
                  tp_dbox_start_cb cb, void *data, tp_error_t *err);

/* Takes over a box a previous daemon started: re-opens its cgroup (when the
 * daemon has cgroups), then be->check_adopt and be->adopt.  NULL and err on
 * failure, nothing signalled. */
tp_dbox_t *tp_dbox_adopt(tp_daemon_t *d, uv_loop_t *loop, const tp_backend_t *be,
                         tp_adopt_spec_t *spec, const char *cgroup, tp_error_t *err);

/* Starts delivering frames and the down event.  EBUSY if called twice or
 * after destroy; else a uv error, the box unchanged. */
int tp_dbox_on(tp_dbox_t *b, tp_dbox_frame_cb on_frame, tp_dbox_down_cb on_down,
               tp_error_t *err);

/* 1 if requests can be sent. */
int tp_dbox_running(const tp_dbox_t *b);
/* Writes an encoded frame; takes buf (freed when written, or on failure). */
int tp_dbox_send(tp_dbox_t *b, tp_buf_t *buf, tp_error_t *err);
/* tp_dbox_send of the frame in buf followed by tail[0..tlen), the bytes of
 * its last field (tp_frame_end_tail): what the channel takes at once goes
 * from tail itself (one writev, when nothing is queued); only the rest is
 * copied.  Takes buf; tail is the caller's again when this returns. */
int tp_dbox_send_tail(tp_dbox_t *b, tp_buf_t *buf, const void *tail, size_t tlen, tp_error_t *err);
/* Bytes queued on the channel. */
size_t tp_dbox_queued(const tp_dbox_t *b);

/* 1 if the box has a live cgroup (not after destroy). */
int tp_dbox_has_cgroup(const tp_dbox_t *b);

/* Moves process box_pid (as the box sees it) into a new sub cgroup `name`,
 * so that its whole tree can be signalled or killed, setsid and
 * double-fork included.  EEXIST if the tree exists; EOPNOTSUPP where the
 * box's processes are not in its cgroup (an engine's box). */
int tp_dbox_tree(tp_dbox_t *b, const char *name, pid_t box_pid, tp_error_t *err);
/* A tree's end: err NULL once made, else why not. */
typedef void (*tp_dbox_tree_cb)(void *data, const tp_error_t *err);
/* tp_dbox_tree in the pool (a v1 attach can take the kernel tens of ms):
 * the checks here, the sub and the move there; cb(data, ...) runs on the
 * loop after, unless the box is released by then.  A destroy or release
 * meanwhile waits for it.  -1 and err if nothing was queued. */
int tp_dbox_tree_start(tp_dbox_t *b, const char *name, pid_t box_pid, tp_dbox_tree_cb cb,
                       void *data, tp_error_t *err);
tp_dbox_tree_t *tp_dbox_tree_find(tp_dbox_t *b, const char *name);
/* sig to every process of t (SIGKILL: the whole tree, waiting until it is
 * gone); *n gets how many were signalled. */
int tp_dbox_tree_signal(tp_dbox_t *b, tp_dbox_tree_t *t, int sig, size_t *n, tp_error_t *err);
int tp_dbox_tree_count(tp_dbox_t *b, tp_dbox_tree_t *t, size_t *n, tp_error_t *err);
/* A kill's end: n signalled (its count when the kill began), or err. */
typedef void (*tp_dbox_kill_cb)(void *data, size_t n, const tp_error_t *err);
/* tp_dbox_tree_signal(SIGKILL) in the pool (v1 freezes, signals and waits
 * there); cb runs on the loop unless the box is released.  A removal of t
 * meanwhile waits for it. */
int tp_dbox_tree_kill_start(tp_dbox_t *b, tp_dbox_tree_t *t, tp_dbox_kill_cb cb, void *data,
                            tp_error_t *err);
/* A freeze's end: err NULL once frozen (or thawed), else why not. */
typedef void (*tp_dbox_freeze_cb)(void *data, const tp_error_t *err);
/* tp_cgroup_freeze of the box's cgroup in the pool: a v1 freeze can wait
 * up to TP_CGROUP_TIMEOUT_MS for a task caught in vfork, and a v2 one for
 * cgroup.events, which must not hold the loop.  cb runs on the loop after,
 * unless the box is released by then; a destroy or release meanwhile waits
 * for it.  Two freezes of one box at once are the caller's to keep apart
 * (the daemon serializes them per box: daemon/sandbox.lua). */
int tp_dbox_freeze_start(tp_dbox_t *b, int frozen, tp_dbox_freeze_cb cb, void *data,
                         tp_error_t *err);
/* Kills what is left of t and removes its cgroup; t is freed. */
int tp_dbox_tree_remove(tp_dbox_t *b, tp_dbox_tree_t *t, tp_error_t *err);
/* The same in the pool: t is unlinked (no longer found) at once, its cgroup
 * removed there (on failure, the box's destroy removes it); its v1 OOM
 * kills move to oom_gone as the removal is queued, on the loop, in the step
 * that renames its memory cgroup out of the box's count (dbox_tree.c
 * hide_oom), so the box's count never misses nor doubles them.  ENOENT if t
 * is not b's. */
int tp_dbox_tree_remove_start(tp_dbox_t *b, tp_dbox_tree_t *t, tp_error_t *err);
/* A tree whose processes are all gone (the caller counted none, on the loop
 * since) becomes a spare again, its cgroup kept as it is, while the box has
 * fewer than TP_DBOX_SPARES and no refill is under way: no rmdir now, no
 * mkdir for a later start.  Not
 * a tree a kill touches or touched (the caller's to say: a v1 kill freezes
 * it), nor one whose v1 memory cgroup counted an OOM kill (removed, that
 * count goes to the box's).  Returns 1 when it was kept (no longer found by
 * name), 0 when the caller is to remove it. */
int tp_dbox_tree_recycle(tp_dbox_t *b, tp_dbox_tree_t *t);

/* Spare trees (per-process cgroups made ahead, so that a process.start
 * makes none: one EXEC, no HOLD and RELEASE).  A box has one from its
 * start (made in the start's job, tp_dbox_start), which its first take gets
 * (a take that finds none takes the held way with tp_dbox_tree_start); its
 * first take queues nothing, a take that finds none after that
 * (a second process while the first runs) queues a job in the pool that
 * makes up TP_DBOX_SPARES, and a tree whose processes ended comes back as
 * a spare (tp_dbox_tree_recycle), so a take that leaves none queues
 * nothing either.  So a box that runs one process at a time (`tupper run`,
 * `exec` after `exec`, the churn of create, run, kill) makes one tree in
 * all, and an idle box one (on v1 in the freezer hierarchy only); a box
 * that starts processes faster than they end or the pool refills takes the
 * held way too.
 *
 * tp_dbox_tree_take hands one over: it is a tree like any other from then
 * on (found by name, t->name), NULL if none is spare.  Send the EXEC that
 * puts a process there with tp_dbox_send_tree. */
tp_dbox_tree_t *tp_dbox_tree_take(tp_dbox_t *b);
/* Queues the job that makes up TP_DBOX_SPARES (none while one runs, or
 * where the box has no trees). */
void tp_dbox_tree_refill(tp_dbox_t *b);
/* The same up to n spares (at most TP_DBOX_SPARES): a pooled box gets one
 * ahead of its first process. */
void tp_dbox_tree_refill_to(tp_dbox_t *b, int n);
/* n spares made here, at once (tests). */
int tp__dbox_spares_make(tp_dbox_t *b, int n, tp_error_t *err);

/* tp_dbox_send of a frame with the cgroup.procs fds of t (opened here, one
 * per hierarchy) attached to its first byte (SCM_RIGHTS): for an EXEC with
 * TP_F_EXEC_TREE.  Only while nothing else is queued on the channel (else
 * the fds would arrive with other bytes): EAGAIN, and nothing sent, if it
 * is not so or the socket takes no byte now; the caller then starts the
 * process another way.  buf is freed in every case. */
int tp_dbox_send_tree(tp_dbox_t *b, tp_buf_t *buf, const tp_dbox_tree_t *t, tp_error_t *err);
/* tp_dbox_send of a frame with fds[0..n) (n <= TP_DBOX_SEND_FDS_MAX)
 * attached to its first byte, under tp_dbox_send_tree's rules (EAGAIN
 * while other bytes are queued).  The fds stay the caller's (the kernel
 * holds its own references once sent); buf is freed in every case. */
#define TP_DBOX_SEND_FDS_MAX 8
int tp_dbox_send_fds(tp_dbox_t *b, tp_buf_t *buf, const int *fds, int n, tp_error_t *err);

/* Kills every process of the box at once and, in the pool, waits for its
 * end, removes its dir and its cgroups; with keep_upper (an absolute path on
 * the dir's filesystem that does not exist) the box's upper dir is moved
 * there first.  *queued = 1: done(b, ...) runs on the loop later; 0: it
 * could not be queued and was done here (the result is returned).  EBUSY
 * if already destroyed. */
int tp_dbox_destroy(tp_dbox_t *b, const char *keep_upper, tp_dbox_done_cb done, int *queued,
                    tp_error_t *err);

/* Before tp_dbox_destroy (without keep_upper): the destroy waits for the
 * box's PID 1 to exit on the loop (its pidfd turns readable once every
 * process of the box is dead), runs dead(b, 0, NULL) there, and only then
 * queues the removal of its dir and cgroups, whose end is done's.  A box
 * without a pidfd, or a wait that cannot be set up, gets no dead call: done
 * is the first word. */
void tp_dbox_on_dead(tp_dbox_t *b, tp_dbox_done_cb dead);

/* The owner lets go: no callback runs from now on; a box not destroyed yet
 * is destroyed here, on the loop.  b is freed when its handles and job are
 * done. */
void tp_dbox_release(tp_dbox_t *b);

#endif
