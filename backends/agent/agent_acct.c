/* tupper-agent: an account of the box from its /etc/passwd and /etc/group.
 *
 * The files are the box's, so hostile: opened inside the box's root
 * (openat2 RESOLVE_IN_ROOT: a symlink cannot lead out of it), regular files
 * only, at most AGENT_ACCT_FILE_MAX bytes, lines over AGENT_ACCT_LINE_MAX
 * skipped, ids strictly decimal.  No getpwnam: the agent is static, and NSS
 * would load modules named by the box.  The rules follow Sandbox:account
 * in the daemon (which still resolves for agents without
 * TP_F_READY_EXEC_USER), message for message. */
#define _GNU_SOURCE
#include "agent_acct.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FIELDS 7

typedef struct {
  const char *p;
  size_t n;
} span_t;

/* path (absolute) under rootfd: its bytes in a malloc'd *buf.  0, or -1
 * with errno (EFBIG past the cap, EINVAL for a file that is not regular)
 * and *what naming the failed step (NULL: not a regular file). */
static int read_file(int rootfd, const char *path, char **buf, size_t *len, const char **what) {
  struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
  struct stat st;
  size_t cap, n = 0;
  char *b;
  int fd, e, tries = 0;
  *what = "open";
  /* openat2 may ask for a retry (a rename or mount raced a lookup through
   * ".."): a few, not for ever, since the box's own processes can keep
   * renaming; then EAGAIN is the answer */
  do
    fd = (int) syscall(SYS_openat2, rootfd, path, &how, sizeof(how));
  while (fd < 0 && errno == EAGAIN && ++tries < 16);
  if (fd < 0)
    return -1;
  *what = "stat";
  if (fstat(fd, &st) < 0) {
    e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    /* a FIFO would block, a device never end (FS_READ's messages) */
    *what = S_ISDIR(st.st_mode) ? "read" : NULL;
    close(fd);
    errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    return -1;
  }
  *what = "read";
  if (st.st_size > AGENT_ACCT_FILE_MAX) {
    close(fd);
    errno = EFBIG;
    return -1;
  }
  /* the size may change under us: read one byte past the cap to see */
  cap = (size_t) st.st_size + 1;
  if ((b = malloc(cap + 1)) == NULL) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  for (;;) {
    ssize_t r;
    if (n == cap) {
      char *nb;
      if (cap > AGENT_ACCT_FILE_MAX) {
        free(b);
        close(fd);
        errno = EFBIG;
        return -1;
      }
      cap = cap * 2 > AGENT_ACCT_FILE_MAX + 1 ? AGENT_ACCT_FILE_MAX + 1 : cap * 2;
      if ((nb = realloc(b, cap + 1)) == NULL) {
        free(b);
        close(fd);
        errno = ENOMEM;
        return -1;
      }
      b = nb;
    }
    r = read(fd, b + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      e = errno;
      free(b);
      close(fd);
      errno = e;
      return -1;
    }
    if (r == 0)
      break;
    n += (size_t) r;
  }
  close(fd);
  if (n > AGENT_ACCT_FILE_MAX) {
    free(b);
    errno = EFBIG;
    return -1;
  }
  *buf = b;
  *len = n;
  return 0;
}

/* The next non-empty line of [*pos, end) (Lua's "[^\n]+"): 1, or 0 at the
 * end.  Lines over AGENT_ACCT_LINE_MAX are skipped. */
static int next_line(const char **pos, const char *end, span_t *line) {
  while (*pos < end) {
    const char *s = *pos, *nl = memchr(s, '\n', (size_t) (end - s));
    const char *e = nl ? nl : end;
    *pos = nl ? nl + 1 : end;
    if (e > s && (size_t) (e - s) <= AGENT_ACCT_LINE_MAX) {
      line->p = s;
      line->n = (size_t) (e - s);
      return 1;
    }
  }
  return 0;
}

/* The first FIELDS ":"-separated fields of line; the count (those past it
 * are absent: n = 0, p = NULL). */
static int split(span_t line, span_t *f) {
  const char *s = line.p, *end = line.p + line.n;
  int k = 0;
  memset(f, 0, sizeof(span_t) * FIELDS);
  while (k < FIELDS) {
    const char *c = memchr(s, ':', (size_t) (end - s));
    const char *e = c ? c : end;
    f[k].p = s;
    f[k].n = (size_t) (e - s);
    k++;
    if (!c)
      break;
    s = c + 1;
  }
  return k;
}

static int span_eq(span_t a, const char *s, size_t n) { return a.p && a.n == n && memcmp(a.p, s, n) == 0; }

/* An id field: 1 to 10 decimal digits, at most max; -1 otherwise. */
static long long id_field(span_t f, unsigned max) {
  long long v = 0;
  if (!f.p || f.n == 0 || f.n > 10)
    return -1;
  for (size_t i = 0; i < f.n; i++) {
    if (f.p[i] < '0' || f.p[i] > '9')
      return -1;
    v = v * 10 + (f.p[i] - '0');
  }
  return v <= (long long) max ? v : -1;
}

/* home made clean into out as clean_abs in sandbox.lua does it: absolute,
 * one trailing "/" dropped (but for "/"), then no "//" and no "." or ".."
 * part; -1 otherwise (a NUL too: it cannot be a path). */
