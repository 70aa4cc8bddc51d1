/* tupper-agent: file operations on absolute paths inside the box.
 *
 * A request with UID GID GROUPS? runs with those filesystem ids (the
 * dispatcher switches around the handler, agent_cred.c): what it creates
 * belongs to that account, and the kernel checks permissions as for it.
 *
 * The agent runs in the box's own mount namespace and root, so a path (or a
 * symlink) can never name a host file.  Files are opened O_NONBLOCK so a
 * FIFO cannot hang the agent, and only regular files are read or written.
 * The agent's umask is 0: MODE fields are applied exactly.  Recursive removal
 * never follows a symlink and refuses to cross into another filesystem. */
#define _GNU_SOURCE
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fdpass.h"
#include "utils.h"

#define RM_DEPTH_MAX 512
/* FS_LIST: each ENTRY is one top-level field; a host parsing the reply with
 * TP_FIELDS_MAX fields must still be able to (one more for FLAGS). */
#define LIST_MAX (TP_LIST_MAX < TP_FIELDS_MAX - 1 ? TP_LIST_MAX : TP_FIELDS_MAX - 1)
#define LIST_PAYLOAD_MAX (TP_FRAME_MAX - 64u * 1024u)

/* A path split into its parent directory and last component. */
typedef struct path_split_s {
  char buf[TP_PATH_MAX + 2];
  const char *parent;
  const char *base;
} path_split_t;

static void closedirp(DIR **d) {
  if (*d != NULL)
    closedir(*d);
}
#define cleanup_dir __attribute__((cleanup(closedirp)))

static int file_type(mode_t m) {
  if (S_ISREG(m))
    return TP_FT_FILE;
  if (S_ISDIR(m))
    return TP_FT_DIR;
  if (S_ISLNK(m))
    return TP_FT_SYMLINK;
  return TP_FT_OTHER;
}

static void add_stat(tp_buf_t *b, const struct stat *st) {
  tp_frame_add_int(b, TP_TAG_TYPE, file_type(st->st_mode));
  tp_frame_add_int(b, TP_TAG_SIZE, st->st_size);
  tp_frame_add_int(b, TP_TAG_MODE, st->st_mode & 07777);
  tp_frame_add_int(b, TP_TAG_MTIME, st->st_mtim.tv_sec);
}

static int get_flags(const agent_req_t *r, int64_t known, const char *what, int64_t *out,
                     tp_error_t *err) {
  *out = agent_req_int(r, TP_TAG_FLAGS, 0);
  if (*out & ~known)
    return tp_error_set(err, EINVAL, "%s: unknown FLAGS 0x%llx", what, (unsigned long long) *out);
  return 0;
}

static int get_mode(const agent_req_t *r, mode_t def, const char *what, mode_t *out, tp_error_t *err) {
  int64_t m = agent_req_int(r, TP_TAG_MODE, def);
  if (m < 0 || m > 07777)
    return tp_error_set(err, EINVAL, "%s: bad MODE 0%llo", what, (unsigned long long) m);
  *out = (mode_t) m;
  return 0;
}

/* Splits an absolute path; trailing slashes are ignored.  Returns 1 for the
 * root directory itself (no parent). */
static int path_split(const char *path, path_split_t *ps) {
  size_t len = strlen(path);
  char *slash;
  memcpy(ps->buf, path, len + 1);
  while (len > 1 && ps->buf[len - 1] == '/')
    ps->buf[--len] = '\0';
  if (strcmp(ps->buf, "/") == 0)
    return 1;
  slash = strrchr(ps->buf, '/');
  *slash = '\0';
  ps->base = slash + 1;
  ps->parent = slash == ps->buf ? "/" : ps->buf;
  return 0;
}

static int mkdir_one(const char *path, mode_t mode, int *created, tp_error_t *err) {
  struct stat st;
  int e;
  if (mkdir(path, mode) == 0) {
    *created = 1;
    return 0;
  }
  e = errno;
  if (e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    *created = 0;
    return 0;
  }
  return tp_error_errno(err, e, "mkdir '%s'", path);
}

