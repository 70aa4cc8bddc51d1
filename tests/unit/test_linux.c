/* Unit tests for the linux backend (backends/linux): tp_rmtree, the sealed
 * agent memfd, the default image, and boxes started with the real agent
 * (TUPPER_AGENT), asserting isolation and hardening from inside (masked
 * /proc, mount flags, rlimits, cgroups, seccomp, the disk cap), survival of
 * a dead daemon, adoption by another process, and a clean host after
 * destroy (no mount, loop device, process or file left).  TAP-ish output;
 * exit 0 pass, 1 fail, 77 skip (not root, no user namespaces, or no agent). */
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

#define UID_BASE 100000000u
#define ID_COUNT 65536u
#define IO_TIMEOUT_MS 20000

static char tmp_root[256]; /* everything this test makes on disk lives here */



static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double) t.tv_sec * 1e3 + (double) t.tv_nsec / 1e6;
}

static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0)
    abort();
  return p;
}

static int write_text(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  size_t n = strlen(text);
  int ok;
  if (fd < 0)
    return -1;
  ok = write(fd, text, n) == (ssize_t) n;
  close(fd);
  return ok ? 0 : -1;
}

/* Whole file (proc files included, whose size says 0). */
static char *slurp(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  char *buf = NULL;
  size_t cap = 0, n = 0;
  ssize_t r;
  if (fd < 0)
    return NULL;
  for (;;) {
    if (cap - n < 4096) {
      cap = cap ? cap * 2 : 16384;
      buf = realloc(buf, cap);
    }
    r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t) r;
  }
  close(fd);
  if (r < 0) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* Lines of /proc/self/mountinfo mentioning `needle`. */
static int mounts_matching(const char *needle) {
  size_t len;
  char *text = slurp("/proc/self/mountinfo", &len);
  int n = 0;
  for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"))
    if (strstr(line, needle) != NULL)
      n++;
  free(text);
  return n;
}

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

/* ------------------------------------------------------------ agent client */

typedef struct conn_s {
  int fd;
  uint8_t *buf;
  size_t len;
  size_t cap;
  uint32_t next_id;
} conn_t;

typedef struct msg_s {
  uint8_t type;
  uint32_t id;
  uint8_t *payload; /* owned */
  int n;
  tp_field_t fields[64];
} msg_t;

static int64_t msg_int(const msg_t *m, uint16_t tag, int64_t dflt) {
  int64_t v;
  return tp_field_int(tp_fields_get(m->fields, m->n, tag), &v) == 0 ? v : dflt;
}

/* Next whole frame, waiting up to IO_TIMEOUT_MS.  1 = got one, 0 = EOF or
 * timeout, -1 = protocol error. */
static int conn_next(conn_t *c, msg_t *m) {
  for (;;) {
    tp_frame_t f;
    long total = tp_frame_parse_header(c->buf, c->len, &f);
    if (total < 0)
      return -1;
    if (total > 0) {
      m->type = f.type;
      m->id = f.id;
      m->payload = malloc(f.len ? f.len : 1);
      memcpy(m->payload, f.payload, f.len);
      m->n = tp_fields_parse(m->payload, f.len, m->fields, 64);
      memmove(c->buf, c->buf + total, c->len - (size_t) total);
      c->len -= (size_t) total;
      return m->n < 0 ? -1 : 1;
    }
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, IO_TIMEOUT_MS) <= 0)
      return 0;
    if (c->cap - c->len < 65536) {
      c->cap = c->cap ? c->cap * 2 : 131072;
      c->buf = realloc(c->buf, c->cap);
    }
    ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (n <= 0)
      return 0;
    c->len += (size_t) n;
  }
}

static int conn_send(conn_t *c, tp_buf_t *b) {
  size_t off = 0;
  if (tp_frame_end(b) < 0)
    return -1;
  while (off < b->len) {
    ssize_t n = write(c->fd, b->data + off, b->len - off);
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = c->fd, .events = POLLOUT};
      poll(&p, 1, IO_TIMEOUT_MS);
      continue;
    }
    if (n < 0)
      return -1;
    off += (size_t) n;
  }
  return 0;
}

/* Runs `sh -c script` in the box; returns its exit code (or -1) and its
 * stdout in *out (malloc'ed).  *pid_out, if set, gets the box-side pid and
 * the call returns as soon as the command started (no output collected). */
static int box_sh_as(conn_t *c, const char *script, int64_t uid, char **out, int64_t *pid_out) {
  tp_buf_t b;
  uint32_t id = ++c->next_id;
  int64_t pid = -1;
  int code = -1;
  size_t olen = 0;
  char *o = calloc(1, 1);
  msg_t m;

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_EXEC, id);
  tp_frame_add_str(&b, TP_TAG_ARG, "/bin/sh");
  tp_frame_add_str(&b, TP_TAG_ARG, "-c");
  tp_frame_add_str(&b, TP_TAG_ARG, script);
  if (uid >= 0) {
    tp_frame_add_int(&b, TP_TAG_UID, uid);
    tp_frame_add_int(&b, TP_TAG_GID, uid);
  }
  if (conn_send(c, &b) < 0) {
    tp_buf_free(&b);
    free(o);
    return -1;
  }
  tp_buf_free(&b);
  while (conn_next(c, &m) == 1) {
    int done = 0;
    if (m.id == id && m.type == TP_MSG_OK) {
      pid = msg_int(&m, TP_TAG_PID, -1);
      if (pid_out != NULL) {
        *pid_out = pid;
        done = 1;
        code = 0;
      }
    } else if (m.id == id && m.type == TP_MSG_ERR) {
      done = 1;
    } else if (m.type == TP_MSG_OUTPUT && msg_int(&m, TP_TAG_PID, -2) == pid &&
               msg_int(&m, TP_TAG_STREAM, 0) == 1) {
      const tp_field_t *d = tp_fields_get(m.fields, m.n, TP_TAG_DATA);
      if (d != NULL) {
        o = realloc(o, olen + d->len + 1);
        memcpy(o + olen, d->val, d->len);
        olen += d->len;
        o[olen] = '\0';
      }
    } else if (m.type == TP_MSG_EXIT && msg_int(&m, TP_TAG_PID, -2) == pid) {
      code = (int) msg_int(&m, TP_TAG_CODE, -1);
      done = 1;
    }
    free(m.payload);
    if (done)
      break;
  }
  if (out != NULL)
    *out = o;
  else
    free(o);
  return code;
}

/* As root in the box. */
static int box_sh(conn_t *c, const char *script, char **out, int64_t *pid_out) {
  return box_sh_as(c, script, -1, out, pid_out);
}

/* Output of a command, trailing newline removed; "" on failure. */
static char *box_out(conn_t *c, const char *script) {
  char *o = NULL;
  box_sh(c, script, &o, NULL);
  if (o == NULL)
    return calloc(1, 1);
  size_t n = strlen(o);
  while (n > 0 && o[n - 1] == '\n')
    o[--n] = '\0';
  return o;
}

/* ------------------------------------------------------------ boxes */

typedef struct env_s {
  const char *image;
  const char *layers[2]; /* {image, NULL} */
  int agent_fd;
} env_t;

