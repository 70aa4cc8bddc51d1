/* tupper-agent as PID 1 of a microVM guest (backend "microvm", docs/microvm.md).
 *
 * The guest kernel starts the agent as /init from the initramfs the daemon
 * built: no fd 3, pid 1.  It then does what the linux backend's box_child.c
 * does for a box, with the guest's own kernel:
 *   1. /dev (devtmpfs), /proc, /sys; stdio on /dev/console (the serial
 *      console, which the daemon reads into a bounded buffer);
 *   2. loads /modules/NN-name.ko in name order with finit_module, passing
 *      the kernel command line's `name.param=value` words as parameters (what
 *      modprobe would do), and brings lo up;
 *   3. waits for the root disk (serial tupper-root: the image, read-only),
 *      the writable disk (tupper-rw: this VM's ext4 layer) and the agent's
 *      virtio-serial port
 *      (named "tupper.agent" in /sys/class/virtio-ports/);
 *   4. mounts the image read-only, the writable disk, an overlay of the two at /newroot, and
 *      /proc, /sys (read-only), a /dev as a linux box has it, /dev/pts and
 *      /dev/shm in it, then moves
 *      /newroot onto / and chroots there;
 *   5. waits until the host end of the port is connected and returns it as
 *      the channel.
 * The guest has no network device.  The host end of the port is a unix
 * socket QEMU listens on: when it closes (the daemon crashed) the agent
 * detaches and keeps the guest running for the grace period (VM_INIT's
 * GRACE), re-attaching when a daemon connects again (the port reopens: the
 * guest kernel signals it with SIGIO, agent_vm_port_init); once the grace
 * ends it stops every process and powers the VM off. */
#define _GNU_SOURCE
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "box_dev.h"
#include "box_proc.h"
#include "utils.h"

#define VM_PORT_NAME "tupper.agent"
#define VM_MODULES_DIR "/modules"
#define VM_DISK_ROOT "tupper-root" /* serials of the image's disk and of the writable one */
#define VM_DISK_RW "tupper-rw"
#define VM_WAIT_MS 20000        /* for a device to appear, the host to connect */
#define VM_CMDLINE_MAX 4096
#define VM_ENTROPY_MAX 256      /* bytes of VM_INIT entropy */
#define VM_HOSTNAME_MAX 64

int agent_vm_guest;

int agent_vm_detect(void) {
  return getpid() == 1 && fcntl(AGENT_CHAN_FD, F_GETFD) < 0 && errno == EBADF;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
}

static int mkdir_p1(const char *path, mode_t mode, tp_error_t *err) {
  if (mkdir(path, mode) < 0 && errno != EEXIST)
    return tp_error_errno(err, errno, "mkdir '%s'", path);
  return 0;
}

static int do_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data, tp_error_t *err) {
  if (mkdir_p1(dst, 0755, err) < 0)
    return -1;
  if (mount(src, dst, type, flags, data) < 0)
    return tp_error_errno(err, errno, "mount %s on '%s'", type ? type : src, dst);
  return 0;
}

static void console_stdio(void) {
  int fd = open("/dev/console", O_RDWR | O_NOCTTY);
  if (fd < 0)
    return;
  for (int i = 0; i < 3; i++)
    if (fd != i)
      dup2(fd, i);
  if (fd > 2)
    close(fd);
}

static int read_cmdline(char *buf, size_t cap) {
  cleanup_close int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
  ssize_t n;
  if (fd < 0)
    return -1;
  n = read(fd, buf, cap - 1);
  if (n < 0)
    return -1;
  buf[n] = '\0';
  return 0;
}

/* The command line's `mod.param=value` words for module mod, space separated
 * and without the prefix, into out (cap bytes). */
