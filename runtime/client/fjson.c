/* The C client's JSON (fjson.h). */
#include "fjson.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tp__fjp_s {
  tp_fjson_t *j;
  size_t pos;
  tp_error_t *err;
} tp__fjp_t;

static int tp__fj_fail(tp__fjp_t *p, const char *what) {
  return tp_error_set(p->err, EPROTO, "bad JSON at byte %zu: %s", p->pos, what);
}

static void tp__fj_ws(tp__fjp_t *p) {
  while (p->pos < p->j->n) {
    char c = p->j->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      break;
    p->pos++;
  }
}

static int tp__fj_tok(tp__fjp_t *p, int type, size_t start) {
  tp_fjson_t *j = p->j;
  if (j->ntok >= j->cap)
    return tp__fj_fail(p, "too many values");
  j->tok[j->ntok].type = (uint8_t) type;
  j->tok[j->ntok].start = (uint32_t) start;
  j->tok[j->ntok].len = 0;
  j->tok[j->ntok].next = j->ntok + 1;
  return j->ntok++;
}

static int tp__fj_hex(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* A string from its opening quote: checks it, leaves pos after it. */
static int tp__fj_string(tp__fjp_t *p) {
  const char *s = p->j->s;
  size_t n = p->j->n;
  int t;
  p->pos++; /* the quote */
  t = tp__fj_tok(p, TP_FJ_STRING, p->pos);
  if (t < 0)
    return -1;
  while (p->pos < n) {
    unsigned char c = (unsigned char) s[p->pos];
    if (c == '"') {
      p->j->tok[t].len = (uint32_t) (p->pos - p->j->tok[t].start);
      p->pos++;
      return t;
    }
    if (c < 0x20)
      return tp__fj_fail(p, "a control byte in a string");
    if (c == '\\') {
      if (p->pos + 1 >= n)
        break;
      switch (s[p->pos + 1]) {
      case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        p->pos += 2;
        continue;
      case 'u':
        if (p->pos + 6 > n)
          return tp__fj_fail(p, "a short \\u escape");
        for (int k = 2; k < 6; k++)
          if (tp__fj_hex(s[p->pos + (size_t) k]) < 0)
            return tp__fj_fail(p, "a bad \\u escape");
        p->pos += 6;
        continue;
      default:
        return tp__fj_fail(p, "an unknown escape");
      }
    }
    p->pos++;
  }
  return tp__fj_fail(p, "an unterminated string");
}

static int tp__fj_digits(tp__fjp_t *p) {
  size_t at = p->pos;
  while (p->pos < p->j->n && p->j->s[p->pos] >= '0' && p->j->s[p->pos] <= '9')
    p->pos++;
  return p->pos > at ? 0 : -1;
}

static int tp__fj_number(tp__fjp_t *p) {
  const char *s = p->j->s;
  size_t start = p->pos;
  int t;
  if (s[p->pos] == '-')
    p->pos++;
  if (p->pos < p->j->n && s[p->pos] == '0')
    p->pos++;
  else if (tp__fj_digits(p) < 0)
    return tp__fj_fail(p, "a bad number");
  if (p->pos < p->j->n && s[p->pos] == '.') {
    p->pos++;
    if (tp__fj_digits(p) < 0)
      return tp__fj_fail(p, "a bad fraction");
  }
  if (p->pos < p->j->n && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
    p->pos++;
    if (p->pos < p->j->n && (s[p->pos] == '+' || s[p->pos] == '-'))
      p->pos++;
    if (tp__fj_digits(p) < 0)
      return tp__fj_fail(p, "a bad exponent");
  }
  if (p->pos - start > 64)
    return tp__fj_fail(p, "a number longer than 64 bytes");
  t = tp__fj_tok(p, TP_FJ_NUMBER, start);
  if (t >= 0)
    p->j->tok[t].len = (uint32_t) (p->pos - start);
  return t;
}

static int tp__fj_word(tp__fjp_t *p, const char *w, int type) {
  size_t l = strlen(w);
  int t;
  if (p->j->n - p->pos < l || memcmp(p->j->s + p->pos, w, l) != 0)
    return tp__fj_fail(p, "an unexpected byte");
  t = tp__fj_tok(p, type, p->pos);
  if (t >= 0)
    p->j->tok[t].len = (uint32_t) l;
  p->pos += l;
  return t;
}

static int tp__fj_value(tp__fjp_t *p, int depth);

/* An object or an array from its bracket: members (an object's as key,
 * value token pairs) follow the container's token. */
static int tp__fj_container(tp__fjp_t *p, int depth, int object) {
  char close = object ? '}' : ']';
  int t, first = 1;
  if (depth >= TP_FJSON_DEPTH)
    return tp__fj_fail(p, "nested too deep");
  t = tp__fj_tok(p, object ? TP_FJ_OBJECT : TP_FJ_ARRAY, p->pos);
  if (t < 0)
    return -1;
  p->pos++;
  for (;;) {
    tp__fj_ws(p);
    if (p->pos >= p->j->n)
      return tp__fj_fail(p, "an unterminated object or array");
    if (p->j->s[p->pos] == close && first) {
      p->pos++;
      break;
    }
    if (object) {
      if (p->j->s[p->pos] != '"')
        return tp__fj_fail(p, "a key that is not a string");
      if (tp__fj_string(p) < 0)
        return -1;
      tp__fj_ws(p);
      if (p->pos >= p->j->n || p->j->s[p->pos] != ':')
        return tp__fj_fail(p, "no ':' after a key");
      p->pos++;
    }
    if (tp__fj_value(p, depth + 1) < 0)
      return -1;
    first = 0;
    tp__fj_ws(p);
    if (p->pos < p->j->n && p->j->s[p->pos] == ',') {
      p->pos++;
      tp__fj_ws(p);
      if (p->pos < p->j->n && p->j->s[p->pos] == close)
        return tp__fj_fail(p, "a trailing comma");
      continue;
    }
    if (p->pos < p->j->n && p->j->s[p->pos] == close) {
      p->pos++;
      break;
    }
    return tp__fj_fail(p, "no ',' between members");
  }
  p->j->tok[t].len = (uint32_t) (p->pos - p->j->tok[t].start);
  p->j->tok[t].next = p->j->ntok;
  return t;
}

static int tp__fj_value(tp__fjp_t *p, int depth) {
  tp__fj_ws(p);
  if (p->pos >= p->j->n)
    return tp__fj_fail(p, "a value is missing");
  switch (p->j->s[p->pos]) {
  case '{': return tp__fj_container(p, depth, 1);
  case '[': return tp__fj_container(p, depth, 0);
  case '"': return tp__fj_string(p);
  case 't': return tp__fj_word(p, "true", TP_FJ_TRUE);
  case 'f': return tp__fj_word(p, "false", TP_FJ_FALSE);
  case 'n': return tp__fj_word(p, "null", TP_FJ_NULL);
  default:
    if (p->j->s[p->pos] == '-' || (p->j->s[p->pos] >= '0' && p->j->s[p->pos] <= '9'))
      return tp__fj_number(p);
    return tp__fj_fail(p, "an unexpected byte");
  }
}

int tp_fjson_parse(tp_fjson_t *j, const char *s, size_t n, tp_fjson_tok_t *tok, int cap,
                   tp_error_t *err) {
  tp__fjp_t p = { .j = j, .pos = 0, .err = err };
  j->s = s;
  j->n = n;
  j->tok = tok;
  j->ntok = 0;
  j->cap = cap;
  if (n > UINT32_MAX)
    return tp_error_set(err, E2BIG, "JSON text of %zu bytes", n);
  if (tp__fj_value(&p, 0) < 0)
    return -1;
  tp__fj_ws(&p);
  if (p.pos != n)
    return tp__fj_fail(&p, "bytes after the value");
  return 0;
}

int tp_fjson_is(const tp_fjson_t *j, int t, int type) {
  return t >= 0 && t < j->ntok && j->tok[t].type == type;
}

/* Whether the (escaped) key at token k spells key. */
static int tp__fj_key_is(const tp_fjson_t *j, int k, const char *key) {
  char buf[128];
  long l = tp_fjson_str(j, k, buf, sizeof(buf));
  return l >= 0 && strcmp(buf, key) == 0;
}

int tp_fjson_get(const tp_fjson_t *j, int obj, const char *key) {
  int found = -1;
  if (!tp_fjson_is(j, obj, TP_FJ_OBJECT))
    return -1;
  for (int k = obj + 1; k < j->tok[obj].next;) {
    int v = k + 1; /* the parser put a value after every key */
    if (tp__fj_key_is(j, k, key))
      found = v;
    k = j->tok[v].next;
  }
  return found;
}

int tp_fjson_int(const tp_fjson_t *j, int t, int64_t *out) {
  char buf[72];
  char *end;
  double d;
  if (!tp_fjson_is(j, t, TP_FJ_NUMBER) || j->tok[t].len >= sizeof(buf))
    return -1;
  memcpy(buf, j->s + j->tok[t].start, j->tok[t].len);
  buf[j->tok[t].len] = '\0';
  errno = 0;
  d = strtod(buf, &end);
  if (*end != '\0' || !isfinite(d) || d != floor(d) || fabs(d) >= 9007199254740992.0)
    return -1;
  *out = (int64_t) d;
  return 0;
}

/* Appends code point cp as UTF-8; -1 when it does not fit. */
static int tp__fj_utf8(char *buf, size_t cap, size_t *o, uint32_t cp) {
  unsigned char u[4];
  size_t l;
  if (cp < 0x80) {
    u[0] = (unsigned char) cp;
    l = 1;
  } else if (cp < 0x800) {
    u[0] = (unsigned char) (0xc0 | (cp >> 6));
    u[1] = (unsigned char) (0x80 | (cp & 0x3f));
    l = 2;
  } else if (cp < 0x10000) {
    u[0] = (unsigned char) (0xe0 | (cp >> 12));
    u[1] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
    u[2] = (unsigned char) (0x80 | (cp & 0x3f));
    l = 3;
  } else {
    u[0] = (unsigned char) (0xf0 | (cp >> 18));
    u[1] = (unsigned char) (0x80 | ((cp >> 12) & 0x3f));
    u[2] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
    u[3] = (unsigned char) (0x80 | (cp & 0x3f));
    l = 4;
  }
  if (*o + l >= cap)
    return -1;
  memcpy(buf + *o, u, l);
  *o += l;
  return 0;
}

static uint32_t tp__fj_u4(const char *s) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++)
    v = (v << 4) | (uint32_t) tp__fj_hex(s[k]);
  return v;
}