static tp_box_spec_t spec_for(const env_t *e, const char *id, const char *box_dir) {
  tp_box_spec_t s = {.id = id,
                     .layers = e->layers,
                     .box_dir = box_dir,
                     .agent_fd = e->agent_fd,
                     .uid_base = UID_BASE,
                     .gid_base = UID_BASE,
                     .id_count = ID_COUNT};
  return s;
}

/* Loop devices whose backing file is under `dir` (what losetup -a reads). */
static int loops_backed_by(const char *dir) {
  DIR *d = opendir("/sys/block");
  struct dirent *e;
  int n = 0;
  while (d != NULL && (e = readdir(d)) != NULL) {
    char path[300], *text;
    size_t len;
    if (strncmp(e->d_name, "loop", 4) != 0)
      continue;
    snprintf(path, sizeof(path), "/sys/block/%s/loop/backing_file", e->d_name);
    text = slurp(path, &len);
    if (text != NULL && strstr(text, dir) != NULL)
      n++;
    free(text);
  }
  if (d != NULL)
    closedir(d);
  return n;
}

/* ------------------------------------------------------------ mountinfo */

typedef struct mnt_s {
  char mp[256];
  char opts[256];  /* per-mount options */
  char fstype[64];
  char super[512]; /* superblock options */
} mnt_t;

static int parse_mnt(const char *line, mnt_t *m) {
  const char *sep = strstr(line, " - ");
  memset(m, 0, sizeof(*m));
  if (sep == NULL || sscanf(line, "%*s %*s %*s %*s %255s %255s", m->mp, m->opts) != 2 ||
      sscanf(sep + 3, "%63s %*s %511s", m->fstype, m->super) < 1)
    return -1;
  return 0;
}

/* 1 if the comma-separated list has `opt` (exactly, or as "opt=..."). */
static int has_opt(const char *opts, const char *opt) {
  size_t n = strlen(opt);
  for (const char *p = opts; p != NULL; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
    if (strncmp(p, opt, n) == 0 && (p[n] == ',' || p[n] == '\0' || p[n] == '='))
      return 1;
  return 0;
}

/* The topmost mount at `mp` in mountinfo text; 0 if found. */
static int find_mnt(const char *mi, const char *mp, mnt_t *out) {
  char *text = strdup(mi), *save = NULL;
  int found = -1;
  memset(out, 0, sizeof(*out));
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    mnt_t m;
    if (parse_mnt(line, &m) == 0 && strcmp(m.mp, mp) == 0) {
      *out = m;
      found = 0;
    }
  }
  free(text);
  return found;
}

/* Every writable mount must be nosuid and nodev; only the device-node binds
 * of /dev (nodes of the host's /dev) and devpts (the box's ptys, nosuid and
 * noexec) may carry devices.  Offenders are listed in bad. */
static int audit_mounts(const char *mi, char *bad, size_t cap) {
  static const char *const dev_nodes[] = {"/dev/null",   "/dev/zero",    "/dev/full",
                                          "/dev/random", "/dev/urandom", "/dev/tty"};
  char *text = strdup(mi), *save = NULL;
  int n_bad = 0, n = 0;
  bad[0] = '\0';
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    mnt_t m;
    int ok, dev = 0;
    if (parse_mnt(line, &m) < 0) {
      n_bad++;
      continue;
    }
    n++;
    for (size_t i = 0; i < sizeof(dev_nodes) / sizeof(dev_nodes[0]); i++)
      dev |= strcmp(m.mp, dev_nodes[i]) == 0;
    if (strcmp(m.fstype, "devpts") == 0)
      ok = has_opt(m.opts, "nosuid") && has_opt(m.opts, "noexec");
    else if (dev)
      ok = 1;
    else
      ok = has_opt(m.opts, "ro") || (has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev"));
    if (!ok) {
      n_bad++;
      snprintf(bad + strlen(bad), cap - strlen(bad), "%s(%s %s) ", m.mp, m.fstype, m.opts);
    }
  }
  free(text);
  return n < 10 ? -1 : n_bad; /* a box has well over 10 mounts: else parsing failed */
}

/* Entries of tmp_root named like a box dir of test_box_threads. */
static int leftover_boxes(void) {
  DIR *d = opendir(tmp_root);
  struct dirent *e;
  int n = 0;
  while (d != NULL && (e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "thread-", 7) == 0)
      n++;
  if (d != NULL)
    closedir(d);
  return n;
}

static int no_children_left(void) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  return waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD;
}

/* The host pid of the box process whose parent is `ppid` and name `comm`. */
static pid_t find_child(pid_t ppid, const char *comm) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = -1;
  while (d != NULL && found < 0 && (e = readdir(d)) != NULL) {
    char path[300], *text, *s;
    size_t len;
    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
    text = slurp(path, &len);
    if (text == NULL)
      continue;
    s = strstr(text, "\nPPid:\t");
    if (s != NULL && atoi(s + 7) == ppid && strncmp(text + 6, comm, strlen(comm)) == 0)
      found = atoi(e->d_name);
    free(text);
  }
  if (d != NULL)
    closedir(d);
  return found;
}

/* /proc masks, read-only kernel knobs, mount flags and rlimits, from
 * inside a box with default settings. */
