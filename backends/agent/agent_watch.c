/* tupper-agent: watching directories (WATCH_ADD, WATCH_REMOVE, WATCH_EVENT).
 *
 * Each watch has an inotify instance of its own, so two watches of one
 * directory never share (and never remove) each other's watch descriptors.
 * A recursive watch adds every subdirectory it finds (never following a
 * symlink), and each new one as it appears; the entries of a directory that
 * appears (mkdir -p, a directory moved in) are reported as created, since
 * they may have been made before its watch was in place.  Every count is
 * bounded: AGENT_WATCH_MAX watches, AGENT_WATCH_DIRS_MAX directories per
 * watch (past it, at WATCH_ADD an error, later an OVERFLOW event saying
 * what is not watched), WALK_EVENTS_MAX synthetic events per new directory.
 * Names come from inside the box and are sent as they are (no NUL byte can
 * be in one); the host treats them as hostile.  A watch made with UID GID
 * GROUPS? adds the directories that appear later as that account too. */
#define _GNU_SOURCE
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define WATCH_MASK                                                                                 \
  (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DONT_FOLLOW | \
   IN_ONLYDIR | IN_EXCL_UNLINK)
#define WALK_EVENTS_MAX 4096 /* synthetic CREATE events for one new directory tree */
#define READ_BUF 16384

static agent_watch_t *watch_find(agent_t *a, int64_t id) {
  if (id <= 0)
    return NULL;
  for (int i = 0; i < AGENT_WATCH_MAX; i++)
    if (a->watches[i].id == id)
      return &a->watches[i];
  return NULL;
}

static void watch_free(agent_watch_t *w) {
  if (w->fd >= 0)
    close(w->fd);
  for (int i = 0; i < w->ndirs; i++)
    free(w->dirs[i].rel);
  free(w->dirs);
  free(w->root);
  *w = (agent_watch_t){.fd = -1};
}

void agent_watch_clear(agent_t *a) {
  for (int i = 0; i < AGENT_WATCH_MAX; i++)
    if (a->watches[i].id != 0)
      watch_free(&a->watches[i]);
}

static void send_event(agent_t *a, const agent_watch_t *w, int kind, const char *name, const char *msg) {
  agent_event_begin(a, TP_MSG_WATCH_EVENT);
  tp_frame_add_int(&a->out, TP_TAG_WATCH, w->id);
  tp_frame_add_int(&a->out, TP_TAG_EVENT, kind);
  if (name != NULL && name[0] != '\0')
    tp_frame_add_str(&a->out, TP_TAG_NAME, name);
  if (msg != NULL)
    tp_frame_add_str(&a->out, TP_TAG_MSG, msg);
  agent_send(a);
}

/* rel joined to name ("" + name = name), into buf (TP_PATH_MAX + 1 bytes);
 * -1 when too long. */
static int rel_join(char *buf, const char *rel, const char *name) {
  size_t lr = strlen(rel), ln = strlen(name);
  size_t n = lr + (lr ? 1 : 0) + ln;
  if (n > TP_PATH_MAX)
    return -1;
  memcpy(buf, rel, lr);
  if (lr)
    buf[lr++] = '/';
  memcpy(buf + lr, name, ln + 1);
  return 0;
}

/* The absolute path of rel under w's root; -1 when too long. */
static int abs_join(char *buf, const agent_watch_t *w, const char *rel) {
  if (rel[0] == '\0') {
    if (strlen(w->root) > TP_PATH_MAX)
      return -1;
    strcpy(buf, w->root);
    return 0;
  }
  return rel_join(buf, strcmp(w->root, "/") == 0 ? "" : w->root, rel) < 0 ? -1 : 0;
}

static agent_wdir_t *dir_by_wd(agent_watch_t *w, int wd) {
  for (int i = 0; i < w->ndirs; i++)
    if (w->dirs[i].wd == wd)
      return &w->dirs[i];
  return NULL;
}

