/* Unit tests for the agent frame codec (backends/agent/frame.c): round trips,
 * nested groups, several frames in one buffer, and hostile input. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "frame.h"
#include "tap.h"



/* Raw little-endian writers for hand-made (hostile) payloads. */
static size_t raw_field(uint8_t *p, uint16_t tag, uint32_t len, const void *val, uint32_t vlen) {
  p[0] = (uint8_t) tag;
  p[1] = (uint8_t) (tag >> 8);
  for (int i = 0; i < 4; i++)
    p[2 + i] = (uint8_t) (len >> (8 * i));
  if (vlen)
    memcpy(p + 6, val, vlen);
  return 6 + vlen;
}

static void raw_header(uint8_t *p, uint32_t len, uint8_t version, uint8_t type, uint32_t id) {
  memset(p, 0, TP_FRAME_HDR);
  for (int i = 0; i < 4; i++) {
    p[i] = (uint8_t) (len >> (8 * i));
    p[8 + i] = (uint8_t) (id >> (8 * i));
  }
  p[4] = version;
  p[5] = type;
}

static int parse_one(const uint8_t *p, uint32_t len, int max) {
  tp_field_t fs[16];
  return tp_fields_parse(p, len, fs, max < 16 ? max : 16);
}

static void test_round_trip(void) {
  static const uint8_t bin[] = {0, 1, 2, 0, 255};
  tp_buf_t b;
  tp_frame_t f;
  tp_field_t fs[16];
  int64_t v = 0;
  char *s;
  long total;
  int n;

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_EXEC, 0xdeadbeefu);
  tp_frame_add_str(&b, TP_TAG_ARG, "/bin/echo");
  tp_frame_add_str(&b, TP_TAG_ARG, "");
  tp_frame_add_str(&b, TP_TAG_ENV, "A=b");
  tp_frame_add_int(&b, TP_TAG_FLAGS, -5);
  tp_frame_add_int(&b, TP_TAG_PID, INT64_MAX);
  tp_frame_add(&b, TP_TAG_DATA, bin, sizeof(bin));
  check(tp_frame_end(&b) == 0, "encode a frame");

  total = tp_frame_parse_header(b.data, b.len, &f);
  check(total == (long) b.len, "header: whole frame present (%ld of %zu)", total, b.len);
  check(f.type == TP_MSG_EXEC && f.id == 0xdeadbeefu && f.flags == 0, "header: type, id, flags");
  check(f.len == b.len - TP_FRAME_HDR && f.payload == b.data + TP_FRAME_HDR, "header: payload");
  for (size_t k = 0; k < b.len; k++)
    if (tp_frame_parse_header(b.data, k, &f) != 0) {
      check(0, "header: prefix of %zu bytes asks for more", k);
      break;
    }
  total = tp_frame_parse_header(b.data, b.len, &f);

  n = tp_fields_parse(f.payload, f.len, fs, 16);
  check(n == 6, "six fields (%d)", n);
  check(tp_fields_count(fs, n, TP_TAG_ARG) == 2, "two ARG");
  s = tp_field_strdup(tp_fields_get(fs, n, TP_TAG_ARG));
  check(s != NULL && strcmp(s, "/bin/echo") == 0, "first ARG round trips");
  free(s);
  check(fs[1].tag == TP_TAG_ARG && fs[1].len == 0, "empty string round trips");
  check(tp_field_int(tp_fields_get(fs, n, TP_TAG_FLAGS), &v) == 0 && v == -5, "negative int");
  check(tp_field_int(tp_fields_get(fs, n, TP_TAG_PID), &v) == 0 && v == INT64_MAX, "INT64_MAX");
  check(tp_fields_get(fs, n, TP_TAG_DATA)->len == sizeof(bin) &&
            memcmp(tp_fields_get(fs, n, TP_TAG_DATA)->val, bin, sizeof(bin)) == 0,
        "bytes with NULs round trip");
  check(tp_fields_get(fs, n, TP_TAG_PATH) == NULL, "absent tag is NULL");
  check(tp_field_int(tp_fields_get(fs, n, TP_TAG_ARG), &v) < 0, "tp_field_int refuses a string");
  check(tp_field_int(NULL, &v) < 0, "tp_field_int refuses NULL");
  tp_buf_free(&b);
}

