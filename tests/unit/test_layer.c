/* Unit tests for the layer unpacker and blob store (backends/linux/layer.c):
 * tars are written here with libarchive, hostile ones included, and each
 * refusal is checked along with what is left on disk (nothing).  Needs root
 * (chown, mknod of whiteouts, trusted.* xattrs): else exit 77. */
#define _GNU_SOURCE
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "layer.h"
#include "rmtree.h"
#include "tap.h"

#define BASE 100000000u

static char tmp_root[256];

enum { F, D, L, H, C, B, P }; /* file, dir, symlink, hardlink, char dev, block dev, fifo */

typedef struct ent_s {
  int type;
  const char *path;
  const char *data; /* file contents, or link target */
  int mode;
  long long uid;
  long long size; /* for files: 0 = strlen(data); a bigger size writes zeros */
} ent_t;

static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0)
    abort();
  return p;
}

/* Writes the entries as a tar ("gzip", "zstd" or NULL: plain) at path. */
static int make_tar(const char *path, const char *filter, const ent_t *ents, int n) {
  struct archive *a = archive_write_new();
  struct archive_entry *e = archive_entry_new();
  static char zeros[65536];
  int ok = 1;
  archive_write_set_format_pax_restricted(a);
  if (filter && strcmp(filter, "gzip") == 0)
    archive_write_add_filter_gzip(a);
  else if (filter && strcmp(filter, "zstd") == 0)
    archive_write_add_filter_zstd(a);
  if (archive_write_open_filename(a, path) != ARCHIVE_OK)
    return -1;
  for (int i = 0; i < n && ok; i++) {
    const ent_t *x = &ents[i];
    long long size = x->type == F ? (x->size ? x->size : (long long) strlen(x->data)) : 0;
    archive_entry_clear(e);
    archive_entry_set_pathname(e, x->path);
    archive_entry_set_uid(e, x->uid);
    archive_entry_set_gid(e, x->uid);
    archive_entry_set_mtime(e, 1700000000, 0);
    switch (x->type) {
    case F: archive_entry_set_filetype(e, AE_IFREG); break;
    case D: archive_entry_set_filetype(e, AE_IFDIR); break;
    case L: archive_entry_set_filetype(e, AE_IFLNK); archive_entry_set_symlink(e, x->data); break;
    case H: archive_entry_set_filetype(e, AE_IFREG); archive_entry_set_hardlink(e, x->data); break;
    case C: archive_entry_set_filetype(e, AE_IFCHR); archive_entry_set_rdev(e, makedev(x->size, 0)); break;
    case B: archive_entry_set_filetype(e, AE_IFBLK); archive_entry_set_rdev(e, makedev(8, 0)); break;
    case P: archive_entry_set_filetype(e, AE_IFIFO); break;
    }
    archive_entry_set_perm(e, x->mode ? x->mode : (x->type == D ? 0755 : 0644));
    archive_entry_set_size(e, size);
    if (archive_write_header(a, e) < ARCHIVE_WARN) {
      ok = 0;
      break;
    }
    if (x->type == F) {
      long long left = size - (long long) strlen(x->data);
      archive_write_data(a, x->data, strlen(x->data));
      while (left > 0) {
        size_t k = left > (long long) sizeof(zeros) ? sizeof(zeros) : (size_t) left;
        archive_write_data(a, zeros, k);
        left -= (long long) k;
      }
    }
  }
  archive_entry_free(e);
  if (archive_write_close(a) != ARCHIVE_OK)
    ok = 0;
  archive_write_free(a);
  return ok ? 0 : -1;
}

static tp_layer_opts_t opts(void) {
  tp_layer_opts_t o = {.uid_base = BASE, .gid_base = BASE, .id_count = 65536,
                       .max_tar_bytes = 64 << 20, .max_bytes = 64 << 20,
                       .max_entries = 10000};
  return o;
}

/* Entries of dir (. and .. aside). */
static int count_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      n++;
  if (d)
    closedir(d);
  return n;
}

static int st_is(const char *dir, const char *rel, mode_t type, uid_t uid, mode_t perm) {
  struct stat st;
  char *p = path_in(dir, rel);
  int r = lstat(p, &st) == 0 && (st.st_mode & S_IFMT) == type && st.st_uid == uid &&
          (perm == (mode_t) -1 || (st.st_mode & 07777) == perm);
  free(p);
  return r;
}