static void dir_drop(agent_watch_t *w, int i) {
  free(w->dirs[i].rel);
  w->dirs[i] = w->dirs[--w->ndirs];
}

/* Adds an inotify watch for rel.  0, or -1 with err (ENOSPC past
 * AGENT_WATCH_DIRS_MAX).  A directory already watched (two names for one
 * inode cannot happen without hard links to directories) keeps its name. */
static int dir_add(agent_watch_t *w, const char *rel, tp_error_t *err) {
  char path[TP_PATH_MAX + 1];
  char *copy;
  int wd;
  if (w->ndirs >= AGENT_WATCH_DIRS_MAX)
    return tp_error_set(err, ENOSPC, "watch: more than %d directories under %s", AGENT_WATCH_DIRS_MAX,
                        w->root);
  if (abs_join(path, w, rel) < 0)
    return tp_error_set(err, ENAMETOOLONG, "watch: path of '%s' too long", rel);
  wd = inotify_add_watch(w->fd, path, WATCH_MASK);
  if (wd < 0)
    return tp_error_errno(err, errno, "watch '%s'", path);
  if (dir_by_wd(w, wd) != NULL)
    return 0;
  if (w->ndirs == w->cap) {
    int cap = w->cap ? w->cap * 2 : 16;
    agent_wdir_t *d = realloc(w->dirs, (size_t) cap * sizeof(*d));
    if (d == NULL) {
      inotify_rm_watch(w->fd, wd);
      return tp_error_set(err, ENOMEM, "watch: out of memory");
    }
    w->dirs = d;
    w->cap = cap;
  }
  copy = strdup(rel);
  if (copy == NULL) {
    inotify_rm_watch(w->fd, wd);
    return tp_error_set(err, ENOMEM, "watch: out of memory");
  }
  w->dirs[w->ndirs++] = (agent_wdir_t){.wd = wd, .rel = copy};
  return 0;
}

