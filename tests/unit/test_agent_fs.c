/* The agent's file operations (FS_READ, FS_WRITE, FS_STAT, FS_LIST,
 * FS_MKDIR, FS_REMOVE, FS_RENAME, FS_SETATTR, FS_SYMLINK, FS_OPEN) on one channel to the real tupper-agent
 * (agent_client.h): offsets, modes, big files in chunks, a listing too big
 * for one reply, removes that never follow a symlink, path validation; and
 * the same requests acting as an account (UID GID GROUPS), whose
 * permissions apply and whose files are its own.  Runs as root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "tap.h"
#include "agent_client.h"

/* ---- files ---------------------------------------------------------------------------- */

/* A directory too big for one reply: the listing is cut, flagged, sorted,
 * and still parses with the codec's TP_FIELDS_MAX. */
static void test_list_many(host_t *h, const char *d) {
  const int files = TP_FIELDS_MAX + 40;
  char dir[PATH_MAX], name[PATH_MAX], num[16];
  tp_field_t *fs = calloc(TP_FIELDS_MAX, sizeof(*fs));
  int k = 0, sorted = 1;
  char prev[32] = "";
  msg_t *m;

  join(dir, d, "/many");
  mkdir(dir, 0755);
  for (int i = 0; i < files; i++) {
    snprintf(num, sizeof(num), "/%05d", (i * 7919) % files);
    close(open(join(name, dir, num), O_WRONLY | O_CREAT, 0644));
  }
  m = path_req(h, TP_MSG_FS_LIST, dir);
  for (int i = 0; m && i < m->n; i++) {
    tp_field_t sub[8];
    int n;
    const tp_field_t *nf;
    char cur[32] = "";
    if (m->f[i].tag != TP_TAG_ENTRY)
      continue;
    n = tp_fields_parse(m->f[i].val, m->f[i].len, sub, 8);
    nf = n > 0 ? tp_fields_get(sub, n, TP_TAG_NAME) : NULL;
    if (nf != NULL && nf->len < sizeof(cur))
      memcpy(cur, nf->val, nf->len);
    sorted &= strcmp(prev, cur) < 0;
    memcpy(prev, cur, sizeof(prev));
    k++;
  }
  check(msg_is_ok(m) && msg_int(m, TP_TAG_FLAGS, 0) == 1 && k > 1000 && k < files && k <= TP_LIST_MAX,
        "list of %d entries: %d sent, FLAGS=1 (truncated)", files, k);
  check(sorted, "the truncated listing is sorted");
  check(m && tp_fields_parse(m->raw, m->len, fs, TP_FIELDS_MAX) == m->n,
        "the reply parses with TP_FIELDS_MAX fields");
  msg_free(m);
  free(fs);
}

