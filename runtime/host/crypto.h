/* tupper: libcrypto, opened at first use, and SHA-256 over its EVP API.
 *
 * Every hash tupper takes goes through here: blob digests and diff ids
 * (layer.c), downloads (http.c), core.sha256 and tupper.util.digest (the
 * Lua side's cache keys, runtime/lua/l_digest.c).  There is no SHA-256 of
 * our own: a kept library is reviewed, tested and fast where ours would be
 * none of these.
 *
 * libcrypto.so.3 is opened with dlopen, not linked: a client verb is a
 * fresh process each time, and one that hashes nothing (`tupper ls`) must
 * not pay for loading it.  The first call to tp_crypto_load (or to
 * tp_sha256_init) opens it, once per process, from any thread; every later
 * call returns the first one's result. */
#ifndef TP_CRYPTO_H
#define TP_CRYPTO_H

#include <stddef.h>

#include "error.h"

#define TP_SHA256_LEN 32      /* bytes of a digest */
#define TP_SHA256_HEX_LEN 64  /* its lowercase hex, without the NUL */

/* Opens libcrypto and resolves the EVP digest functions (thread-safe,
 * once).  Fails with ENOSYS, saying what to install, when the library or
 * one of its functions is missing. */
int tp_crypto_load(tp_error_t *err);

/* For tests: the file name tp_crypto_load opens instead of libcrypto.so.3.
 * Only a call before the first load has any effect. */
void tp_crypto_set_library(const char *name);

/* A streaming SHA-256: init, updates, final.  A hash that does not reach
 * its final (an error on the way) is freed by tp_sha256_close, or by
 * cleanup_sha256 on scope exit; both are no-ops on a zeroed, failed or
 * finished one. */
typedef struct tp_sha256_s {
  void *ctx; /* libcrypto's EVP_MD_CTX, NULL when closed */
} tp_sha256_t;

/* Starts a hash in c, whatever c held (close an open one first); loads
 * libcrypto on first use.  On failure c is closed. */
int tp_sha256_init(tp_sha256_t *c, tp_error_t *err);
/* Adds n bytes (n may be 0). */
int tp_sha256_update(tp_sha256_t *c, const void *data, size_t n, tp_error_t *err);
/* Ends the hash and closes c: hex gets the digest as 64 lowercase hex
 * digits and a NUL. */
int tp_sha256_final(tp_sha256_t *c, char hex[TP_SHA256_HEX_LEN + 1], tp_error_t *err);
/* Frees the hash; a no-op on a closed or zeroed one. */
void tp_sha256_close(tp_sha256_t *c);
#define cleanup_sha256 __attribute__((cleanup(tp_sha256_close)))

#endif
