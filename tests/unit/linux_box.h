/* What the linux backend's tests (test_rmtree, test_image, test_box,
 * test_box_limits, test_box_adopt) share: a temp dir of their own
 * (tmp_root), small file helpers, a client of the agent's channel (a
 * command in a box, its output), a box spec over the default image, and
 * each test's set-up and tear-down.  Include it after the test's include
 * block (the libc headers, frame.h, tap.h, linux.h); its functions are
 * static, and a test uses the ones it needs. */
#ifndef TP_LINUX_BOX_H
#define TP_LINUX_BOX_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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

static int no_children_left(void) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  return waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD;
}

/* ------------------------------------------------------------ set-up, tear-down */

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

/* What a test needs first: root and user namespaces, with busybox (the
 * default image's) when the test makes an image, and its tmp_root
 * (TMPDIR or /tmp, 0711).  Returns 0, or the exit code (77 skip, 1). */
static int linux_test_begin(int need_busybox, char **bb, size_t *bb_len, char **applets,
                            size_t *applets_len) {
  const char *tmpdir = getenv("TMPDIR");

  setvbuf(stdout, NULL, _IOLBF, 0);
  if (geteuid() != 0 || !have_userns()) {
    printf("1..0 # SKIP needs root and user namespaces\n");
    return 77;
  }
  if (need_busybox) {
    *bb = slurp("/bin/busybox", bb_len);
    *applets = busybox_applets(applets_len);
    if (*bb == NULL || *applets == NULL) {
      printf("1..0 # SKIP needs /bin/busybox (busybox-static)\n");
      free(*bb);
      free(*applets);
      return 77;
    }
  }
  snprintf(tmp_root, sizeof(tmp_root), "%s/tupper-test-linux.XXXXXX", tmpdir ? tmpdir : "/tmp");
  if (mkdtemp(tmp_root) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  chmod(tmp_root, 0711);
  return 0;
}

/* The environment of the box tests: the default image in tmp_root (which
 * test_image checks) and the agent (TUPPER_AGENT) in a sealed memfd, which
 * `counted` makes a numbered check (test_box's) and else a guard.
 * Returns 0; -1 when the box tests cannot run (failed, tear down with
 * linux_test_end); or an exit code to return at once (77 skip, 1). */
static int box_env_begin(env_t *e, int counted) {
  const char *agent_path = getenv("TUPPER_AGENT");
  char *bb = NULL, *applets = NULL, *agent;
  size_t bb_len = 0, applets_len = 0, agent_len;
  tp_error_t err = {0};
  char *image;
  int r;

  if ((r = linux_test_begin(1, &bb, &bb_len, &applets, &applets_len)) != 0)
    return r;
  agent = agent_path ? slurp(agent_path, &agent_len) : NULL;
  if (agent == NULL) {
    printf("1..0 # SKIP box tests: TUPPER_AGENT %s\n", agent_path ? "unreadable" : "unset");
    tp_rmtree(tmp_root, &err);
    free(bb);
    free(applets);
    return 77;
  }
  image = path_in(tmp_root, "image");
  r = tp_image_default_ensure(image, bb, bb_len, applets, applets_len, UID_BASE, UID_BASE, &err);
  tap_guard(r == 0, "the default image (%s)", r < 0 ? err.msg : "ok");
  free(bb);
  free(applets);
  *e = (env_t){image, {image, NULL}, -1};
  e->agent_fd = r == 0 ? tp_agent_memfd(agent, agent_len, &err) : -1;
  free(agent);
  if (counted)
    check(e->agent_fd >= 0, "agent memfd (%s)", e->agent_fd < 0 ? err.msg : "ok");
  else
    tap_guard(e->agent_fd >= 0, "agent memfd (%s)", e->agent_fd < 0 ? err.msg : "ok");
  return e->agent_fd >= 0 ? 0 : -1;
}

/* Nothing of the test left: no loop device, no mount under tmp_root (a
 * numbered check if `counted`, test_box's; else a guard), then tmp_root
 * removed.  Prints the plan, returns the exit code. */
static int linux_test_end(env_t *e, int counted) {
  tp_error_t err = {0};
  int clean = loops_backed_by(tmp_root) == 0 && mounts_matching(tmp_root) == 0;

  if (e != NULL) {
    if (e->agent_fd >= 0)
      close(e->agent_fd);
    free((char *) e->image);
  }
  if (counted)
    check(clean, "no loop device and no mount left under %s", tmp_root);
  else
    tap_guard(clean, "no loop device and no mount left under %s", tmp_root);
  if (tp_rmtree(tmp_root, &err) < 0)
    check(0, "clean up %s: %s", tmp_root, err.msg);
  return tap_done();
}

#pragma GCC diagnostic pop

#endif
