/* libFuzzer target: the C client's JSON reader (runtime/client/fjson.c),
 * what reads every reply of the daemon in `tupper exec` and `tupper run`.
 *
 * The input is one line as the daemon might send it.  Beyond "no crash, no
 * sanitizer report": an accepted text's tokens lie inside it and nest (each
 * one's subtree ends at or before its parent's), every string reads back
 * (or is refused for its NUL or its size) without writing past the buffer,
 * every member lookup stays inside the object, and a text cut short by a
 * byte is never taken where the whole one was a container. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond)                                                                     \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "fuzz_fjson: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                             \
    }                                                                                      \
  } while (0)

#define FZ_TOKENS 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static tp_fjson_tok_t tok[FZ_TOKENS];
  static const char *const keys[] = { "id", "result", "error", "message", "pid", "streams", "stdout", "" };
  tp_fjson_t j;
  tp_error_t err;
  char *s = malloc(size ? size : 1);
  if (s == NULL)
    return 0;
  memcpy(s, data, size);
  if (tp_fjson_parse(&j, s, size, tok, FZ_TOKENS, &err) < 0) {
    FZ_CHECK(err.msg[0] != '\0');
    free(s);
    return 0;
  }
  FZ_CHECK(j.ntok >= 1 && j.ntok <= FZ_TOKENS && j.tok[0].next == j.ntok);
  for (int t = 0; t < j.ntok; t++) {
    char buf[64];
    int64_t v;
    FZ_CHECK(j.tok[t].start <= size && j.tok[t].len <= size - j.tok[t].start);
    FZ_CHECK(j.tok[t].next > t && j.tok[t].next <= j.ntok);
    if (j.tok[t].type == TP_FJ_STRING) {
      long l = tp_fjson_str(&j, t, buf, sizeof(buf));
      FZ_CHECK(l < (long) sizeof(buf) && (l < 0 || (size_t) l == strlen(buf)));
    }
    (void) tp_fjson_int(&j, t, &v);
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
      int m = tp_fjson_get(&j, t, keys[k]);
      FZ_CHECK(m == -1 || (m > t && m < j.tok[t].next));
    }
  }
  if (size > 1 && (j.tok[0].type == TP_FJ_OBJECT || j.tok[0].type == TP_FJ_ARRAY))
    FZ_CHECK(tp_fjson_parse(&j, s, size - 1, tok, FZ_TOKENS, &err) < 0 || s[size - 1] == ' ' ||
             s[size - 1] == '\t' || s[size - 1] == '\n' || s[size - 1] == '\r');
  free(s);
  return 0;
}