/* mkdir -p: missing parents get 0755, the last component `mode`. */
static int mkdir_parents(const char *path, mode_t mode, int *created, tp_error_t *err) {
  char buf[TP_PATH_MAX + 1];
  size_t len = strlen(path);
  int dummy;
  memcpy(buf, path, len + 1);
  while (len > 1 && buf[len - 1] == '/')
    buf[--len] = '\0';
  for (size_t i = 1; i < len; i++) {
    if (buf[i] != '/' || buf[i - 1] == '/')
      continue;
    buf[i] = '\0';
    if (mkdir_one(buf, 0755, &dummy, err) < 0)
      return -1;
    buf[i] = '/';
  }
  return mkdir_one(buf, mode, created, err);
}

/* ---- read / write ------------------------------------------------------------ */

int agent_fs_read(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed =
      AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_OFFSET) | AGENT_TAG(TP_TAG_LENGTH) | AGENT_AS_TAGS;
  char path[TP_PATH_MAX + 1];
  int64_t off = agent_req_int(r, TP_TAG_OFFSET, 0);
  int64_t len = agent_req_int(r, TP_TAG_LENGTH, TP_CHUNK_MAX);
  cleanup_close int fd = -1;
  struct stat st;
  size_t got = 0;
  uint8_t *room;

  if (agent_req_check(r, allowed, 0, "fs_read", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_read", path, err) < 0)
    return -1;
  if (off < 0 || len < 0)
    return tp_error_set(err, EINVAL, "fs_read: negative OFFSET or LENGTH");
  if (len > TP_CHUNK_MAX)
    len = TP_CHUNK_MAX;
  if (off > INT64_MAX - len)
    return tp_error_set(err, EINVAL, "fs_read: OFFSET too large");
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return tp_error_errno(err, errno, "read '%s'", path);
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "read '%s': fstat", path);
  if (S_ISDIR(st.st_mode))
    return tp_error_errno(err, EISDIR, "read '%s'", path);
  if (!S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "read '%s': not a regular file", path);
  /* SIZE first: DATA is read straight into the reply, as its last field */
  tp_frame_add_int(&a->out, TP_TAG_SIZE, st.st_size);
  if ((room = tp_frame_add_room(&a->out, TP_TAG_DATA, (uint32_t) len)) == NULL)
    return tp_error_set(err, ENOMEM, "read '%s': out of memory", path);
  while (got < (size_t) len) {
    ssize_t n = pread(fd, room + got, (size_t) len - got, (off_t) (off + (int64_t) got));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "read '%s'", path);
    if (n == 0)
      break;
    got += (size_t) n;
  }
  tp_frame_fit(&a->out, room, (uint32_t) len, (uint32_t) got);
  return 0;
}

int agent_fs_write(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed = AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_DATA) | AGENT_TAG(TP_TAG_OFFSET) |
                           AGENT_TAG(TP_TAG_FLAGS) | AGENT_TAG(TP_TAG_MODE) | AGENT_AS_TAGS;
  const int64_t known = TP_F_WRITE_TRUNC | TP_F_WRITE_APPEND | TP_F_WRITE_PARENTS;
  char path[TP_PATH_MAX + 1];
  int64_t off = agent_req_int(r, TP_TAG_OFFSET, 0), flags;
  const tp_field_t *data = agent_req_get(r, TP_TAG_DATA);
  int oflags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  cleanup_close int fd = -1;
  struct stat st;
  size_t done = 0;
  mode_t mode = 0;

  if (agent_req_check(r, allowed, 0, "fs_write", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_write", path, err) < 0 ||
      get_flags(r, known, "fs_write", &flags, err) < 0 || get_mode(r, 0644, "fs_write", &mode, err) < 0)
    return -1;
  if (data == NULL)
    return tp_error_set(err, EINVAL, "fs_write: no DATA");
  if (off < 0 || off > INT64_MAX - (int64_t) data->len)
    return tp_error_set(err, EINVAL, "fs_write: bad OFFSET");
  if (flags & TP_F_WRITE_PARENTS) {
    path_split_t ps;
    int created;
    if (path_split(path, &ps) == 1)
      return tp_error_set(err, EISDIR, "write '/'");
    if (mkdir_parents(ps.parent, 0755, &created, err) < 0)
      return tp_error_prefix(err, "write '%s'", path);
  }
  if (flags & TP_F_WRITE_TRUNC)
    oflags |= O_TRUNC;
  if (flags & TP_F_WRITE_APPEND)
    oflags |= O_APPEND;
  fd = open(path, oflags, mode);
  if (fd < 0)
    return tp_error_errno(err, errno, "write '%s'", path);
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "write '%s': fstat", path);
  if (!S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "write '%s': not a regular file", path);
  while (done < data->len) {
    ssize_t n = (flags & TP_F_WRITE_APPEND)
                    ? write(fd, data->val + done, data->len - done)
                    : pwrite(fd, data->val + done, data->len - done, (off_t) (off + (int64_t) done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "write '%s'", path);
    done += (size_t) n;
  }
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "write '%s': fstat", path);
  tp_frame_add_int(&a->out, TP_TAG_SIZE, st.st_size);
  return 0;
}

