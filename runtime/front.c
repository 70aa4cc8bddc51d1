/* tupper: the installed command.  `tupper exec ID -- CMD` and `tupper run
 * -- CMD` run here, in the C client (runtime/client/fast.h), in a
 * static-pie process (runtime/CMakeLists.txt): no dynamic loader, no Lua,
 * libuv, seccomp or embedded payloads to map and relocate at every start.  Every other command line is handed,
 * argv as given, to tupper-core (runtime/main.c: the daemon, the Lua CLI
 * and the same C client), an exec of the binary next to this one
 * (docs/cli.md, "The C client"). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fast.h"

#define CORE_NAME "tupper-core"

int main(int argc, char **argv) {
  char path[PATH_MAX];
  ssize_t n;
  char *slash;
  int code;

  /* as in tp_main: a reader that goes away costs an EPIPE, not the process */
  signal(SIGPIPE, SIG_IGN);
  if (tp_fast_main(argc, argv, &code))
    return code;
  /* the core next to the file this process runs (a symlink to tupper
   * finds it beside its target) */
  n = readlink("/proc/self/exe", path, sizeof(path));
  if (n <= 0 || (size_t) n >= sizeof(path)) {
    fprintf(stderr, "tupper: cannot find %s: /proc/self/exe: %s\n", CORE_NAME,
            n < 0 ? strerror(errno) : "too long");
    return 127;
  }
  path[n] = '\0';
  slash = strrchr(path, '/');
  if (slash == NULL || (size_t) (slash + 1 - path) + sizeof(CORE_NAME) > sizeof(path)) {
    fprintf(stderr, "tupper: cannot find %s beside %s\n", CORE_NAME, path);
    return 127;
  }
  memcpy(slash + 1, CORE_NAME, sizeof(CORE_NAME));
  /* the C client already declined this command line: the core goes
   * straight to Lua (and drops the variable, so nothing it starts sees it) */
  if (setenv("TUPPER_FRONT_DECLINED", "1", 1) < 0) {
    fprintf(stderr, "tupper: setenv: %s\n", strerror(errno));
    return 127;
  }
  execv(path, argv);
  fprintf(stderr, "tupper: exec %s: %s\n", path, strerror(errno));
  return 127;
}
