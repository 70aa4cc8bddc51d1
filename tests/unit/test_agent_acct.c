/* The agent's account lookup (backends/agent/agent_acct.c) against hostile
 * /etc/passwd and /etc/group files of a box: huge lines and files, missing
 * fields, ids that are negative, overflow or are not decimal, no newline
 * at the end, binary junk, homes that are not clean paths, too many
 * groups, a FIFO, and symlinks that point out of the box's root (they
 * resolve inside it).  The rules and messages are the daemon's
 * (Sandbox:account in lua/tupper/daemon/sandbox.lua). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_acct.h"
#include "tap.h"

static char root[256];
static int rootfd = -1;

static void put(const char *rel, const char *data, size_t len) {
  char p[512];
  int fd;
  snprintf(p, sizeof(p), "%s/%s", root, rel);
  unlink(p);
  fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  tap_guard(fd >= 0 && write(fd, data, len) == (ssize_t) len && close(fd) == 0, "write %s", rel);
}

static void puts_(const char *rel, const char *s) { put(rel, s, strlen(s)); }

static void rm(const char *rel) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s", root, rel);
  unlink(p);
}

static int look(const char *user, agent_acct_t *a, tp_error_t *err) {
  memset(err, 0, sizeof(*err));
  return agent_acct_resolve(rootfd, user, strlen(user), 65535, a, err);
}

static void want_err(const char *user, int code, const char *msg, const char *what) {
  agent_acct_t a;
  tp_error_t err;
  int rc = look(user, &a, &err);
  check(rc == -1 && err.code == code && (msg == NULL || strcmp(err.msg, msg) == 0), "%s: errno %d '%s'", what,
        err.code, err.msg);
}

static const char *passwd = "root:x:0:0:root:/root:/bin/sh\n"
                            "daemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n"
                            "user:x:1000:1000:User:/home/user:/bin/bash\n";

static void test_plain(void) {
  agent_acct_t a;
  tp_error_t err;
  puts_("etc/passwd", passwd);
  puts_("etc/group", "root:x:0:\nuser:x:1000:\nwheel:x:10:root,user\ndocker:x:999:user\n"
                     "again:x:10:user\nbad:x:-5:user\nother:x:50:userx,xuser\nlast:x:51:a,,user");
  check(look("user", &a, &err) == 0 && a.uid == 1000 && a.gid == 1000 && strcmp(a.home, "/home/user") == 0 &&
            strcmp(a.name, "user") == 0,
        "user: uid 1000, gid 1000, home /home/user (%s)", err.msg);
  check(a.ngroups == 4 && a.groups[0] == 1000 && a.groups[1] == 10 && a.groups[2] == 999 && a.groups[3] == 51,
        "user: groups 1000 10 999 51 (a gid once, a bad gid skipped, only whole member names)");
  check(look("root", &a, &err) == 0 && a.uid == 0 && a.gid == 0 && strcmp(a.home, "/root") == 0 && a.ngroups == 2 &&
            a.groups[1] == 10,
        "root: from its line, with its groups");
  check(look("daemon", &a, &err) == 0 && a.uid == 1 && a.ngroups == 1, "daemon: no supplementary group");
  want_err("nobody", ENOENT, "user 'nobody' is not in the box's /etc/passwd", "an unknown user");
  want_err("use", ENOENT, NULL, "a prefix of a name is not the name");
  want_err("x", ENOENT, NULL, "a field other than the name does not match");
  rm("etc/group");
  check(look("user", &a, &err) == 0 && a.ngroups == 1 && a.groups[0] == 1000, "no /etc/group: the primary group");
}

static void test_root_fallback(void) {
  agent_acct_t a;
  tp_error_t err;
  puts_("etc/passwd", "user:x:1000:1000::/home/user:/bin/sh\n");
  check(look("root", &a, &err) == 0 && a.uid == 0 && a.gid == 0 && strcmp(a.home, "/root") == 0 && a.ngroups == 1,
        "root missing from /etc/passwd: uid 0, home /root");
  rm("etc/passwd");
  check(look("root", &a, &err) == 0 && a.uid == 0, "no /etc/passwd: root still works");
  want_err("user", EIO, "user 'user': cannot read the box's /etc/passwd: read '/etc/passwd': No such file or directory",
           "no /etc/passwd: another user cannot be looked up");
}

static void test_ids(void) {
  static const struct {
    const char *line;
    const char *what;
  } bad[] = {
      {"user:x:-1:1000::/h:/bin/sh\n", "a negative uid"},
      {"user:x:1000:-1::/h:/bin/sh\n", "a negative gid"},
      {"user:x:99999999999:1000::/h:/bin/sh\n", "a uid of 11 digits"},
      {"user:x:4294967296:1000::/h:/bin/sh\n", "a uid past 32 bits"},
      {"user:x:65536:1000::/h:/bin/sh\n", "a uid past the box's ids"},
      {"user:x:+5:1000::/h:/bin/sh\n", "a uid with a sign"},
      {"user:x: 5:1000::/h:/bin/sh\n", "a uid with a space"},
      {"user:x:0x10:1000::/h:/bin/sh\n", "a uid in hex"},
      {"user:x::1000::/h:/bin/sh\n", "an empty uid"},
      {"user:x:1000\n", "no gid field"},
      {"user\n", "a name alone"},
      {"user:x:10\x00" "0:1000::/h\n", "a NUL in the uid"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    size_t n = strlen(bad[i].line);
    if (strstr(bad[i].what, "NUL"))
      n = sizeof("user:x:10\x00" "0:1000::/h\n") - 1;
    put("etc/passwd", bad[i].line, n);
    want_err("user", EINVAL,
             "user 'user': its line in the box's /etc/passwd has a uid or gid that is not a number in 0..65535",
             bad[i].what);
  }
  puts_("etc/passwd", "user:x:0:0::/root:/bin/sh\n");
  want_err("user", EINVAL, "user 'user' has uid 0 in the box's /etc/passwd: ask for 'root' to act as root",
           "uid 0 under another name");
  puts_("etc/passwd", "user:x:0000000065:0065535::/h\n");
  {
    agent_acct_t a;
    tp_error_t err;
    check(look("user", &a, &err) == 0 && a.uid == 65 && a.gid == 65535, "leading zeros, 10 digits at most");
  }
}

static void test_homes(void) {
  static const struct {
    const char *home, *want;
  } cases[] = {
      {"", "/"},           {"/", "/"},         {"/home/u/", "/home/u"}, {"/a//", "/a/"},
      {"//", "/"},         {"rel/dir", NULL},  {"/a/../b", NULL},       {"/a/./b", NULL},
      {"/a//b", NULL},     {"/..", NULL},      {"/.", NULL},            {"/a/b..c", "/a/b..c"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char line[128];
    agent_acct_t a;
    tp_error_t err;
    int rc;
    snprintf(line, sizeof(line), "user:x:1000:1000::%s:/bin/sh", cases[i].home);
    puts_("etc/passwd", line);
    rc = look("user", &a, &err);
    if (cases[i].want)
      check(rc == 0 && strcmp(a.home, cases[i].want) == 0, "home '%s' is '%s' (%s)", cases[i].home, cases[i].want,
            rc == 0 ? a.home : err.msg);
    else
      check(rc == -1 && err.code == EINVAL &&
                strcmp(err.msg, "user 'user': its home in the box's /etc/passwd is not a clean absolute path") == 0,
            "home '%s' is refused (%s)", cases[i].home, err.msg);
  }
  puts_("etc/passwd", "user:x:1000");
  want_err("user", EINVAL, NULL, "a last line without newline and gid field");
  puts_("etc/passwd", "user:x:1000:1000:gecos");
  {
    agent_acct_t a;
    tp_error_t err;
    check(look("user", &a, &err) == 0 && strcmp(a.home, "/") == 0, "no home field, no newline: home /");
  }
}

static void test_sizes_and_junk(void) {
  size_t big = AGENT_ACCT_LINE_MAX + 10, n;
  char *b = malloc(AGENT_ACCT_FILE_MAX + 64);
  agent_acct_t a;
  tp_error_t err;
  tap_guard(b != NULL, "malloc");
  /* a huge line before the entry: skipped */
  memcpy(b, "junk:", 5);
  memset(b + 5, 'a', big);
  n = 5 + big;
  n += (size_t) sprintf(b + n, "\nuser:x:1000:1000::/home/user:/bin/sh\n");
  put("etc/passwd", b, n);
  check(look("user", &a, &err) == 0 && a.uid == 1000, "a line over the line cap before the entry is skipped");
  /* the entry itself over the cap: not an entry */
  n = (size_t) sprintf(b, "user:x:1000:1000:");
  memset(b + n, 'g', big);
  n += big;
  n += (size_t) sprintf(b + n, ":/home/user:/bin/sh\n");
  put("etc/passwd", b, n);
  want_err("user", ENOENT, NULL, "an entry longer than the line cap is skipped");
  /* binary junk, NULs, CRs and lone colons around the entry */
  for (size_t i = 0; i < 4096; i++)
    b[i] = (char) ((i * 2654435761u) >> 13);
  n = 4096;
  {
    static const char junk[] = "\n:::::\n\r\nuser\0:x:7:7::/x\nuser\r:x:8:8::/x\n"
                               "user:x:1001:1001::/home/user:/bin/sh\n";
    memcpy(b + n, junk, sizeof(junk) - 1);
    n += sizeof(junk) - 1;
  }
  put("etc/passwd", b, n);
  check(look("user", &a, &err) == 0 && a.uid == 1001, "the entry is found among binary junk (%s)", err.msg);
  /* a file over the cap */
  memset(b, '\n', AGENT_ACCT_FILE_MAX + 1);
  put("etc/passwd", b, AGENT_ACCT_FILE_MAX + 1);
  want_err("user", EFBIG, "user 'user': cannot read the box's /etc/passwd: /etc/passwd is over 1048576 bytes",
           "/etc/passwd over 1 MiB");
  check(look("root", &a, &err) == 0 && a.uid == 0, "root still works when /etc/passwd is too big");
  put("etc/passwd", b, AGENT_ACCT_FILE_MAX);
  want_err("user", ENOENT, NULL, "/etc/passwd of exactly 1 MiB is read");
  puts_("etc/passwd", passwd);
  put("etc/group", b, AGENT_ACCT_FILE_MAX + 1);
  want_err("user", EFBIG, "user 'user': /etc/group is over 1048576 bytes", "/etc/group over 1 MiB");
  /* more groups than TP_GROUPS_MAX */
  n = 0;
  for (int g = 0; g < TP_GROUPS_MAX; g++)
    n += (size_t) sprintf(b + n, "g%d:x:%d:a,user,b\n", g, 2000 + g);
  put("etc/group", b, n);
  want_err("user", E2BIG, "user 'user' is in more than 64 groups in the box's /etc/group", "65 groups in all");
  n = 0;
  for (int g = 0; g < TP_GROUPS_MAX - 1; g++)
    n += (size_t) sprintf(b + n, "g%d:x:%d:user\n", g, 2000 + g);
  put("etc/group", b, n);
  check(look("user", &a, &err) == 0 && a.ngroups == TP_GROUPS_MAX, "64 groups in all are allowed");
  rm("etc/group");
  free(b);
  /* names the daemon would not send */
  check(agent_acct_resolve(rootfd, "us\0er", 5, 65535, &a, &err) == -1 && err.code == EINVAL, "a NUL in USER");
  check(agent_acct_resolve(rootfd, "", 0, 65535, &a, &err) == -1 && err.code == EINVAL, "an empty USER");
}