static void test_good(const char *layers) {
  const ent_t ents[] = {
      {D, "./", NULL, 0755, 0, 0},
      {D, "etc", NULL, 0755, 0, 0},
      {F, "etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0644, 0, 0},
      {F, "./usr//bin/./tool", "#!/bin/sh\n", 04755, 0, 0}, /* implicit parents, setuid */
      {D, "home/user", NULL, 0700, 1000, 0},
      {F, "home/user/big", "x", 0600, 1000, 300000},
      {L, "etc/mtab", "/proc/self/mounts", 0777, 0, 0},
      {H, "usr/bin/tool2", "usr/bin/tool", 0, 0, 0},
      {F, "gone/.wh.old", "", 0, 0, 0},
      {F, "opq/.wh..wh..opq", "", 0, 0, 0},
      {C, "dev-wh", NULL, 0, 0, 0},
      {F, ".wh..wh.plnk", "", 0, 0, 0},
      {F, "etc/passwd", "root:x:0:0::/root:/bin/sh\nlater:x:1:1::/:/bin/sh\n", 0644, 0, 0},
  };
  char *gz = path_in(tmp_root, "good.tar.gz"), *plain = path_in(tmp_root, "good.tar");
  char *zst = path_in(tmp_root, "good.tar.zst");
  char digest[TP_DIGEST_LEN + 1], plain_digest[TP_DIGEST_LEN + 1], buf[64];
  tp_layer_opts_t o = opts();
  tp_layer_info_t info, info2;
  tp_error_t err = {0};
  char *dir, *p;
  struct stat a, b;
  int r, n = (int) (sizeof(ents) / sizeof(ents[0]));

  check(make_tar(gz, "gzip", ents, n) == 0 && make_tar(plain, NULL, ents, n) == 0 &&
            make_tar(zst, "zstd", ents, n) == 0,
        "good: tars written");
  check(tp_blob_put(gz, NULL, NULL, 1 << 30, digest, &err) == 0 &&
            tp_blob_put(plain, NULL, NULL, 1 << 30, plain_digest, &err) == 0,
        "good: blobs hashed");
  o.want_digest = digest;
  o.want_diff_id = plain_digest;
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r == 0, "good: gzip layer unpacked (%s)", r < 0 ? err.msg : "ok");
  check(strcmp(info.digest, digest) == 0 && strcmp(info.diff_id, plain_digest) == 0,
        "good: digest is the blob's, diff id the plain tar's");
  dir = path_in(layers, plain_digest + 7);
  check(st_is(dir, "", S_IFDIR, BASE, 0755), "good: root owned by the box's root");
  check(st_is(dir, "etc/passwd", S_IFREG, BASE, 0644), "good: file, owner shifted");
  p = path_in(dir, "etc/passwd");
  {
    FILE *f = fopen(p, "r");
    size_t k = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[k] = '\0';
    if (f)
      fclose(f);
  }
  free(p);
  check(strstr(buf, "later") != NULL, "good: a later entry of the same path wins");
  check(st_is(dir, "usr/bin/tool", S_IFREG, BASE, 04755), "good: setuid kept, implicit parents");
  check(st_is(dir, "usr/bin", S_IFDIR, BASE, 0755), "good: implicit parent owned, 0755");
  check(st_is(dir, "home/user", S_IFDIR, BASE + 1000, 0700), "good: uid 1000 -> base+1000");
  check(st_is(dir, "home/user/big", S_IFREG, BASE + 1000, 0600), "good: big file");
  check(st_is(dir, "etc/mtab", S_IFLNK, BASE, (mode_t) -1), "good: symlink stored");
  p = path_in(dir, "etc/mtab");
  r = (int) readlink(p, buf, sizeof(buf) - 1);
  buf[r > 0 ? r : 0] = '\0';
  free(p);
  check(strcmp(buf, "/proc/self/mounts") == 0, "good: symlink target kept as is");
  {
    char *p1 = path_in(dir, "usr/bin/tool"), *p2 = path_in(dir, "usr/bin/tool2");
    check(stat(p1, &a) == 0 && stat(p2, &b) == 0 && a.st_ino == b.st_ino,
          "good: hardlink is the same inode");
    free(p1);
    free(p2);
  }
  p = path_in(dir, "gone/old");
  check(lstat(p, &a) == 0 && S_ISCHR(a.st_mode) && a.st_rdev == makedev(0, 0),
        "good: .wh.old became a whiteout (char 0:0)");
  free(p);
  p = path_in(dir, "dev-wh");
  check(lstat(p, &a) == 0 && S_ISCHR(a.st_mode) && a.st_rdev == 0, "good: char 0:0 kept");
  free(p);
  p = path_in(dir, "opq");
  r = (int) getxattr(p, "trusted.overlay.opaque", buf, sizeof(buf));
  check(r == 1 && buf[0] == 'y', "good: .wh..wh..opq made its dir opaque");
  free(p);
  p = path_in(dir, "opq/.wh..wh..opq");
  check(lstat(p, &a) < 0, "good: no marker files left");
  free(p);
  check(count_dir(dir) == 6, "good: root holds etc usr home gone opq dev-wh (.wh..wh.plnk skipped)");

  /* zstd: the same tar, so the same diff id: the dir exists already */
  o.want_digest = NULL;
  r = tp_layer_unpack(zst, layers, &o, &info2, &err);
  check(r == 0 && info2.existed && strcmp(info2.diff_id, plain_digest) == 0,
        "good: zstd layer with the same diff id (%s)", r < 0 ? err.msg : "ok");
  check(count_dir(layers) == 1, "good: one layer dir, no temp dir");
  tp_rmtree(dir, NULL);
  free(dir);
  free(gz);
  free(plain);
  free(zst);
}

