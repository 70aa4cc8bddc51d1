/* tp_rmtree (backends/linux): a deep tree with 0000 dirs and symlinks out
 * of it, walked with few fds, never following a link; a mount inside the
 * tree is refused.  TAP-ish output; exit 0 pass, 1 fail, 77 skip (not root
 * or no user namespaces). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "tap.h"
#include "image.h"
#include "linux.h"
#include "rmtree.h"
#include "linux_box.h"

/* ------------------------------------------------------------ tp_rmtree */

static void test_rmtree(void) {
  tp_error_t err = {0};
  char *outside = path_in(tmp_root, "outside");
  char *keep = path_in(outside, "keep");
  char *tree = path_in(tmp_root, "tree");
  char *p;
  int dfd, r;
  struct rlimit old, low;

  check(tp_rmtree("/nonexistent/tupper/dir", &err) == 0, "rmtree: a missing dir is success");

  mkdir(outside, 0755);
  write_text(keep, "keep\n", 0644);
  mkdir(tree, 0755);
  /* symlinks out of the tree, absolute and relative, to a dir and a file */
  p = path_in(tree, "abs-link");
  symlink(outside, p);
  free(p);
  p = path_in(tree, "rel-link");
  symlink("../outside/keep", p);
  free(p);
  /* a 0000 dir holding a 0000 dir and a 0000 file */
  p = path_in(tree, "locked");
  mkdir(p, 0755);
  dfd = open(p, O_RDONLY | O_DIRECTORY);
  mkdirat(dfd, "inner", 0000);
  close(openat(dfd, "file", O_CREAT | O_WRONLY, 0000));
  close(dfd);
  chmod(p, 0000);
  free(p);
  /* a chain deeper than PATH_MAX allows as a string */
  dfd = open(tree, O_RDONLY | O_DIRECTORY);
  for (int i = 0; i < 400 && dfd >= 0; i++) {
    int next;
    mkdirat(dfd, "deeeeeeeeeeeeep", 0755);
    next = openat(dfd, "deeeeeeeeeeeeep", O_RDONLY | O_DIRECTORY);
    close(dfd);
    dfd = next;
  }
  if (dfd >= 0) {
    close(openat(dfd, "leaf", O_CREAT | O_WRONLY, 0644));
    symlinkat(outside, dfd, "deep-link");
    close(dfd);
  }

  /* Few fds: the walk must not hold one per level. */
  getrlimit(RLIMIT_NOFILE, &old);
  low = old;
  low.rlim_cur = 32;
  setrlimit(RLIMIT_NOFILE, &low);
  r = tp_rmtree(tree, &err);
  setrlimit(RLIMIT_NOFILE, &old);
  check(r == 0, "rmtree: deep tree, 0000 dirs, symlinks, 32 fds (%s)", r < 0 ? err.msg : "ok");
  check(!exists(tree), "rmtree: tree is gone");
  check(exists(keep), "rmtree: symlink targets outside the tree survive");

  /* The top itself a symlink: only the link goes. */
  p = path_in(tmp_root, "top-link");
  symlink(outside, p);
  r = tp_rmtree(p, &err);
  check(r == 0 && !exists(p) && exists(keep), "rmtree: a symlink as top is unlinked, not followed");
  free(p);

  free(outside);
  free(keep);
  free(tree);
}

/* A mount inside the tree (made in a private mount namespace) is refused. */
static void test_rmtree_xdev(void) {
  char *tree = path_in(tmp_root, "xdev");
  char *mnt = path_in(tree, "mnt");
  pid_t pid;
  int status = 0;

  mkdir(tree, 0755);
  mkdir(mnt, 0755);
  pid = fork();
  if (pid == 0) {
    tp_error_t err = {0};
    char *inner = path_in(mnt, "inner");
    if (unshare(CLONE_NEWNS) < 0 || mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=64k") < 0 || write_text(inner, "x", 0644) < 0)
      _exit(2);
    if (tp_rmtree(tree, &err) == 0)
      _exit(3); /* it must refuse */
    _exit(err.code == EXDEV && exists(inner) ? 0 : 4);
  }
  waitpid(pid, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "rmtree: refuses to cross into another mount (status %d)", WEXITSTATUS(status));
  tp_error_t err = {0};
  check(tp_rmtree(tree, &err) == 0 && !exists(tree), "rmtree: removes it once unmounted");
  free(mnt);
  free(tree);
}

int main(void) {
  int r = linux_test_begin(0, NULL, NULL, NULL, NULL);

  if (r != 0)
    return r;
  test_rmtree();
  test_rmtree_xdev();
  return linux_test_end(NULL, 0);
}