static void test_fs(host_t *h, const char *tmp) {
  char d[PATH_MAX], a[PATH_MAX], big[PATH_MAX], big2[PATH_MAX], deep[PATH_MAX], path[PATH_MAX];
  char outside[PATH_MAX], keep[PATH_MAX], tree[PATH_MAX], longpath[TP_PATH_MAX + 16];
  const size_t bigsize = 3u * 1024 * 1024;
  uint8_t *pat = malloc(bigsize);
  struct stat st;
  msg_t *m;
  int good;

  join(d, tmp, "/fs");
  join(a, d, "/a.txt");
  join(big, d, "/big");
  join(big2, d, "/big2");

  m = flags_req(h, TP_MSG_FS_MKDIR, d, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 1, "mkdir -> CREATED 1");
  msg_free(m);
  m = flags_req(h, TP_MSG_FS_MKDIR, d, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 0, "mkdir of an existing dir -> CREATED 0");
  msg_free(m);
  check(stat(d, &st) == 0 && (st.st_mode & 07777) == 0755, "mkdir default mode 0755");

  /* write / read */
  m = write_req(h, a, "hello", 5, -1, TP_F_WRITE_TRUNC, 0600);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 5, "write 'hello' -> SIZE 5");
  msg_free(m);
  check(stat(a, &st) == 0 && (st.st_mode & 07777) == 0600, "MODE 0600 applied exactly on create");
  m = read_req(h, a, -1, -1);
  check(msg_is_ok(m) && data_eq(m, "hello", 5) && msg_int(m, TP_TAG_SIZE, -1) == 5, "read it back");
  msg_free(m);
  m = write_req(h, a, "XY", 2, 10, 0, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 12, "write at OFFSET 10 without TRUNC -> SIZE 12");
  msg_free(m);
  m = read_req(h, a, 3, 9);
  check(msg_is_ok(m) && data_eq(m, "lo\0\0\0\0\0XY", 9), "read OFFSET 3 LENGTH 9 sees the hole");
  msg_free(m);
  m = write_req(h, a, "!", 1, -1, TP_F_WRITE_APPEND, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 13, "APPEND -> SIZE 13");
  msg_free(m);
  m = write_req(h, a, "new", 3, -1, TP_F_WRITE_TRUNC, 0644);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 3, "TRUNC -> SIZE 3");
  msg_free(m);
  check(stat(a, &st) == 0 && (st.st_mode & 07777) == 0600, "MODE is only used on create");
  m = read_req(h, a, 100, -1);
  check(msg_is_ok(m) && data_eq(m, "", 0), "read past EOF -> empty DATA");
  msg_free(m);

  join(deep, d, "/p/q/r/f.txt");
  m = write_req(h, deep, "x", 1, -1, TP_F_WRITE_PARENTS, -1);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 1, "write with PARENTS creates p/q/r");
  msg_free(m);
  join(path, d, "/p/q");
  check(stat(path, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755, "parents are 0755");
  join(path, d, "/x/y/f");
  expect_err(write_req(h, path, "x", 1, -1, 0, -1), ENOENT, "write without PARENTS into a missing dir");
  expect_err(write_req(h, d, "x", 1, -1, 0, -1), EISDIR, "write to a directory");
  expect_err(write_req(h, a, "x", 1, -1, 0x80, -1), EINVAL, "write with unknown FLAGS");
  expect_err(write_req(h, a, "x", 1, -1, 0, 010000), EINVAL, "write with MODE beyond 07777");

  /* 3 MiB in 1 MiB chunks, both ways */
  for (size_t i = 0; i < bigsize; i++)
    pat[i] = (uint8_t) (i * 7 + i / 4093);
  good = 1;
  for (size_t off = 0; off < bigsize; off += TP_CHUNK_MAX) {
    m = write_req(h, big, pat + off, TP_CHUNK_MAX, (int64_t) off, off == 0 ? TP_F_WRITE_TRUNC : 0, -1);
    good &= msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == (int64_t) (off + TP_CHUNK_MAX);
    msg_free(m);
  }
  check(good, "3 MiB written in three 1 MiB chunks");
  good = 1;
  for (size_t off = 0; off < bigsize; off += TP_CHUNK_MAX) {
    m = read_req(h, big, (int64_t) off, -1);
    good &= msg_is_ok(m) && data_eq(m, pat + off, TP_CHUNK_MAX) &&
            msg_int(m, TP_TAG_SIZE, -1) == (int64_t) bigsize;
    msg_free(m);
  }
  check(good, "3 MiB read back in 1 MiB chunks (default LENGTH), SIZE is the file size");
  m = read_req(h, big, 0, 2 * TP_CHUNK_MAX);
  check(msg_is_ok(m) && data_eq(m, pat, TP_CHUNK_MAX), "LENGTH above TP_CHUNK_MAX is clamped");
  msg_free(m);
  m = read_req(h, big, (int64_t) bigsize - 1000, 5000);
  check(msg_is_ok(m) && data_eq(m, pat + bigsize - 1000, 1000), "a read at the tail is short");
  msg_free(m);
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_READ);
    tp_frame_add_str(b, TP_TAG_PATH, big);
    tp_frame_add_int(b, TP_TAG_OFFSET, -2);
    expect_err(req_call(h), EINVAL, "negative OFFSET");
  }
  expect_err(path_req(h, TP_MSG_FS_READ, d), EISDIR, "read of a directory");
  join(path, d, "/missing");
  expect_err(path_req(h, TP_MSG_FS_READ, path), ENOENT, "read of a missing file");

  /* stat */
  m = path_req(h, TP_MSG_FS_STAT, a);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_FILE && msg_int(m, TP_TAG_SIZE, -1) == 3 &&
            msg_int(m, TP_TAG_MODE, -1) == 0600 && msg_int(m, TP_TAG_MTIME, 0) > 1000000000 &&
            msg_int(m, TP_TAG_UID, -1) == (int64_t) getuid() &&
            msg_int(m, TP_TAG_GID, -1) == (int64_t) getgid() && msg_get(m, TP_TAG_LINK) == NULL,
        "stat of a file: TYPE SIZE MODE MTIME UID GID");
  msg_free(m);
  m = path_req(h, TP_MSG_FS_STAT, d);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_DIR, "stat of a dir: TYPE DIR");
  msg_free(m);
  join(path, d, "/link");
  check(symlink("a.txt", path) == 0, "make a symlink");
  m = path_req(h, TP_MSG_FS_STAT, path);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_SYMLINK && msg_get(m, TP_TAG_LINK) &&
            msg_get(m, TP_TAG_LINK)->len == 5 && memcmp(msg_get(m, TP_TAG_LINK)->val, "a.txt", 5) == 0,
        "stat of a symlink: TYPE SYMLINK, LINK is its target");
  msg_free(m);
  join(path, d, "/missing");
  expect_err(path_req(h, TP_MSG_FS_STAT, path), ENOENT, "stat of a missing path");

  /* list: a.txt big link p (sorted) */
  m = path_req(h, TP_MSG_FS_LIST, d);
  {
    const char *names[] = {"a.txt", "big", "link", "p"};
    const int types[] = {TP_FT_FILE, TP_FT_FILE, TP_FT_SYMLINK, TP_FT_DIR};
    int k = 0;
    good = msg_is_ok(m) && msg_get(m, TP_TAG_FLAGS) == NULL;
    for (int i = 0; m && i < m->n; i++) {
      tp_field_t sub[16];
      int n;
      const tp_field_t *name;
      if (m->f[i].tag != TP_TAG_ENTRY)
        continue;
      n = tp_fields_parse(m->f[i].val, m->f[i].len, sub, 16);
      name = tp_fields_get(sub, n > 0 ? n : 0, TP_TAG_NAME);
      /* NAME TYPE SIZE MODE MTIME UID GID, and LINK for the symlink */
      good &= k < 4 && n == (k == 2 ? 8 : 7) && name != NULL && name->len == strlen(names[k]) &&
              memcmp(name->val, names[k], name->len) == 0;
      if (k < 4 && n > 0) {
        int64_t type = 0, size = -1, uid = -1, gid = -1;
        const tp_field_t *link = tp_fields_get(sub, n, TP_TAG_LINK);
        tp_field_int(tp_fields_get(sub, n, TP_TAG_TYPE), &type);
        tp_field_int(tp_fields_get(sub, n, TP_TAG_SIZE), &size);
        tp_field_int(tp_fields_get(sub, n, TP_TAG_UID), &uid);
        tp_field_int(tp_fields_get(sub, n, TP_TAG_GID), &gid);
        good &= type == types[k] && (k != 1 || size == (int64_t) bigsize);
        good &= uid == (int64_t) getuid() && gid == (int64_t) getgid();
        good &= k == 2 ? link != NULL && link->len == 5 && memcmp(link->val, "a.txt", 5) == 0 : link == NULL;
      }
      k++;
    }
    check(good && k == 4, "list: 4 ENTRY groups sorted by NAME, with TYPE, SIZE, UID, GID (lstat) and a symlink's LINK");
  }
  msg_free(m);
  expect_err(path_req(h, TP_MSG_FS_LIST, a), ENOTDIR, "list of a file");
  test_list_many(h, d);

  /* mkdir */
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, a, 0, -1), EEXIST, "mkdir over a file");
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, a, TP_F_MKDIR_PARENTS, -1), EEXIST, "mkdir -p over a file");
  join(path, d, "/m/n/o");
  expect_err(flags_req(h, TP_MSG_FS_MKDIR, path, 0, -1), ENOENT, "mkdir with a missing parent");
  m = flags_req(h, TP_MSG_FS_MKDIR, path, TP_F_MKDIR_PARENTS, 0700);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 1, "mkdir PARENTS -> CREATED 1");
  msg_free(m);
  check(stat(path, &st) == 0 && (st.st_mode & 07777) == 0700, "mkdir MODE 0700 applied");
  m = flags_req(h, TP_MSG_FS_MKDIR, path, TP_F_MKDIR_PARENTS, 0700);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_CREATED, -1) == 0, "mkdir PARENTS again -> CREATED 0");
  msg_free(m);

  /* remove: a recursive remove never follows a symlink */
  join(outside, tmp, "/outside");
  join(keep, tmp, "/outside/keep.txt");
  join(tree, d, "/tree");
  join(path, d, "/tree/sub");
  mkdir(outside, 0755);
  close(open(keep, O_WRONLY | O_CREAT, 0644));
  mkdir(tree, 0755);
  mkdir(path, 0755);
  join(path, d, "/tree/sub/dirlink");
  check(symlink(outside, path) == 0, "symlink to a directory outside the tree");
  join(path, d, "/tree/filelink");
  check(symlink(keep, path) == 0, "symlink to a file outside the tree");
  join(path, d, "/tree/sub/f");
  close(open(path, O_WRONLY | O_CREAT, 0644));
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, tree, 0, -1), ENOTEMPTY, "non-recursive remove of a non-empty dir");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, tree, TP_F_REMOVE_RECURSIVE, -1), "recursive remove");
  check(lstat(tree, &st) < 0 && errno == ENOENT, "the tree is gone");
  check(stat(keep, &st) == 0 && stat(outside, &st) == 0, "the symlinks' targets outside survive");
  join(path, d, "/link");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, path, TP_F_REMOVE_RECURSIVE, -1), "recursive remove of a symlink");
  check(stat(a, &st) == 0, "removes the link, not its target");
  m = flags_req(h, TP_MSG_FS_REMOVE, "/", TP_F_REMOVE_RECURSIVE, -1);
  check(msg_errno(m) == EBUSY || msg_errno(m) == EINVAL, "remove of / is refused");
  msg_free(m);
  join(path, d, "/..");
  m = flags_req(h, TP_MSG_FS_REMOVE, "/tmp/..", TP_F_REMOVE_RECURSIVE, -1);
  check(msg_errno(m) == EBUSY || msg_errno(m) == EINVAL, "remove of /tmp/.. is refused");
  msg_free(m);
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, path, TP_F_REMOVE_RECURSIVE, -1), EINVAL,
             "remove of a path ending in ..");
  expect_ok(flags_req(h, TP_MSG_FS_REMOVE, a, 0, -1), "remove a file");
  check(lstat(a, &st) < 0 && errno == ENOENT, "the file is gone");
  expect_err(flags_req(h, TP_MSG_FS_REMOVE, a, 0, -1), ENOENT, "remove of a missing path");

  /* rename */
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_RENAME);
    tp_frame_add_str(b, TP_TAG_PATH, big);
    tp_frame_add_str(b, TP_TAG_PATH2, big2);
    expect_ok(req_call(h), "rename");
  }
  check(lstat(big, &st) < 0 && stat(big2, &st) == 0 && (size_t) st.st_size == bigsize,
        "renamed: old name gone, new name has the data");
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_RENAME);
    tp_frame_add_str(b, TP_TAG_PATH, big2);
    expect_err(req_call(h), EINVAL, "rename without PATH2");
  }

  /* path validation */
  expect_err(path_req(h, TP_MSG_FS_READ, "relative/path"), EINVAL, "relative path (read)");
  expect_err(write_req(h, "x", "x", 1, -1, 0, -1), EINVAL, "relative path (write)");
  expect_err(path_req(h, TP_MSG_FS_LIST, ""), EINVAL, "empty path (list)");
  memset(longpath, 'a', sizeof(longpath) - 1);
  longpath[0] = '/';
  longpath[TP_PATH_MAX + 1] = '\0';
  expect_err(path_req(h, TP_MSG_FS_STAT, longpath), ENAMETOOLONG, "path longer than TP_PATH_MAX");
  free(pat);
}