static void fdset_close(agent_fdset_t *s) {
  for (int i = 0; i < s->n; i++)
    close(s->fd[i]);
  s->n = 0;
}

/* FS_OPEN: PATH FLAGS? MODE?: opens PATH as FS_READ (or, with
 * TP_F_OPEN_WRITE, as FS_WRITE) does, as the request's account, refuses
 * anything but a regular file, and hands the open file to the host over
 * the one socket that came with the frame.  The agent keeps no copy. */
int agent_fs_open(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed =
      AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_FLAGS) | AGENT_TAG(TP_TAG_MODE) | AGENT_AS_TAGS;
  const int64_t known = TP_F_OPEN_WRITE | TP_F_WRITE_TRUNC | TP_F_WRITE_APPEND | TP_F_WRITE_PARENTS;
  __attribute__((cleanup(fdset_close))) agent_fdset_t set = {0};
  char path[TP_PATH_MAX + 1];
  cleanup_close int fd = -1;
  int64_t flags;
  int oflags = O_CLOEXEC | O_NOCTTY | O_NONBLOCK, sotype = 0;
  socklen_t sl = sizeof(sotype);
  const char *what;
  struct stat st;
  mode_t mode = 0;

  /* first: the set is this frame's, whatever becomes of the request */
  if (agent_fdsets_take(a, a->fpos, &set) < 0)
    set.n = 0;
  if (agent_req_check(r, allowed, 0, "fs_open", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_open", path, err) < 0 ||
      get_flags(r, known, "fs_open", &flags, err) < 0 || get_mode(r, 0644, "fs_open", &mode, err) < 0)
    return -1;
  if (set.n != 1 || getsockopt(set.fd[0], SOL_SOCKET, SO_TYPE, &sotype, &sl) < 0)
    return tp_error_set(err, EBADF, "fs_open: the request came without its one socket");
  if (!(flags & TP_F_OPEN_WRITE) && (flags & ~TP_F_OPEN_WRITE))
    return tp_error_set(err, EINVAL, "fs_open: TRUNC, APPEND and PARENTS need FLAGS WRITE");
  what = (flags & TP_F_OPEN_WRITE) ? "write" : "read";
  if (flags & TP_F_OPEN_WRITE) {
    oflags |= O_WRONLY | O_CREAT;
    if (flags & TP_F_WRITE_PARENTS) {
      path_split_t ps;
      int created;
      if (path_split(path, &ps) == 1)
        return tp_error_set(err, EISDIR, "write '/'");
      if (mkdir_parents(ps.parent, 0755, &created, err) < 0)
        return tp_error_prefix(err, "write '%s'", path);
    }
    if (flags & TP_F_WRITE_TRUNC)
      oflags |= O_TRUNC;
    if (flags & TP_F_WRITE_APPEND)
      oflags |= O_APPEND;
  } else {
    oflags |= O_RDONLY;
  }
  fd = open(path, oflags, mode);
  if (fd < 0)
    return tp_error_errno(err, errno, "%s '%s'", what, path);
  if (fstat(fd, &st) < 0)
    return tp_error_errno(err, errno, "%s '%s': fstat", what, path);
  if (S_ISDIR(st.st_mode))
    return tp_error_errno(err, EISDIR, "%s '%s'", what, path);
  if (!S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "%s '%s': not a regular file", what, path);
  /* one byte with the fd (SCM_RIGHTS) on the host's end of the socketpair
   * that came with the request */
  if (tp_fd_send(set.fd[0], "", 1, fd) != 1)
    return tp_error_errno(err, errno ? errno : EPIPE, "fs_open: cannot hand '%s' over", path);
  add_stat(&a->out, &st);
  return 0;
}

