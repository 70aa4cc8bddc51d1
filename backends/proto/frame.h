/* Frame codec for the agent protocol (proto.h).  Shared by the agent and the
 * host: both sides treat every incoming byte as hostile. */
#ifndef TP_FRAME_H
#define TP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define TP_FIELDS_MAX (TP_ARGS_MAX + 64)

typedef struct tp_field_s {
  uint16_t tag;
  uint32_t len;
  const uint8_t *val;
} tp_field_t;

typedef struct tp_frame_s {
  uint8_t type;
  uint16_t flags;
  uint32_t id;
  uint32_t len;          /* payload length */
  const uint8_t *payload;
} tp_frame_t;

/* Growable output buffer. */
typedef struct tp_buf_s {
  uint8_t *data;
  size_t len;
  size_t cap;
  int oom;               /* set once an allocation failed; appends become no-ops */
  size_t frame_start;    /* offset of the frame being built */
} tp_buf_t;

void tp_buf_init(tp_buf_t *b);
void tp_buf_free(tp_buf_t *b);
void tp_buf_reset(tp_buf_t *b);
int tp_buf_append(tp_buf_t *b, const void *p, size_t n);
/* Room for n more bytes without a later realloc; -1 (oom set) without it. */
int tp_buf_reserve(tp_buf_t *b, size_t n);

/* Encoding: begin a frame, add fields, end it.  tp_frame_end patches the
 * length and returns 0, or -1 when the buffer ran out of memory or the
 * payload grew past TP_FRAME_MAX (the frame is then dropped). */
void tp_frame_begin(tp_buf_t *b, uint8_t type, uint32_t id);
void tp_frame_add(tp_buf_t *b, uint16_t tag, const void *val, uint32_t len);
void tp_frame_add_str(tp_buf_t *b, uint16_t tag, const char *s);
void tp_frame_add_int(tp_buf_t *b, uint16_t tag, int64_t v);
/* Nested groups (ENTRY): begin returns an offset to pass to end. */
size_t tp_frame_group_begin(tp_buf_t *b, uint16_t tag);
void tp_frame_group_end(tp_buf_t *b, size_t off);
int tp_frame_end(tp_buf_t *b);
/* Bulk bytes without a copy through the encoder.
 * tp_frame_add_room adds field tag with room for len bytes that the caller
 * fills in place (a read straight into the frame): it returns where they go,
 * valid until the next append, or NULL when out of memory; tp_frame_fit then
 * cuts that field, the last one added, to got <= len bytes.
 * tp_frame_add_head adds only the header of a field of len bytes that will
 * follow the buffer on the wire (it must be the frame's last field), and
 * tp_frame_end_tail ends the frame counting those len bytes: the caller
 * writes b's bytes, then the field's, as one frame (writev). */
uint8_t *tp_frame_add_room(tp_buf_t *b, uint16_t tag, uint32_t len);
void tp_frame_fit(tp_buf_t *b, uint8_t *room, uint32_t len, uint32_t got);
void tp_frame_add_head(tp_buf_t *b, uint16_t tag, uint32_t len);
int tp_frame_end_tail(tp_buf_t *b, uint32_t tail);

/* Decoding.  tp_frame_parse_header looks at a buffer of n bytes:
 * returns 0 when more bytes are needed, the total frame size (header +
 * payload) when a whole frame is present, or -1 for a bad header
 * (version, length cap, unknown type). */
long tp_frame_parse_header(const uint8_t *buf, size_t n, tp_frame_t *f);
int tp_msg_type_valid(unsigned type);
/* Network stream frames (NET_OPEN..NET_TAKEN): id 0, both directions, no reply. */
static inline int tp_msg_net_stream(unsigned type) {
  return type >= TP_MSG_NET_OPEN && type <= TP_MSG_NET_TAKEN;
}

/* Split a payload into fields.  Returns the number of fields, or -1 when a
 * field is truncated, has an unknown tag, a wrong integer size, a string
 * with a NUL byte, or there are more than max fields. */
int tp_fields_parse(const uint8_t *p, uint32_t len, tp_field_t *out, int max);

/* Helpers over a parsed field array. */
const tp_field_t *tp_fields_get(const tp_field_t *fs, int n, uint16_t tag);
int tp_fields_count(const tp_field_t *fs, int n, uint16_t tag);
int tp_field_int(const tp_field_t *f, int64_t *out);
/* Copies a string field into a fresh NUL-terminated malloc'ed string. */
char *tp_field_strdup(const tp_field_t *f);
/* 1 when tag is an integer, 2 string, 3 bytes, 4 nested, 0 unknown. */
int tp_tag_kind(unsigned tag);

enum { TP_KIND_INT = 1, TP_KIND_STR = 2, TP_KIND_BYTES = 3, TP_KIND_NESTED = 4 };

#endif