/* ---- acting as an account (UID GID GROUPS? on FS_* and WATCH_ADD) ---------------------- */

/* Adds UID, GID and (ngroups > 0) GROUPS, each group as a u32 (raw: the
 * field's bytes as given, for hostile sizes). */
static void add_as(tp_buf_t *b, int64_t uid, int64_t gid, const uint32_t *groups, int ngroups) {
  uint8_t raw[4 * 80];
  if (uid != NO_ID)
    tp_frame_add_int(b, TP_TAG_UID, uid);
  if (gid != NO_ID)
    tp_frame_add_int(b, TP_TAG_GID, gid);
  for (int i = 0; i < ngroups && i < 80; i++)
    for (int k = 0; k < 4; k++)
      raw[4 * i + k] = (uint8_t) (groups[i] >> (8 * k));
  if (ngroups > 0)
    tp_frame_add(b, TP_TAG_GROUPS, raw, (uint32_t) (4 * (ngroups < 80 ? ngroups : 80)));
}

/* ---- FS_OPEN: the open file handed to the host ------------------------------------------ */

static int agent_fd_count(pid_t pid) {
  char path[64];
  struct dirent *e;
  DIR *d;
  int n = 0;
  snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
  if ((d = opendir(path)) == NULL)
    return -1;
  while ((e = readdir(d)) != NULL)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* FS_OPEN of path with flags (and mode, as uid:gid unless NO_ID), sent
 * with nsocks sockets attached (the other ends of socketpairs: *fd gets
 * the file that came back on the first, or -1). */
static msg_t *open_req(host_t *h, const char *path, int flags, int mode, int64_t uid, int64_t gid,
                       int nsocks, int *fd) {
  union {
    struct cmsghdr hd;
    char buf[CMSG_SPACE(sizeof(int) * 2)];
  } cm, rcm;
  int sp[2][2] = {{-1, -1}, {-1, -1}}, theirs[2];
  struct iovec iov;
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  tp_buf_t *b = req_begin(h, TP_MSG_FS_OPEN);
  msg_t *m = NULL;
  *fd = -1;
  tp_frame_add_str(b, TP_TAG_PATH, path);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  if (mode >= 0)
    tp_frame_add_int(b, TP_TAG_MODE, mode);
  add_as(b, uid, gid, NULL, 0);
  if (tp_frame_end(&h->req) < 0)
    return NULL;
  for (int i = 0; i < nsocks; i++) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp[i]) < 0)
      return NULL;
    theirs[i] = sp[i][1];
  }
  iov = (struct iovec){.iov_base = h->req.data, .iov_len = h->req.len};
  if (nsocks > 0) {
    struct cmsghdr *c;
    memset(cm.buf, 0, sizeof(cm.buf));
    mh.msg_control = cm.buf;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t) nsocks);
    c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t) nsocks);
    memcpy(CMSG_DATA(c), theirs, sizeof(int) * (size_t) nsocks);
  }
  if (sendmsg(h->fd, &mh, MSG_NOSIGNAL) == (ssize_t) h->req.len)
    m = wait_reply(h, h->cur_id);
  for (int i = 0; i < nsocks; i++)
    close(sp[i][1]);
  if (nsocks > 0) {
    char byte;
    struct iovec riov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr rmh = {.msg_iov = &riov, .msg_iovlen = 1, .msg_control = rcm.buf,
                         .msg_controllen = sizeof(rcm.buf)};
    if (recvmsg(sp[0][0], &rmh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) == 1) {
      struct cmsghdr *c = CMSG_FIRSTHDR(&rmh);
      if (c != NULL && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(fd, CMSG_DATA(c), sizeof(int));
    }
  }
  for (int i = 0; i < nsocks; i++)
    close(sp[i][0]);
  return m;
}

