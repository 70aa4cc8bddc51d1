/* tp_agent_memfd: the agent binary as a sealed, executable memfd.  Boxes
 * exec it with execveat(AT_EMPTY_PATH), so no agent file has to exist on the
 * host or in any image, and nobody holding the fd can change it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "linux.h"
#include "utils.h"

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif
#ifndef F_SEAL_EXEC
#define F_SEAL_EXEC 0x0020
#endif

int tp_agent_memfd(const void *bin, size_t len, tp_error_t *err) {
  const unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
  cleanup_close int fd = -1;
  const char *p = bin;
  int ret;

  if (bin == NULL || len == 0)
    return tp_error_set(err, EINVAL, "agent memfd: empty agent binary");
  /* Say MFD_EXEC explicitly (kernels >= 6.3 warn otherwise); older ones
   * reject the flag and are executable by default. */
  fd = memfd_create("tupper-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
  if (fd < 0 && errno == EINVAL)
    fd = memfd_create("tupper-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return tp_error_errno(err, errno, "agent memfd: memfd_create");
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return tp_error_errno(err, errno, "agent memfd: write");
    p += n;
    len -= (size_t) n;
  }
  /* F_SEAL_EXEC (>= 6.3) also pins the mode bits; fall back without it. */
  if (fcntl(fd, F_ADD_SEALS, seals | F_SEAL_EXEC) < 0 &&
      (errno != EINVAL || fcntl(fd, F_ADD_SEALS, seals) < 0))
    return tp_error_errno(err, errno, "agent memfd: seal");
  ret = fd;
  fd = -1;
  return ret;
}