static void test_box_hardening(conn_t *c, const char *id) {
  static const char *const masked[] = {"kcore", "keys", "key-users", "timer_list", "sched_debug",
                                       "kmsg", "latency_stats", "sysrq-trigger", "config.gz"};
  static const char *const emptied[] = {"acpi", "scsi", "asound", "firmware"};
  char want[1024] = "", path[64], bad[2048], *o, *mi;
  struct stat st;
  struct rlimit nofile;
  mnt_t m;
  int code, n_masked = 0;

  for (size_t i = 0; i < sizeof(masked) / sizeof(masked[0]); i++) {
    snprintf(path, sizeof(path), "/proc/%s", masked[i]);
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
      snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s 0 1:3 denied\n", masked[i]);
      n_masked++;
    }
  }
  o = box_out(c, "for f in kcore keys key-users timer_list sched_debug kmsg latency_stats "
                 "sysrq-trigger config.gz; do [ -e /proc/$f ] || continue; "
                 "echo \"$f $(cat /proc/$f 2>/dev/null | wc -c) $(stat -c %t:%T /proc/$f) "
                 "$( (echo 1 >/proc/$f) 2>/dev/null && echo written || echo denied)\"; done");
  want[strlen(want) > 0 ? strlen(want) - 1 : 0] = '\0';
  check(strcmp(o, want) == 0 && n_masked > 0,
        "inside: %d masked /proc files are /dev/null, read nothing, refuse writes ('%s')",
        n_masked, o);
  free(o);

  want[0] = '\0';
  for (size_t i = 0; i < sizeof(emptied) / sizeof(emptied[0]); i++) {
    snprintf(path, sizeof(path), "/proc/%s", emptied[i]);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
      snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s 0 denied\n", emptied[i]);
  }
  want[strlen(want) > 0 ? strlen(want) - 1 : 0] = '\0';
  o = box_out(c, "for d in acpi scsi asound firmware; do [ -d /proc/$d ] || continue; "
                 "echo \"$d $(ls -A /proc/$d | wc -l) "
                 "$(touch /proc/$d/x 2>/dev/null && echo written || echo denied)\"; "
                 "done");
  check(strcmp(o, want) == 0, "inside: /proc hardware dirs empty and read-only ('%s')", o);
  free(o);

  code = box_sh(c, "echo evil > /proc/sys/kernel/hostname", NULL, NULL);
  o = box_out(c, "cat /proc/sys/kernel/hostname; hostname");
  snprintf(want, sizeof(want), "%s\n%s", id, id);
  check(code != 0 && strcmp(o, want) == 0,
        "inside: writing /proc/sys/kernel/hostname fails (exit %d, '%s')", code, o);
  free(o);

  mi = box_out(c, "cat /proc/self/mountinfo");
  code = audit_mounts(mi, bad, sizeof(bad));
  check(code == 0, "inside: every writable mount is nosuid,nodev (%d offenders: %s)", code, bad);
  for (const char *const *d = (const char *const[]){"/proc/sys", "/proc/bus", "/proc/fs",
                                                    "/proc/irq", "/sys", NULL};
       *d; d++) {
    if (strncmp(*d, "/proc/", 6) == 0 && stat(*d, &st) < 0)
      continue; /* this kernel has none (the box's /proc is the host kernel's) */
    check(find_mnt(mi, *d, &m) == 0 && has_opt(m.opts, "ro") && has_opt(m.opts, "nosuid") &&
              has_opt(m.opts, "nodev") && has_opt(m.opts, "noexec"),
          "inside: %s mounted ro,nosuid,nodev,noexec ('%s')", *d, m.opts);
  }
  check(find_mnt(mi, "/dev/shm", &m) == 0 && has_opt(m.opts, "rw") &&
            has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev") &&
            has_opt(m.opts, "noexec") && strstr(m.super, "size=65536k") != NULL,
        "inside: /dev/shm rw,nosuid,nodev,noexec, 64 MiB ('%s' '%s')", m.opts, m.super);
  check(find_mnt(mi, "/dev", &m) == 0 && has_opt(m.opts, "noexec") && has_opt(m.opts, "nodev"),
        "inside: /dev nodev,noexec ('%s')", m.opts);
  check(find_mnt(mi, "/", &m) == 0 && strcmp(m.fstype, "overlay") == 0 &&
            has_opt(m.opts, "nosuid") && has_opt(m.opts, "nodev"),
        "inside: / (overlay) nosuid,nodev ('%s')", m.opts);
  free(mi);

  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_max > 1048576)
    nofile.rlim_max = 1048576;
  o = box_out(c, "ulimit -c; ulimit -Hc; ulimit -n; ulimit -Hn; "
                 "grep '^Max core' /proc/1/limits | tr -s ' '");
  snprintf(want, sizeof(want), "0\n0\n%llu\n%llu\nMax core file size 0 0 bytes ",
           (unsigned long long) nofile.rlim_max, (unsigned long long) nofile.rlim_max);
  check(strcmp(o, want) == 0, "inside: RLIMIT_CORE 0 (agent too), RLIMIT_NOFILE %llu ('%s')",
        (unsigned long long) nofile.rlim_max, o);
  free(o);
  o = box_out(c, "grep '^Seccomp:' /proc/1/status | tr -d '\\t'");
  check(strcmp(o, "Seccomp:0") == 0, "inside: no seccomp filter unless asked ('%s')", o);
  free(o);
}

