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
  char prefix[TP_ERROR_MSG_MAX];
  char old[TP_ERROR_MSG_MAX];
  va_list ap;
  if (err == NULL)
    return -1;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  memcpy(old, err->msg, sizeof(old));
  snprintf(err->msg, sizeof(err->msg), "%s: %s", prefix, old);
  return -1;
}

void tp_error_clear(tp_error_t *err) {
  if (err == NULL)
    return;
  err->code = 0;
  err->msg[0] = '\0';
}
