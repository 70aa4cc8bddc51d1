/* tp_sha256 (runtime/host/crypto.c) over libcrypto: FIPS 180-4's vectors,
 * one message fed in odd chunks, misuse, the first load racing in threads,
 * libcrypto not mapped before the first hash, and the error when the
 * library cannot be loaded.  TAP output; exit 0 pass, 1 fail. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crypto.h"
#include "tap.h"
#include "utils.h"

/* The hex SHA-256 of n bytes, hashed in chunks of the sizes in chunks[]
 * (cycled; NULL: all at once), or "" on an error (in err). */
static void hash(const void *data, size_t n, const size_t *chunks, size_t nchunks,
                 char hex[TP_SHA256_HEX_LEN + 1], tp_error_t *err) {
  tp_sha256_t c;
  const unsigned char *p = data;
  size_t off = 0, k = 0;
  hex[0] = '\0';
  if (tp_sha256_init(&c, err) < 0)
    return;
  while (off < n) {
    size_t len = chunks == NULL ? n : chunks[k++ % nchunks];
    if (len > n - off)
      len = n - off;
    if (tp_sha256_update(&c, p + off, len, err) < 0 || tp_sha256_update(&c, p, 0, err) < 0) {
      tp_sha256_close(&c);
      hex[0] = '\0';
      return;
    }
    off += len;
  }
  if (tp_sha256_final(&c, hex, err) < 0)
    hex[0] = '\0';
}

static int crypto_mapped(void) {
  char line[512];
  int found = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (strstr(line, "libcrypto") != NULL)
      found = 1;
  fclose(f);
  return found;
}

/* In a child, before any load: a library that is not there. */
static void test_missing_library(void) {
  int fds[2], status = 0;
  char msg[TP_ERROR_MSG_MAX] = "";
  ssize_t got;
  pid_t pid;
  if (pipe(fds) < 0) {
    check(0, "missing library: pipe: %s", strerror(errno));
    return;
  }
  pid = fork();
  if (pid == 0) {
    tp_error_t err = {0}, again = {0};
    tp_sha256_t c = {0};
    int bad = 0;
    close(fds[0]);
    tp_crypto_set_library("libtupper-no-such-crypto.so.3");
    if (tp_sha256_init(&c, &err) == 0 || err.code != ENOSYS || c.ctx != NULL)
      bad |= 1;
    tp_sha256_close(&c); /* a failed init left nothing to free */
    if (tp_crypto_load(&again) == 0 || strstr(again.msg, "cannot load") == NULL)
      bad |= 2; /* the first load's answer stands */
    tp_crypto_set_library("libcrypto.so.3"); /* too late: the load happened */
    if (tp_sha256_init(&c, NULL) == 0)
      bad |= 4;
    if (write(fds[1], err.msg, strlen(err.msg)) < 0)
      bad |= 8;
    _exit(bad);
  }
  close(fds[1]);
  got = pid < 0 ? -1 : read(fds[0], msg, sizeof(msg) - 1);
  close(fds[0]);
  if (got > 0)
    msg[got] = '\0';
  if (pid > 0)
    waitpid(pid, &status, 0);
  check(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "missing library: init fails with ENOSYS, and so does every later load (status %#x)",
        status);
  check(strstr(msg, "sha256: cannot load libtupper-no-such-crypto.so.3 (install libssl3)") == msg,
        "missing library: the error names the file and the package: %s", msg);
}

#define RACERS 4
static const char *const ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

static void *racer(void *arg) {
  int *bad = arg;
  for (int i = 0; i < 200; i++) {
    char hex[TP_SHA256_HEX_LEN + 1];
    tp_error_t err = {0};
    hash("abc", 3, NULL, 0, hex, &err);
    if (strcmp(hex, ABC) != 0)
      (*bad)++;
  }
  return NULL;
}

/* The first load, from several threads at once (layer.c hashes in the
 * thread pool). */