static void test_box(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "box");
  char *secret = path_in(tmp_root, "host-secret");
  char id[64], script[512], *o, *p;
  tp_box_spec_t s;
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  int r, code;
  int64_t sleep_pid = -1;
  pid_t sleep_host = -1;
  int sleep_pidfd = -1;

  snprintf(id, sizeof(id), "tp-test-%d", (int) getpid());
  write_text(secret, "secret\n", 0644);
  s = spec_for(e, id, box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "box: started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  check(box.pid > 0 && box.pidfd >= 0 && box.chan_fd >= 0, "box: pid, pidfd and channel set");
  check((fcntl(box.chan_fd, F_GETFL) & O_NONBLOCK) && (fcntl(box.chan_fd, F_GETFD) & FD_CLOEXEC) &&
            (fcntl(box.pidfd, F_GETFD) & FD_CLOEXEC),
        "box: channel non-blocking, fds close-on-exec");
  c.fd = box.chan_fd;

  r = conn_next(&c, &m);
  check(r == 1 && m.type == TP_MSG_READY && msg_int(&m, TP_TAG_PID, 0) == 1,
        "box: agent says READY as PID 1");
  if (r == 1)
    free(m.payload);

  o = box_out(&c, "hostname");
  check(strcmp(o, id) == 0, "inside: hostname is the box id ('%s')", o);
  free(o);
  o = box_out(&c, "id -u; id -g");
  check(strcmp(o, "0\n0") == 0, "inside: uid and gid 0 ('%s')", o);
  free(o);
  o = box_out(&c, "cat /proc/self/uid_map /proc/self/gid_map | tr -s ' ' | sed 's/^ //'");
  snprintf(script, sizeof(script), "0 %u %u\n0 %u %u", UID_BASE, ID_COUNT, UID_BASE, ID_COUNT);
  check(strcmp(o, script) == 0, "inside: root maps to the host range, not host root ('%s')", o);
  free(o);
  o = box_out(&c, "grep -c : /proc/net/dev; grep -o '^ *lo:' /proc/net/dev | tr -d ' '");
  check(strcmp(o, "1\nlo:") == 0, "inside: only lo in the netns ('%s')", o);
  free(o);
  o = box_out(&c, "cat /sys/class/net/lo/operstate /sys/class/net/lo/flags; ls /sys/class/net");
  check(strcmp(o, "unknown\n0x9\nlo") == 0, "inside: lo is up, fresh sysfs shows only lo ('%s')",
        o);
  free(o);
  o = box_out(&c, "ls /proc | grep -c '^[0-9]'; tr '\\0' ' ' < /proc/1/cmdline");
  check(strcmp(o, "3\ntupper-agent ") == 0 || strcmp(o, "4\ntupper-agent ") == 0,
        "inside: host processes invisible, PID 1 is the agent ('%s')", o);
  free(o);
  snprintf(script, sizeof(script), "test -e /proc/%d; echo $?; test -e '%s'; echo $?",
           (int) getpid(), secret);
  o = box_out(&c, script);
  check(strcmp(o, "1\n1") == 0, "inside: host pid and host file invisible ('%s')", o);
  free(o);
  o = box_out(&c, "echo $(ls -A /dev)");
  check(strcmp(o, "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero") == 0,
        "inside: minimal /dev ('%s')", o);
  free(o);
  o = box_out(&c, "head -c 4 /dev/zero | od -An -tx1 | tr -d ' '; "
                  "echo x > /dev/null && echo null-ok");
  check(strcmp(o, "00000000\nnull-ok") == 0, "inside: /dev/zero and /dev/null work ('%s')", o);
  free(o);
  code = box_sh(&c, "echo > /dev/tty", NULL, NULL);
  check(code != 0, "inside: no controlling terminal (/dev/tty fails, exit %d)", code);
  o = box_out(&c, "stat -c '%a' /dev/pts/ptmx; stat -c '%U %a' /dev/shm /tmp");
  check(strcmp(o, "666\nroot 1777\nroot 1777") == 0,
        "inside: ptmx 0666, /dev/shm and /tmp 1777 owned by root ('%s')", o);
  free(o);

  code = box_sh(&c, "mkdir -p /mnt && mount -t tmpfs x /mnt", NULL, NULL);
  check(code != 0, "inside: mount denied (exit %d)", code);
  code = box_sh(&c, "hostname evil", NULL, NULL);
  o = box_out(&c, "hostname");
  check(code != 0 && strcmp(o, id) == 0, "inside: sethostname denied (exit %d)", code);
  free(o);
  code = box_sh(&c, "ip link set lo down || ifconfig lo down", NULL, NULL);
  check(code != 0, "inside: network config denied (exit %d)", code);
  code = box_sh(&c, "echo 1 > /proc/sys/kernel/panic", NULL, NULL);
  check(code != 0, "inside: /proc/sys not writable (exit %d)", code);
  test_box_hardening(&c, id);

  p = path_in(box_dir, "agent.sock");
  {
    struct stat st;
    char fd4[300], link[64] = "";
    ssize_t n;
    check(lstat(p, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0600 &&
              st.st_uid == 0 && st.st_gid == 0,
          "box: agent.sock in box_dir, a socket, 0600, host root's");
    snprintf(fd4, sizeof(fd4), "/proc/%d/fd/%d", (int) box.pid, TP_AGENT_LISTEN_FD);
    n = readlink(fd4, link, sizeof(link) - 1);
    link[n > 0 ? n : 0] = '\0';
    diag("the agent %s fd %d (%s)", strncmp(link, "socket:", 7) == 0 ? "keeps" : "closed",
         TP_AGENT_LISTEN_FD, link);
  }
  free(p);

  code = box_sh(&c, "echo data > /newfile", NULL, NULL);
  p = path_in(box_dir, "upper/newfile");
  {
    size_t len;
    char *text = slurp(p, &len);
    struct stat st;
    check(code == 0 && text && strcmp(text, "data\n") == 0 && stat(p, &st) == 0 &&
              st.st_uid == UID_BASE,
          "box: writes land in upper/, owned by the box's root on the host");
    free(text);
  }
  free(p);
  code = box_sh_as(&c, "echo more > /home/user/f", 1000, NULL, NULL);
  p = path_in(box_dir, "upper/home/user/f");
  {
    struct stat st;
    check(code == 0 && stat(p, &st) == 0 && st.st_uid == UID_BASE + 1000 &&
              st.st_gid == UID_BASE + 1000,
          "box: copy-up works, uid 1000 inside is base+1000 on the host");
  }
  free(p);
  p = path_in(e->image, "newfile");
  check(!exists(p), "box: the image is untouched");
  free(p);

  /* A background process: it must die with the box. */
  box_sh(&c, "exec sleep 1000", NULL, &sleep_pid);
  for (int i = 0; i < 200 && sleep_host < 0; i++) {
    sleep_host = find_child(box.pid, "sleep");
    if (sleep_host < 0)
      usleep(5000);
  }
  if (sleep_host > 0)
    sleep_pidfd = (int) syscall(SYS_pidfd_open, sleep_host, 0);
  check(sleep_pid > 0 && sleep_pidfd >= 0, "box: background process started (host pid %d)",
        (int) sleep_host);

  {
    pid_t pid = box.pid;
    double t0 = now_ms();
    /* as uv_poll leaves it: destroy must still wait for the exit */
    fcntl(box.pidfd, F_SETFL, fcntl(box.pidfd, F_GETFL) | O_NONBLOCK);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0, "destroy: ok in %.2f ms (%s)", now_ms() - t0, r < 0 ? err.msg : "ok");
    check(box.pidfd == -1 && box.chan_fd == -1, "destroy: fds closed and reset");
    check(kill(pid, 0) < 0 && errno == ESRCH, "destroy: PID 1 gone");
    if (sleep_pidfd >= 0) {
      struct pollfd pf = {.fd = sleep_pidfd, .events = POLLIN};
      check(poll(&pf, 1, 0) == 1, "destroy: every process of the box gone");
      close(sleep_pidfd);
    }
    check(mounts_matching(box_dir) == 0, "destroy: no mount under box_dir left");
    check(!exists(box_dir), "destroy: box_dir removed");
    check(no_children_left(), "destroy: no zombie");
    check(tp_box_destroy(&box, box_dir, &err) == 0, "destroy: idempotent");
  }
out:
  free(c.buf);
  unlink(secret);
  free(secret);
  free(box_dir);
}

/* A start that fails leaves no process, no dir and says which step failed. */
static void test_box_failures(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "fbox");
  char *missing = path_in(tmp_root, "no-such-image");
  tp_box_spec_t s;
  tp_box_t box;
  int r, fd;

  s = spec_for(e, "Bad_ID", box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: invalid id refused (%s)", err.msg);
  s = spec_for(e, "ok", box_dir);
  s.uid_base = 0;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: uid_base 0 refused (%s)", err.msg);
  s = spec_for(e, "ok", "relative/dir");
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL, "start: relative box_dir refused");
  {
    const char *inject[] = {"/tmp/a,upperdir=/x", NULL};
    const char *relative[] = {e->image, "rel/layer", NULL};
    const char *none[] = {NULL};
    s = spec_for(e, "ok", box_dir);
    s.layers = inject;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: overlay option injection refused");
    s.layers = relative;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: relative layer refused (%s)",
          err.msg);
    s.layers = none;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: no layers refused (%s)", err.msg);
    s.layers = NULL;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == EINVAL, "start: NULL layers refused");
  }
  {
    const char *many[TP_LAYERS_MAX + 2];
    for (int i = 0; i < TP_LAYERS_MAX + 1; i++)
      many[i] = e->image;
    many[TP_LAYERS_MAX + 1] = NULL;
    s = spec_for(e, "ok", box_dir);
    s.layers = many;
    r = tp_linux_box_start(&s, &box, &err);
    check(r < 0 && err.code == E2BIG && !exists(box_dir), "start: %d layers refused (%s)",
          TP_LAYERS_MAX + 1, err.msg);
  }

  mkdir(box_dir, 0700);
  s = spec_for(e, "ok", box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EEXIST && exists(box_dir),
        "start: existing box_dir refused, kept (%s)", err.msg);
  rmdir(box_dir);

  const char *missing_layers[] = {missing, NULL};
  s = spec_for(e, "ok", box_dir);
  s.layers = missing_layers;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "mount overlay") != NULL && err.code == ENOENT,
        "start: a failed step is named (%s)", err.msg);
  check(!exists(box_dir) && no_children_left() && box.pidfd == -1 && box.chan_fd == -1,
        "start: failure leaves no dir, no process, no fds");

  fd = tp_agent_memfd("#!/bin/nothing\n", 15, &err);
  s = spec_for(e, "ok", box_dir);
  s.agent_fd = fd;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "exec agent") != NULL, "start: exec failure reported (%s)",
        err.msg);
  check(!exists(box_dir) && no_children_left() && mounts_matching(box_dir) == 0,
        "start: exec failure leaves nothing");
  if (fd >= 0)
    close(fd);
  free(missing);
  free(box_dir);
}

