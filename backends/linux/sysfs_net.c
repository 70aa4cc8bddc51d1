/* The network namespace every box's /sys is mounted from.
 *
 * A sysfs mount shows the network devices of the namespace its mounter was
 * in, and the kernel keeps one superblock per such namespace: a box that
 * mounts sysfs in its own namespace makes a superblock of its own, and
 * each superblock is a shrinker that every memory cgroup on the host keeps
 * room for (docs/benchmarks.md, "Loop").  So the boxes mount it from one
 * namespace made here, empty but for its loopback device (up, as a box's
 * own): they all share one superblock and see what they saw in their own,
 * a read-only /sys whose only network device is an "lo" that is up.  Its
 * counters are this namespace's, where nothing runs (zero), not the box's.
 * Nothing of the namespace is reachable from a box: the box runs in its
 * own, and the fd held here never enters one (the child closes the
 * daemon's fds before its exec). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "linux_int.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int netns_fd = -1;

/* Runs on a thread of its own: unshare changes only the calling thread's
 * network namespace, and the thread ends with it (the fd keeps it). */
static void *make(void *arg) {
  struct ifreq ifr;
  int s, fd = -1;
  (void) arg;
  if (unshare(CLONE_NEWNET) < 0)
    return NULL;
  s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return NULL;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) == 0)
      fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  }
  close(s);
  netns_fd = fd;
  return NULL;
}

static void make_once(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, make, NULL) == 0)
    pthread_join(t, NULL);
}

int tp__sysfs_netns(void) {
  pthread_once(&once, make_once);
  return netns_fd;
}