long tp_fjson_str(const tp_fjson_t *j, int t, char *buf, size_t cap) {
  const char *s;
  size_t n, o = 0;
  if (!tp_fjson_is(j, t, TP_FJ_STRING) || cap == 0)
    return -1;
  s = j->s + j->tok[t].start;
  n = j->tok[t].len;
  for (size_t i = 0; i < n;) {
    char c = s[i];
    if (c != '\\') {
      if (o + 1 >= cap)
        return -1;
      buf[o++] = c;
      i++;
      continue;
    }
    c = s[i + 1]; /* the parser checked every escape */
    if (c == 'u') {
      uint32_t cp = tp__fj_u4(s + i + 2);
      i += 6;
      if (cp >= 0xd800 && cp < 0xdc00 && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u') {
        uint32_t lo = tp__fj_u4(s + i + 2);
        if (lo >= 0xdc00 && lo < 0xe000) {
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          i += 6;
        }
      }
      if (cp == 0)
        return -1; /* a NUL would cut the C string */
      if (cp >= 0xd800 && cp < 0xe000)
        cp = 0xfffd; /* a lone surrogate */
      if (tp__fj_utf8(buf, cap, &o, cp) < 0)
        return -1;
      continue;
    }
    if (o + 1 >= cap)
      return -1;
    switch (c) {
    case 'b': buf[o++] = '\b'; break;
    case 'f': buf[o++] = '\f'; break;
    case 'n': buf[o++] = '\n'; break;
    case 'r': buf[o++] = '\r'; break;
    case 't': buf[o++] = '\t'; break;
    default: buf[o++] = c; break; /* " \ / */
    }
    i += 2;
  }
  buf[o] = '\0';
  return (long) o;
}

