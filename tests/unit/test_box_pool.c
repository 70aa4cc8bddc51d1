/* The btrfs pool of box upper dirs (backends/linux/pool_btrfs.c) with the
 * real agent: a pool made and mounted in the test's temp dir, a box on it
 * (its subvolume, its qgroup limit: EDQUOT past the cap), a read-only
 * snapshot that does not copy, the destroy deleting the box's subvolume, a
 * second open adopting the mount, the close unmounting it.  TAP-ish; exit
 * 0 pass, 1 fail, 77 skip (not root, no btrfs or mkfs.btrfs, no agent). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
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

static int64_t used(const char *path) {
  struct statfs st;
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  syncfs(fd);
  close(fd);
  if (statfs(path, &st) < 0)
    return -1;
  return (int64_t) (st.f_blocks - st.f_bfree) * st.f_bsize;
}

/* Entries of dir other than the agent's socket and the pool link: the
 * setup's mount points and links are on the box's tmpfs, not here. */
static int other_entries(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  if (d == NULL)
    return -1;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
        strcmp(de->d_name, "agent.sock") != 0 && strcmp(de->d_name, "pool") != 0)
      n++;
  closedir(d);
  return n;
}

/* Spare box dirs (box_spare.c): with <parent>/.spare made, a destroyed
 * box's dir goes there emptied (no socket, no pool name) and the next start
 * takes that very dir (its inode) under its own name. */
static void spare_part(const env_t *e, const char *pool) {
  tp_error_t err = {0};
  char *spare = path_in(tmp_root, ".spare"), *a = path_in(tmp_root, "sa"),
       *b = path_in(tmp_root, "sb"), *kept = path_in(tmp_root, ".spare/sa"),
       *sock = path_in(kept, "agent.sock");
  tp_box_spec_t s = spec_for(e, "sa", a);
  tp_box_t box;
  struct stat st_kept, st_b;
  char name[400];
  int r;

  check(mkdir(spare, 0700) == 0, "spare: .spare made");
  s.disk_bytes = 32 << 20;
  s.pool = pool;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "spare: a box started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  r = tp_linux_box_destroy(&box, a, &err);
  check(r == 0 && !exists(a) && exists(kept), "spare: its dir kept in .spare (%s)",
        r < 0 ? err.msg : "ok");
  check(stat(kept, &st_kept) == 0 && other_entries(kept) == 0 && !exists(sock),
        "spare: kept empty");
  check(lgetxattr(kept, "trusted.tupper.pool", name, sizeof(name)) < 0,
        "spare: kept without the pool's name");
  s.id = "sb";
  s.box_dir = b;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "spare: a second box started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  check(!exists(kept) && stat(b, &st_b) == 0 && st_b.st_ino == st_kept.st_ino,
        "spare: the second box took the kept dir");
  r = tp_linux_box_destroy(&box, b, &err);
  check(r == 0 && !exists(b), "spare: the second box destroyed (%s)", r < 0 ? err.msg : "ok");
out:
  tp_rmtree(spare, NULL);
  free(spare);
  free(a);
  free(b);
  free(kept);
  free(sock);
}

/* Spare subvolumes (pool_btrfs.c): a destroyed box that left little in
 * its subvolume (a small file, a dir) has it renamed to boxes/.spare-<id>,
 * emptied and its upper/ made anew (the box had chmod'ed its "/"), and the
 * next box gets that very subvolume (its st_dev) with its own cap and a
 * clean "/"; a box that left 32 MiB has its subvolume deleted. */
