/* The little JSON the C client (fast.c) needs: a strict reader of the
 * daemon's replies and a writer of its few fixed requests.
 *
 * The reader takes one line, checks all of it against the JSON grammar
 * (RFC 8259: no trailing commas, no bare words, no control bytes in
 * strings, nothing after the value) and keeps a flat array of tokens; the
 * caller then asks for members by name.  Bounded: at most the caller's
 * token array, TP_FJSON_DEPTH levels of nesting; nothing is allocated.
 * The daemon is trusted more than a box, but a reply that is malformed,
 * too deep or too big is an error, never a crash: the CLI prints it and
 * exits 125. */
#ifndef TP_FJSON_H
#define TP_FJSON_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define TP_FJSON_DEPTH 32

enum tp_fjson_type {
  TP_FJ_OBJECT = 1,
  TP_FJ_ARRAY,
  TP_FJ_STRING,
  TP_FJ_NUMBER,
  TP_FJ_TRUE,
  TP_FJ_FALSE,
  TP_FJ_NULL,
};

/* One value: its type, its bytes in the line (a string's without the
 * quotes, still escaped), and the index of the token after its subtree. */
typedef struct tp_fjson_tok_s {
  uint8_t type;
  uint32_t start, len;
  int next;
} tp_fjson_tok_t;

typedef struct tp_fjson_s {
  const char *s;
  size_t n;
  tp_fjson_tok_t *tok;
  int ntok, cap;
} tp_fjson_t;

/* Parses the n bytes of s (one JSON text) into tok (cap entries): 0, or
 * -1 with err saying what is wrong and where. */
int tp_fjson_parse(tp_fjson_t *j, const char *s, size_t n, tp_fjson_tok_t *tok, int cap,
                   tp_error_t *err);

/* The value of member key of the object at token obj (the last one when a
 * key repeats, as lua-cjson keeps it), or -1 (none, or obj no object). */
int tp_fjson_get(const tp_fjson_t *j, int obj, const char *key);

/* Whether token t exists and has type type. */
int tp_fjson_is(const tp_fjson_t *j, int t, int type);

/* The number at t as an integer: 0, or -1 when t is no number, not whole,
 * or not below 2^53 in magnitude. */
int tp_fjson_int(const tp_fjson_t *j, int t, int64_t *out);

/* The string at t unescaped into buf (cap bytes with the NUL): its length,
 * or -1 when t is no string, holds a NUL or does not fit. */
long tp_fjson_str(const tp_fjson_t *j, int t, char *buf, size_t cap);

/* A growing buffer for a request line. */
typedef struct tp_fjson_buf_s {
  char *b;
  size_t len, cap, max; /* max: the most it may hold (0: no bound) */
  int failed;           /* latched: out of memory or past max */
} tp_fjson_buf_t;

void tp_fjson_buf_init(tp_fjson_buf_t *w, size_t max);
void tp_fjson_buf_free(tp_fjson_buf_t *w);
void tp_fjson_raw(tp_fjson_buf_t *w, const char *s);
/* s as a JSON string (quoted, escaped); bytes >= 0x80 go as they are. */
void tp_fjson_string(tp_fjson_buf_t *w, const char *s);
void tp_fjson_int_out(tp_fjson_buf_t *w, int64_t v);

#endif
