/* tupper-agent: an account of the box, looked up in the box's own
 * /etc/passwd and /etc/group (EXEC with USER).  Standalone (proto and
 * common only) so that a unit test can run it against hostile files. */
#ifndef TP_AGENT_ACCT_H
#define TP_AGENT_ACCT_H

#include <sys/types.h>

#include "error.h"
#include "proto.h"

#define AGENT_ACCT_FILE_MAX 1048576 /* bytes of /etc/passwd or /etc/group */
#define AGENT_ACCT_LINE_MAX 65536   /* longer lines are skipped */
#define AGENT_ACCT_NAME_MAX 256     /* bytes of a USER */

typedef struct agent_acct {
  uid_t uid;
  gid_t gid;
  int ngroups; /* groups[0] is gid */
  gid_t groups[TP_GROUPS_MAX];
  char home[TP_PATH_MAX + 1];
  char name[AGENT_ACCT_NAME_MAX + 1];
} agent_acct_t;

/* The account named user (len bytes) of the tree whose root is rootfd
 * (its files resolved inside it, symlinks included): the same rules and
 * messages as the daemon's Sandbox:account (lua/tupper/daemon/sandbox.lua)
 * for a name, ids in 0..max.  Returns 0, or -1 with err (ENOENT: no such
 * account; EINVAL: the files are malformed for it; EFBIG: a file is over
 * AGENT_ACCT_FILE_MAX; E2BIG: too many groups; EIO: /etc/passwd cannot be
 * read). */
int agent_acct_resolve(int rootfd, const char *user, size_t len, unsigned max, agent_acct_t *acct,
                       tp_error_t *err);

#endif
