/* Layer unpacking, blob hashing and tarring a directory: see layer.h for the
 * rules.  One pass over a layer blob: the file is read and hashed (the
 * blob's digest), a first libarchive reader decompresses it (gzip, zstd or
 * nothing: format "raw"), the bytes it yields are hashed (the diff id) and
 * counted, and fed to a second reader that parses them as tar.
 *
 * libarchive is opened with dlopen at first use, not linked: it brings a
 * dozen shared libraries (its compressors, libxml2, nettle, acl...), whose
 * loading would cost every CLI verb start-up time; only the daemon's first
 * import or unpack pays for them.  SHA-256 is libcrypto's (crypto.h), opened
 * the same way. */
#define _GNU_SOURCE
#include <archive.h>
#include <archive_entry.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "crypto.h"
#include "layer.h"
#include "rmtree.h"
#include "utils.h"

/* Every libarchive function used here, called through a pointer loaded at
 * first use (each name below is redirected to its pointer). */
#define TP_AR_FUNCS(X)                                                                             \
  X(archive_read_new) X(archive_read_free) X(archive_read_support_filter_gzip)                     \
  X(archive_read_support_filter_zstd) X(archive_read_support_format_raw)                           \
  X(archive_read_support_format_tar) X(archive_read_open) X(archive_read_next_header)              \
  X(archive_read_next_header2) X(archive_read_data) X(archive_read_data_block)                     \
  X(archive_error_string) X(archive_set_error) X(archive_entry_pathname) X(archive_entry_filetype) \
  X(archive_entry_uid) X(archive_entry_gid) X(archive_entry_size) X(archive_entry_size_is_set)     \
  X(archive_entry_perm) X(archive_entry_mtime) X(archive_entry_symlink) X(archive_entry_hardlink)  \
  X(archive_entry_rdevmajor) X(archive_entry_rdevminor) X(archive_entry_new) X(archive_entry_free) \
  X(archive_entry_clear) X(archive_entry_set_pathname) X(archive_entry_set_uid)                    \
  X(archive_entry_set_gid) X(archive_entry_sourcepath) X(archive_read_disk_new)                    \
  X(archive_read_disk_set_symlink_physical) X(archive_read_disk_set_behavior)                      \
  X(archive_read_disk_open) X(archive_read_disk_descend) X(archive_write_new) X(archive_write_free) \
  X(archive_write_set_format_pax_restricted) X(archive_write_open_fd) X(archive_write_header)       \
  X(archive_write_data) X(archive_write_close)

#define TP_AR_SLOT(name) __typeof__(name) *name;
static struct {
  TP_AR_FUNCS(TP_AR_SLOT)
} tp__ar;
#undef TP_AR_SLOT
static pthread_once_t tp__ar_once = PTHREAD_ONCE_INIT;
static char tp__ar_err[256];

static void tp__ar_load(void) {
  void *lib = dlopen("libarchive.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(tp__ar_err, sizeof(tp__ar_err), "cannot load libarchive.so.13 (install libarchive13): %s",
             dlerror());
    return;
  }
