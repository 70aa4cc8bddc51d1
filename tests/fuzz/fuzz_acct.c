/* libFuzzer target: the agent's account lookup (backends/agent/agent_acct.c)
 * against a box's hostile /etc/passwd and /etc/group.
 *
 * The input is the two files, split at the first NUL byte (passwd before
 * it, group after; no NUL: no /etc/group).  They are written into a
 * directory that stands for the box's root, and the names "user" and
 * "root" are looked up.  Beyond "no crash, no sanitizer report", every
 * account found is checked: ids within 0..65535, uid 0 only for root, a
 * home that is absolute with no "." or ".." part, 1 to TP_GROUPS_MAX
 * groups with the primary first and none twice; every refusal has an
 * errno the protocol documents and a message naming the user. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_acct.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond)                                                                     \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "fuzz_acct: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                             \
    }                                                                                      \
  } while (0)

static char root[256];
static int rootfd = -1;

static void put(const char *name, const uint8_t *p, size_t n) {
  char path[300];
  int fd;
  snprintf(path, sizeof(path), "%s/etc/%s", root, name);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FZ_CHECK(fd >= 0);
  FZ_CHECK(n == 0 || write(fd, p, n) == (ssize_t) n);
  close(fd);
}

static void cleanup(void) {
  char path[300];
  snprintf(path, sizeof(path), "%s/etc/passwd", root);
  unlink(path);
  snprintf(path, sizeof(path), "%s/etc/group", root);
  unlink(path);
  snprintf(path, sizeof(path), "%s/etc", root);
  rmdir(path);
  rmdir(root);
}

static void setup(void) {
  char path[300];
  const char *tmp = getenv("TMPDIR");
  snprintf(root, sizeof(root), "%s/fuzz-acct-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  FZ_CHECK(mkdtemp(root) != NULL);
  snprintf(path, sizeof(path), "%s/etc", root);
  FZ_CHECK(mkdir(path, 0755) == 0);
  rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  FZ_CHECK(rootfd >= 0);
  atexit(cleanup);
}

static void look(const char *name) {
  agent_acct_t a;
  tp_error_t err = {0};
  size_t len = strlen(name);
  if (agent_acct_resolve(rootfd, name, len, TP_ID_MAX, &a, &err) < 0) {
    FZ_CHECK(err.code == ENOENT || err.code == EINVAL || err.code == EFBIG || err.code == E2BIG ||
             err.code == EIO);
    FZ_CHECK(strstr(err.msg, name) != NULL);
    return;
  }
  FZ_CHECK(a.uid <= TP_ID_MAX && a.gid <= TP_ID_MAX);
  FZ_CHECK(a.uid != 0 || strcmp(name, "root") == 0);
  FZ_CHECK(a.home[0] == '/' && strstr(a.home, "/./") == NULL && strstr(a.home, "/../") == NULL);
  FZ_CHECK(strcmp(a.name, name) == 0);
  FZ_CHECK(a.ngroups >= 1 && a.ngroups <= TP_GROUPS_MAX && a.groups[0] == a.gid);
  for (int i = 0; i < a.ngroups; i++) {
    FZ_CHECK(a.groups[i] <= TP_ID_MAX);
    for (int j = 0; j < i; j++)
      FZ_CHECK(a.groups[i] != a.groups[j]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, '\0', size);
  char path[300];
  if (rootfd < 0)
    setup();
  put("passwd", data, nul ? (size_t) (nul - data) : size);
  snprintf(path, sizeof(path), "%s/etc/group", root);
  unlink(path);
  if (nul)
    put("group", nul + 1, size - (size_t) (nul - data) - 1);
  look("user");
  look("root");
  return 0;
}
