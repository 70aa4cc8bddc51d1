/* tupper linux backend, internals shared by box.c (parent side), box_plan.c
 * (turns a spec into setup steps) and box_child.c (runs them in the child).
 *
 * The daemon is multi-threaded, so the cloned child may only make
 * async-signal-safe calls: every path and option string it needs is built
 * by tp__plan_build() in the parent before the clone, and the child replays
 * the plan's ops in order (bubblewrap's SetupOp list, in spirit).
 *
 * The child is cloned with CLONE_VM | CLONE_VFORK, like posix_spawn: no page
 * tables are copied and exec has no address space to tear down, which on a
 * VM guest is most of the cost of a start (about 2-4 ms of fork + exec).
 * The price: the parent is suspended until the exec, so it cannot write the
 * user namespace's id maps itself.  The child clones a helper (CLONE_VM,
 * still real root in the host user namespace) before unsharing its user
 * namespace; the helper writes /proc/1/uid_map and gid_map and exits. */
#ifndef TP_LINUX_INT_H
#define TP_LINUX_INT_H

#include <stdint.h>
#include <sys/types.h>

#include "linux.h"

enum tp__op_kind {
  TP__OP_MOUNT,    /* mount(src, dst, fstype, flags, data) */
  TP__OP_DIR,      /* mkdir dst (EEXIST is fine), then insist it is a real dir */
  TP__OP_FILE,     /* create an empty file dst (a bind mount target) */
  TP__OP_SYMLINK,  /* symlink(src, dst) */
  TP__OP_HOSTNAME, /* sethostname(src) */
  TP__OP_LO_UP,    /* bring the loopback interface of the new netns up */
  TP__OP_PIVOT,    /* pivot_root into dst, detach the old root */
};

typedef struct tp__op_s {
  enum tp__op_kind kind;
  const char *step; /* static text naming the step in an error report */
  const char *src;
  const char *dst;
  const char *fstype;
  unsigned long flags;
  const char *data;
  mode_t mode;
} tp__op_t;

#define TP__OPS_MAX 48
#define TP__STRS_MAX 48

typedef struct tp__plan_s {
  tp__op_t ops[TP__OPS_MAX];
  int n_ops;
  char *strs[TP__STRS_MAX]; /* strings the ops point into, owned */
  int n_strs;
  char *uid_map; /* "0 <base> <count>\n", written by the id-map helper */
  char *gid_map;
} tp__plan_t;

/* Validates the parts of spec the plan depends on and fills plan; on failure
 * the plan is freed.  tp__plan_free is idempotent. */
int tp__plan_build(tp__plan_t *plan, const tp_box_spec_t *spec, tp_error_t *err);
void tp__plan_free(tp__plan_t *plan);

/* A failed step, as the child (or its helper) leaves it for the parent. */
typedef struct tp__child_report_s {
  int32_t err;
  char msg[252];
} tp__child_report_t;

/* Shared by the parent and the child: the child runs with CLONE_VM |
 * CLONE_VFORK, so it lives in the parent's memory while the parent waits
 * (suspended) for its exec or exit.  Only the report fields are written by
 * the child side, and only just before it exits. */
typedef struct tp__child_s {
  const tp__plan_t *plan;
  int chan;           /* child end of the agent channel -> TP_AGENT_FD */
  int agent;          /* the agent executable */
  void *helper_stack; /* top of the id-map helper's stack */
  int sync_r;         /* child -> helper: "the user ns exists" */
  int sync_w;
  tp__child_report_t report;        /* set by a failed child step */
  tp__child_report_t helper_report; /* set by a failed helper step */
} tp__child_t;

/* Entry point for clone(): runs the plan, enters a user namespace (its maps
 * are written by a helper it clones first, still in the host one), becomes
 * root in it and execs the agent.  Returns only through _exit. */
int tp__box_child(void *child);

#endif