static void module_params(const char *cmdline, const char *mod, char *out, size_t cap) {
  size_t mlen = strlen(mod), used = 0;
  const char *p = cmdline;
  out[0] = '\0';
  while (*p) {
    const char *w;
    size_t wlen;
    while (*p == ' ' || *p == '\n')
      p++;
    w = p;
    while (*p && *p != ' ' && *p != '\n')
      p++;
    wlen = (size_t) (p - w);
    if (wlen > mlen + 1 && strncmp(w, mod, mlen) == 0 && w[mlen] == '.' &&
        used + wlen - mlen + 1 < cap) {
      if (used > 0)
        out[used++] = ' ';
      memcpy(out + used, w + mlen + 1, wlen - mlen - 1);
      used += wlen - mlen - 1;
      out[used] = '\0';
    }
  }
}

static int name_filter(const struct dirent *d) {
  size_t n = strlen(d->d_name);
  return n > 3 && strcmp(d->d_name + n - 3, ".ko") == 0;
}

/* Loads every module of VM_MODULES_DIR, in name order (the daemon numbered
 * them so that dependencies come first). */
static int load_modules(const char *cmdline, tp_error_t *err) {
  struct dirent **list = NULL;
  int n = scandir(VM_MODULES_DIR, &list, name_filter, alphasort);
  int ret = 0;
  if (n < 0)
    return errno == ENOENT ? 0 : tp_error_errno(err, errno, "read %s", VM_MODULES_DIR);
  for (int i = 0; i < n; i++) {
    char path[512], mod[256], params[VM_CMDLINE_MAX];
    const char *base = list[i]->d_name;
    const char *dash = strchr(base, '-');
    size_t len;
    int fd;
    if (ret == 0) {
      snprintf(path, sizeof(path), "%s/%s", VM_MODULES_DIR, base);
      snprintf(mod, sizeof(mod), "%s", dash ? dash + 1 : base);
      len = strlen(mod);
      if (len > 3)
        mod[len - 3] = '\0';
      for (char *c = mod; *c; c++)
        if (*c == '-')
          *c = '_';
      module_params(cmdline, mod, params, sizeof(params));
      fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        ret = tp_error_errno(err, errno, "open module '%s'", path);
      } else {
        if (syscall(SYS_finit_module, fd, params, 0) < 0 && errno != EEXIST)
          ret = tp_error_errno(err, errno, "load module %s", mod);
        close(fd);
      }
    }
    free(list[i]);
  }
  free(list);
  return ret;
}

/* /dev/NAME of the virtio-serial port called VM_PORT_NAME, into out. */
static int find_port(char *out, size_t cap) {
  DIR *d = opendir("/sys/class/virtio-ports");
  struct dirent *e;
  int found = -1;
  if (d == NULL)
    return -1;
  while (found < 0 && (e = readdir(d)) != NULL) {
    char path[512], name[64] = {0};
    int fd;
    ssize_t n;
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "/sys/class/virtio-ports/%s/name", e->d_name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    n = read(fd, name, sizeof(name) - 1);
    close(fd);
    if (n > 0 && name[n - 1] == '\n')
      name[n - 1] = '\0';
    if (n > 0 && strcmp(name, VM_PORT_NAME) == 0) {
      snprintf(out, cap, "/dev/%s", e->d_name);
      found = 0;
    }
  }
  closedir(d);
  return found;
}

/* Waits for path to exist (udev-less: devtmpfs makes the nodes). */
static int wait_path(const char *path, tp_error_t *err) {
  for (long t = 0; t < VM_WAIT_MS; t += 5) {
    if (access(path, F_OK) == 0)
      return 0;
    sleep_ms(5);
  }
  return tp_error_set(err, ENODEV, "no %s after %d ms", path, VM_WAIT_MS);
}

/* The port reads as EOF while its host end is closed: wait until it is open
 * (poll reports POLLHUP until then). */
static int wait_host(int fd, tp_error_t *err) {
  for (long t = 0; t < VM_WAIT_MS; t += 5) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
    if (poll(&p, 1, 0) >= 0 && !(p.revents & POLLHUP))
      return 0;
    sleep_ms(5);
  }
  return tp_error_set(err, ETIMEDOUT, "the host did not open the agent port");
}