/* Each hostile tar is refused with msg in the error and leaves nothing. */
static void refused(const char *layers, const char *what, const char *filter, const ent_t *ents,
                    int n, tp_layer_opts_t o, const char *msg) {
  char *blob = path_in(tmp_root, "bad.tar");
  tp_layer_info_t info;
  tp_error_t err = {0};
  int r;
  unlink(blob);
  if (make_tar(blob, filter, ents, n) < 0) {
    check(0, "%s: tar written", what);
    free(blob);
    return;
  }
  r = tp_layer_unpack(blob, layers, &o, &info, &err);
  check(r < 0 && strstr(err.msg, msg) != NULL, "%s: refused (%s)", what, err.msg);
  check(count_dir(layers) == 0, "%s: nothing left in the layers dir", what);
  unlink(blob);
  free(blob);
}

static void test_hostile(const char *layers) {
  char *outside = path_in(tmp_root, "outside");
  char *pwned = path_in(outside, "pwned");
  char target[512];
  tp_layer_opts_t o = opts();
  mkdir(outside, 0755);

  ent_t dotdot[] = {{F, "a/../../evil", "x", 0, 0, 0}};
  refused(layers, "'..' path", NULL, dotdot, 1, o, "leads out of the layer");
  ent_t abs[] = {{F, "/etc/evil", "x", 0, 0, 0}};
  refused(layers, "absolute path", NULL, abs, 1, o, "is absolute");
  snprintf(target, sizeof(target), "%s", outside);
  ent_t through[] = {{L, "link", target, 0, 0, 0}, {F, "link/pwned", "x", 0, 0, 0}};
  refused(layers, "write through a symlink", NULL, through, 2, o, "goes through a symlink");
  check(access(pwned, F_OK) < 0, "write through a symlink: nothing written outside");
  ent_t through_dir[] = {{L, "link", target, 0, 0, 0}, {D, "link/sub", NULL, 0, 0, 0}};
  refused(layers, "mkdir through a symlink", NULL, through_dir, 2, o, "goes through a symlink");
  ent_t hl_out[] = {{H, "passwd", "../../../../etc/passwd", 0, 0, 0}};
  refused(layers, "hardlink out by ..", NULL, hl_out, 1, o, "leads out of the layer");
  ent_t hl_abs[] = {{H, "passwd", "/etc/passwd", 0, 0, 0}};
  refused(layers, "hardlink to an absolute path", NULL, hl_abs, 1, o, "is absolute");
  ent_t hl_missing[] = {{H, "passwd", "etc/passwd", 0, 0, 0}};
  refused(layers, "hardlink to nothing in the layer", NULL, hl_missing, 1, o, "not in this layer");
  ent_t hl_sym[] = {{L, "l", target, 0, 0, 0}, {H, "x", "l/pwned", 0, 0, 0}};
  refused(layers, "hardlink through a symlink", NULL, hl_sym, 2, o, "goes through a symlink");
  ent_t hl_dir[] = {{D, "d", NULL, 0, 0, 0}, {H, "x", "d", 0, 0, 0}};
  refused(layers, "hardlink to a dir", NULL, hl_dir, 2, o, "not a file");
  ent_t chr[] = {{C, "dev/mem", NULL, 0, 0, 1}};
  refused(layers, "char device", NULL, chr, 1, o, "device node");
  ent_t blk[] = {{B, "dev/sda", NULL, 0, 0, 0}};
  refused(layers, "block device", NULL, blk, 1, o, "device node");
  ent_t fifo[] = {{P, "fifo", NULL, 0, 0, 0}};
  refused(layers, "fifo", NULL, fifo, 1, o, "fifo");
  ent_t uid[] = {{F, "f", "x", 0, 70000, 0}};
  refused(layers, "uid past the range", NULL, uid, 1, o, "outside the sandbox's ids");
  ent_t replace_dir[] = {{D, "d", NULL, 0, 0, 0}, {F, "d/x", "x", 0, 0, 0}, {F, "d", "x", 0, 0, 0}};
  refused(layers, "file over a dir", NULL, replace_dir, 3, o, "would replace a directory");
  ent_t bad_wh[] = {{F, "d/.wh..", "", 0, 0, 0}};
  refused(layers, "whiteout of ..", NULL, bad_wh, 1, o, "names nothing");

  /* bombs: 200 MiB of zeros, gzip'ed to a few hundred KiB */
  ent_t bomb[] = {{F, "zeros", "", 0, 0, 200LL << 20}};
  o.max_tar_bytes = 16 << 20;
  o.max_bytes = 1ULL << 40;
  refused(layers, "decompression bomb", "gzip", bomb, 1, o, "decompression bomb");
  o = opts();
  o.max_bytes = 1 << 20;
  ent_t big[] = {{F, "a", "", 0, 0, 600 << 10}, {F, "b", "", 0, 0, 600 << 10}};
  refused(layers, "file bytes over the cap", NULL, big, 2, o, "hold more than");
  o = opts();
  o.max_entries = 50;
  {
    ent_t many[60];
    char names[60][16];
    for (int i = 0; i < 60; i++) {
      snprintf(names[i], sizeof(names[i]), "f%d", i);
      many[i] = (ent_t){F, names[i], "x", 0, 0, 0};
    }
    refused(layers, "entries over the cap", NULL, many, 60, o, "more than 50 entries");
  }
  free(pwned);
  free(outside);
}

