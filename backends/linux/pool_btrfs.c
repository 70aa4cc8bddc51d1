/* The btrfs pool of box upper dirs (docs/limits.md, docs/snapshots.md).
 *
 * One sparse image file, <dir>.img, formatted btrfs (mkfs.btrfs: the only
 * tool run; everything else is an ioctl), attached to a loop device with
 * LO_FLAGS_AUTOCLEAR and mounted at <dir> (nosuid, nodev) in the daemon's
 * mount namespace, quotas on.  Inside:
 *
 *   <dir>/boxes/<id>    one subvolume per box: upper/ and work/ of its
 *                       overlay; the disk cap is its qgroup's limit on
 *                       referenced bytes (a write past it fails EDQUOT)
 *   <dir>/snaps/<name>  read-only snapshots of box subvolumes (a snapshot's
 *                       upper/ is a lower dir of the boxes made from it)
 *   <dir>/snaps/.tmp-*  a snapshot being made (renamed when whole)
 *
 * Lifetime: the loop device goes with the last user of the filesystem (the
 * host's mount, and the overlays of live boxes, which hold it in their own
 * mount namespaces).  A daemon killed leaves the mount; the next one adopts
 * it after checking that it is this image's (tp_linux_pool_open).
 *
 * Threat model: every path here is the daemon's own (its state dir); names
 * inside the pool are checked to be one plain component.  No box can reach
 * the pool: its root is the overlay, and the bind of its subvolume lives
 * only in its mount namespace, dropped with the old root at pivot_root. */
#define _GNU_SOURCE
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/loop.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "linux_int.h"
#include "utils.h"

#define TP__MKFS_BTRFS "/sbin/mkfs.btrfs"
#define TP__POOL_MIN (1LL << 30) /* below this btrfs's own metadata crowds the boxes out */
#define TP__SUBVOL_ROOT_INO 256  /* BTRFS_FIRST_FREE_OBJECTID: a subvolume's root dir */