static void spare_subvol_part(const env_t *e, const char *pool) {
  tp_error_t err = {0};
  char *a = path_in(tmp_root, "va"), *b = path_in(tmp_root, "vb"), path[400], *o;
  tp_box_spec_t s = spec_for(e, "va", a);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  struct stat st_kept, st_b, st_up;
  int r;

  s.disk_bytes = 32 << 20;
  s.pool = pool;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "spare subvolume: a box started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;
  o = box_out(&c, "chmod 700 / && mkdir -p /etc/zz && echo left > /zzz && stat -c %a /");
  check(strcmp(o, "700") == 0, "spare subvolume: the box chmod'ed its /, left a file ('%s')", o);
  free(o);
  r = tp_linux_box_destroy(&box, a, &err);
  snprintf(path, sizeof(path), "%s/boxes/.spare-va", pool);
  check(r == 0 && tp_linux_pool_is_subvol(path) == 1 && stat(path, &st_kept) == 0,
        "spare subvolume: kept as boxes/.spare-va (%s)", r < 0 ? err.msg : "ok");
  snprintf(path, sizeof(path), "%s/boxes/.spare-va/upper", pool);
  memset(&st_up, 0, sizeof(st_up));
  r = stat(path, &st_up);
  check(r == 0 && (st_up.st_mode & 07777) == 0755 && st_up.st_uid == 0 && other_entries(path) == 0,
        "spare subvolume: its upper/ made anew, empty (%o, uid %u)", (unsigned) (st_up.st_mode & 07777),
        (unsigned) st_up.st_uid);
  snprintf(path, sizeof(path), "%s/boxes/.spare-va/agent.sock", pool);
  check(!exists(path), "spare subvolume: without the agent's socket");

  free(c.buf);
  c = (conn_t){-1, NULL, 0, 0, 0};
  s = spec_for(e, "vb", b);
  s.disk_bytes = 32 << 20;
  s.pool = pool;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "spare subvolume: a second box started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;
  snprintf(path, sizeof(path), "%s/boxes/vb", pool);
  check(stat(path, &st_b) == 0 && st_b.st_dev == st_kept.st_dev,
        "spare subvolume: the second box took it (the same subvolume)");
  snprintf(path, sizeof(path), "%s/boxes/.spare-va", pool);
  check(!exists(path), "spare subvolume: no longer a spare");
  o = box_out(&c, "stat -c '%a %u' /; ls -A / /etc | grep -c zz; "
                  "dd if=/dev/zero of=/big bs=1M count=40 2>&1 | grep -o 'Disk quota exceeded'"
                  " | head -1");
  check(strcmp(o, "755 0\n0\nDisk quota exceeded") == 0,
        "spare subvolume: a clean / (mode 755, root's, nothing the first left) and the "
        "second box's own 32 MiB cap ('%s')",
        o);
  free(o);
  r = tp_linux_box_destroy(&box, b, &err);
  snprintf(path, sizeof(path), "%s/boxes/vb", pool);
  check(r == 0 && !exists(path), "spare subvolume: the second box destroyed (%s)",
        r < 0 ? err.msg : "ok");
  snprintf(path, sizeof(path), "%s/boxes/.spare-vb", pool);
  check(!exists(path), "spare subvolume: one a box left 32 MiB in is deleted, not kept");
out:
  free(c.buf);
  free(a);
  free(b);
}