static int is_dir_entry(int dfd, const struct dirent *e) {
  struct stat st;
  if (e->d_type == DT_DIR)
    return 1;
  if (e->d_type != DT_UNKNOWN)
    return 0;
  return fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* Watches the subdirectories of w->dirs[from..] and those added meanwhile
 * (the table is the queue).  With emit (a directory that appeared later),
 * every entry found is reported as created (at most WALK_EVENTS_MAX, then
 * one OVERFLOW) and failures become OVERFLOW events; without (WATCH_ADD)
 * the first failure is the error. */
static int walk(agent_t *a, agent_watch_t *w, int from, int emit, tp_error_t *err) {
  int events = 0, overflow = 0;
  for (int i = from; i < w->ndirs; i++) {
    char path[TP_PATH_MAX + 1], rel[TP_PATH_MAX + 1];
    struct dirent *e;
    DIR *d;
    if (abs_join(path, w, w->dirs[i].rel) < 0)
      continue;
    d = opendir(path);
    if (d == NULL)
      continue; /* gone meanwhile: its IN_IGNORED follows */
    while ((e = readdir(d)) != NULL) {
      tp_error_t e2;
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
        continue;
      if (rel_join(rel, w->dirs[i].rel, e->d_name) < 0)
        continue;
      if (emit && !overflow) {
        if (events++ < WALK_EVENTS_MAX) {
          send_event(a, w, TP_WE_CREATE, rel, NULL);
        } else {
          overflow = 1;
          send_event(a, w, TP_WE_OVERFLOW, w->dirs[i].rel,
                     "too many entries in a new directory: not all were reported");
        }
      }
      if (!w->recursive || !is_dir_entry(dirfd(d), e))
        continue;
      tp_error_clear(&e2);
      if (dir_add(w, rel, &e2) < 0) {
        if (!emit) {
          closedir(d);
          *err = e2;
          return -1;
        }
        send_event(a, w, TP_WE_OVERFLOW, rel, e2.msg);
        if (e2.code == ENOSPC) {
          closedir(d);
          return 0;
        }
      }
    }
    closedir(d);
  }
  return 0;
}

int agent_watch_add(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  char path[TP_PATH_MAX + 1];
  int64_t flags = agent_req_int(r, TP_TAG_FLAGS, 0);
  agent_watch_t *w = NULL;
  struct stat st;

  if (agent_req_check(r, AGENT_TAG(TP_TAG_PATH) | AGENT_TAG(TP_TAG_FLAGS) | AGENT_AS_TAGS, 0, "watch", err) < 0)
    return -1;
  if (flags & ~(int64_t) TP_F_WATCH_RECURSIVE)
    return tp_error_set(err, EINVAL, "watch: unknown FLAGS 0x%llx", (unsigned long long) flags);
  if (agent_req_path(r, TP_TAG_PATH, "watch", path, err) < 0)
    return -1;
  if (stat(path, &st) < 0)
    return tp_error_errno(err, errno, "watch '%s'", path);
  if (!S_ISDIR(st.st_mode))
    return tp_error_set(err, ENOTDIR, "watch '%s': not a directory", path);
  for (int i = 0; i < AGENT_WATCH_MAX && w == NULL; i++)
    if (a->watches[i].id == 0)
      w = &a->watches[i];
  if (w == NULL)
    return tp_error_set(err, EMFILE, "watch: too many watches (%d)", AGENT_WATCH_MAX);

  *w = (agent_watch_t){.fd = -1, .recursive = (flags & TP_F_WATCH_RECURSIVE) != 0, .as = a->as};
  w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd < 0) {
    int e = errno;
    watch_free(w);
    return tp_error_errno(err, e, "watch: inotify_init1");
  }
  w->root = strdup(path);
  if (w->root == NULL) {
    watch_free(w);
    return tp_error_set(err, ENOMEM, "watch: out of memory");
  }
  if (dir_add(w, "", err) < 0 || walk(a, w, 0, 0, err) < 0) {
    watch_free(w);
    return -1;
  }
  w->id = ++a->next_watch;
  tp_frame_add_int(&a->out, TP_TAG_WATCH, w->id);
  return 0;
}

int agent_watch_remove(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  agent_watch_t *w;
  if (agent_req_check(r, AGENT_TAG(TP_TAG_WATCH), 0, "unwatch", err) < 0)
    return -1;
  if (agent_req_get(r, TP_TAG_WATCH) == NULL)
    return tp_error_set(err, EINVAL, "unwatch: no WATCH");
  w = watch_find(a, agent_req_int(r, TP_TAG_WATCH, 0));
  if (w == NULL)
    return tp_error_set(err, ENOENT, "unwatch: no watch %lld",
                        (long long) agent_req_int(r, TP_TAG_WATCH, 0));
  watch_free(w);
  return 0;
}

int agent_watch_poll_fill(agent_t *a, int first) {
  int n = first;
  for (int i = 0; i < AGENT_WATCH_MAX; i++)
    if (a->watches[i].id != 0) {
      a->pfds[n] = (struct pollfd){.fd = a->watches[i].fd, .events = POLLIN};
      a->prefs[n++] = (agent_pollref_t){.slot = (int16_t) i, .stream = 3};
    }
  return n;
}

/* Stops watching rel and everything under it (moved away). */
static void drop_subtree(agent_watch_t *w, const char *rel) {
  size_t len = strlen(rel);
  for (int i = w->ndirs - 1; i >= 0; i--) {
    const char *r = w->dirs[i].rel;
    if (strncmp(r, rel, len) == 0 && (r[len] == '\0' || r[len] == '/')) {
      inotify_rm_watch(w->fd, w->dirs[i].wd);
      dir_drop(w, i);
    }
  }
}

/* A directory appeared in a recursive watch: watch it and what is in it,
 * as the account the watch was made for (a directory it cannot read stays
 * unwatched, with an OVERFLOW event saying why). */