static void test_fs_open(host_t *h, const char *tmp) {
  char d[PATH_MAX], f[PATH_MAX], p[PATH_MAX], buf[64];
  struct stat st;
  int fd, before, n;
  msg_t *m;

  join(d, tmp, "/open");
  mkdir(d, 0755);
  join(f, d, "/sub/new");
  before = agent_fd_count(h->agent);

  m = open_req(h, f, TP_F_OPEN_WRITE | TP_F_WRITE_TRUNC | TP_F_WRITE_PARENTS, 0600, NO_ID, NO_ID, 1, &fd);
  check(msg_is_ok(m) && fd >= 0 && msg_int(m, TP_TAG_TYPE, -1) == TP_FT_FILE &&
            msg_int(m, TP_TAG_SIZE, -1) == 0 && msg_int(m, TP_TAG_MODE, -1) == 0600,
        "FS_OPEN WRITE|TRUNC|PARENTS: OK TYPE file SIZE 0 MODE 0600, and an fd on the socket");
  check(fd >= 0 && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_WRONLY && fstat(fd, &st) == 0 &&
            S_ISREG(st.st_mode),
        "the fd is the regular file, write-only");
  check(fd >= 0 && write(fd, "hello", 5) == 5 && stat(f, &st) == 0 && st.st_size == 5 &&
            (st.st_mode & 07777) == 0600,
        "bytes written through it are the file's; MODE applied on create");
  if (fd >= 0)
    close(fd);
  check(agent_fd_count(h->agent) == before, "the agent keeps no copy of the file or the socket (%d fds)",
        agent_fd_count(h->agent));

  m = open_req(h, f, 0, -1, NO_ID, NO_ID, 1, &fd);
  n = fd >= 0 ? (int) read(fd, buf, sizeof(buf)) : -1;
  check(msg_is_ok(m) && fd >= 0 && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY && n == 5 &&
            memcmp(buf, "hello", 5) == 0 && msg_int(m, TP_TAG_SIZE, -1) == 5,
        "FS_OPEN for reading: a read-only fd of the file, SIZE 5");
  if (fd >= 0)
    close(fd);
  msg_free(m);
  m = open_req(h, f, TP_F_OPEN_WRITE | TP_F_WRITE_TRUNC, -1, NO_ID, NO_ID, 1, &fd);
  check(msg_is_ok(m) && fd >= 0 && stat(f, &st) == 0 && st.st_size == 0 && (st.st_mode & 07777) == 0600,
        "TRUNC empties an existing file and keeps its mode");
  if (fd >= 0)
    close(fd);
  msg_free(m);

  /* no socket, two sockets: refused, nothing opened */
  expect_err(open_req(h, f, 0, -1, NO_ID, NO_ID, 0, &fd), EBADF, "FS_OPEN without its socket");
  check(fd < 0, "no fd without a socket");
  expect_err(open_req(h, f, 0, -1, NO_ID, NO_ID, 2, &fd), EBADF, "FS_OPEN with two sockets");
  check(fd < 0, "no fd with two sockets");
  /* not regular files: a directory, a FIFO (no hang: O_NONBLOCK), a device */
  expect_err(open_req(h, d, 0, -1, NO_ID, NO_ID, 1, &fd), EISDIR, "FS_OPEN of a directory (read)");
  expect_err(open_req(h, d, TP_F_OPEN_WRITE, -1, NO_ID, NO_ID, 1, &fd), EISDIR,
             "FS_OPEN of a directory (write)");
  join(p, d, "/fifo");
  check(mkfifo(p, 0666) == 0, "mkfifo");
  expect_err(open_req(h, p, 0, -1, NO_ID, NO_ID, 1, &fd), EINVAL, "FS_OPEN of a FIFO (read)");
  check(fd < 0, "no fd for a FIFO");
  expect_err(open_req(h, p, TP_F_OPEN_WRITE, -1, NO_ID, NO_ID, 1, &fd), ENXIO,
             "FS_OPEN of a FIFO without a reader (write): ENXIO, no hang");
  expect_err(open_req(h, "/dev/null", TP_F_OPEN_WRITE, -1, NO_ID, NO_ID, 1, &fd), EINVAL,
             "FS_OPEN of a device (write)");
  expect_err(open_req(h, "/dev/zero", 0, -1, NO_ID, NO_ID, 1, &fd), EINVAL, "FS_OPEN of a device (read)");
  check(fd < 0, "no fd for a device");
  /* bad requests */
  expect_err(open_req(h, f, TP_F_WRITE_TRUNC, -1, NO_ID, NO_ID, 1, &fd), EINVAL, "TRUNC without WRITE");
  expect_err(open_req(h, f, 0x100, -1, NO_ID, NO_ID, 1, &fd), EINVAL, "unknown FLAGS");
  expect_err(open_req(h, "rel", 0, -1, NO_ID, NO_ID, 1, &fd), EINVAL, "a relative path");
  /* as an account: the kernel's permissions, its ownership */
  expect_err(open_req(h, f, 0, -1, 65534, 65534, 1, &fd), EACCES, "reading a 0600 root file as 65534");
  expect_err(open_req(h, f, TP_F_OPEN_WRITE, -1, 65534, 65534, 1, &fd), EACCES,
             "writing a 0600 root file as 65534");
  check(fd < 0, "no fd for a file the account may not open");
  chmod(tmp, 0711);
  chmod(d, 0777);
  join(p, d, "/theirs");
  m = open_req(h, p, TP_F_OPEN_WRITE | TP_F_WRITE_TRUNC, 0640, 65534, 65534, 1, &fd);
  check(msg_is_ok(m) && fd >= 0 && stat(p, &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534,
        "a file opened as 65534 is created as theirs");
  if (fd >= 0)
    close(fd);
  msg_free(m);
  chmod(tmp, 0700);
  check(agent_fd_count(h->agent) == before, "after every refusal the agent holds no more fds (%d)",
        agent_fd_count(h->agent));
}

static msg_t *write_as(host_t *h, const char *path, const char *data, int flags, int64_t uid,
                       int64_t gid, const uint32_t *groups, int ngroups) {
  tp_buf_t *b = req_begin(h, TP_MSG_FS_WRITE);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  tp_frame_add(b, TP_TAG_DATA, data, (uint32_t) strlen(data));
  tp_frame_add_int(b, TP_TAG_FLAGS, TP_F_WRITE_TRUNC | flags);
  add_as(b, uid, gid, groups, ngroups);
  return req_call(h);
}

/* A request of type with PATH (and PATH2 or FLAGS), as uid:gid. */
static msg_t *path_as(host_t *h, uint8_t type, const char *path, const char *path2, int flags,
                      int64_t uid, int64_t gid) {
  tp_buf_t *b = req_begin(h, type);
  tp_frame_add_str(b, TP_TAG_PATH, path);
  if (path2)
    tp_frame_add_str(b, TP_TAG_PATH2, path2);
  if (flags)
    tp_frame_add_int(b, TP_TAG_FLAGS, flags);
  add_as(b, uid, gid, NULL, 0);
  return req_call(h);
}

static int owned_by(const char *path, uid_t uid, gid_t gid) {
  struct stat st;
  return lstat(path, &st) == 0 && st.st_uid == uid && st.st_gid == gid;
}

/* The agent's own filesystem ids and groups are root's, none. */
static int agent_is_root(const host_t *h) {
  char path[64], t[4096];
  ssize_t n;
  snprintf(path, sizeof(path), "/proc/%d/status", (int) h->agent);
  n = slurp(path, t, sizeof(t));
  return n > 0 && field_is(t, (size_t) n, "Uid", "0\t0\t0\t0") &&
         field_is(t, (size_t) n, "Gid", "0\t0\t0\t0") && field_is(t, (size_t) n, "Groups", "");
}

static void test_fs_as(host_t *h, const char *tmp) {
  char home[PATH_MAX], etc[PATH_MAX], priv[PATH_MAX], grp[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
  const uint32_t both[] = {1000, 2000}, bad_group[] = {70000};
  uint32_t many[TP_GROUPS_MAX + 1];
  const char *status[] = {"/bin/cat", "/proc/self/status", NULL};
  int64_t rec;
  tproc_t *pr;
  msg_t *m;

  /* tmp: searchable by anyone; home: uid 1000's; etc: root's 0755; priv:
   * root's 0700; grp: root:2000 0770 */
  join(home, tmp, "/home");
  join(etc, tmp, "/etc");
  join(priv, tmp, "/priv");
  join(grp, tmp, "/grp");
  check(chmod(tmp, 0711) == 0 && mkdir(home, 0755) == 0 && chown(home, 1000, 1000) == 0 &&
            mkdir(etc, 0755) == 0 && mkdir(priv, 0700) == 0 && mkdir(grp, 0770) == 0 &&
            chown(grp, 0, 2000) == 0 && chmod(home, 0755) == 0 && chmod(etc, 0755) == 0 &&
            chmod(grp, 0770) == 0 && sh_in(h, priv, "echo s > secret && echo e > ../etc/e && chmod 644 ../etc/e"),
        "set up home (1000), etc (root 0755), priv (root 0700), grp (root:2000 0770)");

  /* writes: what the account creates is its own, parents included */
  m = write_as(h, join(p, home, "/a/b/f"), "hi", TP_F_WRITE_PARENTS, 1000, 1000, NULL, 0);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_SIZE, -1) == 2, "FS_WRITE as 1000 with PARENTS -> OK");
  msg_free(m);
  check(owned_by(p, 1000, 1000) && owned_by(join(q, home, "/a"), 1000, 1000) &&
            owned_by(join(q, home, "/a/b"), 1000, 1000),
        "the file and the parents made for it belong to 1000:1000");
  m = write_as(h, join(p, etc, "/x"), "no", 0, 1000, 1000, NULL, 0);
  check(msg_errno(m) == EACCES && msg_has_text(m, "etc/x") && access(p, F_OK) < 0,
        "FS_WRITE as 1000 into root's 0755 dir -> ERR EACCES naming the path, nothing made");
  msg_free(m);
  expect_err(write_as(h, join(p, etc, "/e"), "no", 0, 1000, 1000, NULL, 0), EACCES,
             "FS_WRITE as 1000 over root's 0644 file");
  expect_err(write_as(h, join(p, etc, "/new/f"), "no", TP_F_WRITE_PARENTS, 1000, 1000, NULL, 0),
             EACCES, "FS_WRITE as 1000 whose parent it would have to make in root's dir");
  check(agent_is_root(h), "after a refused request the agent's fs ids are root's again");
  m = write_as(h, join(p, etc, "/x"), "ok", 0, NO_ID, NO_ID, NULL, 0);
  check(msg_is_ok(m) && owned_by(p, 0, 0), "the same FS_WRITE without UID/GID acts as root");
  msg_free(m);
  m = write_as(h, join(p, etc, "/x0"), "ok", 0, 0, 0, NULL, 0);
  check(msg_is_ok(m) && owned_by(p, 0, 0), "UID 0 GID 0 acts as root too");
  msg_free(m);

  /* groups: the account's supplementary groups count, and only those given */
  expect_err(write_as(h, join(p, grp, "/f"), "no", 0, 1000, 1000, NULL, 0), EACCES,
             "FS_WRITE as 1000 (groups {1000}) into root:2000 0770");
  m = write_as(h, join(p, grp, "/f"), "ok", 0, 1000, 1000, both, 2);
  check(msg_is_ok(m) && owned_by(p, 1000, 1000), "with GROUPS {1000, 2000} -> OK, the file is 1000:1000");
  msg_free(m);

  /* reads, stat, list: the account's permissions */
  expect_err(path_as(h, TP_MSG_FS_READ, join(p, priv, "/secret"), NULL, 0, 1000, 1000), EACCES,
             "FS_READ as 1000 under root's 0700 dir");
  expect_err(path_as(h, TP_MSG_FS_STAT, p, NULL, 0, 1000, 1000), EACCES, "FS_STAT as 1000 there");
  expect_err(path_as(h, TP_MSG_FS_LIST, priv, NULL, 0, 1000, 1000), EACCES, "FS_LIST as 1000 of it");
  expect_err(path_as(h, TP_MSG_WATCH_ADD, priv, NULL, 0, 1000, 1000), EACCES, "WATCH_ADD as 1000 of it");
  m = path_as(h, TP_MSG_FS_READ, p, NULL, 0, NO_ID, NO_ID);
  check(msg_is_ok(m) && data_eq(m, "s\n", 2), "root reads it");
  msg_free(m);
  m = path_as(h, TP_MSG_FS_READ, join(p, home, "/a/b/f"), NULL, 0, 1000, 1000);
  check(msg_is_ok(m) && data_eq(m, "hi", 2), "FS_READ as 1000 of its own file");
  msg_free(m);
  m = path_as(h, TP_MSG_FS_LIST, home, NULL, 0, 1000, 1000);
  check(msg_is_ok(m) && tp_fields_count(m->f, m->n, TP_TAG_ENTRY) == 1, "FS_LIST as 1000 of its home");
  msg_free(m);

  /* mkdir, rename, remove */
  m = path_as(h, TP_MSG_FS_MKDIR, join(p, home, "/d/e"), NULL, TP_F_MKDIR_PARENTS, 1000, 1000);
  check(msg_is_ok(m) && owned_by(p, 1000, 1000) && owned_by(join(q, home, "/d"), 1000, 1000),
        "FS_MKDIR -p as 1000 -> its own directories");
  msg_free(m);
  expect_err(path_as(h, TP_MSG_FS_MKDIR, join(p, etc, "/d"), NULL, 0, 1000, 1000), EACCES,
             "FS_MKDIR as 1000 in root's dir");
  expect_ok(path_as(h, TP_MSG_FS_RENAME, join(p, home, "/a/b/f"), join(q, home, "/g"), 0, 1000, 1000),
            "FS_RENAME as 1000 in its home");
  expect_err(path_as(h, TP_MSG_FS_RENAME, join(p, etc, "/x"), join(q, home, "/x"), 0, 1000, 1000), EACCES,
             "FS_RENAME as 1000 out of root's dir");
  expect_err(path_as(h, TP_MSG_FS_REMOVE, join(p, etc, "/x"), NULL, 0, 1000, 1000), EACCES,
             "FS_REMOVE as 1000 of root's file");
  expect_ok(path_as(h, TP_MSG_FS_REMOVE, join(p, home, "/a"), NULL, TP_F_REMOVE_RECURSIVE, 1000, 1000),
            "FS_REMOVE -r as 1000 of its own tree");

  /* a recursive watch as 1000 grows as 1000: a directory it cannot read is not walked */
  m = path_as(h, TP_MSG_WATCH_ADD, home, NULL, TP_F_WATCH_RECURSIVE, 1000, 1000);
  rec = msg_is_ok(m) ? msg_int(m, TP_TAG_WATCH, -1) : -1;
  msg_free(m);
  check(rec > 0, "WATCH_ADD as 1000 of its home");
  /* open is made 0755 at once (umask 022 for the mkdir): made under the
   * test's umask 027 and chmod'ed after, it was root's 0750 for a moment, and
   * an agent quick to walk it as 1000 rightly reported it as unreadable */
  mode_t um = umask(022);
  int made = mkdir(join(p, home, "/hidden"), 0700) == 0 && close(creat(join(p, home, "/hidden/f"), 0600)) == 0 &&
             mkdir(join(p, home, "/open"), 0755) == 0;
  umask(um);
  check(made && close(creat(join(p, home, "/open/f"), 0600)) == 0,
        "root makes a 0700 dir (a file in it) and a 0755 one (a file in it) there");
  check(wait_wev(h, rec, TP_WE_CREATE, "open/f") && wait_wev(h, rec, TP_WE_OVERFLOW, "hidden") &&
            !wev_has(h, rec, TP_WE_CREATE, "hidden/f"),
        "the watch reports open/f, and an OVERFLOW for hidden, never hidden/f");
  expect_ok(unwatch_req(h, rec), "WATCH_REMOVE");
  check(agent_is_root(h), "after all that the agent's ids are root's");

  /* exec takes GROUPS too */
  {
    tp_buf_t *b = req_begin(h, TP_MSG_EXEC);
    int64_t pid;
    for (const char *const *a = status; *a; a++)
      tp_frame_add_str(b, TP_TAG_ARG, *a);
    add_as(b, 1000, 1001, both, 2);
    m = req_call(h);
    pid = msg_is_ok(m) ? msg_int(m, TP_TAG_PID, -1) : -1;
    msg_free(m);
    pr = pid > 0 ? wait_exit(h, pid) : NULL;
    check(pr != NULL && field_is((char *) pr->out[1].data, pr->out[1].len, "Groups", "1000 2000") &&
              field_is((char *) pr->out[1].data, pr->out[1].len, "Gid", "1001\t1001\t1001\t1001"),
          "EXEC with GROUPS {1000, 2000}: the child's groups are those");
  }

  /* hostile account fields */
  join(p, home, "/h");
  expect_err(write_as(h, p, "x", 0, 1000, NO_ID, NULL, 0), EINVAL, "UID without GID");
  expect_err(write_as(h, p, "x", 0, NO_ID, 1000, NULL, 0), EINVAL, "GID without UID");
  expect_err(write_as(h, p, "x", 0, NO_ID, NO_ID, both, 2), EINVAL, "GROUPS without UID and GID");
  expect_err(write_as(h, p, "x", 0, 65536, 1000, NULL, 0), EINVAL, "UID 65536");
  expect_err(write_as(h, p, "x", 0, -1, 1000, NULL, 0), EINVAL, "UID -1");
  expect_err(write_as(h, p, "x", 0, 1000, 1000, bad_group, 1), EINVAL, "a group of 70000");
  for (int i = 0; i < TP_GROUPS_MAX + 1; i++)
    many[i] = 1000;
  expect_err(write_as(h, p, "x", 0, 1000, 1000, many, TP_GROUPS_MAX + 1), EINVAL, "65 GROUPS");
  {
    tp_buf_t *b = req_begin(h, TP_MSG_FS_WRITE);
    tp_frame_add_str(b, TP_TAG_PATH, p);
    tp_frame_add(b, TP_TAG_DATA, "x", 1);
    add_as(b, 1000, 1000, NULL, 0);
    tp_frame_add(b, TP_TAG_GROUPS, "abc", 3);
    expect_err(req_call(h), EINVAL, "GROUPS of 3 bytes");
  }
  expect_err(path_as(h, TP_MSG_FS_STAT, home, NULL, 0, 70000, 0), EINVAL, "FS_STAT with UID 70000");
  check(access(p, F_OK) < 0 && agent_is_root(h), "none of them wrote anything or left the ids switched");
  chmod(tmp, 0700);
}