static void test_nested(void) {
  const char *names[] = {"a", "bb", "ccc"};
  tp_buf_t b;
  tp_frame_t f;
  tp_field_t fs[16], sub[16];
  int n, entries = 0, good = 1;

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_OK, 3);
  for (int i = 0; i < 3; i++) {
    size_t g = tp_frame_group_begin(&b, TP_TAG_ENTRY);
    tp_frame_add_str(&b, TP_TAG_NAME, names[i]);
    tp_frame_add_int(&b, TP_TAG_TYPE, TP_FT_FILE);
    tp_frame_add_int(&b, TP_TAG_SIZE, i * 100);
    tp_frame_group_end(&b, g);
  }
  tp_frame_group_end(&b, tp_frame_group_begin(&b, TP_TAG_ENTRY)); /* empty group */
  tp_frame_add_int(&b, TP_TAG_FLAGS, 1);
  check(tp_frame_end(&b) == 0, "encode nested groups");
  check(tp_frame_parse_header(b.data, b.len, &f) == (long) b.len, "nested: header");
  n = tp_fields_parse(f.payload, f.len, fs, 16);
  check(n == 5, "nested: 4 ENTRY + FLAGS at top level (%d)", n);
  for (int i = 0; i < n; i++) {
    int m;
    int64_t size = -1;
    if (fs[i].tag != TP_TAG_ENTRY)
      continue;
    m = tp_fields_parse(fs[i].val, fs[i].len, sub, 16);
    if (entries == 3) {
      good &= m == 0;
    } else {
      const tp_field_t *name = tp_fields_get(sub, m, TP_TAG_NAME);
      good &= m == 3 && name != NULL && name->len == strlen(names[entries]) &&
              memcmp(name->val, names[entries], name->len) == 0;
      good &= tp_field_int(tp_fields_get(sub, m, TP_TAG_SIZE), &size) == 0 && size == entries * 100;
    }
    entries++;
  }
  check(entries == 4 && good, "nested: each group parses back to its fields");
  tp_buf_free(&b);
}

static void test_multiple_frames(void) {
  tp_buf_t b;
  tp_frame_t f;
  long l1, l2, l3;
  tp_field_t fs[4];

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_STDIN_CLOSE, 1); /* zero-length payload */
  check(tp_frame_end(&b) == 0, "encode an empty frame");
  tp_frame_begin(&b, TP_MSG_SIGNAL, 2);
  tp_frame_add_int(&b, TP_TAG_PID, 42);
  tp_frame_add_int(&b, TP_TAG_SIGNAL, 9);
  check(tp_frame_end(&b) == 0, "encode a second frame in the same buffer");
  tp_frame_begin(&b, TP_MSG_READY, 0);
  check(tp_frame_end(&b) == 0, "encode a third frame");

  l1 = tp_frame_parse_header(b.data, b.len, &f);
  check(l1 == TP_FRAME_HDR && f.len == 0 && f.type == TP_MSG_STDIN_CLOSE && f.id == 1,
        "first frame is header only");
  check(tp_fields_parse(f.payload, f.len, fs, 4) == 0, "empty payload has no fields");
  l2 = tp_frame_parse_header(b.data + l1, b.len - (size_t) l1, &f);
  check(l2 == TP_FRAME_HDR + 28 && f.type == TP_MSG_SIGNAL && f.id == 2, "second frame follows");
  check(tp_fields_parse(f.payload, f.len, fs, 4) == 2, "second frame has two fields");
  l3 = tp_frame_parse_header(b.data + l1 + l2, b.len - (size_t) (l1 + l2), &f);
  check(l3 == TP_FRAME_HDR && f.type == TP_MSG_READY && (size_t) (l1 + l2 + l3) == b.len,
        "third frame ends the buffer");
  check(tp_frame_parse_header(b.data + l1, (size_t) l2 - 1, &f) == 0, "partial second frame");
  tp_buf_free(&b);
}

