/* The configure-time check of the musl build of tupper
 * (runtime/CMakeLists.txt): Debian's libjansson.a, built against glibc,
 * linked with musl and front_musl.c, does what the C client asks of it.
 * Exit 0 when every call below answers as it must. */
#include <jansson.h>
#include <string.h>

int main(void) {
  static const char in[] = "{\"a\":[1,2.5,\"x\\u00e9\"],\"b\":{\"c\":null},\"d\":-9007199254740993}";
  static const char out[] = "{\"in\":{\"a\":[1,2.5,\"x\xc3\xa9\"],\"b\":{\"c\":null},"
                            "\"d\":-9007199254740993},\"k\":\"v\",\"n\":1099511627776}";
  json_error_t jerr;
  json_t *v, *o;
  char buf[256];
  size_t n;
  int ok;

  v = json_loadb(in, sizeof(in) - 1, 0, &jerr);
  if (v == NULL)
    return 1;
  o = json_pack("{s:s, s:I, s:O}", "k", "v", "n", (json_int_t) 1 << 40, "in", v);
  n = json_dumpb(o, buf, sizeof(buf), JSON_COMPACT | JSON_SORT_KEYS);
  ok = o != NULL && n == sizeof(out) - 1 && memcmp(buf, out, n) == 0;
  json_decref(o);
  json_decref(v);
  /* an error message is built with the checked snprintf */
  if (json_loadb("[1,", 3, 0, &jerr) != NULL || strstr(jerr.text, "end of file") == NULL)
    return 1;
  return ok ? 0 : 1;
}