static void grow(agent_t *a, agent_watch_t *w, const char *rel) {
  tp_error_t err;
  int from = w->ndirs;
  tp_error_clear(&err);
  if (agent_as_enter(&w->as, &err) < 0 || dir_add(w, rel, &err) < 0)
    send_event(a, w, TP_WE_OVERFLOW, rel, err.msg);
  else
    walk(a, w, from, 1, &err);
  if (agent_as_leave(&w->as) < 0) {
    agent_log("cannot return to root's filesystem ids: stopping");
    a->broken = 1;
  }
}

/* One inotify event; returns -1 once the watch ended (freed). */
static int handle_event(agent_t *a, agent_watch_t *w, const struct inotify_event *ev) {
  char rel[TP_PATH_MAX + 1];
  agent_wdir_t *d;
  int kind = 0;
  if (ev->mask & IN_Q_OVERFLOW) {
    send_event(a, w, TP_WE_OVERFLOW, NULL, "the kernel's event queue overflowed: events were lost");
    return 0;
  }
  d = dir_by_wd(w, ev->wd);
  if (d == NULL)
    return 0; /* a watch we dropped */
  if (ev->mask & IN_IGNORED) {
    if (d->rel[0] == '\0') {
      send_event(a, w, TP_WE_END, NULL, "the watched directory is gone");
      watch_free(w);
      return -1;
    }
    dir_drop(w, (int) (d - w->dirs));
    return 0;
  }
  if (ev->len == 0 || ev->name[0] == '\0')
    return 0; /* about the directory itself: its parent reports it */
  if (rel_join(rel, d->rel, ev->name) < 0)
    return 0;
  if (ev->mask & (IN_CREATE | IN_MOVED_TO))
    kind = TP_WE_CREATE;
  else if (ev->mask & IN_MODIFY)
    kind = TP_WE_WRITE;
  else if (ev->mask & IN_DELETE)
    kind = TP_WE_REMOVE;
  else if (ev->mask & IN_MOVED_FROM)
    kind = TP_WE_RENAME;
  else if (ev->mask & IN_ATTRIB)
    kind = TP_WE_CHMOD;
  if (kind == 0)
    return 0;
  send_event(a, w, kind, rel, NULL);
  if (!w->recursive || !(ev->mask & IN_ISDIR))
    return 0;
  if (ev->mask & IN_MOVED_FROM) {
    drop_subtree(w, rel);
  } else if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
    grow(a, w, rel);
  }
  return 0;
}

/* One read per ready watch per round, like process output: no watch can
 * starve the loop. */
static void watch_read(agent_t *a, agent_watch_t *w) {
  char buf[READ_BUF] __attribute__((aligned(__alignof__(struct inotify_event))));
  ssize_t n;
  do
    n = read(w->fd, buf, sizeof(buf));
  while (n < 0 && errno == EINTR);
  if (n <= 0) {
    if (n < 0 && errno == EAGAIN)
      return;
    send_event(a, w, TP_WE_END, NULL, "reading the watch failed");
    watch_free(w);
    return;
  }
  for (char *p = buf; p < buf + n;) {
    const struct inotify_event *ev = (const struct inotify_event *) (void *) p;
    if ((size_t) (buf + n - p) < sizeof(*ev) || sizeof(*ev) + ev->len > (size_t) (buf + n - p))
      break;
    if (handle_event(a, w, ev) < 0)
      return;
    p += sizeof(*ev) + ev->len;
  }
}

void agent_watch_poll_handle(agent_t *a, int first, int n) {
  for (int i = first; i < n; i++) {
    agent_watch_t *w = &a->watches[a->prefs[i].slot];
    if (a->pfds[i].revents == 0 || w->id == 0 || w->fd != a->pfds[i].fd)
      continue;
    watch_read(a, w);
  }
}
