/* tupper: cleanup attributes and small helpers shared by every C file.
 * Ownership is handed out explicitly: `ret = fd; fd = -1; return ret;`. */
#ifndef TP_UTILS_H
#define TP_UTILS_H

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static inline void tp__cleanup_freep(void *p) {
  void **pp = (void **) p;
  free(*pp);
}
static inline void tp__cleanup_closep(int *fd) {
  if (*fd >= 0) {
    int saved = errno;
    close(*fd);
    errno = saved;
  }
}
/* Kills and reaps a helper process on any early return. */
static inline void tp__cleanup_pidp(pid_t *pid) {
  if (*pid > 0) {
    int saved = errno;
    kill(*pid, SIGKILL);
    while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
      ;
    errno = saved;
  }
}

#define cleanup_free __attribute__((cleanup(tp__cleanup_freep)))
#define cleanup_close __attribute__((cleanup(tp__cleanup_closep)))
#define cleanup_pid __attribute__((cleanup(tp__cleanup_pidp)))

#define TP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* 1 if name matches [a-z0-9][a-z0-9-]{0,62} (a sandbox id, a cgroup or
 * process tree name: safe as a path component and a hostname), else 0. */
static inline int tp_name_valid(const char *name) {
  if (name == NULL || !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9')))
    return 0;
  for (size_t i = 1; name[i] != '\0'; i++) {
    char ch = name[i];
    if (i > 62 || !((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-'))
      return 0;
  }
  return 1;
}

#endif
