/* Box cgroups: reading and writing the files of a cgroup directory, and
 * the clock of the bounded waits. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cgroup_int.h"
#include "utils.h"

long long tp__cg_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void tp__cg_nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- files ------------------------------------------------------------------------ */

/* Writes val to dir/file.  With `optional`, a missing file returns 1. */
int tp__cg_write(const char *dir, const char *file, const char *val, int optional,
                    tp_error_t *err) {
  cleanup_free char *p = NULL;
  cleanup_close int fd = -1;
  size_t len = strlen(val);
  ssize_t w;

  if (asprintf(&p, "%s/%s", dir, file) < 0) {
    p = NULL;
    return tp_error_errno(err, ENOMEM, "write '%s/%s'", dir, file);
  }
  fd = open(p, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (optional && errno == ENOENT)
      return 1;
    return tp_error_errno(err, errno, "open '%s'", p);
  }
  do
    w = write(fd, val, len);
  while (w < 0 && errno == EINTR);
  if (w < 0)
    return tp_error_errno(err, errno, "write '%s' to '%s'", val, p);
  if ((size_t) w != len)
    return tp_error_set(err, EIO, "short write of '%s' to '%s'", val, p);
  return 0;
}

/* Reads fd whole into a NUL-terminated buffer; NULL with errno set. */
static char *read_fd(int fd) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap), *nb;
  ssize_t r;

  if (buf == NULL)
    return NULL;
  for (;;) {
    if (len + 1 >= cap) {
      nb = cap < (64u << 20) ? realloc(buf, cap * 2) : NULL;
      if (nb == NULL) {
        free(buf);
        errno = ENOMEM;
        return NULL;
      }
      buf = nb;
      cap *= 2;
    }
    r = read(fd, buf + len, cap - len - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      errno = e;
      return NULL;
    }
    if (r == 0)
      break;
    len += (size_t) r;
  }
  buf[len] = '\0';
  return buf;
}

/* dir/file whole; NULL with errno set (and err, if given). */
char *tp__cg_read(const char *dir, const char *file, tp_error_t *err) {
  cleanup_free char *p = NULL;
  cleanup_close int fd = -1;
  char *text;
  int e;

  if (asprintf(&p, "%s/%s", dir, file) < 0) {
    p = NULL;
    tp_error_errno(err, ENOMEM, "read '%s/%s'", dir, file);
    errno = ENOMEM;
    return NULL;
  }
  fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0 && (text = read_fd(fd)) != NULL)
    return text;
  e = errno;
  tp_error_errno(err, e, "read '%s'", p);
  errno = e;
  return NULL;
}

/* The value of "key <n>" in a flat keyed file's text, or -1. */
int64_t tp__cg_keyed(const char *text, const char *key) {
  size_t kl = strlen(key);
  const char *line = text;
  while (line != NULL && *line != '\0') {
    if (strncmp(line, key, kl) == 0 && line[kl] == ' ')
      return strtoll(line + kl + 1, NULL, 10);
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  return -1;
}

/* 1 if word is one of the space-separated words of text. */
int tp__cg_has_word(const char *text, const char *word) {
  size_t wl = strlen(word);
  const char *p = text;
  while ((p = strstr(p, word)) != NULL) {
    int start = p == text || p[-1] == ' ' || p[-1] == '\n';
    int end = p[wl] == '\0' || p[wl] == ' ' || p[wl] == '\n';
    if (start && end)
      return 1;
    p += wl;
  }
  return 0;
}

/* A single number (or "max") from dir/file, or -1 if unreadable. */
int64_t tp__cg_read_num(const char *dir, const char *file) {
  cleanup_free char *text = dir ? tp__cg_read(dir, file, NULL) : NULL;
  if (text == NULL)
    return -1;
  if (strncmp(text, "max", 3) == 0)
    return INT64_MAX;
  return strtoll(text, NULL, 10);
}

int64_t tp__cg_read_keyed(const char *dir, const char *file, const char *key) {
  cleanup_free char *text = dir ? tp__cg_read(dir, file, NULL) : NULL;
  return text ? tp__cg_keyed(text, key) : -1;
}

int tp__cg_is_dir(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