static void test_pool(const env_t *e) {
  tp_error_t err = {0};
  char *pool = path_in(tmp_root, "pool"), *box_dir = path_in(tmp_root, "pbox");
  char path[400];
  tp_box_spec_t s = spec_for(e, "pooled", box_dir);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  int adopted = -1, r;
  int64_t before;
  char *o;

  r = tp_linux_pool_open(pool, 2LL << 30, &adopted, &err);
  check(r == 0 && adopted == 0, "open: a 2 GiB pool made and mounted (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  check(mounts_matching(pool) == 1, "open: mounted at its dir");
  s.disk_bytes = 32 << 20;
  s.pool = pool;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "box: started on the pool (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto close;
  c.fd = box.chan_fd;
  snprintf(path, sizeof(path), "%s/boxes/pooled", pool);
  check(tp_linux_pool_is_subvol(path) == 1, "box: its upper dir is a writable subvolume");
  {
    char name[400], link[400];
    ssize_t n = lgetxattr(box_dir, "trusted.tupper.pool", name, sizeof(name) - 1);
    snprintf(link, sizeof(link), "%s/pool", box_dir);
    if (n < 0 && errno == EOPNOTSUPP)
      n = readlink(link, name, sizeof(name) - 1);
    else
      check(!exists(link), "box: no pool link where the xattr names the subvolume");
    if (n >= 0)
      name[n] = '\0';
    check(n > 0 && strcmp(name, path) == 0, "box: its dir names the subvolume ('%s')",
          n > 0 ? name : strerror(errno));
    n = other_entries(box_dir);
    check(n == 0, "box: its dir holds nothing: the socket is in the subvolume (%d entries)", (int) n);
    {
      struct stat st;
      char sock[440];
      snprintf(sock, sizeof(sock), "%s/agent.sock", path);
      check(lstat(sock, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600 &&
                st.st_uid == 0,
            "box: the agent's socket is in its subvolume's root, root's, 0600");
      snprintf(sock, sizeof(sock), "%s/agent.sock", box_dir);
      check(!exists(sock), "box: and not in its dir");
    }
  }
  o = box_out(&c, "dd if=/dev/zero of=/big bs=1M count=64 2>&1 | grep -o 'Disk quota exceeded'"
                  " | head -1; rm /big; sync; head -c 4000000 /dev/urandom > /ok && echo ok-after");
  check(strcmp(o, "Disk quota exceeded\nok-after") == 0,
        "box: writing past 32 MiB gets EDQUOT, freeing makes room ('%s')", o);
  free(o);
  o = box_out(&c, "head -c 16000000 /dev/urandom > /data && echo written");
  free(o);

  before = used(pool);
  r = tp_linux_pool_snapshot(pool, "pooled", "snap1", &err);
  check(r == 0, "snapshot: taken (%s)", r < 0 ? err.msg : "ok");
  snprintf(path, sizeof(path), "%s/snaps/snap1", pool);
  check(tp_linux_pool_is_subvol(path) == 2, "snapshot: a read-only subvolume");
  check(used(pool) - before < (4 << 20), "snapshot: the 16 MB the box wrote were not copied (%lld)",
        (long long) (used(pool) - before));
  snprintf(path, sizeof(path), "%s/snaps/snap1/upper/data", pool);
  check(open(path, O_WRONLY | O_CLOEXEC) < 0 && errno == EROFS, "snapshot: refuses writes");
  snprintf(path, sizeof(path), "%s/snaps/.tmp-snap1", pool);
  check(!exists(path), "snapshot: no temp name left");
  r = tp_linux_pool_snapshot(pool, "pooled", "../x", &err);
  check(r < 0 && err.code == EINVAL, "snapshot: a name with '/' refused (%s)", err.msg);
  r = tp_linux_pool_drop(pool, "..", "boxes", &err);
  check(r < 0 && err.code == EINVAL, "drop: only boxes/ and snaps/ (%s)", err.msg);

  r = tp_linux_box_destroy(&box, box_dir, &err);
  check(r == 0, "box: destroyed (%s)", r < 0 ? err.msg : "ok");
  snprintf(path, sizeof(path), "%s/boxes/pooled", pool);
  check(!exists(path) && !exists(box_dir), "box: its subvolume and dir are gone");
  snprintf(path, sizeof(path), "%s/snaps/snap1/upper/data", pool);
  check(exists(path), "snapshot: outlives the box");
  spare_part(e, pool);
  spare_subvol_part(e, pool);

  adopted = -1;
  r = tp_linux_pool_open(pool, 2LL << 30, &adopted, &err);
  check(r == 0 && adopted == 1, "open: a second open adopts the mount (%s)", r < 0 ? err.msg : "ok");
  r = tp_linux_pool_drop(pool, "snaps", "snap1", &err);
  snprintf(path, sizeof(path), "%s/snaps/snap1", pool);
  check(r == 0 && !exists(path), "drop: the snapshot deleted (%s)", r < 0 ? err.msg : "ok");
  {
    /* an admin's umount -l while something still holds the filesystem: a
     * second mount of the image through another loop device is refused */
    int hold = open(pool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    check(hold >= 0 && umount2(pool, MNT_DETACH) == 0, "open: the pool detached, still held");
    memset(&err, 0, sizeof(err));
    r = tp_linux_pool_open(pool, 2LL << 30, &adopted, &err);
    check(r < 0 && err.code == EBUSY && mounts_matching(pool) == 0,
          "open: refused while its image is still attached (%s)", r < 0 ? err.msg : "mounted");
    if (r == 0)
      umount2(pool, MNT_DETACH);
    if (hold >= 0)
      close(hold);
  }
  /* as after a reboot: the image mounted again, what it held still there */
  for (int i = 0; i < 300 && loops_backed_by(tmp_root) > 0; i++)
    poll(NULL, 0, 10);
  memset(&err, 0, sizeof(err));
  adopted = -1;
  r = tp_linux_pool_open(pool, 2LL << 30, &adopted, &err);
  snprintf(path, sizeof(path), "%s/snaps", pool);
  check(r == 0 && adopted == 0 && mounts_matching(pool) == 1 && exists(path),
        "open: the existing image mounted again (%s)", r < 0 ? err.msg : "ok");
close:
  r = tp_linux_pool_close(pool, &err);
  check(r == 0 && mounts_matching(pool) == 0, "close: unmounted (%s)", r < 0 ? err.msg : "ok");
  /* the box's mount namespace lets go of the filesystem a moment after
   * its last process: then the loop device detaches itself */
  for (int i = 0; i < 300 && loops_backed_by(tmp_root) > 0; i++)
    poll(NULL, 0, 10);
  check(loops_backed_by(tmp_root) == 0, "close: the loop device went with the last user");
out:
  free(c.buf);
  free(pool);
  free(box_dir);
}

int main(void) {
  env_t env = {NULL, {NULL, NULL}, -1};
  tp_error_t err = {0};
  int r;

  if (tp_linux_pool_probe(&err) < 0) {
    printf("1..0 # SKIP %s\n", err.msg);
    return 77;
  }
  r = box_env_begin(&env, 0);
  if (r == 0)
    test_pool(&env);
  return r > 0 ? r : linux_test_end(&env, 0);
}