/* 1 if name is one plain path component of at most 200 bytes. */
static int plain_name(const char *name) {
  size_t n = name != NULL ? strlen(name) : 0;
  if (n == 0 || n > 200 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (name[i] == '/' || (unsigned char) name[i] < 0x20)
      return 0;
  return 1;
}

static int is_btrfs_fd(int fd) {
  struct statfs sf;
  return fstatfs(fd, &sf) == 0 && sf.f_type == (typeof(sf.f_type)) BTRFS_SUPER_MAGIC;
}

int tp_linux_pool_probe(tp_error_t *err) {
  char buf[4096];
  ssize_t n;
  int found = 0;
  cleanup_close int fd = open("/proc/filesystems", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "open /proc/filesystems");
  while ((n = read(fd, buf, sizeof(buf) - 1)) > 0 && !found) {
    buf[n] = '\0';
    found = strstr(buf, "\tbtrfs\n") != NULL;
  }
  if (!found)
    return tp_error_set(err, ENODEV, "the kernel has no btrfs (not in /proc/filesystems)");
  if (access(TP__MKFS_BTRFS, X_OK) < 0)
    return tp_error_errno(err, errno, "no %s (apt install btrfs-progs)", TP__MKFS_BTRFS);
  if (access("/dev/loop-control", R_OK | W_OK) < 0)
    return tp_error_errno(err, errno, "no /dev/loop-control");
  return 0;
}

/* mkfs.btrfs on path; the start of its stderr goes into the error. */
static int mkfs_btrfs(const char *path, tp_error_t *err) {
  char *const argv[] = {"mkfs.btrfs", "-q", "-f", "--nodiscard", "-L", "tupper-pool",
                        (char *) path, NULL};
  char msg[200];
  int status;

  if (tp__run_tool(TP__MKFS_BTRFS, argv, "btrfs-progs", &status, msg, sizeof(msg), err) < 0)
    return -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return tp_error_set(err, EIO, "%s '%s' failed: %s", TP__MKFS_BTRFS, path, msg);
  return 0;
}

/* Is the btrfs mounted at mnt (its root open) this image's?  Its device 1
 * must be a loop device whose backing file is img. */
static int mounted_on(int mnt, const struct stat *img, tp_error_t *err) {
  struct btrfs_ioctl_dev_info_args di;
  struct loop_info64 li;
  cleanup_close int dev = -1;

  memset(&di, 0, sizeof(di));
  di.devid = 1;
  if (ioctl(mnt, BTRFS_IOC_DEV_INFO, &di) < 0)
    return tp_error_errno(err, errno, "BTRFS_IOC_DEV_INFO");
  di.path[sizeof(di.path) - 1] = '\0';
  if (strncmp((const char *) di.path, "/dev/loop", 9) != 0)
    return tp_error_set(err, EEXIST, "the btrfs mounted there is on '%s', not a loop device",
                        (const char *) di.path);
  dev = open((const char *) di.path, O_RDONLY | O_CLOEXEC);
  if (dev < 0)
    return tp_error_errno(err, errno, "open '%s'", (const char *) di.path);
  if (ioctl(dev, LOOP_GET_STATUS64, &li) < 0)
    return tp_error_errno(err, errno, "LOOP_GET_STATUS64 '%s'", (const char *) di.path);
  if (li.lo_device != img->st_dev || li.lo_inode != img->st_ino)
    return tp_error_set(err, EEXIST, "the btrfs mounted there is not the pool's image");
  return 0;
}

/* Is the image already attached to a loop device?  Then a filesystem on it
 * may still be alive (the boxes of a killed daemon whose pool mount was
 * taken away): a second mount of the same btrfs through another device
 * would corrupt it. */
static int attached_elsewhere(const struct stat *img, char *dev, size_t dev_len) {
  DIR *d = opendir("/sys/block");
  struct dirent *e;
  int found = 0;
  if (d == NULL)
    return 0;
  while (!found && (e = readdir(d)) != NULL) {
    struct loop_info64 li;
    int fd;
    if (strncmp(e->d_name, "loop", 4) != 0 || e->d_name[4] < '0' || e->d_name[4] > '9' ||
        strlen(e->d_name) + 6 > dev_len)
      continue;
    memcpy(dev, "/dev/", 5);
    memcpy(dev + 5, e->d_name, strlen(e->d_name) + 1);
    fd = open(dev, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    found = ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && li.lo_device == img->st_dev &&
            li.lo_inode == img->st_ino;
    close(fd);
  }
  closedir(d);
  return found;
}

/* Opens dir (the mount point) and says whether a filesystem other than its
 * parent's is mounted there. */
static int open_mount_point(const char *dir, int *is_mount, tp_error_t *err) {
  struct stat st, up;
  char parent[TP__PATH_MAX_LEN + 4];
  int fd;

  if (mkdir(dir, 0700) < 0 && errno != EEXIST)
    return tp_error_errno(err, errno, "mkdir '%s'", dir);
  fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "open '%s'", dir);
  snprintf(parent, sizeof(parent), "%s/..", dir);
  if (fstat(fd, &st) < 0 || stat(parent, &up) < 0) {
    int e = errno;
    close(fd);
    return tp_error_errno(err, e, "stat '%s'", dir);
  }
  *is_mount = st.st_dev != up.st_dev;
  return fd;
}

static int mkdir_in(int dfd, const char *name, tp_error_t *err) {
  if (mkdirat(dfd, name, 0700) < 0 && errno != EEXIST)
    return tp_error_errno(err, errno, "mkdir '%s' in the pool", name);
  return 0;
}

int tp_linux_pool_open(const char *dir, int64_t bytes, int *adopted, tp_error_t *err) {
  char img_path[TP__PATH_MAX_LEN + 8], dev[32];
  cleanup_close int img = -1, loop = -1, mnt = -1;
  struct btrfs_ioctl_quota_ctl_args q;
  struct stat st;
  int is_mount = 0, made = 0;

  *adopted = 0;
  if (dir == NULL || dir[0] != '/' || strlen(dir) > TP__PATH_MAX_LEN)
    return tp_error_set(err, EINVAL, "pool dir must be an absolute path of at most %d bytes",
                        TP__PATH_MAX_LEN);
  snprintf(img_path, sizeof(img_path), "%s.img", dir);
  mnt = open_mount_point(dir, &is_mount, err);
  if (mnt < 0)
    return -1;
  img = open(img_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (img < 0 && errno != ENOENT)
    return tp_error_errno(err, errno, "open '%s'", img_path);
  if (is_mount) {
    /* a killed daemon's mount: ours if it is this image's btrfs */
    if (img < 0 || fstat(img, &st) < 0)
      return tp_error_set(err, EEXIST, "'%s' is a mount point but '%s' is missing", dir,
                          img_path);
    if (!is_btrfs_fd(mnt) || mounted_on(mnt, &st, err) < 0)
      return tp_error_prefix(err, "'%s' is mounted, not with the pool", dir);
    *adopted = 1;
  } else {
    if (img < 0) {
      if (bytes < TP__POOL_MIN)
        bytes = TP__POOL_MIN;
      img = open(img_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (img < 0)
        return tp_error_errno(err, errno, "create '%s'", img_path);
      made = 1;
      if (ftruncate(img, (off_t) bytes) < 0 || mkfs_btrfs(img_path, err) < 0) {
        if (err->code == 0)
          tp_error_errno(err, errno, "size '%s' to %lld bytes", img_path, (long long) bytes);
        unlink(img_path);
        return -1;
      }
    } else if (fstat(img, &st) < 0 || !S_ISREG(st.st_mode)) {
      return tp_error_set(err, EINVAL, "'%s' is not a regular file", img_path);
    } else if (attached_elsewhere(&st, dev, sizeof(dev))) {
      return tp_error_set(err, EBUSY,
                          "'%s' is still attached to %s but not mounted at '%s' (boxes of an "
                          "earlier daemon still use it): not mounted twice",
                          img_path, dev, dir);
    }
    loop = tp__loop_attach(img, dev, sizeof(dev), err);
    if (loop < 0)
      goto fail;
    /* discard=async: what boxes free is punched out of the sparse image */
    if (mount(dev, dir, "btrfs", MS_NOSUID | MS_NODEV | MS_NOATIME, "discard=async") < 0) {
      tp_error_errno(err, errno, "mount '%s' (btrfs on %s) at '%s'", img_path, dev, dir);
      goto fail;
    }
    close(mnt);
    mnt = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (mnt < 0 || !is_btrfs_fd(mnt)) {
      tp_error_errno(err, mnt < 0 ? errno : EIO, "open the pool at '%s'", dir);
      umount2(dir, MNT_DETACH);
      goto fail;
    }
  }
  /* idempotent: an enabled quota is left as it is */
  memset(&q, 0, sizeof(q));
  q.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (ioctl(mnt, BTRFS_IOC_QUOTA_CTL, &q) < 0) {
    tp_error_errno(err, errno, "enable quotas on the pool (BTRFS_IOC_QUOTA_CTL)");
    if (!*adopted)
      umount2(dir, MNT_DETACH);
    goto fail;
  }
  if (fchmod(mnt, 0700) < 0 || mkdir_in(mnt, "boxes", err) < 0 || mkdir_in(mnt, "snaps", err) < 0) {
    if (err->code == 0)
      tp_error_errno(err, errno, "chmod '%s'", dir);
    if (!*adopted)
      umount2(dir, MNT_DETACH);
    goto fail;
  }
  return 0;
fail:
  if (made)
    unlink(img_path);
  return -1;
}

int tp_linux_pool_close(const char *dir, tp_error_t *err) {
  if (umount2(dir, UMOUNT_NOFOLLOW) == 0 || errno == EINVAL) /* EINVAL: not mounted */
    return 0;
  /* EBUSY: a host process still has a file of it open; the caller's boxes
   * are gone, so detach it: it goes with that last file */
  if (errno == EBUSY && umount2(dir, UMOUNT_NOFOLLOW | MNT_DETACH) == 0)
    return 0;
  return tp_error_errno(err, errno, "unmount the pool at '%s'", dir);
}

/* Opens <dir>/<sub> as a directory on the pool. */
static int open_in_pool(const char *dir, const char *sub, tp_error_t *err) {
  char path[TP__PATH_MAX_LEN + 16];
  int fd;
  snprintf(path, sizeof(path), "%s/%s", dir, sub);
  fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return tp_error_errno(err, errno, "open '%s'", path);
  if (!is_btrfs_fd(fd)) {
    close(fd);
    return tp_error_set(err, EXDEV, "'%s' is not on the btrfs pool", path);
  }
  return fd;
}

/* Deletes subvolume name of the dir open at parent (its qgroup with it,
 * best effort: the kernel drops a deleted subvolume in the background). */
static int subvol_destroy(int parent, const char *name, tp_error_t *err) {
  struct btrfs_ioctl_vol_args va;
  struct stat st;
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "stat subvolume '%s'", name);
  if (!S_ISDIR(st.st_mode) || st.st_ino != TP__SUBVOL_ROOT_INO)
    return tp_error_set(err, EINVAL, "'%s' is not a subvolume", name);
  memset(&va, 0, sizeof(va));
  snprintf(va.name, sizeof(va.name), "%s", name);
  if (ioctl(parent, BTRFS_IOC_SNAP_DESTROY, &va) < 0 && errno != ENOENT)
    return tp_error_errno(err, errno, "delete subvolume '%s' (BTRFS_IOC_SNAP_DESTROY)", name);
  return 0;
}

/* Spare box subvolumes: a removed box's subvolume that it left empty,
 * renamed to boxes/.spare-<its id> (never a box id: ids have no dot) and
 * renamed to the next box's name instead of a BTRFS_IOC_SNAP_DESTROY now
 * and a BTRFS_IOC_SUBVOL_CREATE then.  The deletion is the costly part:
 * the btrfs cleaner thread's work on each deleted subvolume took about a
 * third as much CPU as the boxes' starts and removals themselves under
 * churn (docs/benchmarks.md, "A box's set-up").  Kept only when the box
 * left little, and nothing of it is left to carry over: upper/ holding at
 * most TP__SPARE_ENTRIES_MAX entries and TP__SPARE_BYTES_MAX of files (the
 * agent writes etc/resolv.conf in every box), all removed, upper/ itself
 * made anew (the box's "/" had its owner, mode and xattrs there); work/
 * holding only overlayfs's marks (removed); nothing else beside the
 * agent's socket; and the qgroup's committed count of referenced bytes
 * under TP__SPARE_RFER_MAX (a box that wrote and then deleted more still
 * counts it until the next commit: a next box must not find its cap
 * taken).  A daemon's start
 * removes every name of boxes/ that no box owns (daemon/disk_pool.lua), so
 * spares a crash left go then.  The list is the process's, by path, under
 * a lock (starts and removals run in the thread pool). */
#define TP__SPARE_SV_PREFIX ".spare-"
#define TP__SPARE_RFER_MAX (1LL << 20)
#define TP__SPARE_ENTRIES_MAX 64 /* in upper/: the agent's etc/resolv.conf and the like */
#define TP__SPARE_BYTES_MAX (64 << 10) /* their files' blocks */
#define TP__SPARE_DEPTH_MAX 8
static tp__spares_t sv_spares = TP__SPARES_INIT; /* "<pool dir>/boxes/.spare-<old id>" */

/* Removes what is in the dir open at dfd (kept open, not read yet),
 * never following a symlink, at most *budget entries in all, their files'
 * blocks at most *bytes, TP__SPARE_DEPTH_MAX deep: 0, or -1 (more than
 * that, or an error: some may be gone by then).  One pass: a listing goes
 * on past the entries it removed (an entry it missed would make the rmdir
 * of its dir, or of upper/, fail, and the subvolume go), and the type
 * getdents gives spares the dirs' and links' fstatat; a regular file's
 * blocks are counted with one. */
static int clear(int dfd, int depth, int *budget, int64_t *bytes) {
  char buf[1024];
  long n;
  if (depth > TP__SPARE_DEPTH_MAX)
    return -1;
  while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
    for (long off = 0; off < n; off += ((struct dirent64 *) (buf + off))->d_reclen) {
      struct dirent64 *de = (struct dirent64 *) (buf + off);
      unsigned char type = de->d_type;
      int sub, r;
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
        continue;
      if (--*budget < 0)
        return -1;
      if (type == DT_REG || type == DT_UNKNOWN) {
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
          return -1;
        type = S_ISDIR(st.st_mode) ? DT_DIR : DT_REG;
        if (type == DT_REG && (*bytes -= (int64_t) st.st_blocks * 512) < 0)
          return -1;
      }
      if (type != DT_DIR) {
        if (unlinkat(dfd, de->d_name, 0) < 0)
          return -1;
        continue;
      }
      sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0)
        return -1;
      r = clear(sub, depth + 1, budget, bytes);
      close(sub);
      if (r < 0 || unlinkat(dfd, de->d_name, AT_REMOVEDIR) < 0)
        return -1;
    }
  }
  return n < 0 ? -1 : 0;
}