/* /dev/vdX of the virtio disk whose serial is `serial`, into out: the
 * daemon names its disks, so the order QEMU gives them does not matter. */
static int find_disk(const char *serial, char *out, size_t cap, tp_error_t *err) {
  for (long t = 0; t < VM_WAIT_MS; t += 5) {
    DIR *d = opendir("/sys/block");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
      char path[512], val[64] = {0};
      int fd;
      ssize_t n;
      if (strncmp(e->d_name, "vd", 2) != 0)
        continue;
      snprintf(path, sizeof(path), "/sys/block/%s/serial", e->d_name);
      fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        continue;
      n = read(fd, val, sizeof(val) - 1);
      close(fd);
      if (n > 0 && val[n - 1] == '\n')
        val[n - 1] = '\0';
      if (n > 0 && strcmp(val, serial) == 0) {
        snprintf(out, cap, "/dev/%s", e->d_name);
        closedir(d);
        return wait_path(out, err);
      }
    }
    if (d != NULL)
      closedir(d);
    sleep_ms(5);
  }
  return tp_error_set(err, ENODEV, "no disk with serial %s", serial);
}

/* The box's /dev: what a linux-backend box has (backends/linux/box_plan.c),
 * not the guest's devtmpfs, whose nodes include the disks and the agent's
 * port. */
static int box_dev(tp_error_t *err) {
  char path[64];
  if (do_mount("tmpfs", "/newroot/dev", "tmpfs", MS_NOSUID | MS_NOEXEC,
               "mode=0755,size=64k,nr_inodes=64", err) < 0)
    return -1;
  for (size_t i = 0; i < TP_BOX_DEV_NODES; i++) {
    snprintf(path, sizeof(path), "/newroot/dev/%s", tp_box_dev_nodes[i].name);
    if (mknod(path, S_IFCHR | 0666, makedev(tp_box_dev_nodes[i].major, tp_box_dev_nodes[i].minor)) < 0 ||
        chmod(path, 0666) < 0) /* past the umask */
      return tp_error_errno(err, errno, "mknod %s", path);
  }
  for (size_t i = 0; i < TP_BOX_DEV_LINKS; i++) {
    snprintf(path, sizeof(path), "/newroot/dev/%s", tp_box_dev_links[i].name);
    if (symlink(tp_box_dev_links[i].target, path) < 0)
      return tp_error_errno(err, errno, "symlink %s", path);
  }
  if (do_mount("devpts", "/newroot/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620,gid=5", err) < 0 ||
      do_mount("tmpfs", "/newroot/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "mode=1777,size=64m", err) < 0)
    return -1;
  return 0;
}

/* The box's /proc hardened as a linux box's is (box_proc.h): the kernel is
 * the guest's own, but a box process (root in the guest, without
 * capabilities) could still read kmsg or tune /proc/sys through the DAC
 * rights root keeps, core_pattern among them: a program of its choosing
 * run by the kernel with every capability, and from there the raw devices
 * behind which QEMU's emulation is the host's boundary.  One exception:
 * sysrq-trigger stays, as in a VM of one's own; it can crash, reboot or
 * stop only this guest, which is how the tests make a guest panic. */
static int box_proc(tp_error_t *err) {
  const unsigned long ro = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  char path[64];
  struct stat st;
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_masked); i++) {
    if (strcmp(tp_box_proc_masked[i], "sysrq-trigger") == 0)
      continue;
    snprintf(path, sizeof(path), "/newroot/proc/%s", tp_box_proc_masked[i]);
    if (lstat(path, &st) < 0 || S_ISDIR(st.st_mode))
      continue;
    if (mount("/dev/null", path, NULL, MS_BIND, NULL) < 0 || mount(NULL, path, NULL, ro, NULL) < 0)
      return tp_error_errno(err, errno, "mask %s", path + 8);
  }
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_emptied); i++) {
    snprintf(path, sizeof(path), "/newroot/proc/%s", tp_box_proc_emptied[i]);
    if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
      continue;
    if (mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0555,size=4k,nr_inodes=1") < 0)
      return tp_error_errno(err, errno, "hide %s", path + 8);
  }
  for (size_t i = 0; i < TP_BOX_PROC_N(tp_box_proc_readonly); i++) {
    snprintf(path, sizeof(path), "/newroot/proc/%s", tp_box_proc_readonly[i]);
    if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
      continue;
    if (mount(path, path, NULL, MS_BIND, NULL) < 0 || mount(NULL, path, NULL, ro, NULL) < 0)
      return tp_error_errno(err, errno, "make %s read-only", path + 8);
  }
  return 0;
}

