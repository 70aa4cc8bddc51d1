/* libFuzzer target: the layer unpacker (runtime/host/layer.c).
 *
 * The input is a layer blob as an image or a registry hands it over: a tar,
 * possibly gzip'ed or zstd'ed.  It is written to a file and unpacked into a
 * layers dir with small caps.  Beyond "no crash, no sanitizer report":
 *  - a refused blob leaves the layers dir empty (no temp dir, no half layer);
 *  - an accepted one is exactly one dir, named by the diff id the unpacker
 *    reports, holding only dirs, regular files, symlinks and 0:0 char
 *    devices (whiteouts), every one owned inside the boxes' id range;
 *  - nothing appears next to the layers dir (no write through a symlink or
 *    a "..": the work dir holds the blob and layers/ only).
 * Run as root (chown and the whiteouts' mknod need it); as another user
 * every unpack fails at its first chown, which still checks the cleanup. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "layer.h"
#include "rmtree.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_BASE 100000000u
#define FZ_COUNT 65536u

#define FZ_CHECK(cond)                                                                      \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "fuzz_layer: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                              \
    }                                                                                       \
  } while (0)

static char fz_root[256], fz_layers[300], fz_blob[300];

static int fz_entries(const char *dir, char *only, size_t cap) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  if (only != NULL)
    only[0] = '\0';
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    n++;
    if (only != NULL)
      snprintf(only, cap, "%s", e->d_name);
  }
  if (d != NULL)
    closedir(d);
  return n;
}

/* Every entry under dirfd (already opened) is of an allowed kind and owner. */
static void fz_walk(int dfd, int depth) {
  DIR *d = fdopendir(dfd);
  struct dirent *e;
  FZ_CHECK(d != NULL);
  FZ_CHECK(depth < 4096);
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    FZ_CHECK(fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0);
    FZ_CHECK(st.st_uid >= FZ_BASE && st.st_uid < FZ_BASE + FZ_COUNT);
    FZ_CHECK(st.st_gid >= FZ_BASE && st.st_gid < FZ_BASE + FZ_COUNT);
    if (S_ISCHR(st.st_mode))
      FZ_CHECK(st.st_rdev == makedev(0, 0));
    else
      FZ_CHECK(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode));
    if (S_ISDIR(st.st_mode)) {
      int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      FZ_CHECK(sub >= 0);
      fz_walk(sub, depth + 1);
    }
  }
  closedir(d);
}

static void fz_cleanup(void) { tp_rmtree(fz_root, NULL); }

static void fz_setup(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(fz_root, sizeof(fz_root), "%s/tupper-fuzz-layer.XXXXXX", tmp ? tmp : "/tmp");
  FZ_CHECK(mkdtemp(fz_root) != NULL);
  snprintf(fz_layers, sizeof(fz_layers), "%s/layers", fz_root);
  snprintf(fz_blob, sizeof(fz_blob), "%s/blob", fz_root);
  FZ_CHECK(mkdir(fz_layers, 0700) == 0);
  atexit(fz_cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  tp_layer_opts_t o = {.uid_base = FZ_BASE, .gid_base = FZ_BASE, .id_count = FZ_COUNT,
                       .max_tar_bytes = 1 << 20, .max_bytes = 1 << 20, .max_entries = 512};
  tp_layer_info_t info;
  tp_error_t err = {0};
  char name[TP_DIGEST_LEN + 1], path[400];
  int fd, r;

  if (!ready) {
    fz_setup();
    ready = 1;
  }
  fd = open(fz_blob, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FZ_CHECK(fd >= 0);
  FZ_CHECK(write(fd, data, size) == (ssize_t) size);
  close(fd);

  r = tp_layer_unpack(fz_blob, fz_layers, &o, &info, &err);
  if (r < 0) {
    FZ_CHECK(err.msg[0] != '\0');
    FZ_CHECK(fz_entries(fz_layers, NULL, 0) == 0);
  } else {
    FZ_CHECK(tp_digest_valid(info.digest) && tp_digest_valid(info.diff_id));
    FZ_CHECK(fz_entries(fz_layers, name, sizeof(name)) == 1);
    FZ_CHECK(strcmp(name, info.diff_id + 7) == 0);
    FZ_CHECK(info.tar_bytes <= o.max_tar_bytes && info.bytes <= o.max_bytes &&
             info.entries <= o.max_entries);
    snprintf(path, sizeof(path), "%s/%s", fz_layers, name);
    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    FZ_CHECK(fd >= 0);
    fz_walk(fd, 0);
    FZ_CHECK(tp_rmtree(path, &err) == 0);
  }
  /* the work dir holds the blob and layers/, nothing else */
  FZ_CHECK(fz_entries(fz_root, NULL, 0) == 2);
  return 0;
}