/* ---- metadata ------------------------------------------------------------------ */

int agent_fs_stat(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char path[TP_PATH_MAX + 1];
  struct stat st;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_AS_TAGS, 0, "fs_stat", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_stat", path, err) < 0)
    return -1;
  if (lstat(path, &st) < 0)
    return tp_error_errno(err, errno, "stat '%s'", path);
  add_stat(&a->out, &st);
  tp_frame_add_int(&a->out, TP_TAG_UID, st.st_uid);
  tp_frame_add_int(&a->out, TP_TAG_GID, st.st_gid);
  if (S_ISLNK(st.st_mode)) {
    char target[TP_PATH_MAX + 1];
    ssize_t n = readlink(path, target, sizeof(target));
    if (n < 0)
      return tp_error_errno(err, errno, "readlink '%s'", path);
    if ((size_t) n >= sizeof(target))
      return tp_error_set(err, ENAMETOOLONG, "readlink '%s': target too long", path);
    tp_frame_add(&a->out, TP_TAG_LINK, target, (uint32_t) n);
  }
  return 0;
}

typedef struct name_list_s {
  char **v;
  size_t n;
  size_t cap;
} name_list_t;

static void name_list_free(name_list_t *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->v[i]);
  free(l->v);
}
#define cleanup_names __attribute__((cleanup(name_list_free)))

static int name_list_add(name_list_t *l, const char *name) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char **v = realloc(l->v, cap * sizeof(*v));
    if (v == NULL)
      return -1;
    l->v = v;
    l->cap = cap;
  }
  if ((l->v[l->n] = strdup(name)) == NULL)
    return -1;
  l->n++;
  return 0;
}

static int cmp_names(const void *x, const void *y) {
  return strcmp(*(char *const *) x, *(char *const *) y);
}