#define TP_AR_LOAD(name)                                                                           \
  if ((*(void **) &tp__ar.name = dlsym(lib, #name)) == NULL) {                                     \
    snprintf(tp__ar_err, sizeof(tp__ar_err), "libarchive lacks %s", #name);                        \
    return;                                                                                        \
  }
  TP_AR_FUNCS(TP_AR_LOAD)
#undef TP_AR_LOAD
}

static int tp__ar_ready(tp_error_t *err) {
  pthread_once(&tp__ar_once, tp__ar_load);
  if (tp__ar_err[0] != '\0')
    return tp_error_set(err, ENOSYS, "%s", tp__ar_err);
  return 0;
}

/* From here on, each libarchive name is its loaded pointer. */
#define TP_AR_REDIRECT(name) tp__ar.name
#define archive_read_new TP_AR_REDIRECT(archive_read_new)
#define archive_read_free TP_AR_REDIRECT(archive_read_free)
#define archive_read_support_filter_gzip TP_AR_REDIRECT(archive_read_support_filter_gzip)
#define archive_read_support_filter_zstd TP_AR_REDIRECT(archive_read_support_filter_zstd)
#define archive_read_support_format_raw TP_AR_REDIRECT(archive_read_support_format_raw)
#define archive_read_support_format_tar TP_AR_REDIRECT(archive_read_support_format_tar)
#define archive_read_open TP_AR_REDIRECT(archive_read_open)
#define archive_read_next_header TP_AR_REDIRECT(archive_read_next_header)
#define archive_read_next_header2 TP_AR_REDIRECT(archive_read_next_header2)
#define archive_read_data TP_AR_REDIRECT(archive_read_data)
#define archive_read_data_block TP_AR_REDIRECT(archive_read_data_block)
#define archive_error_string TP_AR_REDIRECT(archive_error_string)
#define archive_set_error TP_AR_REDIRECT(archive_set_error)
#define archive_entry_pathname TP_AR_REDIRECT(archive_entry_pathname)
#define archive_entry_filetype TP_AR_REDIRECT(archive_entry_filetype)
#define archive_entry_uid TP_AR_REDIRECT(archive_entry_uid)
#define archive_entry_gid TP_AR_REDIRECT(archive_entry_gid)
#define archive_entry_size TP_AR_REDIRECT(archive_entry_size)
#define archive_entry_size_is_set TP_AR_REDIRECT(archive_entry_size_is_set)
#define archive_entry_perm TP_AR_REDIRECT(archive_entry_perm)
#define archive_entry_mtime TP_AR_REDIRECT(archive_entry_mtime)
#define archive_entry_symlink TP_AR_REDIRECT(archive_entry_symlink)
#define archive_entry_hardlink TP_AR_REDIRECT(archive_entry_hardlink)
#define archive_entry_rdevmajor TP_AR_REDIRECT(archive_entry_rdevmajor)
#define archive_entry_rdevminor TP_AR_REDIRECT(archive_entry_rdevminor)
#define archive_entry_new TP_AR_REDIRECT(archive_entry_new)
#define archive_entry_free TP_AR_REDIRECT(archive_entry_free)
#define archive_entry_clear TP_AR_REDIRECT(archive_entry_clear)
#define archive_entry_set_pathname TP_AR_REDIRECT(archive_entry_set_pathname)
#define archive_entry_set_uid TP_AR_REDIRECT(archive_entry_set_uid)
#define archive_entry_set_gid TP_AR_REDIRECT(archive_entry_set_gid)
#define archive_entry_sourcepath TP_AR_REDIRECT(archive_entry_sourcepath)
#define archive_read_disk_new TP_AR_REDIRECT(archive_read_disk_new)
#define archive_read_disk_set_symlink_physical TP_AR_REDIRECT(archive_read_disk_set_symlink_physical)
#define archive_read_disk_set_behavior TP_AR_REDIRECT(archive_read_disk_set_behavior)
#define archive_read_disk_open TP_AR_REDIRECT(archive_read_disk_open)
#define archive_read_disk_descend TP_AR_REDIRECT(archive_read_disk_descend)
#define archive_write_new TP_AR_REDIRECT(archive_write_new)
#define archive_write_free TP_AR_REDIRECT(archive_write_free)
#define archive_write_set_format_pax_restricted TP_AR_REDIRECT(archive_write_set_format_pax_restricted)
#define archive_write_open_fd TP_AR_REDIRECT(archive_write_open_fd)
#define archive_write_header TP_AR_REDIRECT(archive_write_header)
#define archive_write_data TP_AR_REDIRECT(archive_write_data)
#define archive_write_close TP_AR_REDIRECT(archive_write_close)

#define TP__IO_BUF 65536
#define TP__PATH_LEN 4096

int tp_digest_valid(const char *s) {
  if (s == NULL || strncmp(s, "sha256:", 7) != 0 || strlen(s) != TP_DIGEST_LEN)
    return 0;
  for (const char *p = s + 7; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return 0;
  return 1;
}

/* out gets "sha256:<hex>" of what md hashed. */
static int md_final(tp_sha256_t *md, char out[TP_DIGEST_LEN + 1], tp_error_t *err) {
  memcpy(out, "sha256:", 7);
  return tp_sha256_final(md, out + 7, err);
}

static void cleanup_archivep(struct archive **a) {
  if (*a != NULL)
    archive_read_free(*a);
}
#define cleanup_archive __attribute__((cleanup(cleanup_archivep)))

/* A temp dir or file under construction: removed on any early return. */
static void cleanup_tmpp(char **path) {
  if (*path != NULL) {
    int saved = errno;
    struct stat st;
    if (lstat(*path, &st) == 0) {
      if (S_ISDIR(st.st_mode))
        tp_rmtree(*path, NULL);
      else
        unlink(*path);
    }
    free(*path);
    errno = saved;
  }
}
#define cleanup_tmp __attribute__((cleanup(cleanup_tmpp)))

/* ------------------------------------------------------------ unpack */

typedef struct ux_s {
  const tp_layer_opts_t *o;
  tp_layer_info_t *info;
  tp_error_t *err;
  int failed;          /* err is set (by a read callback) */
  int blob_fd;
  tp_sha256_t blob_md; /* of the blob's bytes */
  tp_sha256_t tar_md;  /* of the decompressed bytes */
  struct archive *raw; /* the decompressor */
  int raw_eof;
  int root;            /* the layer's temp root */
  char path[TP__PATH_LEN]; /* the current entry, cleaned, for messages */
  unsigned char blob_buf[TP__IO_BUF];
  unsigned char tar_buf[TP__IO_BUF];
} ux_t;

static void cleanup_uxp(ux_t **u) {
  if (*u != NULL) {
    tp_sha256_close(&(*u)->blob_md);
    tp_sha256_close(&(*u)->tar_md);
    free(*u);
  }
}
#define cleanup_ux __attribute__((cleanup(cleanup_uxp)))

static ssize_t blob_read(struct archive *a, void *data, const void **buf) {
  ux_t *u = data;
  ssize_t n;
  (void) a;
  do
    n = read(u->blob_fd, u->blob_buf, sizeof(u->blob_buf));
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    u->failed = 1;
    tp_error_errno(u->err, errno, "read blob");
    archive_set_error(a, errno, "read blob");
    return -1;
  }
  if (tp_sha256_update(&u->blob_md, u->blob_buf, (size_t) n, u->err) < 0) {
    u->failed = 1;
    archive_set_error(a, EIO, "hash blob");
    return -1;
  }
  *buf = u->blob_buf;
  return n;
}

/* The tar reader's input: the decompressor's output, hashed and bounded. */
static ssize_t tar_read(struct archive *a, void *data, const void **buf) {
  ux_t *u = data;
  la_ssize_t n;
  if (u->raw_eof)
    return 0;
  n = archive_read_data(u->raw, u->tar_buf, sizeof(u->tar_buf));
  if (n < 0) {
    if (!u->failed) {
      u->failed = 1;
      tp_error_set(u->err, EINVAL, "corrupt or truncated compressed stream: %s",
                   archive_error_string(u->raw) ? archive_error_string(u->raw) : "?");
    }
    archive_set_error(a, EINVAL, "decompression failed");
    return -1;
  }
  if (n == 0) {
    u->raw_eof = 1;
    return 0;
  }
  u->info->tar_bytes += (uint64_t) n;
  if (u->info->tar_bytes > u->o->max_tar_bytes) {
    u->failed = 1;
    tp_error_set(u->err, EFBIG, "the layer unpacks to more than %llu bytes (decompression bomb?)",
                 (unsigned long long) u->o->max_tar_bytes);
    archive_set_error(a, EFBIG, "too big");
    return -1;
  }
  if (tp_sha256_update(&u->tar_md, u->tar_buf, (size_t) n, u->err) < 0) {
    u->failed = 1;
    archive_set_error(a, EIO, "hash layer");
    return -1;
  }
  *buf = u->tar_buf;
  return n;
}

/* Cleans an entry path into out ("" is the root): no absolute path, no
 * "..", no empty name; "." and repeated slashes dropped. */
static int clean_path(const char *in, char *out, size_t cap, const char *what, tp_error_t *err) {
  size_t off = 0;
  const char *p = in;
  if (in == NULL || in[0] == '\0')
    return tp_error_set(err, EINVAL, "an entry has no %s", what);
  if (in[0] == '/')
    return tp_error_set(err, EINVAL, "%s '%.200s' is absolute", what, in);
  while (*p) {
    const char *end = strchrnul(p, '/');
    size_t n = (size_t) (end - p);
    if (n == 2 && p[0] == '.' && p[1] == '.')
      return tp_error_set(err, EINVAL, "%s '%.200s' leads out of the layer (..)", what, in);
    if (n > NAME_MAX)
      return tp_error_set(err, ENAMETOOLONG, "%s '%.200s' has a name over %d bytes", what, in,
                          NAME_MAX);
    if (n > 0 && !(n == 1 && p[0] == '.')) {
      if (off + n + 2 > cap)
        return tp_error_set(err, ENAMETOOLONG, "%s '%.200s' is too long", what, in);
      if (off > 0)
        out[off++] = '/';
      memcpy(out + off, p, n);
      off += n;
    }
    p = *end ? end + 1 : end;
  }
  out[off] = '\0';
  return 0;
}

static int count_entry(ux_t *u) {
  if (++u->info->entries > u->o->max_entries)
    return tp_error_set(u->err, EFBIG, "the layer has more than %llu entries",
                        (unsigned long long) u->o->max_entries);
  return 0;
}

/* Opens the directory holding the last component of path (cleaned, not
 * ""), walking from the root with O_NOFOLLOW; missing dirs are made (owned
 * by the box's root) when `create`.  *name points at the last component. */
static int open_parent(ux_t *u, const char *path, int create, const char **name) {
  char comp[NAME_MAX + 1];
  const char *p = path, *slash;
  int dfd = dup(u->root);
  if (dfd < 0)
    return tp_error_errno(u->err, errno, "dup");
  while ((slash = strchr(p, '/')) != NULL) {
    size_t n = (size_t) (slash - p);
    int next;
    memcpy(comp, p, n);
    comp[n] = '\0';
    next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      if (count_entry(u) < 0) {
        close(dfd);
        return -1;
      }
      if (mkdirat(dfd, comp, 0755) < 0 ||
          fchownat(dfd, comp, u->o->uid_base, u->o->gid_base, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = errno;
        close(dfd);
        return tp_error_errno(u->err, e, "mkdir parent of '%.200s'", path);
      }
      next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (next < 0) {
      int e = errno;
      close(dfd);
      if (e == ELOOP || e == ENOTDIR)
        return tp_error_set(u->err, ELOOP,
                            "'%.200s' goes through a symlink or a non-directory (refused)", path);
      return tp_error_errno(u->err, e, "open parent of '%.200s'", path);
    }
    close(dfd);
    dfd = next;
    p = slash + 1;
  }
  *name = p;
  return dfd;
}

/* Makes room for a new entry `name` in dfd: a non-directory there is
 * replaced (a later tar entry wins); a directory stays for a directory
 * entry (*is_dir = 1) and is refused for anything else. */
static int make_room(ux_t *u, int dfd, const char *name, int want_dir, int *is_dir) {
  struct stat st;
  *is_dir = 0;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : tp_error_errno(u->err, errno, "stat '%.200s'", u->path);
  if (S_ISDIR(st.st_mode)) {
    if (want_dir) {
      *is_dir = 1;
      return 0;
    }
    return tp_error_set(u->err, EEXIST, "'%.200s' would replace a directory (refused)", u->path);
  }
  if (unlinkat(dfd, name, 0) < 0)
    return tp_error_errno(u->err, errno, "replace '%.200s'", u->path);
  return 0;
}

static int host_ids(ux_t *u, struct archive_entry *e, uid_t *uid, gid_t *gid) {
  la_int64_t eu = archive_entry_uid(e), eg = archive_entry_gid(e);
  if (eu < 0 || eu >= (la_int64_t) u->o->id_count || eg < 0 ||
      eg >= (la_int64_t) u->o->id_count)
    return tp_error_set(u->err, ERANGE,
                        "'%.200s' is owned by %lld:%lld, outside the sandbox's ids 0..%u (refused)",
                        u->path[0] ? u->path : ".", (long long) eu, (long long) eg,
                        u->o->id_count - 1);
  *uid = u->o->uid_base + (uid_t) eu;
  *gid = u->o->gid_base + (gid_t) eg;
  return 0;
}

static int whiteout(ux_t *u, int dfd, const char *name) {
  int is_dir;
  if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
    return tp_error_set(u->err, EINVAL, "whiteout '%.200s' names nothing", u->path);
  if (make_room(u, dfd, name, 0, &is_dir) < 0)
    return -1;
  if (mknodat(dfd, name, S_IFCHR | 0, makedev(0, 0)) < 0 ||
      fchownat(dfd, name, u->o->uid_base, u->o->gid_base, AT_SYMLINK_NOFOLLOW) < 0)
    return tp_error_errno(u->err, errno, "whiteout '%.200s'", u->path);
  return 0;
}

static int write_file(ux_t *u, struct archive *tar, struct archive_entry *e, int dfd,
                      const char *name, uid_t uid, gid_t gid) {
  cleanup_close int fd = -1;
  la_int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
  const void *buf;
  size_t len;
  la_int64_t off;
  int r, is_dir;

  if (size < 0 || (uint64_t) size > u->o->max_bytes - u->info->bytes)
    return tp_error_set(u->err, EFBIG, "the layer's files hold more than %llu bytes ('%.200s')",
                        (unsigned long long) u->o->max_bytes, u->path);
  u->info->bytes += (uint64_t) size;
  if (make_room(u, dfd, name, 0, &is_dir) < 0)
    return -1;
  fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return tp_error_errno(u->err, errno, "create '%.200s'", u->path);
  while ((r = archive_read_data_block(tar, &buf, &len, &off)) == ARCHIVE_OK) {
    const char *p = buf;
    if (off < 0 || (uint64_t) off + len > (uint64_t) size)
      return tp_error_set(u->err, EINVAL, "'%.200s' has data past its size", u->path);
    while (len > 0) {
      ssize_t n = pwrite(fd, p, len, off);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return tp_error_errno(u->err, errno, "write '%.200s'", u->path);
      p += n;
      len -= (size_t) n;
      off += n;
    }
  }
  if (r != ARCHIVE_EOF) {
    if (u->failed)
      return -1;
    return tp_error_set(u->err, EINVAL, "read '%.200s': %s", u->path,
                        archive_error_string(tar) ? archive_error_string(tar) : "?");
  }
  if (ftruncate(fd, size) < 0) /* a sparse tail */
    return tp_error_errno(u->err, errno, "size '%.200s'", u->path);
  /* chown first: it clears setuid/setgid, which the chmod puts back */
  if (fchown(fd, uid, gid) < 0 || fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return tp_error_errno(u->err, errno, "set owner and mode of '%.200s'", u->path);
  {
    struct timespec ts[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
    futimens(fd, ts);
  }
  return 0;
}

static int hardlink(ux_t *u, struct archive_entry *e, int dfd, const char *name) {
  char target[TP__PATH_LEN];
  const char *tname;
  struct stat st;
  cleanup_close int tfd = -1;
  int is_dir;
  if (clean_path(archive_entry_hardlink(e), target, sizeof(target), "hardlink target", u->err) < 0)
    return tp_error_prefix(u->err, "'%.200s'", u->path);
  if (target[0] == '\0')
    return tp_error_set(u->err, EINVAL, "hardlink '%.200s' to the layer's root", u->path);
  tfd = open_parent(u, target, 0, &tname);
  if (tfd < 0 && u->err->code == ENOENT)
    return tp_error_set(u->err, ENOENT, "hardlink '%.200s' to '%.200s' (not in this layer)",
                        u->path, target);
  if (tfd < 0)
    return tp_error_prefix(u->err, "hardlink '%.200s'", u->path);
  if (fstatat(tfd, tname, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return tp_error_errno(u->err, errno, "hardlink '%.200s' to '%.200s' (not in this layer)",
                          u->path, target);
  if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    return tp_error_set(u->err, EPERM, "hardlink '%.200s' to '%.200s', not a file (refused)",
                        u->path, target);
  if (make_room(u, dfd, name, 0, &is_dir) < 0)
    return -1;
  if (linkat(tfd, tname, dfd, name, 0) < 0)
    return tp_error_errno(u->err, errno, "hardlink '%.200s'", u->path);
  return 0;
}

static int symlink_entry(ux_t *u, struct archive_entry *e, int dfd, const char *name, uid_t uid,
                         gid_t gid) {
  const char *target = archive_entry_symlink(e);
  int is_dir;
  if (target == NULL || target[0] == '\0' || strlen(target) >= TP__PATH_LEN)
    return tp_error_set(u->err, EINVAL, "symlink '%.200s' has no target or one too long",
                        u->path);
  if (make_room(u, dfd, name, 0, &is_dir) < 0)
    return -1;
  /* stored as it is: only ever resolved inside the box */
  if (symlinkat(target, dfd, name) < 0 || fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
    return tp_error_errno(u->err, errno, "symlink '%.200s'", u->path);
  {
    struct timespec ts[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
    utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW);
  }
  return 0;
}

static int dir_entry(ux_t *u, struct archive_entry *e, int dfd, const char *name, uid_t uid,
                     gid_t gid) {
  cleanup_close int fd = -1;
  int is_dir;
  if (make_room(u, dfd, name, 1, &is_dir) < 0)
    return -1;
  if (!is_dir && mkdirat(dfd, name, 0700) < 0)
    return tp_error_errno(u->err, errno, "mkdir '%.200s'", u->path);
  fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || fchown(fd, uid, gid) < 0 || fchmod(fd, archive_entry_perm(e) & 07777) < 0)
    return tp_error_errno(u->err, errno, "set owner and mode of '%.200s'", u->path);
  return 0;
}

/* ".wh..wh..opq": the directory holding it hides everything below it. */
static int opaque(ux_t *u, int dfd) {
  if (fsetxattr(dfd, "trusted.overlay.opaque", "y", 1, 0) < 0)
    return tp_error_errno(u->err, errno, "mark '%.200s' opaque", u->path);
  return 0;
}

static int unpack_entry(ux_t *u, struct archive *tar, struct archive_entry *e) {
  const char *name;
  cleanup_close int dfd = -1;
  mode_t type = archive_entry_filetype(e);
  uid_t uid = 0;
  gid_t gid = 0;

  if (clean_path(archive_entry_pathname(e), u->path, sizeof(u->path), "path", u->err) < 0)
    return -1;
  if (host_ids(u, e, &uid, &gid) < 0)
    return -1;
  if (u->path[0] == '\0') { /* the root itself: its owner and mode */
    if (type != AE_IFDIR)
      return tp_error_set(u->err, EINVAL, "the layer's root is not a directory");
    if (fchown(u->root, uid, gid) < 0 || fchmod(u->root, archive_entry_perm(e) & 07777) < 0)
      return tp_error_errno(u->err, errno, "set owner and mode of the root");
    return 0;
  }
  if (count_entry(u) < 0)
    return -1;
  dfd = open_parent(u, u->path, 1, &name);
  if (dfd < 0)
    return -1;
  if (strncmp(name, ".wh.", 4) == 0) {
    if (strcmp(name, ".wh..wh..opq") == 0)
      return opaque(u, dfd);
    if (strncmp(name, ".wh..wh.", 8) == 0)
      return 0; /* aufs bookkeeping (.wh..wh.plnk...): nothing to overlay */
    return whiteout(u, dfd, name + 4);
  }
  if (archive_entry_hardlink(e) != NULL)
    return hardlink(u, e, dfd, name);
  switch (type) {
  case AE_IFREG:
    return write_file(u, tar, e, dfd, name, uid, gid);
  case AE_IFDIR:
    return dir_entry(u, e, dfd, name, uid, gid);
  case AE_IFLNK:
    return symlink_entry(u, e, dfd, name, uid, gid);
  case AE_IFCHR:
    if (archive_entry_rdevmajor(e) == 0 && archive_entry_rdevminor(e) == 0)
      return whiteout(u, dfd, name);
    /* fall through */
  default:
    return tp_error_set(u->err, EPERM,
                        "'%.200s' is a device node, fifo or socket: not allowed in a layer",
                        u->path);
  }
}

/* Reads the whole tar; 0 when every entry was unpacked. */
static int unpack_all(ux_t *u, struct archive *tar) {
  struct archive_entry *e;
  for (;;) {
    int r = archive_read_next_header(tar, &e);
    if (r == ARCHIVE_EOF)
      break;
    if (r < ARCHIVE_WARN) {
      if (u->failed)
        return -1;
      return tp_error_set(u->err, EINVAL, "bad tar: %s",
                          archive_error_string(tar) ? archive_error_string(tar) : "?");
    }
    if (unpack_entry(u, tar, e) < 0)
      return -1;
  }
  /* what follows the end-of-archive blocks is part of the diff id too */
  while (!u->raw_eof) {
    const void *buf;
    if (tar_read(tar, u, &buf) < 0)
      return -1;
  }
  return 0;
}

int tp_layer_unpack(const char *blob, const char *layers_dir, const tp_layer_opts_t *o,
                    tp_layer_info_t *info, tp_error_t *err) {
  cleanup_ux ux_t *u = calloc(1, sizeof(ux_t));
  cleanup_close int blob_fd = -1, root = -1, ldfd = -1;
  cleanup_archive struct archive *raw = NULL, *tar = NULL;
  cleanup_tmp char *tmp = NULL;
  struct archive_entry *e;
  const char *tmp_name;
  int r;

  memset(info, 0, sizeof(*info));
  if (tp__ar_ready(err) < 0)
    return tp_error_prefix(err, "unpack layer");
  raw = archive_read_new();
  tar = archive_read_new();
  if (u == NULL || raw == NULL || tar == NULL)
    return tp_error_set(err, ENOMEM, "unpack layer: out of memory");
  if (tp_sha256_init(&u->blob_md, err) < 0 || tp_sha256_init(&u->tar_md, err) < 0)
    return tp_error_prefix(err, "unpack layer");
  if (o->id_count < 1 || o->uid_base == 0 || o->gid_base == 0)
    return tp_error_set(err, EINVAL, "unpack layer: bad id range");
  if ((o->want_digest && !tp_digest_valid(o->want_digest)) ||
      (o->want_diff_id && !tp_digest_valid(o->want_diff_id)))
    return tp_error_set(err, EINVAL, "unpack layer: a wanted digest is not sha256:<64 hex>");
  blob_fd = open(blob, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (blob_fd < 0)
    return tp_error_errno(err, errno, "open layer blob '%s'", blob);
  ldfd = open(layers_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (ldfd < 0)
    return tp_error_errno(err, errno, "open '%s'", layers_dir);
  if (asprintf(&tmp, "%s/.tmp-XXXXXX", layers_dir) < 0) {
    tmp = NULL;
    return tp_error_set(err, ENOMEM, "unpack layer: out of memory");
  }
  if (mkdtemp(tmp) == NULL) {
    free(tmp);
    tmp = NULL;
    return tp_error_errno(err, errno, "mkdtemp in '%s'", layers_dir);
  }
  tmp_name = strrchr(tmp, '/') + 1;
  root = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0 || fchown(root, o->uid_base, o->gid_base) < 0 || fchmod(root, 0755) < 0)
    return tp_error_errno(err, errno, "set up '%s'", tmp);

  u->o = o;
  u->info = info;
  u->err = err;
  u->blob_fd = blob_fd;
  u->raw = raw;
  u->root = root;

  /* gzip and zstd (OCI's layer media types) or plain tar; nothing else is
   * even looked at, and no external program is ever run */
  if (archive_read_support_filter_gzip(raw) != ARCHIVE_OK ||
      archive_read_support_filter_zstd(raw) != ARCHIVE_OK ||
      archive_read_support_format_raw(raw) != ARCHIVE_OK ||
      archive_read_support_format_tar(tar) != ARCHIVE_OK)
    return tp_error_set(err, ENOTSUP, "unpack layer: libarchive lacks gzip, zstd or tar: %s",
                        archive_error_string(raw) ? archive_error_string(raw) : "?");
  if (archive_read_open(raw, u, NULL, blob_read, NULL) != ARCHIVE_OK) {
    if (!u->failed)
      tp_error_set(err, EINVAL, "unpack layer: %s",
                   archive_error_string(raw) ? archive_error_string(raw) : "unreadable blob");
    return -1;
  }
  r = archive_read_next_header(raw, &e);
  if (r == ARCHIVE_EOF) {
    u->raw_eof = 1;
  } else if (r < ARCHIVE_WARN) {
    if (!u->failed)
      tp_error_set(err, EINVAL, "unpack layer: %s",
                   archive_error_string(raw) ? archive_error_string(raw) : "unreadable blob");
    return -1;
  }
  if (archive_read_open(tar, u, NULL, tar_read, NULL) != ARCHIVE_OK) {
    if (!u->failed)
      tp_error_set(err, EINVAL, "unpack layer: not a tar: %s",
                   archive_error_string(tar) ? archive_error_string(tar) : "?");
    return -1;
  }
  if (unpack_all(u, tar) < 0)
    return tp_error_prefix(err, "unpack layer");
  /* the blob's digest covers the whole file, whatever follows the stream */
  for (;;) {
    const void *buf;
    ssize_t n = blob_read(raw, u, &buf);
    if (n < 0)
      return tp_error_prefix(err, "unpack layer");
    if (n == 0)
      break;
  }
  if (md_final(&u->blob_md, info->digest, err) < 0 || md_final(&u->tar_md, info->diff_id, err) < 0)
    return tp_error_prefix(err, "unpack layer");
  if (o->want_digest && strcmp(o->want_digest, info->digest) != 0)
    return tp_error_set(err, EBADMSG, "layer blob digest mismatch: want %s, got %s",
                        o->want_digest, info->digest);
  if (o->want_diff_id && strcmp(o->want_diff_id, info->diff_id) != 0)
    return tp_error_set(err, EBADMSG, "layer diff id mismatch: want %s, got %s",
                        o->want_diff_id, info->diff_id);
  if (fsync(root) < 0)
    return tp_error_errno(err, errno, "sync layer");
  if (renameat(ldfd, tmp_name, ldfd, info->diff_id + 7) < 0) {
    if (errno != EEXIST && errno != ENOTEMPTY)
      return tp_error_errno(err, errno, "rename layer into place");
    info->existed = 1; /* another unpack of the same layer won: same content */
    return 0;          /* cleanup_tmp removes ours */
  }
  free(tmp);
  tmp = NULL;
  return 0;
}

/* ------------------------------------------------------------ blobs */

int tp_blob_put(const char *src, const char *blobs_dir, const char *want, uint64_t max_bytes,
                char digest[TP_DIGEST_LEN + 1], tp_error_t *err) {
  cleanup_close int in = -1, out = -1;
  cleanup_sha256 tp_sha256_t md = {0};
  cleanup_tmp char *tmp = NULL;
  cleanup_free char *dst = NULL;
  cleanup_free unsigned char *buf = malloc(TP__IO_BUF);
  uint64_t total = 0;
  struct stat st;

  if (buf == NULL)
    return tp_error_set(err, ENOMEM, "blob: out of memory");
  if (want != NULL && !tp_digest_valid(want))
    return tp_error_set(err, EINVAL, "blob: '%.100s' is not sha256:<64 hex>", want);
  if (tp_sha256_init(&md, err) < 0)
    return tp_error_prefix(err, "blob '%s'", src);
  in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return tp_error_errno(err, errno, "open '%s'", src);
  if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "'%s' is not a regular file", src);
  if (blobs_dir != NULL) {
    if (asprintf(&tmp, "%s/.tmp-XXXXXX", blobs_dir) < 0) {
      tmp = NULL;
      return tp_error_set(err, ENOMEM, "blob: out of memory");
    }
    out = mkostemp(tmp, O_CLOEXEC);
    if (out < 0) {
      free(tmp);
      tmp = NULL;
      return tp_error_errno(err, errno, "create a temp file in '%s'", blobs_dir);
    }
  }
  for (;;) {
    ssize_t n = read(in, buf, TP__IO_BUF);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "read '%s'", src);
    if (n == 0)
      break;
    total += (uint64_t) n;
    if (total > max_bytes)
      return tp_error_set(err, EFBIG, "'%s' is over %llu bytes", src,
                          (unsigned long long) max_bytes);
    if (tp_sha256_update(&md, buf, (size_t) n, err) < 0)
      return tp_error_prefix(err, "blob '%s'", src);
    for (ssize_t off = 0; out >= 0 && off < n;) {
      ssize_t w = write(out, buf + off, (size_t) (n - off));
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0)
        return tp_error_errno(err, errno, "write blob");
      off += w;
    }
  }
  if (md_final(&md, digest, err) < 0)
    return tp_error_prefix(err, "blob '%s'", src);
  if (want != NULL && strcmp(want, digest) != 0)
    return tp_error_set(err, EBADMSG, "digest mismatch for '%s': want %s, got %s", src, want,
                        digest);
  if (blobs_dir == NULL)
    return 0;
  if (fchmod(out, 0644) < 0 || fsync(out) < 0)
    return tp_error_errno(err, errno, "write blob");
  if (asprintf(&dst, "%s/%s", blobs_dir, digest + 7) < 0) {
    dst = NULL;
    return tp_error_set(err, ENOMEM, "blob: out of memory");
  }
  if (rename(tmp, dst) < 0)
    return tp_error_errno(err, errno, "rename blob into place");
  free(tmp);
  tmp = NULL;
  return 0;
}

/* ------------------------------------------------------------ tar a dir */

static void cleanup_writep(struct archive **a) {
  if (*a != NULL)
    archive_write_free(*a);
}
#define cleanup_write __attribute__((cleanup(cleanup_writep)))

int tp_tar_dir(const char *dir, const char *out_path, uid_t uid_base, gid_t gid_base,
               uint32_t id_count, tp_error_t *err) {
  /* out is declared first so that it is closed last: freeing w on an
   * early return flushes what it holds into out, which must still be
   * ours (a closed fd number may be another thread's file by then) */
  cleanup_close int out = -1, in = -1;
  cleanup_archive struct archive *disk = NULL;
  cleanup_write struct archive *w = NULL;
  cleanup_free char *buf = malloc(TP__IO_BUF);
  cleanup_tmp char *made = NULL; /* out_path, removed unless complete */
  struct archive_entry *e;
  struct stat st;
  int r;

  if (tp__ar_ready(err) < 0)
    return tp_error_prefix(err, "tar '%s'", dir);
  disk = archive_read_disk_new();
  w = archive_write_new();
  if (disk == NULL || w == NULL || buf == NULL)
    return tp_error_set(err, ENOMEM, "tar: out of memory");
  if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
    return tp_error_set(err, ENOTDIR, "'%s' is not a directory", dir);
  out = open(out_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (out < 0)
    return tp_error_errno(err, errno, "create '%s'", out_path);
  made = strdup(out_path);
  if (made == NULL)
    return tp_error_set(err, ENOMEM, "tar: out of memory");
  archive_read_disk_set_symlink_physical(disk);
  archive_read_disk_set_behavior(disk, ARCHIVE_READDISK_NO_XATTR | ARCHIVE_READDISK_NO_ACL |
                                           ARCHIVE_READDISK_NO_FFLAGS |
                                           ARCHIVE_READDISK_NO_TRAVERSE_MOUNTS);
  if (archive_write_set_format_pax_restricted(w) != ARCHIVE_OK ||
      archive_write_open_fd(w, out) != ARCHIVE_OK ||
      archive_read_disk_open(disk, dir) != ARCHIVE_OK)
    return tp_error_set(err, EIO, "tar '%s': %s", dir,
                        archive_error_string(disk) ? archive_error_string(disk)
                                                   : archive_error_string(w));
  e = archive_entry_new();
  if (e == NULL)
    return tp_error_set(err, ENOMEM, "tar: out of memory");
  for (;;) {
    const char *p;
    char rel[TP__PATH_LEN + 2];
    archive_entry_clear(e);
    r = archive_read_next_header2(disk, e);
    if (r == ARCHIVE_EOF)
      break;
    if (r < ARCHIVE_WARN) {
      tp_error_set(err, EIO, "tar '%s': %s", dir, archive_error_string(disk));
      break;
    }
    archive_read_disk_descend(disk);
    /* a unix socket is no file of an image (tar cannot hold one either):
     * one a server left in a recipe's setup layer is left out */
    if (archive_entry_filetype(e) == AE_IFSOCK)
      continue;
    /* names relative to the root: "./etc/passwd" */
    p = archive_entry_pathname(e);
    p += strlen(dir);
    while (*p == '/')
      p++;
    if (strlen(p) + 2 >= sizeof(rel)) { /* never a truncated name */
      tp_error_set(err, ENAMETOOLONG, "tar '%s': a path is longer than %d bytes", dir,
                   TP__PATH_LEN);
      r = ARCHIVE_FATAL;
      break;
    }
    snprintf(rel, sizeof(rel), "./%s", p);
    archive_entry_set_pathname(e, rel);
    if (archive_entry_uid(e) >= (la_int64_t) uid_base &&
        archive_entry_uid(e) < (la_int64_t) uid_base + id_count)
      archive_entry_set_uid(e, archive_entry_uid(e) - uid_base);
    if (archive_entry_gid(e) >= (la_int64_t) gid_base &&
        archive_entry_gid(e) < (la_int64_t) gid_base + id_count)
      archive_entry_set_gid(e, archive_entry_gid(e) - gid_base);
    if (archive_write_header(w, e) < ARCHIVE_WARN) {
      tp_error_set(err, EIO, "tar '%s': %s", rel, archive_error_string(w));
      r = ARCHIVE_FATAL;
      break;
    }
    if (archive_entry_filetype(e) == AE_IFREG && archive_entry_size(e) > 0) {
      ssize_t n;
      in = open(archive_entry_sourcepath(e), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (in < 0) {
        tp_error_errno(err, errno, "open '%s'", archive_entry_sourcepath(e));
        r = ARCHIVE_FATAL;
        break;
      }
      while ((n = read(in, buf, TP__IO_BUF)) > 0)
        if (archive_write_data(w, buf, (size_t) n) < 0)
          break;
      close(in);
      in = -1;
    }
  }
  archive_entry_free(e);
  if (r != ARCHIVE_EOF)
    return -1;
  if (archive_write_close(w) != ARCHIVE_OK)
    return tp_error_set(err, EIO, "tar: %s", archive_error_string(w));
  free(made);
  made = NULL;
  return 0;
}