static void test_hostile(void) {
  uint8_t p[256], h[TP_FRAME_HDR];
  uint8_t eight[8] = {0};
  tp_frame_t f;
  tp_buf_t b;
  size_t n;

  /* fields */
  n = raw_field(p, TP_TAG_PATH, 10, "/abc", 4);
  check(parse_one(p, (uint32_t) n, 16) < 0, "truncated field value rejected");
  check(parse_one(p, 3, 16) < 0, "truncated field header rejected");
  n = raw_field(p, TP_TAG_PID, 4, "\1\0\0\0", 4);
  check(parse_one(p, (uint32_t) n, 16) < 0, "4-byte integer rejected");
  n = raw_field(p, TP_TAG_PID, 9, "\1\0\0\0\0\0\0\0\0", 9);
  check(parse_one(p, (uint32_t) n, 16) < 0, "9-byte integer rejected");
  n = raw_field(p, TP_TAG_ARG, 3, "a\0b", 3);
  check(parse_one(p, (uint32_t) n, 16) < 0, "NUL inside a string rejected");
  n = raw_field(p, TP_TAG_DATA, 3, "a\0b", 3);
  check(parse_one(p, (uint32_t) n, 16) == 1, "NUL inside bytes accepted");
  n = raw_field(p, 99, 8, eight, 8);
  check(parse_one(p, (uint32_t) n, 16) < 0, "unknown tag 99 rejected");
  n = raw_field(p, 0, 8, eight, 8);
  check(parse_one(p, (uint32_t) n, 16) < 0, "tag 0 rejected");
  n = raw_field(p, TP_TAG_MAX_, 8, eight, 8);
  check(parse_one(p, (uint32_t) n, 16) < 0, "tag TP_TAG_MAX_ rejected");
  n = raw_field(p, TP_TAG_DATA, 0xffffffffu, NULL, 0);
  check(parse_one(p, (uint32_t) n, 16) < 0, "field length 0xffffffff rejected");
  n = 0;
  for (int i = 0; i < 4; i++)
    n += raw_field(p + n, TP_TAG_PID, 8, eight, 8);
  check(parse_one(p, (uint32_t) n, 4) == 4, "4 fields with max 4 accepted");
  check(parse_one(p, (uint32_t) n, 3) < 0, "4 fields with max 3 rejected");
  {
    size_t big = TP_CHUNK_MAX + 1;
    uint8_t *q = calloc(1, big + 6);
    n = raw_field(q, TP_TAG_DATA, (uint32_t) big, NULL, 0);
    check(tp_fields_parse(q, (uint32_t) (big + 6), (tp_field_t[1]){{0}}, 1) < 0,
          "DATA larger than TP_CHUNK_MAX rejected");
    free(q);
  }

  /* headers */
  raw_header(h, 0, TP_PROTO_VERSION, TP_MSG_EXEC, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) == TP_FRAME_HDR, "good empty header accepted");
  check(tp_frame_parse_header(h, sizeof(h) - 1, &f) == 0, "11 bytes ask for more");
  raw_header(h, TP_FRAME_MAX + 1, TP_PROTO_VERSION, TP_MSG_EXEC, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "oversized len rejected from the header alone");
  raw_header(h, 0xffffffffu, TP_PROTO_VERSION, TP_MSG_EXEC, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "len 0xffffffff rejected");
  raw_header(h, 0, TP_PROTO_VERSION + 1, TP_MSG_EXEC, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "bad version rejected");
  raw_header(h, 0, 0, TP_MSG_EXEC, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "version 0 rejected");
  raw_header(h, 0, TP_PROTO_VERSION, 99, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "unknown type 99 rejected");
  raw_header(h, 0, TP_PROTO_VERSION, 0, 1);
  check(tp_frame_parse_header(h, sizeof(h), &f) < 0, "type 0 rejected");

  /* the encoder refuses to build an oversized frame */
  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_OK, 1);
  tp_frame_end(&b);
  n = b.len;
  tp_frame_begin(&b, TP_MSG_OK, 2);
  {
    uint8_t *big = calloc(1, TP_CHUNK_MAX);
    for (int i = 0; i < 2; i++)
      tp_frame_add(&b, TP_TAG_DATA, big, TP_CHUNK_MAX);
    free(big);
  }
  check(tp_frame_end(&b) < 0 && b.len == n, "oversized frame dropped, earlier frame kept");
  tp_buf_free(&b);
}