static int mount_root(tp_error_t *err) {
  const unsigned long nsd = MS_NOSUID | MS_NODEV;
  char root[300], rw[300];
  if (find_disk(VM_DISK_ROOT, root, sizeof(root), err) < 0 ||
      find_disk(VM_DISK_RW, rw, sizeof(rw), err) < 0)
    return -1;
  if (do_mount(root, "/mnt/lower", "ext4", MS_RDONLY | MS_NODEV, "noload", err) < 0 ||
      do_mount(rw, "/mnt/rw", "ext4", nsd, NULL, err) < 0 ||
      mkdir_p1("/mnt/rw/upper", 0755, err) < 0 || mkdir_p1("/mnt/rw/work", 0700, err) < 0 ||
      do_mount("overlay", "/newroot", "overlay", 0,
               "lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work", err) < 0)
    return -1;
  if (do_mount("proc", "/newroot/proc", "proc", nsd | MS_NOEXEC, NULL, err) < 0 || box_proc(err) < 0 ||
      do_mount("sysfs", "/newroot/sys", "sysfs", nsd | MS_NOEXEC | MS_RDONLY, NULL, err) < 0 ||
      box_dev(err) < 0)
    return -1;
  if (chdir("/newroot") < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
      chdir("/") < 0)
    return tp_error_errno(err, errno, "switch to the new root");
  return 0;
}

/* The guest's only interface, lo, up: the network relay's proxy, SOCKS and
 * DNS ports listen on 127.0.0.1 (docs/network.md), as in a linux box. */
static int lo_up(tp_error_t *err) {
  struct ifreq ifr;
  cleanup_close int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return tp_error_errno(err, errno, "socket");
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
    return tp_error_errno(err, errno, "lo: get flags");
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
    return tp_error_errno(err, errno, "lo: up");
  return 0;
}

int agent_vm_port_init(int fd, tp_error_t *err) {
  int fl = fcntl(fd, F_GETFL);
  /* virtio_console sends SIGIO to the owner on every change of the host's
   * connection (and on incoming data): a detached agent wakes at once */
  if (fl < 0 || fcntl(fd, F_SETOWN, getpid()) < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK | O_ASYNC) < 0)
    return tp_error_errno(err, errno, "agent port: non-blocking, SIGIO");
  return 0;
}

