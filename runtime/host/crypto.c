/* tupper: libcrypto at first use, and SHA-256 over EVP (see crypto.h). */
#include <dlfcn.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>

#include "crypto.h"
#include "utils.h"

/* Every libcrypto function used here, called through a pointer resolved
 * once by tp__crypto_open. */
#define TP_CRYPTO_FUNCS(X) \
  X(EVP_MD_CTX_new) X(EVP_MD_CTX_free) X(EVP_DigestInit_ex) X(EVP_DigestUpdate) \
  X(EVP_DigestFinal_ex) X(EVP_sha256)

static struct {
#define TP__SLOT(name) __typeof__(name) *name;
  TP_CRYPTO_FUNCS(TP__SLOT)
#undef TP__SLOT
} tp__evp;
static pthread_once_t tp__crypto_once = PTHREAD_ONCE_INIT;
static const char *tp__crypto_name = "libcrypto.so.3";
static char tp__crypto_err[256]; /* set by a failed load, read-only after it */

static void tp__crypto_open(void) {
  void *lib = dlopen(tp__crypto_name, RTLD_NOW | RTLD_LOCAL);
  struct { const char *name; void **slot; } syms[] = {
#define TP__SYM(name) {#name, (void **) &tp__evp.name},
      TP_CRYPTO_FUNCS(TP__SYM)
#undef TP__SYM
  };
  if (lib == NULL) {
    snprintf(tp__crypto_err, sizeof(tp__crypto_err), "cannot load %s (install libssl3): %s",
             tp__crypto_name, dlerror());
    return;
  }
  for (size_t i = 0; i < TP_ARRAY_SIZE(syms); i++) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (*syms[i].slot == NULL) {
      snprintf(tp__crypto_err, sizeof(tp__crypto_err), "%s lacks %s", tp__crypto_name,
               syms[i].name);
      return;
    }
  }
}

void tp_crypto_set_library(const char *name) {
  tp__crypto_name = name;
}

int tp_crypto_load(tp_error_t *err) {
  pthread_once(&tp__crypto_once, tp__crypto_open);
  if (tp__crypto_err[0] != '\0')
    return tp_error_set(err, ENOSYS, "%s", tp__crypto_err);
  return 0;
}

int tp_sha256_init(tp_sha256_t *c, tp_error_t *err) {
  c->ctx = NULL;
  if (tp_crypto_load(err) < 0)
    return tp_error_prefix(err, "sha256");
  c->ctx = tp__evp.EVP_MD_CTX_new();
  if (c->ctx == NULL)
    return tp_error_set(err, ENOMEM, "sha256: out of memory");
  if (tp__evp.EVP_DigestInit_ex(c->ctx, tp__evp.EVP_sha256(), NULL) != 1) {
    tp_sha256_close(c);
    return tp_error_set(err, EIO, "sha256: libcrypto cannot start a digest");
  }
  return 0;
}

int tp_sha256_update(tp_sha256_t *c, const void *data, size_t n, tp_error_t *err) {
  if (c->ctx == NULL)
    return tp_error_set(err, EINVAL, "sha256: update of a closed hash");
  if (n > 0 && tp__evp.EVP_DigestUpdate(c->ctx, data, n) != 1)
    return tp_error_set(err, EIO, "sha256: libcrypto's update failed");
  return 0;
}

int tp_sha256_final(tp_sha256_t *c, char hex[TP_SHA256_HEX_LEN + 1], tp_error_t *err) {
  static const char x[] = "0123456789abcdef";
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  int r;
  if (c->ctx == NULL)
    return tp_error_set(err, EINVAL, "sha256: final of a closed hash");
  r = tp__evp.EVP_DigestFinal_ex(c->ctx, d, &len);
  tp_sha256_close(c);
  if (r != 1 || len != TP_SHA256_LEN)
    return tp_error_set(err, EIO, "sha256: libcrypto's final failed");
  for (unsigned i = 0; i < TP_SHA256_LEN; i++) {
    hex[2 * i] = x[d[i] >> 4];
    hex[2 * i + 1] = x[d[i] & 15];
  }
  hex[TP_SHA256_HEX_LEN] = '\0';
  return 0;
}

void tp_sha256_close(tp_sha256_t *c) {
  if (c->ctx != NULL) {
    tp__evp.EVP_MD_CTX_free(c->ctx);
    c->ctx = NULL;
  }
}
