/* Maps a pid as a box sees it to the host pid, among candidate host pids
 * (the box cgroup's members), from the NSpid line of /proc/<pid>/status. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nspid.h"
#include "utils.h"

/* The innermost pid of host pid `pid`, or -1 (gone, or not in a child pid
 * namespace). */
static pid_t tp__inner_pid(pid_t pid) {
  char path[64], buf[4096];
  cleanup_close int fd = -1;
  ssize_t n;
  snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  n = read(fd, buf, sizeof(buf) - 1);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  char *line = strstr(buf, "\nNSpid:");
  if (line == NULL)
    return -1;
  line += 7;
  char *end = strchr(line, '\n');
  if (end != NULL)
    *end = '\0';
  long last = -1;
  int fields = 0;
  char *save = NULL;
  /* strtok_r: box:tree runs on the loop while pool threads may tokenize too */
  for (char *tok = strtok_r(line, " \t", &save); tok != NULL; tok = strtok_r(NULL, " \t", &save)) {
    char *e;
    last = strtol(tok, &e, 10);
    if (*e != '\0')
      return -1;
    fields++;
  }
  return fields >= 2 ? (pid_t) last : -1;
}

int tp_nspid_host_pid(const pid_t *candidates, size_t n, pid_t box_pid, pid_t *host,
                      tp_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    if (tp__inner_pid(candidates[i]) == box_pid) {
      *host = candidates[i];
      return 0;
    }
  }
  return tp_error_set(err, ESRCH, "no process %d in the box", (int) box_pid);
}
