/* The disk cap of a box (spec.disk_bytes): a sparse ext4 image in the box dir,
 * attached to a loop device that the box's child mounts under upper/ and
 * work/.  Everything here runs in the parent, before the clone.
 *
 * Lifetime: the loop device is configured with LO_FLAGS_AUTOCLEAR, so the
 * kernel detaches it on its last close.  The parent holds the loop fd only
 * until the child has exec'd (mounting opened the device too); from then on
 * the box's ext4 mount is the only opener, and it goes when the box's mount
 * namespace dies with its last process.  No detach call is ever needed, not
 * even after a daemon crash. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "linux_int.h"
#include "utils.h"

#define TP__MKFS "/sbin/mkfs.ext4"
#define TP__LOOP_TRIES 16 /* LOOP_CTL_GET_FREE races with other attachers */

/* Runs the tool at exe (argv, a fixed PATH, no stdin/stdout, signals reset)
 * and waits for it; the start of its stderr, newlines folded, goes into msg.
 * Returns 0 with its wait status in *status, or -1 with err set when it could
 * not be run (pkg names the Debian package that ships it) or waited for. */
int tp__run_tool(const char *exe, char *const argv[], const char *pkg, int *status, char *msg,
                 size_t msg_len, tp_error_t *err) {
  char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL};
  cleanup_close int rd = -1;
  cleanup_pid pid_t pid = -1;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t none, all;
  size_t len = 0;
  int p[2], r;
  ssize_t n;

  if (pipe2(p, O_CLOEXEC) < 0)
    return tp_error_errno(err, errno, "pipe");
  rd = p[0];
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  r = posix_spawn(&pid, exe, &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(p[1]);
  if (r != 0) {
    pid = -1;
    return tp_error_errno(err, r, "run %s (apt install %s)", exe, pkg);
  }
  /* Read to EOF (keeping the start) so the tool never blocks on a full pipe. */
  for (;;) {
    char buf[512];
    n = read(rd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    for (ssize_t i = 0; i < n && len + 1 < msg_len; i++)
      msg[len++] = buf[i] == '\n' ? ' ' : buf[i];
  }
  msg[len] = '\0';
  while ((r = (int) waitpid(pid, status, 0)) < 0 && errno == EINTR)
    ;
  if (r < 0)
    return tp_error_errno(err, errno, "wait for %s", exe);
  pid = -1; /* reaped */
  return 0;
}

/* Runs mkfs.ext4 on path; its stderr (first bytes) goes into the error.  A
 * box's throwaway disk has no journal; a volume (journal != 0) keeps one, so
 * that what was written survives a host crash in a consistent state. */
static int mkfs(const char *path, int journal, tp_error_t *err) {
  char *const argv[] = {"mkfs.ext4", "-q", "-F", "-O", journal ? "has_journal" : "^has_journal",
                        "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", "-m", "0",
                        "-b", "4096", (char *) path, NULL};
  char msg[200];
  int status;

  if (tp__run_tool(TP__MKFS, argv, "e2fsprogs", &status, msg, sizeof(msg), err) < 0)
    return -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return tp_error_set(err, EIO, "%s '%s' failed (%s %d): %s", TP__MKFS, path,
                        WIFEXITED(status) ? "status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), msg);
  return 0;
}

/* Binds the image to a free loop device; returns the device's fd.
 *
 * Direct I/O (LO_FLAGS_DIRECT_IO): the loop device reads and writes the
 * image with O_DIRECT, so what a box writes is cached once, in the page
 * cache of the filesystem on the device, and not a second time in the
 * host's cache of the image file; its writeback goes to the host's disk in
 * one step (docs/limits.md).  A backing file that cannot do direct I/O (a
 * filesystem without O_DIRECT, a block size the device cannot match) makes
 * newer kernels refuse the flag with EINVAL and older ones drop it: the
 * device is then configured without it, as before. */
int tp__loop_attach(int img, char *dev, size_t dev_len, tp_error_t *err) {
  cleanup_close int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  struct loop_config cfg;

  if (ctl < 0)
    return tp_error_errno(err, errno, "open /dev/loop-control");
  memset(&cfg, 0, sizeof(cfg));
  cfg.fd = (uint32_t) img;
  cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
  for (int i = 0; i < TP__LOOP_TRIES; i++) {
    int fd, n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0)
      return tp_error_errno(err, errno, "LOOP_CTL_GET_FREE");
    snprintf(dev, dev_len, "/dev/loop%d", n);
    fd = open(dev, O_RDWR | O_CLOEXEC);
    if (fd < 0)
      return tp_error_errno(err, errno, "open '%s'", dev);
    if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
      return fd;
    if (errno == EINVAL && (cfg.info.lo_flags & LO_FLAGS_DIRECT_IO)) {
      cfg.info.lo_flags &= ~(uint32_t) LO_FLAGS_DIRECT_IO; /* no direct I/O there: buffered */
      if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0)
        return fd;
    }
    int e = errno;
    close(fd);
    if (e != EBUSY) /* EBUSY: another attacher took it first */
      return tp_error_errno(err, e, "LOOP_CONFIGURE '%s'", dev);
  }
  return tp_error_set(err, EBUSY, "no free loop device after %d tries", TP__LOOP_TRIES);
}

int tp__disk_make(int box_dfd, const char *box_dir, int64_t bytes, char *dev, size_t dev_len,
                  tp_error_t *err) {
  cleanup_close int img = -1;
  char path[TP__PATH_MAX_LEN + 16];

  snprintf(path, sizeof(path), "%s/disk.img", box_dir);
  img = openat(box_dfd, "disk.img", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (img < 0)
    return tp_error_errno(err, errno, "create '%s'", path);
  if (ftruncate(img, (off_t) bytes) < 0)
    return tp_error_errno(err, errno, "size '%s' to %lld bytes", path, (long long) bytes);
  if (mkfs(path, 0, err) < 0)
    return -1;
  return tp__loop_attach(img, dev, dev_len, err);
}

int tp_linux_volume_make(const char *path, int64_t bytes, tp_error_t *err) {
  cleanup_close int img = -1;

  if (bytes < TP__DISK_MIN)
    return tp_error_set(err, EINVAL, "a volume is at least %d bytes", TP__DISK_MIN);
  img = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (img < 0)
    return tp_error_errno(err, errno, "create '%s'", path);
  if (ftruncate(img, (off_t) bytes) < 0 || mkfs(path, 1, err) < 0 || fsync(img) < 0) {
    int e = errno;
    if (err->code == 0)
      tp_error_errno(err, e, "size '%s' to %lld bytes", path, (long long) bytes);
    unlink(path);
    return -1;
  }
  return 0;
}