/* The referenced bytes the quota tree holds for the subvolume open at sv
 * (its committed count), or -1. */
static int64_t rfer_of(int sv) {
  struct btrfs_ioctl_ino_lookup_args il;
  struct btrfs_ioctl_search_args sa;
  struct btrfs_ioctl_search_key *k = &sa.key;
  struct btrfs_ioctl_search_header sh;
  struct btrfs_qgroup_info_item qi;

  memset(&il, 0, sizeof(il));
  il.objectid = BTRFS_FIRST_FREE_OBJECTID;
  if (ioctl(sv, BTRFS_IOC_INO_LOOKUP, &il) < 0)
    return -1;
  memset(&sa, 0, sizeof(sa));
  k->tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  k->min_type = k->max_type = BTRFS_QGROUP_INFO_KEY;
  k->min_offset = k->max_offset = il.treeid; /* level 0: the subvolume's own qgroup */
  k->max_transid = (uint64_t) -1;
  k->nr_items = 1;
  if (ioctl(sv, BTRFS_IOC_TREE_SEARCH, &sa) < 0 || k->nr_items < 1)
    return -1;
  memcpy(&sh, sa.buf, sizeof(sh));
  if (sh.type != BTRFS_QGROUP_INFO_KEY || sh.offset != il.treeid || sh.len < sizeof(qi))
    return -1;
  memcpy(&qi, sa.buf + sizeof(sh), sizeof(qi));
  return (int64_t) le64toh(qi.rfer);
}