/* FS_SETATTR and FS_SYMLINK: modes and times set exactly, a final
 * symlink never followed (its target keeps its mode), LINK checked. */
static void test_setattr_symlink(host_t *h, const char *tmp) {
  char f[PATH_MAX], l[PATH_MAX], l2[PATH_MAX];
  struct stat st;
  tp_buf_t *b;

  close(open(join(f, tmp, "/attr"), O_WRONLY | O_CREAT, 0644));
  b = req_begin(h, TP_MSG_FS_SETATTR);
  tp_frame_add_str(b, TP_TAG_PATH, f);
  tp_frame_add_int(b, TP_TAG_MODE, 04751);
  tp_frame_add_int(b, TP_TAG_MTIME, 1234567890);
  expect_ok(req_call(h), "setattr MODE MTIME");
  check(stat(f, &st) == 0 && (st.st_mode & 07777) == 04751 && st.st_mtim.tv_sec == 1234567890 &&
            st.st_atim.tv_sec == 1234567890,
        "mode 04751 and both times set");

  b = req_begin(h, TP_MSG_FS_SYMLINK);
  tp_frame_add_str(b, TP_TAG_PATH, join(l, tmp, "/attr-link"));
  tp_frame_add_str(b, TP_TAG_LINK, "attr");
  expect_ok(req_call(h), "symlink");
  {
    char target[64] = "";
    ssize_t n = readlink(l, target, sizeof(target) - 1);
    check(n == 4 && memcmp(target, "attr", 4) == 0, "the symlink points at its LINK");
  }
  b = req_begin(h, TP_MSG_FS_SETATTR);
  tp_frame_add_str(b, TP_TAG_PATH, l);
  tp_frame_add_int(b, TP_TAG_MODE, 0600);
  tp_frame_add_int(b, TP_TAG_MTIME, 1000000000);
  expect_ok(req_call(h), "setattr on a symlink");
  check(stat(f, &st) == 0 && (st.st_mode & 07777) == 04751 && st.st_mtim.tv_sec == 1234567890,
        "the symlink's target is untouched");
  check(lstat(l, &st) == 0 && st.st_mtim.tv_sec == 1000000000, "the symlink's own mtime is set");

  b = req_begin(h, TP_MSG_FS_SYMLINK);
  tp_frame_add_str(b, TP_TAG_PATH, l);
  tp_frame_add_str(b, TP_TAG_LINK, "other");
  expect_err(req_call(h), EEXIST, "symlink over an existing path");
  b = req_begin(h, TP_MSG_FS_SYMLINK);
  tp_frame_add_str(b, TP_TAG_PATH, join(l2, tmp, "/attr-link2"));
  tp_frame_add(b, TP_TAG_LINK, "a\0b", 3);
  expect_err(req_call(h), EINVAL, "LINK with a NUL");
  b = req_begin(h, TP_MSG_FS_SYMLINK);
  tp_frame_add_str(b, TP_TAG_PATH, l2);
  expect_err(req_call(h), EINVAL, "symlink without LINK");
  b = req_begin(h, TP_MSG_FS_SETATTR);
  tp_frame_add_str(b, TP_TAG_PATH, f);
  tp_frame_add_int(b, TP_TAG_MODE, 010000);
  expect_err(req_call(h), EINVAL, "MODE above 07777");
  b = req_begin(h, TP_MSG_FS_SETATTR);
  tp_frame_add_str(b, TP_TAG_PATH, f);
  tp_frame_add_int(b, TP_TAG_MTIME, -5);
  expect_err(req_call(h), EINVAL, "negative MTIME");
  b = req_begin(h, TP_MSG_FS_SETATTR);
  tp_frame_add_str(b, TP_TAG_PATH, l2);
  tp_frame_add_int(b, TP_TAG_MODE, 0644);
  expect_err(req_call(h), ENOENT, "setattr of a missing path");
}

int main(void) {
  const char *agent;
  char tmp[PATH_MAX];
  host_t h;
  int r;

  if ((agent = agent_test_begin("test_agent_fs", tmp, &r)) == NULL)
    return r;
  if (agent_session(&h, "test_agent_fs", agent, tmp, NULL) < 0)
    return 1;
  test_fs(&h, tmp);
  test_fs_as(&h, tmp);
  test_setattr_symlink(&h, tmp);
  test_fs_open(&h, tmp);
  agent_session_close(&h);
  return agent_test_end(tmp);
}
