/* Unit tests for the linux backend (backends/linux): tp_rmtree, the sealed
 * agent memfd, the default image, and boxes started with the real agent
 * (TUPPER_AGENT), asserting isolation from inside and a clean host after
 * destroy.  TAP-ish output; exit 0 pass, 1 fail, 77 skip (not root, no user
 * namespaces, or no agent). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "linux.h"

#define UID_BASE 100000000u
#define ID_COUNT 65536u
#define IO_TIMEOUT_MS 20000

static int n_tests, n_failed;
static char tmp_root[256]; /* everything this test makes on disk lives here */

static void check(int cond, const char *fmt, ...) TP_PRINTF(2, 3);
static void check(int cond, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  for (char *q = msg; *q; q++) /* one TAP line per test */
    if (*q == '\n')
      *q = '|';
  printf("%s %d - %s\n", cond ? "ok" : "not ok", ++n_tests, msg);
  fflush(stdout);
  if (!cond)
    n_failed++;
}

static void diag(const char *fmt, ...) TP_PRINTF(1, 2);
static void diag(const char *fmt, ...) {
  va_list ap;
  printf("# ");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
}

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
static int box_sh(conn_t *c, const char *script, char **out, int64_t *pid_out) {
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
  int agent_fd;
} env_t;

static tp_box_spec_t spec_for(const env_t *e, const char *id, const char *box_dir) {
  tp_box_spec_t s = {id, e->image, box_dir, e->agent_fd, UID_BASE, UID_BASE, ID_COUNT};
  return s;
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

  code = box_sh(&c, "echo data > /newfile && echo more > /home/user/f && chown 1000 /home/user/f",
                NULL, NULL);
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
  p = path_in(box_dir, "upper/home/user/f");
  {
    struct stat st;
    check(stat(p, &st) == 0 && st.st_uid == UID_BASE + 1000, "box: copy-up and chown inside work");
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
    r = tp_linux_box_destroy(&box, box_dir, &err);
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
    check(tp_linux_box_destroy(&box, box_dir, &err) == 0, "destroy: idempotent");
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
  s = spec_for(e, "ok", box_dir);
  s.image_dir = "/tmp/a,upperdir=/x";
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EINVAL, "start: overlay option injection refused");

  mkdir(box_dir, 0700);
  s = spec_for(e, "ok", box_dir);
  r = tp_linux_box_start(&s, &box, &err);
  check(r < 0 && err.code == EEXIST && exists(box_dir),
        "start: existing box_dir refused, kept (%s)", err.msg);
  rmdir(box_dir);

  s = spec_for(e, "ok", box_dir);
  s.image_dir = missing;
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

/* The box dies with the thread that started it (PR_SET_PDEATHSIG). */
static void test_box_parent_death(const env_t *e) {
  char *box_dir = path_in(tmp_root, "orphan");
  int p[2];
  pid_t kid, box_pid = -1;
  int status, pidfd = -1;
  tp_error_t err = {0};

  if (pipe(p) < 0)
    return;
  /* The orphaned box is reparented to us, so we reap it, not host init. */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  kid = fork();
  if (kid == 0) {
    tp_box_spec_t s = spec_for(e, "orphan", box_dir);
    tp_box_t box;
    tp_error_t e2 = {0};
    close(p[0]);
    if (tp_linux_box_start(&s, &box, &e2) < 0)
      _exit(1);
    if (write(p[1], &box.pid, sizeof(box.pid)) != sizeof(box.pid))
      _exit(1);
    pause();
    _exit(0);
  }
  close(p[1]);
  if (read(p[0], &box_pid, sizeof(box_pid)) == sizeof(box_pid))
    pidfd = (int) syscall(SYS_pidfd_open, box_pid, 0);
  close(p[0]);
  kill(kid, SIGKILL);
  waitpid(kid, &status, 0);
  if (pidfd >= 0) {
    struct pollfd pf = {.fd = pidfd, .events = POLLIN};
    check(poll(&pf, 1, 5000) == 1, "pdeathsig: the box dies with its daemon");
    close(pidfd);
    waitpid(box_pid, &status, 0);
  } else {
    check(0, "pdeathsig: box started in the child");
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  check(no_children_left(), "pdeathsig: the orphaned box reaped");
  check(tp_rmtree(box_dir, &err) == 0 && !exists(box_dir), "pdeathsig: its dir can be removed");
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
    if (tp_linux_box_start(&s, &box, &err) < 0 || tp_linux_box_destroy(&box, dir, &err) < 0) {
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
            mounts_matching(tmp_root) == 0,
        "threads: 4 threads x 5 boxes started and destroyed concurrently, nothing left");
}

static void time_boxes(const env_t *e) {
  const int runs = 10;
  double start = 0, destroy = 0;
  int ok = 1;
  for (int i = 0; i < runs && ok; i++) {
    char dir[300];
    tp_box_spec_t s;
    tp_box_t box;
    tp_error_t err = {0};
    double t0, t1;
    snprintf(dir, sizeof(dir), "%s/timed-%d", tmp_root, i);
    s = spec_for(e, "timed", dir);
    t0 = now_ms();
    ok = tp_linux_box_start(&s, &box, &err) == 0;
    t1 = now_ms();
    ok = ok && tp_linux_box_destroy(&box, dir, &err) == 0;
    start += t1 - t0;
    destroy += now_ms() - t1;
  }
  check(ok, "timing: %d boxes started and destroyed", runs);
  diag("mean start %.2f ms, destroy %.2f ms (box dirs under %s)", start / runs, destroy / runs,
       tmp_root);
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
  env_t env = {NULL, -1};
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
    env.agent_fd = tp_agent_memfd(agent, agent_len, &err);
    check(env.agent_fd >= 0, "agent memfd (%s)", env.agent_fd < 0 ? err.msg : "ok");
    if (env.agent_fd >= 0) {
      test_box(&env);
      test_box_failures(&env);
      test_box_parent_death(&env);
      test_box_threads(&env);
      time_boxes(&env);
      close(env.agent_fd);
    }
  }

  if (tp_rmtree(tmp_root, &err) < 0)
    check(0, "clean up %s: %s", tmp_root, err.msg);
  free(image);
  free(bb);
  free(applets);
  free(agent);
  printf("1..%d\n", n_tests);
  if (n_failed > 0)
    return 1;
  return agent == NULL ? 77 : 0;
}