static void test_not_files(void) {
  char p[512], outside[512];
  agent_acct_t a;
  tp_error_t err;
  /* a symlink out of the root, by an absolute path and by "..": both
   * resolve inside it */
  snprintf(outside, sizeof(outside), "%s.outside", root);
  {
    int fd = open(outside, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const char *evil = "user:x:4242:4242::/:/bin/sh\n";
    tap_guard(fd >= 0 && write(fd, evil, strlen(evil)) > 0 && close(fd) == 0, "write %s", outside);
  }
  rm("etc/passwd");
  snprintf(p, sizeof(p), "%s/etc/passwd", root);
  tap_guard(symlink(outside, p) == 0, "symlink");
  want_err("user", EIO, NULL, "/etc/passwd -> an absolute path out of the root: not followed out");
  rm("etc/passwd");
  snprintf(outside, sizeof(outside), "../../../../../../../../..%s.outside", root);
  tap_guard(symlink(outside, p) == 0, "symlink ..");
  want_err("user", EIO, NULL, "/etc/passwd -> ../../..: stays in the root");
  /* an absolute link whose target is inside the root */
  rm("etc/passwd");
  puts_("srv-passwd", "user:x:1111:1111::/home/user:/bin/sh\n");
  tap_guard(symlink("/srv-passwd", p) == 0, "symlink in");
  check(look("user", &a, &err) == 0 && a.uid == 1111, "/etc/passwd -> /srv-passwd: the root's file (%s)", err.msg);
  rm("etc/passwd");
  rm("srv-passwd");
  snprintf(outside, sizeof(outside), "%s.outside", root);
  unlink(outside);
  /* a FIFO (no writer): refused, no hang; a directory: refused */
  tap_guard(mkfifo(p, 0644) == 0, "mkfifo");
  want_err("user", EIO, "user 'user': cannot read the box's /etc/passwd: read '/etc/passwd': not a regular file",
           "/etc/passwd is a FIFO: refused, no hang");
  rm("etc/passwd");
  tap_guard(mkdir(p, 0755) == 0, "mkdir");
  want_err("user", EIO, "user 'user': cannot read the box's /etc/passwd: read '/etc/passwd': Is a directory",
           "/etc/passwd is a directory");
  rmdir(p);
  /* /etc/group a FIFO: as if missing */
  puts_("etc/passwd", passwd);
  snprintf(p, sizeof(p), "%s/etc/group", root);
  tap_guard(mkfifo(p, 0644) == 0, "mkfifo group");
  check(look("user", &a, &err) == 0 && a.ngroups == 1, "/etc/group a FIFO: the primary group only");
  rm("etc/group");
  rm("etc/passwd");
}

int main(void) {
  char etc[300];
  const char *tmp = getenv("TMPDIR");
  snprintf(root, sizeof(root), "%s/tp-acct-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  tap_guard(mkdtemp(root) != NULL, "mkdtemp");
  snprintf(etc, sizeof(etc), "%s/etc", root);
  tap_guard(mkdir(etc, 0755) == 0, "mkdir etc");
  rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  tap_guard(rootfd >= 0, "open root");
  test_plain();
  test_root_fallback();
  test_ids();
  test_homes();
  test_sizes_and_junk();
  test_not_files();
  close(rootfd);
  rmdir(etc);
  check(rmdir(root) == 0, "nothing left in the test's root");
  return tap_done();
}
