/* libFuzzer target: the stream frame codec (backends/proto/sframe.c), the
 * parser a client's data connection is read with (runtime/host/stream.c).
 *
 * The input is a byte stream as the daemon reads it from a client: frames
 * are cut with tp_sframe_parse until one is refused or more bytes are
 * needed.  Beyond "no crash, no sanitizer report", every accepted frame is
 * checked: its size is header + len and inside the input, its length obeys
 * its type's rule, every prefix of it is "need more", a refusal names its
 * reason, and encoding the decoded control frame again gives back the same
 * bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sframe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond)                                                                \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "fuzz_sframe: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

static void fz_reencode(const tp_sframe_t *f, const uint8_t *orig, long n) {
  uint8_t out[TP_SF_HDR + 4 + TP_SF_MSG_MAX];
  size_t m = 0;
  char msg[TP_SF_MSG_MAX + 1];
  switch (f->type) {
  case TP_SF_OPEN:
    FZ_CHECK(f->kind >= 1 && f->kind <= TP_SK_MAX_);
    m = tp_sframe_open(out, f->sid, f->kind, f->window);
    break;
  case TP_SF_END:
    FZ_CHECK(f->has_size == (f->len == 8));
    m = tp_sframe_end(out, f->sid, f->has_size, f->size);
    break;
  case TP_SF_CREDIT:
    FZ_CHECK(f->credit >= 1 && f->credit <= TP_SF_CREDIT_MAX);
    m = tp_sframe_credit(out, f->sid, f->credit);
    break;
  case TP_SF_ERROR:
    FZ_CHECK(f->msg_len == f->len - 4 && f->msg_len <= TP_SF_MSG_MAX);
    if (memchr(f->msg, '\0', f->msg_len) != NULL)
      return; /* the encoder takes a C string */
    memcpy(msg, f->msg, f->msg_len);
    msg[f->msg_len] = '\0';
    m = tp_sframe_error(out, f->sid, f->err, msg);
    break;
  case TP_SF_DATA:
    FZ_CHECK(f->len >= 1 && f->len <= TP_SF_DATA_MAX);
    tp_sframe_header(out, TP_SF_DATA, f->sid, f->len);
    FZ_CHECK(memcmp(out, orig, TP_SF_HDR) == 0);
    return;
  default:
    FZ_CHECK(!"an accepted frame of an unknown type");
  }
  FZ_CHECK((long) m == n && memcmp(out, orig, m) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees any read past the end */
  size_t off = 0;
  FZ_CHECK(copy != NULL);
  if (size)
    memcpy(copy, data, size);
  while (off < size) {
    tp_sframe_t f, g;
    const char *why = NULL;
    long n = tp_sframe_parse(copy + off, size - off, &f, &why);
    if (n == 0) {
      FZ_CHECK(size - off < TP_SF_HDR + (size_t) TP_SF_DATA_MAX + 4 + TP_SF_MSG_MAX);
      break;
    }
    if (n < 0) {
      FZ_CHECK(why != NULL && *why != '\0' && size - off >= TP_SF_HDR);
      break;
    }
    FZ_CHECK((size_t) n == TP_SF_HDR + (size_t) f.len && (size_t) n <= size - off);
    FZ_CHECK(f.payload == copy + off + TP_SF_HDR);
    FZ_CHECK(f.sid != 0 || f.type == TP_SF_ERROR);
    /* a prefix of a whole frame is never a frame nor a refusal */
    for (long k = 0; k < n; k += (n > 64 ? n / 16 : 1))
      FZ_CHECK(tp_sframe_parse(copy + off, (size_t) k, &g, NULL) == 0);
    FZ_CHECK(tp_sframe_parse(copy + off, (size_t) n - 1, &g, NULL) == 0);
    fz_reencode(&f, copy + off, n);
    off += (size_t) n;
  }
  free(copy);
  return 0;
}
