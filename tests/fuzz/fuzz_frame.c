/* libFuzzer target: the agent frame decoder (backends/proto/frame.c).
 *
 * The input is a byte stream as the host reads it from an agent's channel:
 * frames are cut with tp_frame_parse_header, split with tp_fields_parse, and
 * decoded the way runtime/lua/l_frame.c's tp_l_push_fields does it (single tags at
 * most once, ENTRY groups parsed one level deep with a scratch array, no
 * ENTRY inside an ENTRY), only into C instead of a Lua table.  The whole
 * input is also parsed as one bare payload, to reach field parsing without
 * a valid header.
 *
 * Beyond "no crash, no sanitizer report", every accepted frame is checked:
 * fields lie inside the payload, integers are 8 bytes, strings carry no NUL
 * and stay under TP_STR_MAX, every tag indexes l_frame.c's name table, a prefix
 * of a whole frame is "need more bytes", and re-encoding the decoded fields
 * with the encoder gives back the payload byte for byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond)                                                               \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "fuzz_frame: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                       \
    }                                                                                \
  } while (0)

typedef struct fz_ctx_s {
  tp_field_t *fields;   /* TP_FIELDS_MAX: top-level fields of a frame */
  tp_field_t *scratch;  /* TP_FIELDS_MAX: fields of one ENTRY group */
  tp_buf_t re;          /* the decoded frame encoded again */
} fz_ctx_t;

/* l_frame.c keeps the tags it has seen in a uint64_t and indexes a table of
 * TP_TAG_MAX_ names with the tag: any tag the parser accepts must fit both. */
static int fz_tag_repeated(unsigned tag) {
  return tag == TP_TAG_ARG || tag == TP_TAG_ENV || tag == TP_TAG_ENTRY;
}

static void fz_check_field(const tp_field_t *f, const uint8_t *p, uint32_t len) {
  FZ_CHECK(f->tag < TP_TAG_MAX_ && f->tag < 64);
  FZ_CHECK(f->val >= p && f->len <= len && (size_t) (f->val - p) <= (size_t) (len - f->len));
  switch (tp_tag_kind(f->tag)) {
  case TP_KIND_INT: {
    int64_t v = 0;
    uint64_t u = 0;
    FZ_CHECK(f->len == 8);
    FZ_CHECK(tp_field_int(f, &v) == 0);
    for (int i = 7; i >= 0; i--)
      u = (u << 8) | f->val[i];
    FZ_CHECK((uint64_t) v == u);
    break;
  }
  case TP_KIND_STR: {
    char *s;
    FZ_CHECK(f->len <= TP_STR_MAX);
    FZ_CHECK(memchr(f->val, '\0', f->len) == NULL);
    s = tp_field_strdup(f);
    FZ_CHECK(s != NULL);
    FZ_CHECK(strlen(s) == f->len && memcmp(s, f->val, f->len) == 0);
    free(s);
    break;
  }
  case TP_KIND_BYTES:
    FZ_CHECK(f->len <= TP_CHUNK_MAX);
    break;
  case TP_KIND_NESTED:
    break;
  default:
    FZ_CHECK(!"tp_fields_parse accepted a tag of unknown kind");
  }
}

/* Mirrors tp_l_push_fields: returns -1 where l_frame.c rejects the payload.
 * Accepted fields are appended to ctx->re as the encoder would write them. */
static int fz_decode(fz_ctx_t *ctx, const tp_field_t *fs, int n, const uint8_t *p, uint32_t len,
                     int nested, tp_field_t *scratch, int scratch_max) {
  uint64_t seen = 0;
  for (int i = 0; i < n; i++) {
    const tp_field_t *f = &fs[i];
    fz_check_field(f, p, len);
    if (!fz_tag_repeated(f->tag)) {
      if (seen & (UINT64_C(1) << f->tag))
        return -1;
      seen |= UINT64_C(1) << f->tag;
    }
    if (tp_tag_kind(f->tag) == TP_KIND_NESTED) {
      size_t grp;
      int m;
      if (nested)
        return -1;
      m = tp_fields_parse(f->val, f->len, scratch, scratch_max);
      if (m < 0)
        return -1;
      FZ_CHECK(m <= scratch_max);
      grp = tp_frame_group_begin(&ctx->re, f->tag);
      if (fz_decode(ctx, scratch, m, f->val, f->len, 1, NULL, 0) < 0)
        return -1;
      tp_frame_group_end(&ctx->re, grp);
    } else {
      tp_frame_add(&ctx->re, f->tag, f->val, f->len);
    }
  }
  /* the lookup helpers agree with a plain scan */
  for (unsigned tag = 0; tag <= TP_TAG_MAX_; tag++) {
    const tp_field_t *first = tp_fields_get(fs, n, (uint16_t) tag);
    int count = tp_fields_count(fs, n, (uint16_t) tag);
    FZ_CHECK((first == NULL) == (count == 0));
    FZ_CHECK(first == NULL || first->tag == tag);
  }
  return 0;
}