static int clean_abs(span_t h, char *out) {
  size_t n = h.n;
  if (n == 0 || h.p[0] != '/' || n > TP_PATH_MAX || memchr(h.p, '\0', n))
    return -1;
  if (n > 1 && h.p[n - 1] == '/')
    n--;
  for (size_t i = 0; i + 1 < n; i++)
    if (h.p[i] == '/' && h.p[i + 1] == '/')
      return -1;
  for (size_t i = 0; i < n;) {
    size_t j;
    while (i < n && h.p[i] == '/')
      i++;
    for (j = i; j < n && h.p[j] != '/'; j++)
      ;
    if ((j - i == 1 && h.p[i] == '.') || (j - i == 2 && h.p[i] == '.' && h.p[i + 1] == '.'))
      return -1;
    i = j;
  }
  memcpy(out, h.p, n);
  out[n] = '\0';
  return 0;
}

int agent_acct_resolve(int rootfd, const char *user, size_t len, unsigned max, agent_acct_t *acct,
                       tp_error_t *err) {
  const agent_acct_t root = {.uid = 0, .gid = 0, .ngroups = 1, .groups = {0}, .home = "/root", .name = "root"};
  char *pw = NULL, *gr = NULL;
  size_t pwn = 0, grn = 0;
  const char *what, *pos, *end;
  int is_root = len == 4 && memcmp(user, "root", 4) == 0;
  int gerrno = 0, found = 0, rc = -1;
  span_t line, f[FIELDS];
  long long uid, gid;

  if (len == 0 || len > AGENT_ACCT_NAME_MAX || memchr(user, '\0', len))
    return tp_error_set(err, EINVAL, "exec: USER must be 1 to %d bytes without NUL", AGENT_ACCT_NAME_MAX);
  if (read_file(rootfd, "/etc/passwd", &pw, &pwn, &what) < 0) {
    int e = errno;
    /* root is uid 0 whatever the file says, so that a box whose
     * /etc/passwd is missing or broken can still be repaired as root */
    if (is_root) {
      *acct = root;
      return 0;
    }
    if (e == EFBIG)
      return tp_error_set(err, EFBIG, "user '%.*s': cannot read the box's /etc/passwd: /etc/passwd is over %d bytes",
                          (int) len, user, AGENT_ACCT_FILE_MAX);
    /* the text of the agent's FS_READ, which the daemon's path quotes */
    if (what == NULL)
      return tp_error_set(err, EIO,
                          "user '%.*s': cannot read the box's /etc/passwd: read '/etc/passwd': not a regular file",
                          (int) len, user);
    return tp_error_set(err, EIO, "user '%.*s': cannot read the box's /etc/passwd: read '/etc/passwd': %s", (int) len,
                        user, strerror(e));
  }
  if (read_file(rootfd, "/etc/group", &gr, &grn, &what) < 0)
    gerrno = errno;

  pos = pw;
  end = pw + pwn;
  while (!found && next_line(&pos, end, &line))
    if (split(line, f) >= 1 && span_eq(f[0], user, len))
      found = 1;
  if (!found) {
    if (is_root) {
      *acct = root;
      rc = 0;
    } else {
      tp_error_set(err, ENOENT, "user '%.*s' is not in the box's /etc/passwd", (int) len, user);
    }
    goto out;
  }
  uid = id_field(f[2], max);
  gid = id_field(f[3], max);
  if (uid < 0 || gid < 0) {
    tp_error_set(err, EINVAL,
                 "user '%.*s': its line in the box's /etc/passwd has a uid or gid that is not a number in 0..%u",
                 (int) len, user, max);
    goto out;
  }
  if (uid == 0 && !is_root) {
    tp_error_set(err, EINVAL, "user '%.*s' has uid 0 in the box's /etc/passwd: ask for 'root' to act as root",
                 (int) len, user);
    goto out;
  }
  memset(acct, 0, sizeof(*acct));
  if (!f[5].p || f[5].n == 0) {
    strcpy(acct->home, "/");
  } else if (clean_abs(f[5], acct->home) < 0) {
    tp_error_set(err, EINVAL, "user '%.*s': its home in the box's /etc/passwd is not a clean absolute path",
                 (int) len, user);
    goto out;
  }
  acct->uid = (uid_t) uid;
  acct->gid = (gid_t) gid;
  acct->groups[0] = (gid_t) gid;
  acct->ngroups = 1;
  memcpy(acct->name, user, len);
  acct->name[len] = '\0';
  if (gr == NULL) {
    /* no /etc/group: the primary group only; one too big is an error,
     * not a silent cut */
    if (gerrno == EFBIG)
      tp_error_set(err, EFBIG, "user '%.*s': /etc/group is over %d bytes", (int) len, user, AGENT_ACCT_FILE_MAX);
    else
      rc = 0;
    goto out;
  }
  pos = gr;
  end = gr + grn;
  while (next_line(&pos, end, &line)) {
    long long g;
    int seen = 0;
    const char *m, *mend;
    split(line, f);
    if ((g = id_field(f[2], max)) < 0)
      continue;
    for (int i = 0; i < acct->ngroups; i++)
      seen |= acct->groups[i] == (gid_t) g;
    if (seen || !f[3].p)
      continue;
    /* members: f[3] up to the next ':' (split stops at FIELDS) */
    m = f[3].p;
    mend = f[3].p + f[3].n;
    while (m < mend) {
      const char *c = memchr(m, ',', (size_t) (mend - m));
      const char *e = c ? c : mend;
      if ((size_t) (e - m) == len && memcmp(m, user, len) == 0) {
        if (acct->ngroups >= TP_GROUPS_MAX) {
          tp_error_set(err, E2BIG, "user '%.*s' is in more than %d groups in the box's /etc/group", (int) len, user,
                       TP_GROUPS_MAX);
          goto out;
        }
        acct->groups[acct->ngroups++] = (gid_t) g;
        break;
      }
      m = c ? c + 1 : mend;
    }
  }
  rc = 0;
out:
  free(pw);
  free(gr);
  return rc;
}
