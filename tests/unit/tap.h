/* The TAP lines every C unit test prints: "ok N - what" / "not ok N - what",
 * "# diagnostics", then "1..N".  Exit 0 passes, 77 skips. */
#ifndef TP_TAP_H
#define TP_TAP_H

#include <stdarg.h>
#include <stdio.h>

#include "error.h"

static int tap_num, tap_failed;

/* One result; newlines in the message are folded so it stays one line. */
__attribute__((unused)) static void check(int ok, const char *fmt, ...) TP_PRINTF(2, 3);
__attribute__((unused)) static void check(int ok, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  for (char *q = msg; *q; q++)
    if (*q == '\n')
      *q = '|';
  printf("%s %d - %s\n", ok ? "ok" : "not ok", ++tap_num, msg);
  fflush(stdout);
  if (!ok)
    tap_failed++;
}

__attribute__((unused)) static void diag(const char *fmt, ...) TP_PRINTF(1, 2);
__attribute__((unused)) static void diag(const char *fmt, ...) {
  va_list ap;
  printf("# ");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
}

/* A condition that fails the test without being a numbered check: what one
 * executable of a split test counts (a whole session's stray events, nothing
 * left behind) is guarded this way in its siblings, so the checks add up to
 * the same number.  A failure prints "# not ok (guard): what". */
__attribute__((unused)) static void tap_guard(int ok, const char *fmt, ...) TP_PRINTF(2, 3);
__attribute__((unused)) static void tap_guard(int ok, const char *fmt, ...) {
  va_list ap;
  if (ok)
    return;
  printf("# not ok (guard): ");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  tap_failed++;
}

/* The plan line; the exit code for main. */
__attribute__((unused)) static int tap_done(void) {
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}

#endif
