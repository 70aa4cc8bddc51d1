/* Drives backends/microvm/ram.c: the guest memory of a microVM snapshot.
 *
 * A template memfd is filled (data pages and zero pages), saved to a file
 * (only the non-zero pages hold blocks), loaded back as a sealed memfd, and
 * the sealed memfd is attacked the ways a compromised QEMU holding it could:
 * write(), ftruncate, a shared writable mapping, reopening
 * /proc/self/fd/N for writing then writing, unsealing.  All are refused; a
 * private writable mapping (what QEMU maps) works and its writes stay its
 * own.  A file of the wrong size and a symlink are refused.  The saved
 * file is then copied sparsely (what a start does with the snapshot's
 * writable disk): same bytes, holes kept, an existing target refused.
 * Exit 0 pass, 1 fail. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "microvm.h"
#include "tap.h"

#define PAGE 4096
#define NPAGES 64

int main(void) {
  tp_error_t err = {0};
  char dir[] = "/tmp/tupper-test-vmram.XXXXXX", path[256], link[256], proc[64];
  unsigned char page[PAGE], back[PAGE];
  struct stat st;
  int t, fd, rfd;
  unsigned char *m;

  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof(path), "%s/vm.ram", dir);
  snprintf(link, sizeof(link), "%s/link", dir);

  t = tp_microvm_ram_new(NPAGES * PAGE, &err);
  check(t >= 0, "ram_new: a memfd (%s)", t < 0 ? err.msg : "ok");
  if (t < 0)
    return tap_done();
  /* pages 3 and 40 hold data, every other page is written as zeros (what a
   * guest with init_on_free leaves) */
  memset(page, 0, sizeof(page));
  {
    int zeros = 0;
    for (int i = 0; i < NPAGES; i++)
      zeros += pwrite(t, page, PAGE, (off_t) i * PAGE) == PAGE;
    check(zeros == NPAGES, "zero pages written");
  }
  memset(page, 0xab, sizeof(page));
  page[100] = 0;
  check(pwrite(t, page, PAGE, 3 * PAGE) == PAGE && pwrite(t, page, PAGE, 40 * PAGE) == PAGE,
        "data pages written");
  check(tp_microvm_ram_save(t, path, &err) == 0, "ram_save (%s)", err.msg);
  check(tp_microvm_ram_save(t, path, &err) < 0 && strstr(err.msg, "create"),
        "ram_save refuses to overwrite a file (%s)", err.msg);
  close(t);
  check(stat(path, &st) == 0 && st.st_size == NPAGES * PAGE, "saved: the full size");
  check(st.st_blocks * 512 < 8 * PAGE, "saved: zero pages are holes (%lld bytes allocated)",
        (long long) st.st_blocks * 512);

  check(tp_microvm_ram_memfd(path, NPAGES * PAGE + PAGE, &err) < 0 && strstr(err.msg, "bytes"),
        "a file of another size is refused (%s)", err.msg);
  check(symlink(path, link) == 0, "symlink made");
  check(tp_microvm_ram_memfd(link, NPAGES * PAGE, &err) < 0, "a symlink is refused (%s)", err.msg);

  fd = tp_microvm_ram_memfd(path, NPAGES * PAGE, &err);
  check(fd >= 0, "ram_memfd: a sealed memfd (%s)", fd < 0 ? err.msg : "ok");
  if (fd < 0)
    return tap_done();
  check(pread(fd, back, PAGE, 40 * PAGE) == PAGE && memcmp(back, page, PAGE) == 0,
        "the data page reads back");
  memset(page, 0, sizeof(page));
  check(pread(fd, back, PAGE, 7 * PAGE) == PAGE && memcmp(back, page, PAGE) == 0,
        "a zero page reads as zeros");

  /* what a compromised QEMU holding the fd could try */
  check(pwrite(fd, page, 1, 0) < 0 && errno == EPERM, "write() is refused");
  check(ftruncate(fd, PAGE) < 0 && errno == EPERM, "shrinking is refused");
  check(ftruncate(fd, (NPAGES + 1) * PAGE) < 0 && errno == EPERM, "growing is refused");
  check(mmap(NULL, NPAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED,
        "a shared writable mapping is refused");
  check(fcntl(fd, F_ADD_SEALS, 0) < 0 && errno == EPERM, "the seals cannot be changed");
  snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
  rfd = open(proc, O_RDWR | O_CLOEXEC);
  check(rfd >= 0, "reopened for writing as QEMU does (memory-backend-file)");
  if (rfd >= 0) {
    check(pwrite(rfd, page, 1, 0) < 0 && errno == EPERM, "a write through the reopened fd is refused");
    close(rfd);
  }

  /* what QEMU maps: private and writable, its writes its own */
  m = mmap(NULL, NPAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  check(m != MAP_FAILED, "a private writable mapping works");
  if (m != MAP_FAILED) {
    check(m[3 * PAGE] == 0xab && m[10 * PAGE] == 0, "it sees the saved memory");
    m[3 * PAGE] = 0x11;
    m[20 * PAGE] = 0x22;
    check(pread(fd, back, 1, 3 * PAGE) == 1 && back[0] == 0xab &&
              pread(fd, back, 1, 20 * PAGE) == 1 && back[0] == 0,
          "its writes do not reach the memfd");
    munmap(m, NPAGES * PAGE);
  }
  close(fd);

  {
    char copy[300];
    unsigned char a[PAGE], b[PAGE];
    int sfd, cfd, same = 1;
    snprintf(copy, sizeof(copy), "%s/copy", dir);
    check(tp_microvm_copy_sparse(path, copy, &err) == 0, "copy_sparse (%s)", err.msg);
    sfd = open(path, O_RDONLY | O_CLOEXEC);
    cfd = open(copy, O_RDONLY | O_CLOEXEC);
    for (int i = 0; i < NPAGES && sfd >= 0 && cfd >= 0; i++)
      same &= pread(sfd, a, PAGE, (off_t) i * PAGE) == PAGE && pread(cfd, b, PAGE, (off_t) i * PAGE) == PAGE &&
              memcmp(a, b, PAGE) == 0;
    check(sfd >= 0 && cfd >= 0 && same, "the copy has the same bytes");
    check(fstat(cfd, &st) == 0 && st.st_size == NPAGES * PAGE && st.st_blocks * 512 < 8 * PAGE,
          "the copy is sparse and of the same size");
    if (sfd >= 0)
      close(sfd);
    if (cfd >= 0)
      close(cfd);
    check(tp_microvm_copy_sparse(path, copy, &err) < 0, "an existing target is refused (%s)", err.msg);
    unlink(copy);
  }
  unlink(link);
  unlink(path);
  rmdir(dir);
  return tap_done();
}
