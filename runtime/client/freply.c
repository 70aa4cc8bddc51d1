/* The daemon's replies through jansson, within the client's bounds
 * (freply.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "freply.h"

/* jansson's allocations while a reply is parsed come out of this many
 * bytes (counted as asked, frees not given back: a parse only grows);
 * SIZE_MAX between parses, when the client builds its requests. */
static size_t tp__freply_left = SIZE_MAX;
static int tp__freply_spent;

/* jansson's blocks (a request's and a reply's objects, strings and
 * tables: a few hundred small ones a command) come first from this arena
 * in .bss, handed out in order and taken back whole once none is in use;
 * what does not fit goes to malloc.  musl's allocator maps and unmaps a
 * page for most of them when the process is young (an `exec` made 35 such
 * system calls, each page also faulted in); the arena makes none.  The
 * client is single-threaded. */
#define TP__FREPLY_ARENA (64u << 10)
static _Alignas(16) unsigned char tp__freply_arena[TP__FREPLY_ARENA];
static size_t tp__freply_used; /* bytes handed out since it was last empty */
static size_t tp__freply_live; /* its blocks not freed yet */

static void *tp__freply_malloc(size_t n) {
  size_t a = (n + 15) & ~(size_t) 15;
  if (n > tp__freply_left) {
    tp__freply_spent = 1;
    return NULL;
  }
  if (tp__freply_left != SIZE_MAX)
    tp__freply_left -= n;
  if (a >= n && a <= TP__FREPLY_ARENA - tp__freply_used) {
    void *p = tp__freply_arena + tp__freply_used;
    tp__freply_used += a;
    tp__freply_live++;
    return p;
  }
  return malloc(n);
}

static void tp__freply_free(void *p) {
  uintptr_t u = (uintptr_t) p, base = (uintptr_t) tp__freply_arena;
  if (u >= base && u < base + TP__FREPLY_ARENA) {
    if (--tp__freply_live == 0)
      tp__freply_used = 0;
    return;
  }
  free(p);
}

/* Walks v at level depth: 0, or -1 with err. */
static int tp__freply_walk(json_t *v, int depth, long *count, tp_error_t *err) {
  if (++*count > TP_FREPLY_VALUES)
    return tp_error_set(err, EPROTO, "too many values (more than %d)", TP_FREPLY_VALUES);
  if (json_is_object(v) || json_is_array(v)) {
    const char *key;
    json_t *m;
    size_t i;
    if (depth > TP_FREPLY_DEPTH)
      return tp_error_set(err, EPROTO, "nested too deep (more than %d levels)", TP_FREPLY_DEPTH);
    if (json_is_object(v)) {
      json_object_foreach(v, key, m) {
        if (tp__freply_walk(m, depth + 1, count, err) < 0)
          return -1;
      }
    } else {
      json_array_foreach(v, i, m) {
        if (tp__freply_walk(m, depth + 1, count, err) < 0)
          return -1;
      }
    }
  }
  return 0;
}

void tp_freply_init(void) {
  uint32_t seed = 0;
  json_set_alloc_funcs(tp__freply_malloc, tp__freply_free);
  /* 0 (or no getrandom) leaves it to jansson */
  if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t) sizeof(seed))
    json_object_seed(seed);
}

json_t *tp_freply_parse(const char *s, size_t n, tp_error_t *err) {
  json_error_t je;
  json_t *v;
  long count = 0;
  json_set_alloc_funcs(tp__freply_malloc, tp__freply_free);
  tp__freply_left = TP_FREPLY_ALLOC;
  tp__freply_spent = 0;
  v = json_loadb(s, n, JSON_DECODE_INT_AS_REAL, &je);
  tp__freply_left = SIZE_MAX;
  if (v == NULL) {
    if (tp__freply_spent)
      tp_error_set(err, E2BIG, "it takes more than %u MiB to hold", TP_FREPLY_ALLOC >> 20);
    else
      tp_error_set(err, EPROTO, "%s (byte %d)", je.text, je.position);
    return NULL;
  }
  if (tp__freply_walk(v, 1, &count, err) < 0) {
    json_decref(v);
    return NULL;
  }
  return v;
}

int tp_freply_int(const json_t *v, int64_t *out) {
  double d;
  if (!json_is_number(v))
    return -1;
  d = json_number_value(v);
  if (!(d > -9007199254740992.0 && d < 9007199254740992.0) || (double) (int64_t) d != d)
    return -1;
  *out = (int64_t) d;
  return 0;
}

long tp_freply_str(const json_t *v, char *buf, size_t cap) {
  size_t len;
  if (!json_is_string(v))
    return -1;
  len = json_string_length(v);
  if (len >= cap || memchr(json_string_value(v), '\0', len) != NULL)
    return -1;
  memcpy(buf, json_string_value(v), len + 1);
  return (long) len;
}