static void test_first_load_in_threads(void) {
  pthread_t t[RACERS];
  int bad[RACERS] = {0}, started = 0, sum = 0;
  check(crypto_mapped() == 0, "libcrypto is not mapped before the first hash");
  for (int i = 0; i < RACERS; i++)
    if (pthread_create(&t[i], NULL, racer, &bad[i]) == 0)
      started++;
    else
      bad[i] = 1;
  for (int i = 0; i < started; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < RACERS; i++)
    sum += bad[i];
  check(started == RACERS && sum == 0, "%d threads hash at the first load: %d wrong", RACERS, sum);
  check(crypto_mapped() == 1, "libcrypto is mapped after it");
}

static void test_vectors(void) {
  static const struct { const char *msg; const char *hex; } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  static const size_t thousand[] = {1000};
  char hex[TP_SHA256_HEX_LEN + 1];
  char *million = malloc(1000000);
  tp_error_t err = {0};
  for (size_t i = 0; i < TP_ARRAY_SIZE(v); i++) {
    hash(v[i].msg, strlen(v[i].msg), NULL, 0, hex, &err);
    check(strcmp(hex, v[i].hex) == 0, "FIPS 180-4: %zu bytes: %s%s", strlen(v[i].msg), hex, err.msg);
  }
  if (million == NULL) {
    check(0, "FIPS 180-4: one million 'a': out of memory");
    return;
  }
  memset(million, 'a', 1000000);
  hash(million, 1000000, thousand, 1, hex, &err);
  check(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
        "FIPS 180-4: one million 'a', 1000 at a time: %s%s", hex, err.msg);
  free(million);
}

/* One message fed in chunks that straddle the 64-byte blocks every way. */
static void test_chunks(void) {
  static const size_t odd[] = {1, 2, 3, 5, 7, 13, 31, 55, 56, 63, 64, 65, 119, 127, 129, 1000};
  unsigned char msg[4099];
  char whole[TP_SHA256_HEX_LEN + 1], hex[TP_SHA256_HEX_LEN + 1];
  tp_error_t err = {0};
  int same = 1;
  for (size_t i = 0; i < sizeof(msg); i++)
    msg[i] = (unsigned char) (i * 131 + 7);
  hash(msg, sizeof(msg), NULL, 0, whole, &err);
  check(strcmp(whole, "0ce42c8081bd563f10696d5608c37746929d69b1462efa25d09352bda85b2b88") == 0,
        "a 4099-byte message at once: %s%s", whole, err.msg);
  hash(msg, sizeof(msg), odd, TP_ARRAY_SIZE(odd), hex, &err);
  check(strcmp(hex, whole) == 0, "the same in chunks of 1, 2, 3, ... 1000 bytes: %s", hex);
  for (size_t i = 0; i < TP_ARRAY_SIZE(odd); i++) {
    hash(msg, sizeof(msg), &odd[i], 1, hex, &err);
    if (strcmp(hex, whole) != 0) {
      diag("chunks of %zu: %s", odd[i], hex);
      same = 0;
    }
  }
  check(same, "the same in chunks of each size alone");
}

static void test_misuse(void) {
  tp_sha256_t c = {0};
  tp_error_t err = {0};
  char hex[TP_SHA256_HEX_LEN + 1];
  check(tp_sha256_update(&c, "x", 1, &err) < 0 && err.code == EINVAL,
        "update of a zeroed hash fails: %s", err.msg);
  check(tp_sha256_init(&c, &err) == 0 && tp_sha256_final(&c, hex, &err) == 0 && c.ctx == NULL,
        "final closes the hash");
  check(tp_sha256_update(&c, "x", 1, &err) < 0 && err.code == EINVAL &&
            tp_sha256_final(&c, hex, &err) < 0,
        "update and final after the final fail: %s", err.msg);
  tp_sha256_close(&c); /* a no-op, twice */
  tp_sha256_close(&c);
  check(tp_sha256_init(&c, &err) == 0 && tp_sha256_update(&c, "ab", 2, &err) == 0, "an open hash");
  tp_sha256_close(&c); /* dropped before its final: ASan's leak check sees it freed */
  check(c.ctx == NULL, "close frees a hash dropped before its final");
}

int main(void) {
  test_missing_library();
  test_first_load_in_threads();
  test_vectors();
  test_chunks();
  test_misuse();
  return tap_done();
}
