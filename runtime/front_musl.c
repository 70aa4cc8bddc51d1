/* Three of glibc's checked string functions, for the musl build of tupper
 * (runtime/CMakeLists.txt).  Debian's libjansson.a was compiled against
 * glibc's headers with _FORTIFY_SOURCE, so its calls to snprintf,
 * vsnprintf and strncpy are calls to these; musl has none of them.  Their
 * contract is glibc's (the LSB's): DESTLEN is the size the compiler knows
 * the destination to have, and a call told to write more than that is a
 * buffer overflow, which ends the process, as glibc's __chk_fail does. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int __vsnprintf_chk(char *s, size_t maxlen, int flag, size_t slen, const char *fmt, va_list ap);
int __snprintf_chk(char *s, size_t maxlen, int flag, size_t slen, const char *fmt, ...);
char *__strncpy_chk(char *dest, const char *src, size_t n, size_t destlen);

static void tp__chk_fail(void) {
  static const char msg[] = "tupper: buffer overflow detected\n";
  ssize_t r = write(2, msg, sizeof(msg) - 1);
  (void) r;
  abort();
}

int __vsnprintf_chk(char *s, size_t maxlen, int flag, size_t slen, const char *fmt, va_list ap) {
  if (slen < maxlen)
    tp__chk_fail();
  return vsnprintf(s, maxlen, fmt, ap);
}

int __snprintf_chk(char *s, size_t maxlen, int flag, size_t slen, const char *fmt, ...) {
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = __vsnprintf_chk(s, maxlen, flag, slen, fmt, ap);
  va_end(ap);
  return r;
}

char *__strncpy_chk(char *dest, const char *src, size_t n, size_t destlen) {
  if (destlen < n)
    tp__chk_fail();
  return strncpy(dest, src, n);
}