int agent_vm_host_connected(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) >= 0 && !(p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

int agent_vm_setup(int *chan, tp_error_t *err) {
  static char cmdline[VM_CMDLINE_MAX];
  char port[300];
  int fd;

  agent_vm_guest = 1;
  if (do_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", err) < 0)
    return -1;
  console_stdio();
  if (do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) < 0 ||
      do_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err) < 0)
    return -1;
  if (read_cmdline(cmdline, sizeof(cmdline)) < 0)
    return tp_error_errno(err, errno, "read /proc/cmdline");
  if (load_modules(cmdline, err) < 0 || lo_up(err) < 0 || agent_cg_setup(err) < 0)
    return -1;
  for (long t = 0; find_port(port, sizeof(port)) < 0; t += 5) {
    if (t >= VM_WAIT_MS)
      return tp_error_set(err, ENODEV, "no virtio-serial port named %s", VM_PORT_NAME);
    sleep_ms(5);
  }
  if (wait_path(port, err) < 0)
    return -1;
  fd = open(port, O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return tp_error_errno(err, errno, "open %s", port);
  if (mount_root(err) < 0 || wait_host(fd, err) < 0) {
    close(fd);
    return -1;
  }
  *chan = fd;
  return 0;
}

void agent_vm_poweroff(void) {
  sync();
  reboot(RB_POWER_OFF);
}

/* VM_INIT: NAME (hostname) MTIME (ns since the epoch) DATA? (entropy).
 * Sent by the host right after READY, on a cold boot and on a start from a
 * snapshot alike: a restored guest's clock is the snapshot's, and its
 * random pool is the snapshot's too, shared by every VM started from it. */
int agent_vm_init(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  const tp_field_t *name, *data;
  int64_t ns, grace;
  if (!agent_vm_guest)
    return tp_error_set(err, EOPNOTSUPP, "VM_INIT: not a microVM guest");
  if (agent_req_check(r, AGENT_TAG(TP_TAG_NAME) | AGENT_TAG(TP_TAG_DATA) | AGENT_TAG(TP_TAG_MTIME) |
                      AGENT_TAG(TP_TAG_GRACE), 0, "VM_INIT", err) < 0)
    return -1;
  grace = agent_req_int(r, TP_TAG_GRACE, AGENT_GRACE_DEFAULT_S);
  if (grace < 0 || grace > AGENT_GRACE_MAX_S)
    return tp_error_set(err, EINVAL, "VM_INIT: GRACE must be 0 to %d seconds", AGENT_GRACE_MAX_S);
  name = agent_req_get(r, TP_TAG_NAME);
  data = agent_req_get(r, TP_TAG_DATA);
  if (tp_field_int(agent_req_get(r, TP_TAG_MTIME), &ns) < 0)
    return tp_error_set(err, EINVAL, "VM_INIT: no MTIME");
  if (name == NULL || name->len == 0 || name->len > VM_HOSTNAME_MAX)
    return tp_error_set(err, EINVAL, "VM_INIT: NAME missing or longer than %d bytes",
                        VM_HOSTNAME_MAX);
  if (data != NULL && data->len > VM_ENTROPY_MAX)
    return tp_error_set(err, EINVAL, "VM_INIT: more than %d bytes of entropy", VM_ENTROPY_MAX);
  if (ns > 0) {
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    if (clock_settime(CLOCK_REALTIME, &ts) < 0)
      return tp_error_errno(err, errno, "VM_INIT: set the clock");
  }
  if (sethostname((const char *) name->val, name->len) < 0)
    return tp_error_errno(err, errno, "VM_INIT: sethostname");
  if (data != NULL && data->len > 0) {
    struct {
      int count, size;
      uint8_t buf[VM_ENTROPY_MAX];
    } e;
    cleanup_close int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    e.count = (int) data->len * 8;
    e.size = (int) data->len;
    memcpy(e.buf, data->val, data->len);
    if (fd < 0 || ioctl(fd, RNDADDENTROPY, &e) < 0)
      return tp_error_errno(err, errno, "VM_INIT: add entropy");
  }
  a->grace_ms = grace * 1000;
  return 0;
}

/* VM_ATTACH: a daemon's first request on a port it (re)connected to.  The
 * agent normally saw the earlier connection close (EOF) and detached, but a
 * close and a reopen can reach the guest back to back (QEMU frozen, or busy,
 * in between): whatever belonged to the earlier daemon goes now.  Its
 * queued EXITs were sent with READY, or go out right after this reply. */
int agent_vm_attach(agent_t *a, const agent_req_t *r, tp_error_t *err) {
  if (!agent_vm_guest)
    return tp_error_set(err, EOPNOTSUPP, "VM_ATTACH: not a microVM guest");
  if (agent_req_check(r, 0, 0, "VM_ATTACH", err) < 0)
    return -1;
  agent_net_detach(a);
  agent_watch_clear(a);
  return 0;
}