/* Bulk fields without the encoder's copy: a field filled in place and cut
 * to what was read, and a last field whose bytes follow the buffer. */
static void test_bulk(void) {
  tp_buf_t b, w;
  tp_frame_t f;
  tp_field_t fs[8];
  uint8_t *room;
  static const uint8_t tail[] = {9, 8, 7, 0, 6};
  long total;
  int n;

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_OK, 7);
  tp_frame_add_int(&b, TP_TAG_SIZE, 3);
  room = tp_frame_add_room(&b, TP_TAG_DATA, 100);
  check(room != NULL, "room: 100 bytes");
  memcpy(room, "abc", 3);
  tp_frame_fit(&b, room, 100, 3);
  check(tp_frame_end(&b) == 0, "room: frame ends");
  total = tp_frame_parse_header(b.data, b.len, &f);
  n = total > 0 ? tp_fields_parse(f.payload, f.len, fs, 8) : -1;
  check(total == (long) b.len && n == 2 && fs[1].tag == TP_TAG_DATA && fs[1].len == 3 &&
            memcmp(fs[1].val, "abc", 3) == 0,
        "room: the field holds the 3 bytes read, the frame nothing more");
  tp_frame_fit(&b, b.data + TP_FRAME_HDR + 6, 8, 1);
  check(b.len == (size_t) total, "fit: a field that is not the last is left as it is");
  tp_buf_free(&b);

  tp_buf_init(&b);
  tp_frame_begin(&b, TP_MSG_FS_WRITE, 8);
  tp_frame_add_str(&b, TP_TAG_PATH, "/f");
  tp_frame_add_head(&b, TP_TAG_DATA, sizeof(tail));
  check(tp_frame_end_tail(&b, sizeof(tail)) == 0, "tail: frame ends");
  tp_buf_init(&w);
  tp_buf_append(&w, b.data, b.len);
  check(tp_frame_parse_header(w.data, w.len, &f) == 0, "tail: without its bytes the frame is not whole");
  tp_buf_append(&w, tail, sizeof(tail));
  total = tp_frame_parse_header(w.data, w.len, &f);
  n = total > 0 ? tp_fields_parse(f.payload, f.len, fs, 8) : -1;
  check(total == (long) w.len && n == 2 && fs[1].len == sizeof(tail) &&
            memcmp(fs[1].val, tail, sizeof(tail)) == 0,
        "tail: buffer and bytes make one frame, the bytes its last field");
  tp_frame_begin(&b, TP_MSG_FS_WRITE, 9);
  tp_frame_add_head(&b, TP_TAG_DATA, TP_CHUNK_MAX);
  n = (int) b.frame_start;
  check(tp_frame_end_tail(&b, TP_FRAME_MAX) < 0 && b.len == (size_t) n,
        "tail: a frame past TP_FRAME_MAX with its bytes is dropped");
  tp_buf_free(&w);
  tp_buf_free(&b);
}

int main(void) {
  test_round_trip();
  test_bulk();
  test_nested();
  test_multiple_frames();
  test_hostile();
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}