static void test_corrupt(const char *layers) {
  const ent_t ents[] = {{F, "a", "hello", 0, 0, 200000}, {F, "b", "world", 0, 0, 0}};
  char *gz = path_in(tmp_root, "c.tar.gz");
  char digest[TP_DIGEST_LEN + 1];
  tp_layer_opts_t o = opts();
  tp_layer_info_t info;
  tp_error_t err = {0};
  struct stat st;
  int r;

  make_tar(gz, "gzip", ents, 2);
  stat(gz, &st);
  check(truncate(gz, st.st_size / 2) == 0, "truncated gzip: made");
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r < 0 && count_dir(layers) == 0, "truncated gzip: refused, nothing left (%s)", err.msg);

  unlink(gz);
  make_tar(gz, "gzip", ents, 2);
  o.want_digest = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r < 0 && strstr(err.msg, "digest mismatch") && count_dir(layers) == 0,
        "wrong digest: refused, nothing left (%s)", err.msg);
  o = opts();
  o.want_diff_id = o.want_digest = NULL;
  o.want_diff_id = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r < 0 && strstr(err.msg, "diff id mismatch") && count_dir(layers) == 0,
        "wrong diff id: refused, nothing left (%s)", err.msg);
  o.want_diff_id = "sha256:xyz";
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r < 0 && err.code == EINVAL, "malformed wanted digest refused");

  {
    int fd = open(gz, O_WRONLY | O_TRUNC);
    if (fd >= 0) {
      (void) !write(fd, "this is not a tar at all, just text\n", 36);
      close(fd);
    }
  }
  o = opts();
  r = tp_layer_unpack(gz, layers, &o, &info, &err);
  check(r < 0 && count_dir(layers) == 0, "garbage: refused, nothing left (%s)", err.msg);

  /* blob_put: a wrong digest leaves no blob and no temp file */
  {
    char *blobs = path_in(tmp_root, "blobs");
    mkdir(blobs, 0755);
    r = tp_blob_put(gz, blobs, "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                    1 << 20, digest, &err);
    check(r < 0 && strstr(err.msg, "digest mismatch") && count_dir(blobs) == 0,
          "blob_put: wrong digest refused, nothing left (%s)", err.msg);
    r = tp_blob_put(gz, blobs, NULL, 10, digest, &err);
    check(r < 0 && count_dir(blobs) == 0, "blob_put: over max_bytes refused (%s)", err.msg);
    r = tp_blob_put(gz, blobs, NULL, 1 << 20, digest, &err);
    {
      char *p = path_in(blobs, digest + 7);
      check(r == 0 && access(p, F_OK) == 0 && count_dir(blobs) == 1,
            "blob_put: stored under its digest");
      free(p);
    }
    tp_rmtree(blobs, NULL);
    free(blobs);
  }
  unlink(gz);
  free(gz);
}