void tp_fjson_buf_init(tp_fjson_buf_t *w, size_t max) {
  memset(w, 0, sizeof(*w));
  w->max = max;
}

void tp_fjson_buf_free(tp_fjson_buf_t *w) {
  free(w->b);
  w->b = NULL;
  w->len = w->cap = 0;
}

static void tp__fj_put(tp_fjson_buf_t *w, const char *s, size_t n) {
  if (w->failed)
    return;
  if (w->max > 0 && w->len + n > w->max) {
    w->failed = 1;
    return;
  }
  if (w->len + n + 1 > w->cap) {
    size_t ncap = w->cap ? w->cap : 1024;
    char *nb;
    while (ncap < w->len + n + 1)
      ncap *= 2;
    nb = realloc(w->b, ncap);
    if (nb == NULL) {
      w->failed = 1;
      return;
    }
    w->b = nb;
    w->cap = ncap;
  }
  memcpy(w->b + w->len, s, n);
  w->len += n;
  w->b[w->len] = '\0';
}

void tp_fjson_raw(tp_fjson_buf_t *w, const char *s) { tp__fj_put(w, s, strlen(s)); }

void tp_fjson_string(tp_fjson_buf_t *w, const char *s) {
  tp__fj_put(w, "\"", 1);
  for (const unsigned char *c = (const unsigned char *) s; *c; c++) {
    char esc[8];
    const unsigned char *run = c;
    while (*c >= 0x20 && *c != '"' && *c != '\\' && *c != 0x7f)
      c++;
    if (c > run)
      tp__fj_put(w, (const char *) run, (size_t) (c - run));
    if (*c == '\0')
      break;
    switch (*c) {
    case '"': tp__fj_put(w, "\\\"", 2); break;
    case '\\': tp__fj_put(w, "\\\\", 2); break;
    case '\n': tp__fj_put(w, "\\n", 2); break;
    case '\t': tp__fj_put(w, "\\t", 2); break;
    case '\r': tp__fj_put(w, "\\r", 2); break;
    default:
      snprintf(esc, sizeof(esc), "\\u%04x", *c);
      tp__fj_put(w, esc, 6);
      break;
    }
  }
  tp__fj_put(w, "\"", 1);
}

void tp_fjson_int_out(tp_fjson_buf_t *w, int64_t v) {
  char num[24];
  snprintf(num, sizeof(num), "%" PRId64, v);
  tp_fjson_raw(w, num);
}