int agent_fs_list(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char path[TP_PATH_MAX + 1];
  cleanup_names name_list_t names = {0};
  cleanup_dir DIR *d = NULL;
  struct dirent *e;
  int fd, count = 0, truncated = 0;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_AS_TAGS, 0, "fs_list", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_list", path, err) < 0)
    return -1;
  fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return tp_error_errno(err, errno, "list '%s'", path);
  d = fdopendir(fd);
  if (d == NULL) {
    int e0 = errno;
    close(fd);
    return tp_error_errno(err, e0, "list '%s'", path);
  }
  while ((errno = 0, e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (name_list_add(&names, e->d_name) < 0)
      return tp_error_set(err, ENOMEM, "list '%s': out of memory", path);
  }
  if (errno != 0)
    return tp_error_errno(err, errno, "list '%s'", path);
  if (names.n > 1)
    qsort(names.v, names.n, sizeof(*names.v), cmp_names);

  for (size_t i = 0; i < names.n; i++) {
    size_t payload = a->out.len - a->out.frame_start - TP_FRAME_HDR;
    struct stat st;
    size_t entry, g;
    if (fstatat(dirfd(d), names.v[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue; /* gone since readdir */
    /* name, type size mode mtime uid gid, and a symlink's target */
    entry = 6 + 6 + strlen(names.v[i]) + 6 * 14 + (S_ISLNK(st.st_mode) ? 6 + TP_PATH_MAX : 0);
    if (count == LIST_MAX || payload + entry + 14 > LIST_PAYLOAD_MAX) {
      truncated = 1;
      break;
    }
    g = tp_frame_group_begin(&a->out, TP_TAG_ENTRY);
    tp_frame_add_str(&a->out, TP_TAG_NAME, names.v[i]);
    add_stat(&a->out, &st);
    tp_frame_add_int(&a->out, TP_TAG_UID, st.st_uid);
    tp_frame_add_int(&a->out, TP_TAG_GID, st.st_gid);
    if (S_ISLNK(st.st_mode)) {
      /* the target, as fs_stat gives it; one that cannot be read or is too long is left out */
      char target[TP_PATH_MAX + 1];
      ssize_t n = readlinkat(dirfd(d), names.v[i], target, sizeof(target));
      if (n > 0 && (size_t) n < sizeof(target))
        tp_frame_add(&a->out, TP_TAG_LINK, target, (uint32_t) n);
    }
    tp_frame_group_end(&a->out, g);
    count++;
  }
  if (truncated)
    tp_frame_add_int(&a->out, TP_TAG_FLAGS, 1);
  return 0;
}

int agent_fs_mkdir(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed =
      AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_MODE) | AGENT_TAG(TP_TAG_FLAGS) | AGENT_AS_TAGS;
  char path[TP_PATH_MAX + 1];
  int64_t flags;
  mode_t mode = 0;
  int created = 0;

  if (agent_req_check(r, allowed, 0, "fs_mkdir", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_mkdir", path, err) < 0 ||
      get_flags(r, TP_F_MKDIR_PARENTS, "fs_mkdir", &flags, err) < 0 ||
      get_mode(r, 0755, "fs_mkdir", &mode, err) < 0)
    return -1;
  if ((flags & TP_F_MKDIR_PARENTS) ? mkdir_parents(path, mode, &created, err) < 0
                                   : mkdir_one(path, mode, &created, err) < 0)
    return -1;
  tp_frame_add_int(&a->out, TP_TAG_CREATED, created);
  return 0;
}

/* ---- remove / rename ------------------------------------------------------------ */

/* Removes `name` in directory dfd and, for a directory, everything below it,
 * through fds only: a symlink is unlinked, never followed. */
static int rm_at(int dfd, const char *name, dev_t dev, int depth, tp_error_t *err) {
  cleanup_dir DIR *d = NULL;
  struct dirent *e;
  struct stat st;
  int fd;

  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "stat '%s'", name);
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
      return tp_error_errno(err, errno, "unlink '%s'", name);
    return 0;
  }
  if (depth >= RM_DEPTH_MAX)
    return tp_error_set(err, ELOOP, "'%s': more than %d levels of directories", name, RM_DEPTH_MAX);
  fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return tp_error_errno(err, errno, "open '%s'", name);
  if (fstat(fd, &st) < 0 || (d = fdopendir(fd)) == NULL) {
    int e0 = errno;
    close(fd);
    return tp_error_errno(err, e0, "open '%s'", name);
  }
  if (st.st_dev != dev)
    return tp_error_set(err, EXDEV, "'%s' is on another filesystem", name);
  while ((errno = 0, e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (rm_at(dirfd(d), e->d_name, dev, depth + 1, err) < 0)
      return tp_error_prefix(err, "in '%s'", name);
  }
  if (errno != 0)
    return tp_error_errno(err, errno, "readdir '%s'", name);
  if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return tp_error_errno(err, errno, "rmdir '%s'", name);
  return 0;
}

int agent_fs_remove(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char path[TP_PATH_MAX + 1];
  path_split_t ps;
  struct stat st, root;
  cleanup_close int pfd = -1;
  int64_t flags;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_FLAGS) | AGENT_AS_TAGS, 0, "fs_remove",
                      err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_remove", path, err) < 0 ||
      get_flags(r, TP_F_REMOVE_RECURSIVE, "fs_remove", &flags, err) < 0)
    return -1;
  if (path_split(path, &ps) == 1)
    return tp_error_set(err, EBUSY, "remove '%s': refusing to remove the root", path);
  if (strcmp(ps.base, ".") == 0 || strcmp(ps.base, "..") == 0)
    return tp_error_set(err, EINVAL, "remove '%s': path ends in '%s'", path, ps.base);
  if (lstat(path, &st) < 0)
    return tp_error_errno(err, errno, "remove '%s'", path);
  if (stat("/", &root) == 0 && st.st_dev == root.st_dev && st.st_ino == root.st_ino)
    return tp_error_set(err, EBUSY, "remove '%s': refusing to remove the root", path);
  if (!(flags & TP_F_REMOVE_RECURSIVE)) {
    if ((S_ISDIR(st.st_mode) ? rmdir(path) : unlink(path)) < 0)
      return tp_error_errno(err, errno, "remove '%s'", path);
    return 0;
  }
  pfd = open(ps.parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0)
    return tp_error_errno(err, errno, "remove '%s': open '%s'", path, ps.parent);
  if (rm_at(pfd, ps.base, st.st_dev, 0, err) < 0)
    return tp_error_prefix(err, "remove '%s'", path);
  return 0;
}

int agent_fs_rename(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char from[TP_PATH_MAX + 1], to[TP_PATH_MAX + 1];
  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_PATH2) | AGENT_AS_TAGS, 0, "fs_rename",
                      err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_rename", from, err) < 0 ||
      agent_req_path(r, TP_TAG_PATH2, "fs_rename", to, err) < 0)
    return -1;
  if (rename(from, to) < 0)
    return tp_error_errno(err, errno, "rename '%s' to '%s'", from, to);
  return 0;
}

