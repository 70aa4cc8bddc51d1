#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void tp__vset(tp_error_t *err, int code, int with_errno, const char *fmt, va_list ap)
  __attribute__((format(printf, 4, 0)));

static void tp__vset(tp_error_t *err, int code, int with_errno, const char *fmt, va_list ap) {
  int n;
  err->code = code;
  n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
  if (n < 0) {
    err->msg[0] = '\0';
    n = 0;
  }
  if (with_errno && (size_t) n < sizeof(err->msg))
    snprintf(err->msg + n, sizeof(err->msg) - (size_t) n, ": %s", strerror(code));
}

int tp_error_set(tp_error_t *err, int code, const char *fmt, ...) {
  va_list ap;
  if (err == NULL)
    return -1;
  va_start(ap, fmt);
  tp__vset(err, code, 0, fmt, ap);
  va_end(ap);
  return -1;
}

int tp_error_errno(tp_error_t *err, int code, const char *fmt, ...) {
  va_list ap;
  if (err == NULL)
    return -1;
  va_start(ap, fmt);
  tp__vset(err, code, 1, fmt, ap);
  va_end(ap);
  return -1;
}

int tp_error_prefix(tp_error_t *err, const char *fmt, ...) {
  char old[TP_ERROR_MSG_MAX];
  size_t n, oldlen;
  va_list ap;
  if (err == NULL)
    return -1;
  memcpy(old, err->msg, sizeof(old));
  old[sizeof(old) - 1] = '\0';
  va_start(ap, fmt);
  int r = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
  va_end(ap);
  n = r < 0 ? 0 : (size_t) r;
  if (n > sizeof(err->msg) - 1)
    n = sizeof(err->msg) - 1;
  /* append ": old", truncated to fit */
  oldlen = strlen(old);
  if (n + 2 < sizeof(err->msg)) {
    err->msg[n++] = ':';
    err->msg[n++] = ' ';
    if (oldlen > sizeof(err->msg) - 1 - n)
      oldlen = sizeof(err->msg) - 1 - n;
    memcpy(err->msg + n, old, oldlen);
    n += oldlen;
  }
  err->msg[n] = '\0';
  return -1;
}

void tp_error_clear(tp_error_t *err) {
  if (err == NULL)
    return;
  err->code = 0;
  err->msg[0] = '\0';
}
