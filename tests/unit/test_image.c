/* What a linux box is made of before it starts: the agent binary in a
 * sealed memfd, and the default image (busybox, its applets, /etc, owners
 * in the box's id range) laid out idempotently, refusing a hostile applet
 * list and surviving two creators racing.  TAP-ish output; exit 0 pass, 1
 * fail, 77 skip (not root, no user namespaces, or no busybox). */
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

/* ------------------------------------------------------------ memfd */

static void test_memfd(void) {
  tp_error_t err = {0};
  const char data[] = "\177ELF, not really";
  int fd = tp_agent_memfd(data, sizeof(data), &err);
  int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
  const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
  check(fd >= 0, "memfd: created (%s)", fd < 0 ? err.msg : "ok");
  check(seals >= 0 && (seals & want) == want, "memfd: sealed against write, resize, more seals");
  check(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC), "memfd: close-on-exec");
  check(fd >= 0 && write(fd, "x", 1) < 0 && errno == EPERM, "memfd: writing fails");
  check(tp_agent_memfd(NULL, 0, &err) < 0 && err.code == EINVAL, "memfd: empty binary refused");
  if (fd >= 0)
    close(fd);
}

/* ------------------------------------------------------------ default image */

static int owned(const char *root, const char *rel, uid_t uid, gid_t gid, mode_t mode,
                 mode_t type) {
  char *p = path_in(root, rel);
  struct stat st;
  int ok = lstat(p, &st) == 0 && st.st_uid == uid && st.st_gid == gid &&
           (st.st_mode & S_IFMT) == type && (mode == (mode_t) -1 || (st.st_mode & 07777) == mode);
  if (!ok)
    diag("%s: uid %u gid %u mode %o", p, (unsigned) st.st_uid, (unsigned) st.st_gid,
         (unsigned) st.st_mode);
  free(p);
  return ok;
}

static int leftover_temps(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  if (d == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, ".tmp-") != NULL)
      n++;
  closedir(d);
  return n;
}

static void test_image(const char *image, const char *bb, size_t bb_len, const char *applets,
                       size_t applets_len) {
  tp_error_t err = {0};
  struct stat st1, st2;
  char buf[64];
  ssize_t n;
  char *p, *bad = path_in(tmp_root, "bad-image");
  int r;
  double t0 = now_ms();

  r = tp_image_default_ensure(image, bb, bb_len, applets, applets_len, UID_BASE, UID_BASE, &err);
  check(r == 0, "image: laid out in %.1f ms (%s)", now_ms() - t0, r < 0 ? err.msg : "ok");
  check(owned(image, "", UID_BASE, UID_BASE, 0755, S_IFDIR), "image: root owned by the box's root");
  check(owned(image, "bin/busybox", UID_BASE, UID_BASE, 0755, S_IFREG), "image: /bin/busybox 0755");
  p = path_in(image, "bin/busybox");
  check(stat(p, &st1) == 0 && (size_t) st1.st_size == bb_len, "image: busybox complete");
  free(p);
  check(owned(image, "bin/sh", UID_BASE, UID_BASE, (mode_t) -1, S_IFLNK),
        "image: /bin/sh a symlink, owned");
  p = path_in(image, "bin/sh");
  n = readlink(p, buf, sizeof(buf) - 1);
  buf[n > 0 ? n : 0] = '\0';
  check(strcmp(buf, "/bin/busybox") == 0, "image: /bin/sh -> /bin/busybox");
  free(p);
  check(owned(image, "usr/bin/[", UID_BASE, UID_BASE, (mode_t) -1, S_IFLNK),
        "image: /usr/bin/[ applet");
  check(owned(image, "tmp", UID_BASE, UID_BASE, 01777, S_IFDIR), "image: /tmp 1777");
  check(owned(image, "root", UID_BASE, UID_BASE, 0700, S_IFDIR), "image: /root 0700");
  check(owned(image, "home/user", UID_BASE + 1000, UID_BASE + 1000, 0755, S_IFDIR),
        "image: /home/user owned by uid 1000 inside");
  check(owned(image, "etc/passwd", UID_BASE, UID_BASE, 0644, S_IFREG), "image: /etc/passwd");
  for (const char *const *d = (const char *const[]){"proc", "dev", "sys", "etc/group",
                                                    "etc/hostname", "etc/resolv.conf", NULL};
       *d; d++) {
    p = path_in(image, *d);
    check(exists(p), "image: /%s exists", *d);
    free(p);
  }
  p = path_in(image, "etc/passwd");
  {
    size_t len;
    char *text = slurp(p, &len);
    check(text && strstr(text, "root:x:0:0:root:/root:/bin/sh\n") &&
              strstr(text, "user:x:1000:1000:user:/home/user:/bin/sh\n"),
          "image: passwd has root and user");
    free(text);
  }
  free(p);

  lstat(image, &st1);
  r = tp_image_default_ensure(image, bb, bb_len, applets, applets_len, UID_BASE, UID_BASE, &err);
  lstat(image, &st2);
  check(r == 0 && st1.st_ino == st2.st_ino, "image: idempotent (same dir kept)");
  check(leftover_temps(tmp_root) == 0, "image: no temp dir left");

  /* A hostile applet list fails whole, leaving nothing. */
  r = tp_image_default_ensure(bad, bb, bb_len, "bin/ls\n../../etc/evil\n", 22, UID_BASE, UID_BASE,
                              &err);
  check(r < 0 && err.code == EINVAL && !exists(bad) && leftover_temps(tmp_root) == 0,
        "image: '..' in the applet list refused, nothing left (%s)", err.msg);
  r = tp_image_default_ensure(bad, bb, bb_len, "/bin/abs\n", 9, UID_BASE, UID_BASE, &err);
  check(r < 0 && !exists(bad), "image: absolute applet path refused");

  /* Two creators racing: both succeed, one image, no temp dirs. */
  {
    char *race = path_in(tmp_root, "race-image");
    pid_t kids[2];
    int good = 0;
    for (int i = 0; i < 2; i++) {
      kids[i] = fork();
      if (kids[i] == 0) {
        tp_error_t e = {0};
        r = tp_image_default_ensure(race, bb, bb_len, applets, applets_len, UID_BASE, UID_BASE,
                                    &e);
        _exit(r == 0 ? 0 : 1);
      }
    }
    for (int i = 0; i < 2; i++) {
      int status;
      waitpid(kids[i], &status, 0);
      good += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    check(good == 2 && owned(race, "bin/busybox", UID_BASE, UID_BASE, 0755, S_IFREG) &&
              leftover_temps(tmp_root) == 0,
          "image: concurrent creators both succeed, no temp dir left");
    tp_rmtree(race, &err);
    free(race);
  }
  free(bad);
}

int main(void) {
  char *bb = NULL, *applets = NULL, *image;
  size_t bb_len = 0, applets_len = 0;
  int r = linux_test_begin(1, &bb, &bb_len, &applets, &applets_len);

  if (r != 0)
    return r;
  image = path_in(tmp_root, "image");
  test_memfd();
  test_image(image, bb, bb_len, applets, applets_len);
  free(image);
  free(bb);
  free(applets);
  return linux_test_end(NULL, 0);
}