/* One payload: parse, decode, and compare the re-encoding with the input. */
static void fz_payload(fz_ctx_t *ctx, uint8_t type, uint32_t id, const uint8_t *p, uint32_t len) {
  int n = tp_fields_parse(p, len, ctx->fields, TP_FIELDS_MAX);
  if (n < 0)
    return;
  FZ_CHECK(n <= TP_FIELDS_MAX);
  FZ_CHECK(n > 0 || len == 0);
  tp_buf_reset(&ctx->re);
  tp_frame_begin(&ctx->re, type, id);
  if (fz_decode(ctx, ctx->fields, n, p, len, 0, ctx->scratch, TP_FIELDS_MAX) < 0)
    return;
  if (len > TP_FRAME_MAX) {
    /* a bare payload over the frame cap: the encoder must refuse it */
    FZ_CHECK(tp_frame_end(&ctx->re) < 0);
    return;
  }
  FZ_CHECK(tp_frame_end(&ctx->re) == 0);
  FZ_CHECK(ctx->re.len == TP_FRAME_HDR + (size_t) len);
  FZ_CHECK(memcmp(ctx->re.data + TP_FRAME_HDR, p, len) == 0);
  if (tp_msg_type_valid(type)) {
    tp_frame_t g;
    long r = tp_frame_parse_header(ctx->re.data, ctx->re.len, &g);
    FZ_CHECK(r == (long) ctx->re.len);
    FZ_CHECK(g.type == type && g.id == id && g.len == len && g.flags == 0);
  }
}

/* The byte stream: frames back to back, as runtime/host/dbox.c's dispatcher sees them. */
static void fz_stream(fz_ctx_t *ctx, const uint8_t *data, size_t size) {
  size_t off = 0;
  while (off < size) {
    const uint8_t *b = data + off;
    size_t avail = size - off;
    tp_frame_t f;
    long r = tp_frame_parse_header(b, avail, &f);
    if (r == 0) {
      /* needs more: only when the header or the payload is incomplete */
      if (avail >= TP_FRAME_HDR) {
        uint32_t len = (uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16 |
                       (uint32_t) b[3] << 24;
        FZ_CHECK(len <= TP_FRAME_MAX && b[4] == TP_PROTO_VERSION && tp_msg_type_valid(b[5]));
        FZ_CHECK(avail < (size_t) TP_FRAME_HDR + len);
      }
      return;
    }
    if (r < 0) {
      FZ_CHECK(avail >= TP_FRAME_HDR);
      return; /* the channel is closed: nothing after this is read */
    }
    FZ_CHECK((size_t) r == TP_FRAME_HDR + (size_t) f.len && (size_t) r <= avail);
    FZ_CHECK(f.len <= TP_FRAME_MAX && f.payload == b + TP_FRAME_HDR);
    FZ_CHECK(tp_msg_type_valid(f.type) && b[4] == TP_PROTO_VERSION);
    /* a prefix of a whole frame is never taken for a frame */
    if (r > TP_FRAME_HDR) {
      tp_frame_t g;
      FZ_CHECK(tp_frame_parse_header(b, (size_t) r - 1, &g) == 0);
      FZ_CHECK(tp_frame_parse_header(b, TP_FRAME_HDR, &g) == 0);
    }
    fz_payload(ctx, f.type, f.id, f.payload, f.len);
    off += (size_t) r;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_ctx_t ctx;
  uint8_t *copy;
  if (size > TP_FRAME_HDR + (size_t) TP_FRAME_MAX * 2)
    return 0;
  memset(&ctx, 0, sizeof(ctx));
  ctx.fields = calloc(TP_FIELDS_MAX, sizeof(tp_field_t));
  ctx.scratch = calloc(TP_FIELDS_MAX, sizeof(tp_field_t));
  copy = malloc(size ? size : 1); /* exact size: ASan sees any read past the end */
  FZ_CHECK(ctx.fields != NULL && ctx.scratch != NULL && copy != NULL);
  tp_buf_init(&ctx.re);
  if (size)
    memcpy(copy, data, size);

  fz_stream(&ctx, copy, size);
  fz_payload(&ctx, TP_MSG_OK, 1, copy, (uint32_t) size);

  tp_buf_free(&ctx.re);
  free(copy);
  free(ctx.scratch);
  free(ctx.fields);
  return 0;
}
