/* Unit tests for the stream frame codec (backends/proto/sframe.c): round
 * trips of every type, partial input, and each rule of docs/protocol.md's
 * "Stream frames" broken once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sframe.h"
#include "tap.h"

static void raw(uint8_t *p, uint32_t len, uint8_t version, uint8_t type, uint16_t flags, uint32_t sid) {
  tp_sframe_header(p, type, sid, len);
  p[4] = version;
  p[6] = (uint8_t) flags;
  p[7] = (uint8_t) (flags >> 8);
}

/* Expect a refusal whose reason contains want. */
static void refused(const uint8_t *buf, size_t n, const char *want, const char *what) {
  tp_sframe_t f;
  const char *why = NULL;
  long r = tp_sframe_parse(buf, n, &f, &why);
  check(r == -1 && why != NULL && strstr(why, want) != NULL, "%s refused (%ld: %s)", what, r,
        why ? why : "-");
}

int main(void) {
  uint8_t buf[TP_SF_HDR + 4 + TP_SF_MSG_MAX + 64];
  tp_sframe_t f;
  const char *why;
  size_t n;
  long r;

  n = tp_sframe_open(buf, 7, TP_SK_STDOUT, 4u << 20);
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == (long) n && f.type == TP_SF_OPEN && f.sid == 7 && f.kind == TP_SK_STDOUT &&
            f.window == 4u << 20, "OPEN round trip");
  for (size_t k = 0; k < n; k++)
    if (tp_sframe_parse(buf, k, &f, &why) != 0) {
      check(0, "a prefix of %zu bytes of a whole frame is not 'need more'", k);
      break;
    }
  check(1, "every prefix of an OPEN is 'need more'");

  n = tp_sframe_end(buf, 9, 1, UINT64_C(4294967296) + 5);
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == (long) n && f.type == TP_SF_END && f.has_size && f.size == UINT64_C(4294967301),
        "END with a size over 2^32 round trips");
  n = tp_sframe_end(buf, 9, 0, 0);
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == TP_SF_HDR && f.type == TP_SF_END && !f.has_size, "bare END round trips");

  n = tp_sframe_error(buf, 0, ETIMEDOUT, "client gave no credit");
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == (long) n && f.type == TP_SF_ERROR && f.sid == 0 && f.err == ETIMEDOUT &&
            f.msg_len == strlen("client gave no credit") &&
            memcmp(f.msg, "client gave no credit", f.msg_len) == 0, "ERROR on sid 0 round trips");
  {
    char *big = malloc(TP_SF_MSG_MAX + 100);
    memset(big, 'x', TP_SF_MSG_MAX + 99);
    big[TP_SF_MSG_MAX + 99] = '\0';
    n = tp_sframe_error(buf, 3, EIO, big);
    free(big);
    r = tp_sframe_parse(buf, n, &f, &why);
    check(r == (long) n && f.msg_len == TP_SF_MSG_MAX, "a long ERROR message is cut at 4096 bytes");
  }

  n = tp_sframe_credit(buf, 5, 65536);
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == (long) n && f.type == TP_SF_CREDIT && f.credit == 65536, "CREDIT round trips");

  /* DATA: the header, then the bytes */
  tp_sframe_header(buf, TP_SF_DATA, 11, 5);
  memcpy(buf + TP_SF_HDR, "hello", 5);
  r = tp_sframe_parse(buf, TP_SF_HDR + 4, &f, &why);
  check(r == 0, "DATA missing its last byte needs more");
  r = tp_sframe_parse(buf, TP_SF_HDR + 5, &f, &why);
  check(r == TP_SF_HDR + 5 && f.len == 5 && memcmp(f.payload, "hello", 5) == 0, "DATA parses");

  /* the rules, each broken once */
  raw(buf, TP_SF_DATA_MAX + 1, TP_SF_VERSION, TP_SF_DATA, 0, 1);
  refused(buf, TP_SF_HDR, "over 1048576", "DATA announcing 1 MiB + 1 (before its payload)");
  raw(buf, 0xffffffffu, TP_SF_VERSION, TP_SF_DATA, 0, 1);
  refused(buf, TP_SF_HDR, "over 1048576", "DATA announcing 4 GiB");
  raw(buf, 0, TP_SF_VERSION, TP_SF_DATA, 0, 1);
  refused(buf, TP_SF_HDR, "empty DATA", "empty DATA");
  raw(buf, 1, 2, TP_SF_DATA, 0, 1);
  refused(buf, TP_SF_HDR + 1, "version", "version 2");
  raw(buf, 1, TP_SF_VERSION, TP_SF_DATA, 1, 1);
  refused(buf, TP_SF_HDR + 1, "flags", "flags 1");
  raw(buf, 1, TP_SF_VERSION, 6, 0, 1);
  refused(buf, TP_SF_HDR + 1, "unknown frame type", "type 6");
  raw(buf, 0, TP_SF_VERSION, 0, 0, 1);
  refused(buf, TP_SF_HDR, "unknown frame type", "type 0");
  raw(buf, 7, TP_SF_VERSION, TP_SF_OPEN, 0, 1);
  refused(buf, TP_SF_HDR, "OPEN payload", "OPEN of 7 bytes");
  raw(buf, 8, TP_SF_VERSION, TP_SF_CREDIT, 0, 1);
  refused(buf, TP_SF_HDR, "CREDIT payload", "CREDIT of 8 bytes");
  n = tp_sframe_credit(buf, 1, 0);
  refused(buf, n, "CREDIT of 0", "a CREDIT of 0 bytes");
  n = tp_sframe_credit(buf, 1, TP_SF_CREDIT_MAX + 1);
  refused(buf, n, "CREDIT of 0", "a CREDIT over 2^30");
  raw(buf, 4, TP_SF_VERSION, TP_SF_END, 0, 1);
  refused(buf, TP_SF_HDR, "END payload", "END of 4 bytes");
  raw(buf, 3, TP_SF_VERSION, TP_SF_ERROR, 0, 1);
  refused(buf, TP_SF_HDR, "ERROR payload", "ERROR of 3 bytes");
  raw(buf, 4 + TP_SF_MSG_MAX + 1, TP_SF_VERSION, TP_SF_ERROR, 0, 1);
  refused(buf, TP_SF_HDR, "ERROR payload", "ERROR with a 4097-byte message");
  n = tp_sframe_open(buf, 1, 0, 10);
  refused(buf, n, "unknown kind", "OPEN of kind 0");
  n = tp_sframe_open(buf, 1, TP_SK_MAX_ + 1, 10);
  refused(buf, n, "unknown kind", "OPEN of kind 16");
  n = tp_sframe_credit(buf, 0, 10);
  refused(buf, n, "stream 0", "CREDIT on stream 0");
  tp_sframe_header(buf, TP_SF_DATA, 0, 1);
  buf[TP_SF_HDR] = 'x';
  refused(buf, TP_SF_HDR + 1, "stream 0", "DATA on stream 0");

  /* two frames back to back: the first is cut exactly */
  n = tp_sframe_credit(buf, 2, 10);
  n += tp_sframe_end(buf + n, 2, 0, 0);
  r = tp_sframe_parse(buf, n, &f, &why);
  check(r == TP_SF_HDR + 4 && f.type == TP_SF_CREDIT, "first of two frames");
  r = tp_sframe_parse(buf + r, n - (size_t) r, &f, &why);
  check(r == TP_SF_HDR && f.type == TP_SF_END, "second of two frames");
  return tap_done();
}
