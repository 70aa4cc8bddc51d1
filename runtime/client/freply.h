/* The daemon's replies as the C client (fast.c) reads them: one line
 * parsed by jansson, within the client's bounds, and typed reads of its
 * members.
 *
 * The line is at most TP_FAST_LINE_MAX bytes (the client's line reader
 * cuts it before this).  jansson checks the grammar (RFC 8259: nothing
 * after the value, valid UTF-8, no \u0000 or lone surrogate) and keeps a
 * repeated key's last value, as lua-cjson does; its own nesting limit is
 * 2048 levels (JSON_PARSER_MAX_DEPTH), so the tree is walked after it for
 * ours: at most TP_FREPLY_DEPTH levels and TP_FREPLY_VALUES values, and
 * jansson may allocate at most TP_FREPLY_ALLOC bytes while it parses.  The
 * daemon is trusted more than a box, but a reply that is malformed, too
 * deep or too big is an error, never a crash: the CLI prints it and exits
 * 125. */
#ifndef TP_FREPLY_H
#define TP_FREPLY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define TP_FREPLY_DEPTH 32               /* levels of nesting */
#define TP_FREPLY_VALUES 16384           /* JSON values in one message */
#define TP_FREPLY_ALLOC (32u << 20)      /* bytes jansson allocates for one */

/* Before the first JSON object is made: the client's allocator, and the
 * seed of jansson's hash tables from getrandom (jansson's own reads
 * /dev/urandom: three system calls where this is one). */
void tp_freply_init(void);

/* The n bytes of s as one JSON text: its value (the caller's to
 * json_decref), or NULL with err saying what is wrong. */
json_t *tp_freply_parse(const char *s, size_t n, tp_error_t *err);

/* The number v as an integer: 0, or -1 when v is no number, not whole, or
 * not below 2^53 in magnitude (numbers are read as doubles, as lua-cjson
 * reads them: 1e3 is 1000). */
int tp_freply_int(const json_t *v, int64_t *out);

/* The string v into buf (cap bytes with the NUL): its length, or -1 when
 * v is no string or does not fit. */
long tp_freply_str(const json_t *v, char *buf, size_t cap);

#endif