/* ------------------------------------------------------------ layers */

/* Writes dir/rel (parents made as needed), all owned by the box's root as
 * an image's files are; a NULL text makes rel a whiteout (char 0:0),
 * overlay's mark of a deleted file. */
static int layer_put(const char *dir, const char *rel, const char *text) {
  char path[2048], *slash;
  snprintf(path, sizeof(path), "%s/%s", dir, rel);
  for (slash = strchr(path + strlen(dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    if ((mkdir(path, 0755) < 0 && errno != EEXIST) || lchown(path, UID_BASE, UID_BASE) < 0)
      return -1;
    *slash = '/';
  }
  if (text == NULL ? mknod(path, S_IFCHR | 0000, makedev(0, 0)) : write_text(path, text, 0644))
    return -1;
  return lchown(path, UID_BASE, UID_BASE);
}

/* Three layers (the busybox image at the bottom): the merged view, the
 * upper layer winning, a whiteout and an opaque dir hiding what is below;
 * then 40 layers at long paths, whose options would pass the page the
 * kernel copies if they were spelt out. */
static void test_box_layers(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lbox");
  char *l1 = path_in(tmp_root, "layer1"), *l2 = path_in(tmp_root, "layer2");
  char *many_root = path_in(tmp_root, "many");
  const char *three[] = {e->image, l1, l2, NULL};
  const char *many[42];
  char *many_dirs[40];
  tp_box_spec_t s;
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  char *o, *p;
  size_t total = 0;
  int r, ok;

  mkdir(l1, 0755);
  mkdir(l2, 0755);
  ok = lchown(l1, UID_BASE, UID_BASE) == 0 && lchown(l2, UID_BASE, UID_BASE) == 0 &&
       layer_put(l1, "etc/a", "one\n") == 0 && layer_put(l1, "etc/b", "one-b\n") == 0 &&
       layer_put(l1, "d/x", "x\n") == 0 && layer_put(l1, "d/keep/k", "k\n") == 0 &&
       layer_put(l2, "etc/a", "two\n") == 0 && layer_put(l2, "etc/b", NULL) == 0 &&
       layer_put(l2, "d/y", "y\n") == 0;
  p = path_in(l2, "d");
  ok = ok && setxattr(p, "trusted.overlay.opaque", "y", 1, 0) == 0;
  free(p);
  check(ok, "layers: three layers laid out (whiteout, opaque dir)");

  s = spec_for(e, "layers", box_dir);
  s.layers = three;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "layers: a 3-layer box started (%s)", r < 0 ? err.msg : "ok");
  if (r == 0) {
    c.fd = box.chan_fd;
    if (conn_next(&c, &m) == 1)
      free(m.payload);
    o = box_out(&c, "cat /etc/a; [ -e /etc/b ] && echo b-seen; ls /d | tr '\\n' ' '; "
                    "[ -x /bin/busybox ] && echo busybox");
    check(strcmp(o, "two\ny busybox") == 0,
          "layers: upper wins, whiteout hides, opaque dir hides, bottom seen ('%s')", o);
    free(o);
    o = box_out(&c, "rm /etc/a && cat /etc/a 2>/dev/null; echo new > /d/z; ls /d | tr '\\n' ' '");
    check(strcmp(o, "y z ") == 0, "layers: deleting a merged file hides every copy ('%s')", o);
    free(o);
    p = path_in(l1, "etc/a");
    {
      size_t len;
      char *t = slurp(p, &len);
      check(t != NULL && strcmp(t, "one\n") == 0, "layers: lower layers untouched");
      free(t);
    }
    free(p);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0 && !exists(box_dir), "layers: destroyed (%s)", r < 0 ? err.msg : "ok");
  }

  /* 40 layers, each at a path of about 230 bytes: 9 KB of paths. */
  mkdir(many_root, 0755);
  many[0] = e->image;
  for (int i = 0; i < 40; i++) {
    char name[256], text[16];
    memset(name, 'a' + i % 26, 200);
    snprintf(name + 200, sizeof(name) - 200, "-%02d", i);
    many_dirs[i] = path_in(many_root, name);
    mkdir(many_dirs[i], 0755);
    snprintf(name, sizeof(name), "m/f%02d", i);
    snprintf(text, sizeof(text), "%d\n", i);
    layer_put(many_dirs[i], name, text);
    layer_put(many_dirs[i], "m/top", text);
    many[i + 1] = many_dirs[i];
    total += strlen(many_dirs[i]) + 1;
  }
  many[41] = NULL;
  s = spec_for(e, "many", box_dir);
  s.layers = many;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "layers: 41 layers with %zu bytes of paths start (%s)", total,
        r < 0 ? err.msg : "ok");
  if (r == 0) {
    c.fd = box.chan_fd;
    c.len = 0;
    if (conn_next(&c, &m) == 1)
      free(m.payload);
    o = box_out(&c, "ls /m | wc -l; cat /m/top");
    check(strcmp(o, "41\n39") == 0, "layers: 40 layers merged, the last on top ('%s')", o);
    free(o);
    r = tp_box_destroy(&box, box_dir, &err);
    check(r == 0 && !exists(box_dir), "layers: many-layer box destroyed");
  }
  for (int i = 0; i < 40; i++)
    free(many_dirs[i]);
  tp_rmtree(many_root, NULL);
  tp_rmtree(l1, NULL);
  tp_rmtree(l2, NULL);
  free(c.buf);
  free(many_root);
  free(l1);
  free(l2);
  free(box_dir);
}

/* ------------------------------------------------------------ limits */

/* A test filter (the real one is seccomp.c's): mknod and mknodat answer
 * EXFULL, a code nothing else returns; everything else passes. */
static struct sock_filter test_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mknodat, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 133 /* x86_64 mknod */, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EXFULL),
};

/* A throwaway cgroup at the root of the v1 pids hierarchy and one at the
 * root of the cgroup2 hierarchy, whichever exist: their cgroup.procs paths
 * go in procs[] (NULL-terminated), their dirs in dirs[]. */
static int make_test_cgroups(char *dirs[2], char *procs[3]) {
  static const char *const roots[] = {"/sys/fs/cgroup/pids", "/sys/fs/cgroup",
                                      "/sys/fs/cgroup/unified"};
  struct statfs sf;
  int n = 0, v2 = 0;
  for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
    char name[64];
    if (statfs(roots[i], &sf) < 0 || (i > 0 && v2))
      continue;
    if (i == 0 ? sf.f_type != 0x27e0eb /* CGROUP_SUPER_MAGIC */
               : sf.f_type != 0x63677270 /* CGROUP2_SUPER_MAGIC */)
      continue;
    v2 = i > 0;
    snprintf(name, sizeof(name), "tupper-test-%d", (int) getpid());
    dirs[n] = path_in(roots[i], name);
    if (mkdir(dirs[n], 0755) < 0) {
      free(dirs[n]);
      continue;
    }
    procs[n] = path_in(dirs[n], "cgroup.procs");
    n++;
  }
  procs[n] = NULL;
  return n;
}