/* ---- attributes / symlinks ------------------------------------------------------ */

/* FS_SETATTR: PATH MODE? MTIME?.  MODE goes through chmod (a symlink's is
 * ignored: Linux keeps none), MTIME sets atime and mtime alike; the final
 * component is never followed. */
int agent_fs_setattr(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const uint64_t allowed =
      AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_MODE) | AGENT_TAG(TP_TAG_MTIME) | AGENT_AS_TAGS;
  char path[TP_PATH_MAX + 1];
  mode_t mode = 0;
  struct stat st;
  int64_t mtime = agent_req_int(r, TP_TAG_MTIME, -1);
  (void) a;

  if (agent_req_check(r, allowed, 0, "fs_setattr", err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_setattr", path, err) < 0 ||
      get_mode(r, 0, "fs_setattr", &mode, err) < 0)
    return -1;
  if (agent_req_get(r, TP_TAG_MTIME) != NULL && mtime < 0)
    return tp_error_set(err, EINVAL, "fs_setattr: negative MTIME");
  if (lstat(path, &st) < 0)
    return tp_error_errno(err, errno, "setattr '%s'", path);
  if (agent_req_get(r, TP_TAG_MODE) != NULL && !S_ISLNK(st.st_mode)) {
    /* opened without following, then changed through its fd: a symlink
     * swapped in after the lstat is not followed either */
    cleanup_close int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    char proc[64];
    if (fd < 0)
      return tp_error_errno(err, errno, "chmod '%s'", path);
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    if (fstat(fd, &st) < 0)
      return tp_error_errno(err, errno, "chmod '%s': fstat", path);
    if (!S_ISLNK(st.st_mode) && chmod(proc, mode) < 0) {
      if (errno != ENOENT)
        return tp_error_errno(err, errno, "chmod '%s'", path);
      if (fchmodat(AT_FDCWD, path, mode, 0) < 0) /* no /proc in this box */
        return tp_error_errno(err, errno, "chmod '%s'", path);
    }
  }
  if (mtime >= 0) {
    struct timespec ts[2] = {{.tv_sec = (time_t) mtime}, {.tv_sec = (time_t) mtime}};
    if (utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) < 0)
      return tp_error_errno(err, errno, "utimes '%s'", path);
  }
  return 0;
}

/* FS_SYMLINK: PATH LINK: a new symlink at PATH whose target is LINK (any
 * text without NUL, as symlink(2) takes it); an existing PATH is EEXIST. */
int agent_fs_symlink(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char path[TP_PATH_MAX + 1], target[TP_PATH_MAX + 1];
  const tp_field_t *link;
  (void) a;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_LINK) | AGENT_AS_TAGS, 0, "fs_symlink",
                      err) < 0 ||
      agent_req_path(r, TP_TAG_PATH, "fs_symlink", path, err) < 0)
    return -1;
  link = agent_req_get(r, TP_TAG_LINK);
  if (link == NULL || link->len == 0)
    return tp_error_set(err, EINVAL, "fs_symlink: no LINK");
  if (link->len > TP_PATH_MAX)
    return tp_error_set(err, ENAMETOOLONG, "fs_symlink: LINK longer than %d bytes", TP_PATH_MAX);
  if (memchr(link->val, '\0', link->len) != NULL)
    return tp_error_set(err, EINVAL, "fs_symlink: LINK contains a NUL byte");
  memcpy(target, link->val, link->len);
  target[link->len] = '\0';
  if (symlink(target, path) < 0)
    return tp_error_errno(err, errno, "symlink '%s'", path);
  return 0;
}
