/* tupper: the one error contract (see docs/architecture.md).
 *
 * A function that can fail takes `tp_error_t *err` last and returns < 0 or
 * NULL.  The error carries an errno-style code and a message built where the
 * failure happened; callers prepend context with tp_error_prefix().  Only the
 * edges (JSON-RPC reply, CLI, Lua binding) print or serialise an error. */
#ifndef TP_ERROR_H
#define TP_ERROR_H

#include <stddef.h>

#define TP_ERROR_MSG_MAX 512

typedef struct tp_error_s {
  int code;                     /* errno value, 0 when unset */
  char msg[TP_ERROR_MSG_MAX];   /* human readable, NUL terminated */
} tp_error_t;

#define TP_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Set err (may be NULL) and return -1. */
int tp_error_set(tp_error_t *err, int code, const char *fmt, ...) TP_PRINTF(3, 4);
/* Like tp_error_set, appending ": strerror(code)". */
int tp_error_errno(tp_error_t *err, int code, const char *fmt, ...) TP_PRINTF(3, 4);
/* Prepend "context: " to an error already set; returns -1. */
int tp_error_prefix(tp_error_t *err, const char *fmt, ...) TP_PRINTF(2, 3);
void tp_error_clear(tp_error_t *err);

#endif