/* Cgroups, seccomp and the disk cap, in one box. */
static void test_box_limits(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lbox");
  char *dirs[2] = {NULL, NULL}, *procs[3] = {NULL, NULL, NULL};
  struct sock_fprog prog = {sizeof(test_filter) / sizeof(test_filter[0]), test_filter};
  char *o, path[300], want[300];
  tp_box_spec_t s = spec_for(e, "limits", box_dir);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  int n_cg = make_test_cgroups(dirs, procs), r, loops;
  size_t len;

  s.cgroup_procs = (const char *const *) procs;
  s.seccomp = &prog;
  s.disk_bytes = 64 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "limits: box with %d cgroups, seccomp and a 64 MiB disk started (%s)", n_cg,
        r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;

  snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) box.pid);
  o = slurp(path, &len);
  for (int i = 0; i < n_cg; i++) {
    int v1 = strncmp(dirs[i], "/sys/fs/cgroup/pids/", 20) == 0;
    snprintf(want, sizeof(want), "%s/tupper-test-%d\n", v1 ? ":pids:" : "\n0::", (int) getpid());
    check(o != NULL && strstr(o, want) != NULL, "cgroup: PID 1 joined %s", dirs[i]);
  }
  free(o);
  o = box_out(&c, "grep -vc ':/$' /proc/self/cgroup");
  check(strcmp(o, "0") == 0, "cgroup: the box's cgroup namespace is rooted at its cgroups (%s)",
        o);
  free(o);

  o = box_out(&c, "grep -E '^(NoNewPrivs|Seccomp):' /proc/1/status | tr -d '\\t'");
  check(strcmp(o, "NoNewPrivs:1\nSeccomp:2") == 0,
        "seccomp: agent runs filtered, no_new_privs ('%s')", o);
  free(o);
  o = box_out(&c, "mkfifo /tmp/fifo 2>&1; test -e /tmp/fifo || echo absent");
  check(strstr(o, "Exchange full") != NULL && strstr(o, "absent") != NULL,
        "seccomp: the filter answers for the box's processes ('%s')", o);
  free(o);

  loops = loops_backed_by(box_dir);
  check(loops == 1, "disk: one loop device backed by the box's disk.img (%d)", loops);
  o = box_out(&c, "dd if=/dev/zero of=/big bs=1M count=100 2>&1 | grep -o 'No space left on device'"
                  " | head -1; rm /big; head -c 4000000 /dev/zero > /ok && echo ok-after");
  check(strcmp(o, "No space left on device\nok-after") == 0,
        "disk: writing past 64 MiB gets ENOSPC, freeing makes room ('%s')", o);
  free(o);
  snprintf(path, sizeof(path), "%s/disk", box_dir);
  check(mounts_matching(path) == 0, "disk: its mount is not in the host's mount table");

  r = tp_box_destroy(&box, box_dir, &err);
  check(r == 0, "limits: destroyed (%s)", r < 0 ? err.msg : "ok");
  loops = loops_backed_by(box_dir);
  check(loops == 0 && !exists(box_dir), "disk: after destroy no loop device refers to it (%d), "
        "no file left", loops);
out:
  for (int i = 0; i < n_cg; i++) {
    check(rmdir(dirs[i]) == 0, "cgroup: %s empty after destroy, removed", dirs[i]);
    free(dirs[i]);
    free(procs[i]);
  }
  free(c.buf);
  free(box_dir);
}

/* Start failures of the new steps: named, nothing left behind. */
static void test_limits_failures(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "lfail");
  char missing[128];
  const char *procs[] = {missing, NULL};
  struct sock_filter ret_kill = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  struct sock_fprog empty = {0, test_filter}, kill_all = {1, &ret_kill};
  tp_box_spec_t s;
  tp_box_t box;
  int r;

  snprintf(missing, sizeof(missing), "/sys/fs/cgroup/pids/tupper-none-%d/cgroup.procs",
           (int) getpid());
  s = spec_for(e, "lfail", box_dir);
  s.cgroup_procs = procs;
  s.disk_bytes = 16 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == ENOENT && strstr(err.msg, "join cgroup") && strstr(err.msg, missing),
        "start: a missing cgroup fails the start, step named (%s)", err.msg);
  check(!exists(box_dir) && no_children_left() && loops_backed_by(box_dir) == 0,
        "start: ...leaving no dir, process or loop device");

  s = spec_for(e, "lfail", box_dir);
  s.disk_bytes = 4096;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: a 4 KiB disk refused (%s)",
        err.msg);
  s = spec_for(e, "lfail", box_dir);
  s.seccomp = &empty;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL && !exists(box_dir), "start: an empty filter refused (%s)",
        err.msg);
  /* A filter that kills even execveat: the child dies, no report. */
  s = spec_for(e, "lfail", box_dir);
  s.seccomp = &kill_all;
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && strstr(err.msg, "exited during start") && !exists(box_dir) && no_children_left(),
        "start: a filter that forbids the exec fails the start cleanly (%s)",
        r < 0 ? err.msg : "started");
  if (r == 0)
    tp_box_destroy(&box, box_dir, &err);
  free(box_dir);
}

/* ------------------------------------------------------------ daemon death, adoption */

static int send_fd(int sock, int fd, pid_t pid) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&pid, sizeof(pid)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  return sendmsg(sock, &mh, 0) == sizeof(pid) ? 0 : -1;
}

static int recv_fd(int sock, pid_t *pid) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {pid, sizeof(*pid)};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                      .msg_controllen = sizeof(cbuf)};
  struct cmsghdr *cm;
  int fd = -1;
  if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != sizeof(*pid))
    return -1;
  cm = CMSG_FIRSTHDR(&mh);
  if (cm != NULL && cm->cmsg_type == SCM_RIGHTS)
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
  return fd;
}

/* No parent-death signal: the box outlives the process that started it.
 * That process hands us the channel (as a daemon's successor would find
 * the box), dies, and the box still answers. */
static void test_box_outlives_daemon(const env_t *e) {
  char *box_dir = path_in(tmp_root, "orphan");
  tp_error_t err = {0};
  tp_box_t box = {-1, -1, -1};
  conn_t c = {-1, NULL, 0, 0, 0};
  pid_t kid;
  int sp[2], status, r;
  char *o, path[64], *st;
  size_t len;

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    return;
  /* The orphaned box is reparented to us, so we reap it, not host init. */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  kid = fork();
  if (kid == 0) {
    tp_box_spec_t s = spec_for(e, "orphan", box_dir);
    tp_box_t b;
    tp_error_t e2 = {0};
    if (tp_linux_box_start(&s, &b, &e2) < 0 || send_fd(sp[1], b.chan_fd, b.pid) < 0)
      _exit(1);
    pause();
    _exit(0);
  }
  close(sp[1]);
  box.chan_fd = recv_fd(sp[0], &box.pid);
  close(sp[0]);
  if (box.chan_fd >= 0)
    box.pidfd = (int) syscall(SYS_pidfd_open, box.pid, 0);
  kill(kid, SIGKILL);
  waitpid(kid, &status, 0);
  check(box.pidfd >= 0, "orphan: box started by a process that is now dead");
  if (box.pidfd < 0)
    goto out;
  c.fd = box.chan_fd;
  o = box_out(&c, "echo alive");
  check(strcmp(o, "alive") == 0, "orphan: the box outlives its daemon and still answers ('%s')", o);
  free(o);
  snprintf(path, sizeof(path), "/proc/%d/status", (int) box.pid);
  st = slurp(path, &len);
  snprintf(path, sizeof(path), "\nPPid:\t%d\n", (int) getpid());
  check(st != NULL && strstr(st, path) != NULL, "orphan: reparented to the subreaper");
  free(st);
  r = tp_box_destroy(&box, box_dir, &err);
  check(r == 0 && !exists(box_dir), "orphan: destroyed by its new parent (%s)",
        r < 0 ? err.msg : "ok");
out:
  prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  check(no_children_left(), "orphan: reaped, nothing left");
  tp_rmtree(box_dir, &err);
  free(c.buf);
  free(box_dir);
}

