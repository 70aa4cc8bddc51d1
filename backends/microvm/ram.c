/* tp_microvm_ram_*: a snapshot's guest memory as a sealed memfd, which
 * every VM started from that snapshot maps privately (docs/microvm.md, "Fast
 * start: snapshots"), and the sparse copies of a snapshot's files.  See
 * microvm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "microvm.h"
#include "utils.h"

#define TP__RAM_PAGE 4096
#define TP__RAM_CHUNK (1024 * 1024)

static int page_is_zero(const unsigned char *p) {
  static const unsigned char zero[TP__RAM_PAGE];
  return memcmp(p, zero, TP__RAM_PAGE) == 0;
}

/* Writes the non-zero pages of buf (n bytes, file offset off) to fd, each
 * run of them in one pwrite: zero pages stay holes. */
static int put_nonzero(int fd, const unsigned char *buf, size_t n, off_t off, tp_error_t *err) {
  size_t i = 0;
  while (i < n) {
    size_t start, len;
    while (i < n && n - i >= TP__RAM_PAGE && page_is_zero(buf + i))
      i += TP__RAM_PAGE;
    start = i;
    while (i < n && (n - i < TP__RAM_PAGE || !page_is_zero(buf + i)))
      i += n - i < TP__RAM_PAGE ? n - i : TP__RAM_PAGE;
    len = i - start;
    for (size_t done = 0; done < len;) {
      ssize_t w = pwrite(fd, buf + start + done, len - done, off + (off_t) (start + done));
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        return tp_error_errno(err, w < 0 ? errno : EIO, "write the guest memory");
      done += (size_t) w;
    }
  }
  return 0;
}

/* Copies the non-zero pages of src's data extents to dst at the same
 * offsets (what=src's name for errors). */
static int copy_nonzero(int src, int dst, const char *what, tp_error_t *err) {
  cleanup_free unsigned char *buf = malloc(TP__RAM_CHUNK);
  off_t off = 0, end;
  if (buf == NULL)
    return tp_error_errno(err, ENOMEM, "malloc");
  while ((off = lseek(src, off, SEEK_DATA)) >= 0) {
    end = lseek(src, off, SEEK_HOLE);
    if (end < 0)
      return tp_error_errno(err, errno, "seek %s", what);
    while (off < end) {
      size_t want = (size_t) (end - off) < TP__RAM_CHUNK ? (size_t) (end - off) : TP__RAM_CHUNK;
      ssize_t n = pread(src, buf, want, off);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return tp_error_errno(err, n < 0 ? errno : EIO, "read %s", what);
      if (put_nonzero(dst, buf, (size_t) n, off, err) < 0)
        return -1;
      off += n;
    }
  }
  if (errno != ENXIO)
    return tp_error_errno(err, errno, "seek %s", what);
  return 0;
}

int tp_microvm_ram_new(uint64_t size, tp_error_t *err) {
  int fd = memfd_create("tupper-vm-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return tp_error_errno(err, errno, "memfd_create");
  if (ftruncate(fd, (off_t) size) < 0) {
    int e = errno;
    close(fd);
    return tp_error_errno(err, e, "size the guest memory");
  }
  return fd;
}

int tp_microvm_ram_save(int memfd, const char *path, tp_error_t *err) {
  cleanup_close int fd = -1;
  struct stat st;
  if (fstat(memfd, &st) < 0)
    return tp_error_errno(err, errno, "stat the guest memory");
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return tp_error_errno(err, errno, "create '%s'", path);
  if (ftruncate(fd, st.st_size) < 0)
    return tp_error_errno(err, errno, "size '%s'", path);
  if (copy_nonzero(memfd, fd, "the guest memory", err) < 0)
    return -1;
  if (fsync(fd) < 0)
    return tp_error_errno(err, errno, "fsync '%s'", path);
  return 0;
}

int tp_microvm_copy_sparse(const char *src_path, const char *dst_path, tp_error_t *err) {
  cleanup_close int src = -1;
  cleanup_close int dst = -1;
  struct stat st;
  src = open(src_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (src < 0)
    return tp_error_errno(err, errno, "open '%s'", src_path);
  if (fstat(src, &st) < 0)
    return tp_error_errno(err, errno, "stat '%s'", src_path);
  if (!S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "'%s' is not a file", src_path);
  dst = open(dst_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (dst < 0)
    return tp_error_errno(err, errno, "create '%s'", dst_path);
  if (ftruncate(dst, st.st_size) < 0)
    return tp_error_errno(err, errno, "size '%s'", dst_path);
  return copy_nonzero(src, dst, src_path, err);
}

int tp_microvm_ram_memfd(const char *path, uint64_t size, tp_error_t *err) {
  cleanup_close int src = -1;
  cleanup_close int fd = -1;
  struct stat st;
  int ret;

  src = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (src < 0)
    return tp_error_errno(err, errno, "open '%s'", path);
  if (fstat(src, &st) < 0)
    return tp_error_errno(err, errno, "stat '%s'", path);
  if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size != size)
    return tp_error_set(err, EINVAL, "'%s': not a guest memory file of %llu bytes", path,
                        (unsigned long long) size);
  fd = tp_microvm_ram_new(size, err);
  if (fd < 0)
    return -1;
  if (copy_nonzero(src, fd, path, err) < 0)
    return -1;
  /* no more writes, size changes or seals: QEMU maps it privately (its
   * writes are copies of its own), and cannot write to it through the fd */
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
    return tp_error_errno(err, errno, "seal the guest memory");
  ret = fd;
  fd = -1;
  return ret;
}