typedef struct race_s {
  const char *blob, *layers;
  int r;
  tp_layer_info_t info;
} race_t;

static void *race_run(void *arg) {
  race_t *x = arg;
  tp_layer_opts_t o = opts();
  tp_error_t err = {0};
  x->r = tp_layer_unpack(x->blob, x->layers, &o, &x->info, &err);
  return NULL;
}

static void test_race_and_tar_dir(const char *layers) {
  const ent_t ents[] = {{F, "a", "x", 0, 0, 100000}, {D, "d", NULL, 0, 0, 0}};
  char *blob = path_in(tmp_root, "race.tar");
  char *tar2 = path_in(tmp_root, "again.tar");
  race_t x[2];
  pthread_t t[2];
  tp_error_t err = {0};
  char *dir;
  make_tar(blob, NULL, ents, 2);
  for (int i = 0; i < 2; i++) {
    memset(&x[i], 0, sizeof(x[i]));
    x[i].blob = blob;
    x[i].layers = layers;
    x[i].r = -1;
    pthread_create(&t[i], NULL, race_run, &x[i]);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  check(x[0].r == 0 && x[1].r == 0 && count_dir(layers) == 1,
        "race: two unpacks of one layer both succeed, one dir");
  /* tar_dir of the unpacked layer, unpacked again: the same tree */
  dir = path_in(layers, x[0].info.diff_id + 7);
  {
    int r = tp_tar_dir(dir, tar2, 7, 7, 10, &err); /* BASE is outside 7..16: kept */
    tp_layer_opts_t o = opts();
    tp_layer_info_t info;
    char *l2 = path_in(tmp_root, "layers2");
    mkdir(l2, 0700);
    check(r == 0, "tar_dir: written (%s)", r < 0 ? err.msg : "ok");
    r = tp_layer_unpack(tar2, l2, &o, &info, &err);
    check(r < 0 && strstr(err.msg, "outside the sandbox's ids"),
          "tar_dir: owners outside the mapped range stay, and are refused (%s)", err.msg);
    unlink(tar2);
    tp_error_clear(&err);
    r = tp_tar_dir(dir, tar2, BASE, BASE, 65536, &err);
    check(r == 0 && tp_layer_unpack(tar2, l2, &o, &info, &err) == 0 &&
              strcmp(info.diff_id, x[0].info.diff_id) != 0 && info.entries == 2,
          "tar_dir: a tree laid out for boxes is shifted back and unpacks (%s)",
          err.msg[0] ? err.msg : "ok");
    {
      char *back = path_in(l2, info.diff_id + 7);
      check(st_is(back, "a", S_IFREG, BASE, 0644), "tar_dir: owners round-trip");
      free(back);
    }
    tp_rmtree(l2, NULL);
    free(l2);
  }
  {
    int r = tp_tar_dir("/nonexistent-dir", tar2, BASE, BASE, 65536, &err);
    check(r < 0, "tar_dir: a missing dir refused");
  }
  tp_rmtree(dir, NULL);
  free(dir);
  unlink(tar2);
  unlink(blob);
  free(tar2);
  free(blob);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR");
  tp_error_t err = {0};
  char *layers;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0) {
    printf("1..0 # SKIP needs root\n");
    return 77;
  }
  snprintf(tmp_root, sizeof(tmp_root), "%s/tupper-test-layer.XXXXXX", tmpdir ? tmpdir : "/tmp");
  if (mkdtemp(tmp_root) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  layers = path_in(tmp_root, "layers");
  mkdir(layers, 0700);
  test_good(layers);
  test_hostile(layers);
  test_corrupt(layers);
  test_race_and_tar_dir(layers);
  if (tp_rmtree(tmp_root, &err) < 0)
    check(0, "clean up %s: %s", tmp_root, err.msg);
  free(layers);
  printf("1..%d\n", tap_num);
  return tap_failed > 0 ? 1 : 0;
}