/* Adoption against a stand-in agent (a process listening on agent.sock),
 * from a process that is not its parent: the exact situation of a
 * restarted daemon, whatever the agent does with its socket. */
static void test_adopt(void) {
  char *dir = path_in(tmp_root, "adopt");
  char *sock_path = path_in(dir, "agent.sock");
  tp_error_t err = {0};
  tp_box_t b;
  int p[2], status = 0, r;
  pid_t listener, adopter;
  char ready;

  mkdir(dir, 0700);
  if (pipe2(p, O_CLOEXEC) < 0)
    return;
  listener = fork();
  if (listener == 0) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(fd, 4) < 0)
      _exit(1);
    if (write(p[1], "r", 1) != 1)
      _exit(1);
    for (;;)
      pause();
  }
  close(p[1]);
  r = (int) read(p[0], &ready, 1);
  close(p[0]);
  check(r == 1, "adopt: stand-in agent listening");

  adopter = fork();
  if (adopter == 0) {
    tp_error_t e2 = {0};
    siginfo_t si;
    if (tp_linux_box_adopt(dir, getppid(), &b, &e2) == 0 || e2.code != ESRCH)
      _exit(10); /* the socket is not the test process's */
    if (tp_linux_box_adopt(dir, listener, &b, &e2) < 0)
      _exit(11);
    if (b.pid != listener || !(fcntl(b.chan_fd, F_GETFL) & O_NONBLOCK) ||
        !(fcntl(b.chan_fd, F_GETFD) & FD_CLOEXEC) || !(fcntl(b.pidfd, F_GETFD) & FD_CLOEXEC))
      _exit(12);
    if (waitid((idtype_t) 3 /* P_PIDFD */, (id_t) b.pidfd, &si, WEXITED | WNOHANG) == 0 ||
        errno != ECHILD)
      _exit(13); /* not ours to reap: destroy must take the other path */
    if (tp_box_destroy(&b, dir, &e2) < 0)
      _exit(14);
    if (exists(dir) || b.pidfd != -1 || b.chan_fd != -1)
      _exit(15);
    _exit(0);
  }
  waitpid(adopter, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "adopt: a non-parent adopts (pidfd, connect, SO_PEERCRED), refuses a wrong pid, "
        "destroys via the pidfd (exit %d)",
        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  waitpid(listener, &status, 0);
  check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "adopt: the adopted pid was killed");
  r = tp_linux_box_adopt(dir, listener, &b, &err);
  check(r < 0 && err.code == ESRCH && b.pidfd == -1 && b.chan_fd == -1,
        "adopt: a gone pid is ESRCH (%s)", err.msg);
  mkdir(dir, 0700);
  r = tp_linux_box_adopt(dir, getpid(), &b, &err);
  check(r < 0 && err.code == ENOENT, "adopt: no agent.sock is ENOENT (%s)", err.msg);
  rmdir(dir);
  free(sock_path);
  free(dir);
}

/* A restarted daemon's view of a real box: adopt it (the agent answers
 * READY on the new channel, a command runs) and destroy it from a
 * process that is not its parent.  The first connect may come while the
 * agent still holds its old channel (it then closes the newcomer at once):
 * retried for up to 2 s. */
static int adopt_and_talk(const char *box_dir, pid_t pid, tp_box_t *b) {
  tp_error_t err = {0};
  for (int i = 0; i < 200; i++) {
    conn_t c = {-1, NULL, 0, 0, 0};
    msg_t m;
    char *o;
    int r;
    if (tp_linux_box_adopt(box_dir, pid, b, &err) < 0)
      return 11;
    c.fd = b->chan_fd;
    r = conn_next(&c, &m);
    if (r == 1 && m.type == TP_MSG_READY) {
      free(m.payload);
      o = box_out(&c, "echo adopted");
      r = strcmp(o, "adopted") == 0 ? 0 : 12;
      free(o);
      free(c.buf);
      return r;
    }
    if (r == 1)
      free(m.payload);
    free(c.buf);
    close(b->chan_fd);
    close(b->pidfd);
    usleep(10000);
  }
  return 13;
}

/* A real box (with a disk cap) after its daemon "crashed" (closed the
 * channel), adopted and destroyed by a process that is not its parent; with
 * an agent that does not keep its listening socket, destroyed from a bare
 * pidfd.  Its loop device must go all the same. */
