/* tupper-agent: what every process the agent starts gives up before it
 * execs.  Runs in the forked child, so only raw system calls.
 *
 * The agent is root of the box's user namespace with every capability in
 * it; a box process gets none of that: no capability in any set (so not
 * even uid 0 can chown, kill across users or bind low ports), securebits
 * locked so that exec cannot hand root its capabilities back, and
 * no_new_privs so that no setuid binary or file capability can either. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* NOROOT: uid 0 gains no capability at exec.  NO_SETUID_FIXUP: a change of
 * uid leaves the capability sets alone (we clear them ourselves, below).
 * KEEP_CAPS stays off.  All locked, so nothing in the box can turn them back. */
#define AGENT_SECUREBITS                                                                           \
  (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED | \
   SECBIT_KEEP_CAPS_LOCKED)
#define AGENT_CAP_GUARD 256 /* far above any kernel's CAP_LAST_CAP */

/* A process of the box starts at 0, not with the agent's own setting (the
 * host may shield the agent from the OOM killer).  EACCES: lowering it below
 * what the host fixed needs a capability we do not have; keep the value. */
static int oom_reset(void) {
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  ssize_t n;
  if (fd < 0)
    return errno == EACCES ? 0 : -1;
  do
    n = write(fd, "0", 1);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno != EACCES) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  close(fd);
  return 0;
}

static int ids_switch(uid_t uid, gid_t gid, int ngroups, const gid_t *groups) {
  if (syscall(SYS_setgroups, (size_t) ngroups, groups) < 0 || syscall(SYS_setresgid, gid, gid, gid) < 0 ||
      syscall(SYS_setresuid, uid, uid, uid) < 0)
    return -1;
  return 0;
}

/* The bounding set: the kernel answers EINVAL past its last capability. */
static int bset_clear(void) {
  int cap;
  for (cap = 0; cap < AGENT_CAP_GUARD; cap++)
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL && cap > 0)
        break;
      return -1;
    }
  if (cap == AGENT_CAP_GUARD) {
    errno = E2BIG;
    return -1;
  }
  return 0;
}

static int caps_clear(int bset_empty) {
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {{0, 0, 0}};

  /* bset_empty: the agent emptied its own at its start (agent_cred_init)
   * and a fork inherits it */
  if (!bset_empty && bset_clear() < 0)
    return -1;
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
    return -1;
  return (int) syscall(SYS_capset, &hdr, data);
}

int agent_cred_init(void) { return bset_clear() == 0; }

/* The kernel's sigaction: the handler first in every layout; the rest
 * (flags, restorer, mask) zero here.  glibc refuses its own signals
 * (SIGCANCEL, SIGSETXID: 32 and 33) through sigaction(), but a parent may
 * hand them down ignored (make does), and an exec keeps SIG_IGN. */
struct agent_ksa {
  void *handler;
  unsigned long rest[3];
};

static int ksa_handler(int sig, void **handler) {
  struct agent_ksa old;
  memset(&old, 0, sizeof(old));
  if (syscall(SYS_rt_sigaction, sig, NULL, &old, sizeof(uint64_t)) < 0)
    return -1;
  *handler = old.handler;
  return 0;
}

void agent_sig_init(uint64_t *set) {
  *set = 0;
  for (int sig = 1; sig < NSIG && sig <= 64; sig++) {
    void *h;
    if (ksa_handler(sig, &h) == 0 && h != (void *) SIG_DFL)
      *set |= (uint64_t) 1 << (sig - 1);
  }
}

void agent_sig_default(int sig) {
  struct agent_ksa dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.handler = (void *) SIG_DFL;
  syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(uint64_t));
}

