#ifndef TP_SHA256_H
#define TP_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* SHA-256 (FIPS 180-4), streaming.  Content hashes of recipe layers
 * (lua/tupper/layers.lua): a key a hostile recipe must not be able to make
 * collide with another recipe's. */
typedef struct tp_sha256_s {
  uint32_t h[8];
  uint64_t len;         /* bytes hashed so far */
  unsigned char buf[64];
  size_t nbuf;
} tp_sha256_t;

void tp_sha256_init(tp_sha256_t *c);
void tp_sha256_update(tp_sha256_t *c, const void *data, size_t n);
void tp_sha256_final(tp_sha256_t *c, unsigned char out[32]);

#endif