static void test_box_readopt(const env_t *e) {
  tp_error_t err = {0};
  char *box_dir = path_in(tmp_root, "rabox");
  tp_box_spec_t s = spec_for(e, "readopt", box_dir);
  tp_box_t box;
  conn_t c = {-1, NULL, 0, 0, 0};
  msg_t m;
  char fd4[64], link[64] = "";
  int r, status = 0, keeps;
  pid_t kid;
  double t0;

  s.disk_bytes = 32 << 20;
  r = tp_linux_box_start(&s, &box, &err);
  check(r == 0, "readopt: box with a disk started (%s)", r < 0 ? err.msg : "ok");
  if (r < 0)
    goto out;
  c.fd = box.chan_fd;
  r = conn_next(&c, &m); /* the agent has set itself up (and kept or closed fds) */
  check(r == 1 && m.type == TP_MSG_READY, "readopt: agent READY");
  if (r == 1)
    free(m.payload);
  snprintf(fd4, sizeof(fd4), "/proc/%d/fd/%d", (int) box.pid, TP_AGENT_LISTEN_FD);
  r = (int) readlink(fd4, link, sizeof(link) - 1);
  link[r > 0 ? r : 0] = '\0';
  keeps = strncmp(link, "socket:", 7) == 0;
  if (keeps) {
    close(box.chan_fd); /* the daemon is gone: the agent detaches */
    box.chan_fd = -1;
  } else {
    diag("the agent closed fd %d: destroying from a bare pidfd, not an adopted box",
         TP_AGENT_LISTEN_FD);
  }
  t0 = now_ms();
  kid = fork();
  if (kid == 0) {
    tp_box_t b = {box.pid, -1, -1};
    tp_error_t e2 = {0};
    if (keeps) {
      if ((r = adopt_and_talk(box_dir, box.pid, &b)) != 0)
        _exit(r);
    } else if ((b.pidfd = (int) syscall(SYS_pidfd_open, box.pid, 0)) < 0) {
      _exit(14);
    }
    _exit(tp_box_destroy(&b, box_dir, &e2) == 0 ? 0 : 15);
  }
  waitpid(kid, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "readopt: %s, destroyed by a non-parent in %.1f ms (exit %d)",
        keeps ? "adopted after the channel closed, the agent answers" : "from a pidfd",
        now_ms() - t0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  check(loops_backed_by(box_dir) == 0 && !exists(box_dir),
        "readopt: by then no loop device and no file left");
  r = tp_box_destroy(&box, box_dir, &err); /* reaps the zombie */
  check(r == 0 && no_children_left(), "readopt: the parent's destroy still works after (%s)",
        r < 0 ? err.msg : "ok");
out:
  free(c.buf);
  free(box_dir);
}

typedef struct worker_s {
  const env_t *e;
  int index;
  int failures;
  pthread_t thread;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  for (int i = 0; i < 5; i++) {
    char dir[300], id[32];
    tp_box_spec_t s;
    tp_box_t box;
    tp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/thread-%d-%d", tmp_root, w->index, i);
    snprintf(id, sizeof(id), "thread-%d-%d", w->index, i);
    s = spec_for(w->e, id, dir);
    if (w->index < 2)
      s.disk_bytes = 32 << 20; /* loop devices taken concurrently */
    if (tp_linux_box_start(&s, &box, &err) < 0 || tp_box_destroy(&box, dir, &err) < 0) {
      diag("thread %d: %s", w->index, err.msg);
      w->failures++;
    }
  }
  return NULL;
}

/* The daemon starts boxes from several threads at once. */
static void test_box_threads(const env_t *e) {
  worker_t w[4];
  int failures = 0;
  for (int i = 0; i < 4; i++) {
    w[i] = (worker_t){e, i, 0, 0};
    pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(w[i].thread, NULL);
    failures += w[i].failures;
  }
  check(failures == 0 && leftover_boxes() == 0 && no_children_left() &&
            mounts_matching(tmp_root) == 0 && loops_backed_by(tmp_root) == 0,
        "threads: 4 threads x 5 boxes (10 with disks) started and destroyed concurrently, "
        "nothing left");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* Start and destroy times, without and with a disk cap (1 GiB, sparse).
 * TUPPER_TIME_RUNS sets the number of boxes of each (default 10). */
static void time_boxes(const env_t *e) {
  const char *env = getenv("TUPPER_TIME_RUNS");
  int runs = env != NULL && atoi(env) > 0 ? atoi(env) : 10;
  double *t_start = calloc((size_t) runs, sizeof(double));
  double *t_destroy = calloc((size_t) runs, sizeof(double));

  for (int disk = 0; disk < 2; disk++) {
    double start = 0, destroy = 0;
    int ok = 1, n = 0;
    for (int i = 0; i < runs && ok; i++, n++) {
      char dir[300];
      tp_box_spec_t s;
      tp_box_t box;
      tp_error_t err = {0};
      double t0, t1;
      snprintf(dir, sizeof(dir), "%s/timed-%d", tmp_root, i);
      s = spec_for(e, "timed", dir);
      s.disk_bytes = disk ? (int64_t) 1 << 30 : 0;
      t0 = now_ms();
      ok = tp_linux_box_start(&s, &box, &err) == 0;
      t1 = now_ms();
      ok = ok && tp_box_destroy(&box, dir, &err) == 0;
      if (!ok)
        diag("timing: %s", err.msg);
      t_start[i] = t1 - t0;
      t_destroy[i] = now_ms() - t1;
      start += t_start[i];
      destroy += t_destroy[i];
    }
    check(ok, "timing: %d boxes %s started and destroyed", runs,
          disk ? "with a 1 GiB disk cap" : "without a disk cap");
    qsort(t_start, (size_t) n, sizeof(double), cmp_double);
    qsort(t_destroy, (size_t) n, sizeof(double), cmp_double);
    diag("%s: start mean %.2f median %.2f ms, destroy mean %.2f median %.2f ms",
         disk ? "disk cap 1 GiB" : "no disk cap", start / n, t_start[n / 2], destroy / n,
         t_destroy[n / 2]);
  }
  free(t_start);
  free(t_destroy);
}

/* ------------------------------------------------------------ main */

static int have_userns(void) {
  size_t len;
  char *t = slurp("/proc/sys/user/max_user_namespaces", &len);
  int ok = t != NULL && atoi(t) > 0;
  free(t);
  return ok;
}

static char *busybox_applets(size_t *len) {
  FILE *f = popen("/bin/busybox --list-full", "r");
  char *buf = NULL;
  size_t cap = 0, n = 0, r;
  if (f == NULL)
    return NULL;
  do {
    if (cap - n < 4096)
      buf = realloc(buf, cap = cap ? cap * 2 : 16384);
    r = fread(buf + n, 1, cap - n - 1, f);
    n += r;
  } while (r > 0);
  buf[n] = '\0';
  *len = n;
  if (pclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

int main(void) {
  const char *agent_path = getenv("TUPPER_AGENT");
  const char *tmpdir = getenv("TMPDIR");
  char *bb, *applets, *agent, *image;
  size_t bb_len, applets_len, agent_len;
  env_t env = {NULL, {NULL, NULL}, -1};
  tp_error_t err = {0};

  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0 || !have_userns()) {
    printf("1..0 # SKIP needs root and user namespaces\n");
    return 77;
  }
  bb = slurp("/bin/busybox", &bb_len);
  applets = busybox_applets(&applets_len);
  if (bb == NULL || applets == NULL) {
    printf("1..0 # SKIP needs /bin/busybox (busybox-static)\n");
    return 77;
  }
  snprintf(tmp_root, sizeof(tmp_root), "%s/tupper-test-linux.XXXXXX", tmpdir ? tmpdir : "/tmp");
  if (mkdtemp(tmp_root) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  chmod(tmp_root, 0711);
  image = path_in(tmp_root, "image");

  test_rmtree();
  test_rmtree_xdev();
  test_memfd();
  test_image(image, bb, bb_len, applets, applets_len);

  agent = agent_path ? slurp(agent_path, &agent_len) : NULL;
  if (agent == NULL) {
    diag("SKIP box tests: TUPPER_AGENT %s", agent_path ? "unreadable" : "unset");
  } else {
    env.image = image;
    env.layers[0] = image;
    env.agent_fd = tp_agent_memfd(agent, agent_len, &err);
    check(env.agent_fd >= 0, "agent memfd (%s)", env.agent_fd < 0 ? err.msg : "ok");
    if (env.agent_fd >= 0) {
      test_box(&env);
      test_box_failures(&env);
      test_box_layers(&env);
      test_box_limits(&env);
      test_limits_failures(&env);
      test_box_outlives_daemon(&env);
      test_adopt();
      test_box_readopt(&env);
      test_box_threads(&env);
      time_boxes(&env);
      close(env.agent_fd);
    }
  }

  check(loops_backed_by(tmp_root) == 0 && mounts_matching(tmp_root) == 0,
        "no loop device and no mount left under %s", tmp_root);
  if (tp_rmtree(tmp_root, &err) < 0)
    check(0, "clean up %s: %s", tmp_root, err.msg);
  free(image);
  free(bb);
  free(applets);
  free(agent);
  printf("1..%d\n", tap_num);
  if (tap_failed > 0)
    return 1;
  return agent == NULL ? 77 : 0;
}