/* What overlayfs leaves in a box's work/ (a volatile mount marks it so
 * that no next mount takes it unawares: its "dirty" a file or, on some
 * kernels, a dir), deepest first. */
static const char *const work_dirs[] = {"work/incompat/volatile/dirty", "work/incompat/volatile",
                                        "work/incompat", "work"};

/* Keeps boxes/<id> of the pool at dir as a spare, its box gone: 0, or -1
 * and it is left as it was (the caller deletes it). */
static int box_keep(const char *dir, const char *id) {
  cleanup_close int boxes = -1, sv = -1;
  char spare[sizeof(TP__SPARE_SV_PREFIX) + 256], *path = NULL;
  struct stat st;
  int64_t rfer;
  int64_t bytes;
  int d, budget, r;

  if (tp__spares_full(&sv_spares) || !plain_name(id) ||
      (boxes = open_in_pool(dir, "boxes", &(tp_error_t){0})) < 0)
    return -1;
  sv = openat(boxes, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sv < 0 || fstat(sv, &st) < 0 || st.st_ino != TP__SUBVOL_ROOT_INO)
    return -1;
  if (unlinkat(sv, TP__AGENT_SOCK, 0) < 0 && errno != ENOENT)
    return -1;
  if ((d = openat(sv, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
    return -1;
  budget = TP__SPARE_ENTRIES_MAX;
  bytes = TP__SPARE_BYTES_MAX;
  r = clear(d, 0, &budget, &bytes);
  close(d);
  if (r < 0)
    return -1;
  /* work/: only overlayfs's work_dirs, which go (an rmdir fails on
   * anything more in them) */
  if ((d = openat(sv, "work", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
    return -1;
  for (size_t i = 0; i < sizeof(work_dirs) / sizeof(work_dirs[0]); i++)
    if (unlinkat(d, work_dirs[i], i == 0 ? 0 : AT_REMOVEDIR) < 0 && errno != ENOENT &&
        (errno != EISDIR || unlinkat(d, work_dirs[i], AT_REMOVEDIR) < 0)) {
      close(d);
      return -1;
    }
  r = tp__dir_only(d, NULL);
  close(d);
  if (r != 1)
    return -1;
  /* upper/ and work/ only (a dup: sv stays open, its offset unread) */
  if ((d = dup(sv)) < 0)
    return -1;
  r = tp__dir_only(d, (const char *const[]){"upper", "work", NULL});
  close(d);
  if (r != 1)
    return -1;
  rfer = rfer_of(sv);
  if (rfer < 0 || rfer >= TP__SPARE_RFER_MAX)
    return -1;
  if (unlinkat(sv, "upper", AT_REMOVEDIR) < 0 || mkdirat(sv, "upper", 0755) < 0)
    return -1;
  snprintf(spare, sizeof(spare), TP__SPARE_SV_PREFIX "%s", id);
  if (asprintf(&path, "%s/boxes/%s", dir, spare) < 0)
    return -1;
  if (renameat2(boxes, id, boxes, spare, RENAME_NOREPLACE) < 0) {
    free(path);
    return -1;
  }
  if (tp__spares_put(&sv_spares, path) < 0) { /* filled meanwhile */
    free(path);
    close(sv);
    sv = -1;
    subvol_destroy(boxes, spare, &(tp_error_t){0});
  }
  return 0;
}

/* A spare of the pool at dir renamed to boxes/<id>: its fd, or -1 (none,
 * or it could not be had: then it is deleted). */
static int box_take(int boxes, const char *dir, const char *id) {
  char *prefix = NULL, *got;
  const char *name;
  int sv;

  if (asprintf(&prefix, "%s/boxes/", dir) < 0)
    return -1;
  got = tp__spares_take(&sv_spares, prefix);
  name = got != NULL ? got + strlen(prefix) : NULL;
  free(prefix);
  if (got == NULL)
    return -1;
  if (renameat2(boxes, name, boxes, id, RENAME_NOREPLACE) < 0) {
    subvol_destroy(boxes, name, &(tp_error_t){0});
    free(got);
    return -1;
  }
  free(got);
  sv = openat(boxes, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sv < 0)
    subvol_destroy(boxes, id, &(tp_error_t){0});
  return sv;
}

int tp__pool_box_keep(const char *dir, const char *id, tp_error_t *err) {
  if (box_keep(dir, id) == 0)
    return 0;
  return tp_linux_pool_drop(dir, "boxes", id, err);
}

int tp__pool_box_make(const char *dir, const char *id, int64_t bytes, uid_t uid, gid_t gid,
                      tp_error_t *err) {
  cleanup_close int boxes = -1, sv = -1;
  struct btrfs_ioctl_vol_args va;
  struct btrfs_ioctl_qgroup_limit_args ql;
  int spare = 0;

  if (!plain_name(id))
    return tp_error_set(err, EINVAL, "bad box id for the pool");
  boxes = open_in_pool(dir, "boxes", err);
  if (boxes < 0)
    return -1;
  /* a spare has upper/ (made anew, root's) and work/ already; it is taken
   * only with a cap to set, which replaces its last box's */
  if (bytes > 0 && (sv = box_take(boxes, dir, id)) >= 0) {
    spare = 1;
    goto limit;
  }
  memset(&va, 0, sizeof(va));
  snprintf(va.name, sizeof(va.name), "%s", id);
  if (ioctl(boxes, BTRFS_IOC_SUBVOL_CREATE, &va) < 0)
    return tp_error_errno(err, errno, "create subvolume boxes/%s (BTRFS_IOC_SUBVOL_CREATE)", id);
  sv = openat(boxes, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sv < 0) {
    tp_error_errno(err, errno, "open subvolume boxes/%s", id);
    goto fail;
  }
limit:
  /* qgroupid 0: the subvolume sv is; referenced bytes, so what the box
   * shares with a snapshot of it counts too, as on its own disk */
  memset(&ql, 0, sizeof(ql));
  ql.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  ql.lim.max_rfer = (uint64_t) bytes;
  if (bytes > 0 && ioctl(sv, BTRFS_IOC_QGROUP_LIMIT, &ql) < 0) {
    tp_error_errno(err, errno, "limit boxes/%s to %lld bytes (BTRFS_IOC_QGROUP_LIMIT)", id,
                   (long long) bytes);
    goto fail;
  }
  if ((!spare && mkdirat(sv, "upper", 0755) < 0) || fchmodat(sv, "upper", 0755, 0) < 0 ||
      fchownat(sv, "upper", uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ||
      (!spare && mkdirat(sv, "work", 0700) < 0)) {
    tp_error_errno(err, errno, "make upper/ and work/ in boxes/%s", id);
    goto fail;
  }
  return 0;
fail:
  close(sv);
  sv = -1;
  subvol_destroy(boxes, id, &(tp_error_t){0});
  return -1;
}

int tp_linux_pool_drop(const char *dir, const char *sub, const char *name, tp_error_t *err) {
  cleanup_close int parent = -1;
  if ((strcmp(sub, "boxes") != 0 && strcmp(sub, "snaps") != 0) || !plain_name(name))
    return tp_error_set(err, EINVAL, "bad pool subvolume %s/%s", sub, name);
  parent = open_in_pool(dir, sub, err);
  if (parent < 0)
    return -1;
  return subvol_destroy(parent, name, err);
}

int tp_linux_pool_snapshot(const char *dir, const char *box_id, const char *name, tp_error_t *err) {
  cleanup_close int boxes = -1, snaps = -1, src = -1;
  struct btrfs_ioctl_vol_args_v2 va;
  char tmp[256];

  if (!plain_name(box_id) || !plain_name(name) || name[0] == '.')
    return tp_error_set(err, EINVAL, "bad name for a pool snapshot");
  boxes = open_in_pool(dir, "boxes", err);
  if (boxes < 0)
    return -1;
  snaps = open_in_pool(dir, "snaps", err);
  if (snaps < 0)
    return -1;
  src = openat(boxes, box_id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (src < 0)
    return tp_error_errno(err, errno, "open boxes/%s", box_id);
  /* what the box wrote is on the pool before the snapshot (the kernel
   * flushes the subvolume's delalloc too; this covers the rest) */
  if (syncfs(src) < 0)
    return tp_error_errno(err, errno, "syncfs the pool");
  /* a temp name first: a daemon killed before the rename leaves only a
   * .tmp-* subvolume, which the next open of the snapshots removes */
  snprintf(tmp, sizeof(tmp), ".tmp-%s", name);
  memset(&va, 0, sizeof(va));
  va.fd = src;
  va.flags = BTRFS_SUBVOL_RDONLY;
  snprintf(va.name, sizeof(va.name), "%s", tmp);
  if (ioctl(snaps, BTRFS_IOC_SNAP_CREATE_V2, &va) < 0)
    return tp_error_errno(err, errno, "snapshot boxes/%s (BTRFS_IOC_SNAP_CREATE_V2)", box_id);
  if (renameat(snaps, tmp, snaps, name) < 0) {
    int e = errno;
    subvol_destroy(snaps, tmp, &(tp_error_t){0});
    return tp_error_errno(err, e, "rename snapshot to snaps/%s", name);
  }
  return 0;
}

int tp_linux_pool_is_subvol(const char *path) {
  cleanup_close int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  uint64_t flags = 0;
  if (fd < 0 || !is_btrfs_fd(fd) || fstat(fd, &st) < 0 || st.st_ino != TP__SUBVOL_ROOT_INO)
    return 0;
  if (ioctl(fd, BTRFS_IOC_SUBVOL_GETFLAGS, &flags) < 0)
    return 0;
  return (flags & BTRFS_SUBVOL_RDONLY) ? 2 : 1;
}