int agent_cred_drop(uid_t uid, gid_t gid, int ngroups, const gid_t *groups, int bset_empty,
                    int oom_zero, int *stage) {
  *stage = AGENT_STAGE_OOM;
  if (!oom_zero && oom_reset() < 0)
    return -1;
  /* Securebits need CAP_SETPCAP, and with NO_SETUID_FIXUP set first the
   * switch to a non-zero uid keeps it for the drops that follow. */
  *stage = AGENT_STAGE_SECUREBITS;
  if (prctl(PR_SET_SECUREBITS, AGENT_SECUREBITS, 0, 0, 0) < 0)
    return -1;
  /* Still a copy of the agent's memory (recent requests, other processes'
   * environments) until exec: a change of ids may make it dumpable again
   * (fs.suid_dumpable), and then anything in the box with the same uid could
   * read it.  exec makes the program dumpable as usual. */
  *stage = AGENT_STAGE_IDS;
  if (ids_switch(uid, gid, ngroups, groups) < 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
    return -1;
  *stage = AGENT_STAGE_CAPS;
  if (caps_clear(bset_empty) < 0)
    return -1;
  *stage = AGENT_STAGE_NNP;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    return -1;
  return 0;
}

/* ---- acting as an account (FS_*, WATCH_ADD) ------------------------------------ */

int agent_groups_parse(const agent_req_t *r, const char *what, gid_t gid, gid_t *groups,
                       tp_error_t *err) {
  const tp_field_t *f = agent_req_get(r, TP_TAG_GROUPS);
  int n;
  if (f == NULL) {
    groups[0] = gid;
    return 1;
  }
  if (f->len == 0 || f->len % 4 != 0 || f->len / 4 > TP_GROUPS_MAX)
    return tp_error_set(err, EINVAL, "%s: GROUPS must hold 1 to %d ids of 4 bytes", what, TP_GROUPS_MAX);
  n = (int) (f->len / 4);
  for (int i = 0; i < n; i++) {
    const uint8_t *p = f->val + 4 * i;
    uint32_t g = (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
    if (g > TP_ID_MAX)
      return tp_error_set(err, EINVAL, "%s: group %u out of range 0..%d", what, g, TP_ID_MAX);
    groups[i] = (gid_t) g;
  }
  return n;
}

int agent_as_parse(const agent_req_t *r, const char *what, agent_as_t *as, tp_error_t *err) {
  const tp_field_t *fu = agent_req_get(r, TP_TAG_UID), *fg = agent_req_get(r, TP_TAG_GID);
  int64_t uid = agent_req_int(r, TP_TAG_UID, -1), gid = agent_req_int(r, TP_TAG_GID, -1);
  memset(as, 0, sizeof(*as));
  if (fu == NULL && fg == NULL) {
    if (agent_req_get(r, TP_TAG_GROUPS) != NULL)
      return tp_error_set(err, EINVAL, "%s: GROUPS without UID and GID", what);
    return 0;
  }
  if (fu == NULL || fg == NULL)
    return tp_error_set(err, EINVAL, "%s: UID and GID go together", what);
  if (uid < 0 || uid > TP_ID_MAX || gid < 0 || gid > TP_ID_MAX)
    return tp_error_set(err, EINVAL, "%s: UID %lld or GID %lld out of range 0..%d", what,
                        (long long) uid, (long long) gid, TP_ID_MAX);
  as->uid = (uid_t) uid;
  as->gid = (gid_t) gid;
  as->ngroups = agent_groups_parse(r, what, as->gid, as->groups, err);
  if (as->ngroups < 0)
    return -1;
  as->active = 1;
  return 0;
}

/* setfsuid and setfsgid return the previous id whether or not they
 * succeeded; asking for the invalid id -1 changes nothing and returns the
 * current one. */
static int fsuid_is(uid_t uid) { return (uid_t) setfsuid((uid_t) -1) == uid; }
static int fsgid_is(gid_t gid) { return (gid_t) setfsgid((gid_t) -1) == gid; }

int agent_as_enter(const agent_as_t *as, tp_error_t *err) {
  if (!as->active)
    return 0;
  /* Groups and gid first: once fsuid is not 0, the kernel has taken the
   * filesystem capabilities away, and permission checks are the account's. */
  if (syscall(SYS_setgroups, (size_t) as->ngroups, as->groups) < 0)
    return tp_error_errno(err, errno, "act as uid %u: setgroups", (unsigned) as->uid);
  setfsgid(as->gid);
  if (!fsgid_is(as->gid))
    return tp_error_set(err, EPERM, "act as uid %u: setfsgid %u failed", (unsigned) as->uid,
                        (unsigned) as->gid);
  setfsuid(as->uid);
  if (!fsuid_is(as->uid))
    return tp_error_set(err, EPERM, "act as uid %u: setfsuid failed", (unsigned) as->uid);
  return 0;
}

int agent_as_leave(const agent_as_t *as) {
  if (!as->active)
    return 0;
  setfsuid(0);
  setfsgid(0);
  if (!fsuid_is(0) || !fsgid_is(0)) {
    errno = EPERM;
    return -1;
  }
  return (int) syscall(SYS_setgroups, (size_t) 0, NULL);
}
