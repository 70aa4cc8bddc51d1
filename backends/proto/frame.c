#include "frame.h"

#include <stdlib.h>
#include <string.h>

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t) v;
  p[1] = (uint8_t) (v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t) (p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

void tp_buf_init(tp_buf_t *b) { memset(b, 0, sizeof(*b)); }
void tp_buf_free(tp_buf_t *b) {
  free(b->data);
  memset(b, 0, sizeof(*b));
}
void tp_buf_reset(tp_buf_t *b) {
  b->len = 0;
  b->oom = 0;
}

int tp_buf_reserve(tp_buf_t *b, size_t n) {
  if (b->oom)
    return -1;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
      cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (d == NULL) {
      b->oom = 1;
      return -1;
    }
    b->data = d;
    b->cap = cap;
  }
  return 0;
}

int tp_buf_append(tp_buf_t *b, const void *p, size_t n) {
  if (tp_buf_reserve(b, n) < 0)
    return -1;
  if (n)
    memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

/* Several frames may be queued in one buffer; the one being built starts at
 * b->frame_start and its length is patched by tp_frame_end. */
void tp_frame_begin(tp_buf_t *b, uint8_t type, uint32_t id) {
  uint8_t h[TP_FRAME_HDR];
  put_u32(h, 0);
  h[4] = TP_PROTO_VERSION;
  h[5] = type;
  put_u16(h + 6, 0);
  put_u32(h + 8, id);
  b->frame_start = b->len;
  tp_buf_append(b, h, sizeof(h));
}

void tp_frame_add(tp_buf_t *b, uint16_t tag, const void *val, uint32_t len) {
  uint8_t h[6];
  put_u16(h, tag);
  put_u32(h + 2, len);
  tp_buf_append(b, h, sizeof(h));
  tp_buf_append(b, val, len);
}

void tp_frame_add_str(tp_buf_t *b, uint16_t tag, const char *s) {
  tp_frame_add(b, tag, s, (uint32_t) strlen(s));
}

void tp_frame_add_int(tp_buf_t *b, uint16_t tag, int64_t v) {
  uint8_t p[8];
  uint64_t u = (uint64_t) v;
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t) (u >> (8 * i));
  tp_frame_add(b, tag, p, 8);
}

size_t tp_frame_group_begin(tp_buf_t *b, uint16_t tag) {
  tp_frame_add(b, tag, NULL, 0);
  return b->len;
}

void tp_frame_group_end(tp_buf_t *b, size_t off) {
  if (b->oom || off < 4 || off > b->len)
    return;
  put_u32(b->data + off - 4, (uint32_t) (b->len - off));
}

uint8_t *tp_frame_add_room(tp_buf_t *b, uint16_t tag, uint32_t len) {
  uint8_t *room;
  tp_frame_add_head(b, tag, len);
  if (tp_buf_reserve(b, len) < 0)
    return NULL;
  room = b->data + b->len;
  b->len += len;
  return room;
}

void tp_frame_fit(tp_buf_t *b, uint8_t *room, uint32_t len, uint32_t got) {
  if (b->oom || got > len || room < b->data + 4 || room + len != b->data + b->len)
    return; /* not the last field: left as it is */
  put_u32(room - 4, got);
  b->len -= len - got;
}

void tp_frame_add_head(tp_buf_t *b, uint16_t tag, uint32_t len) {
  uint8_t h[6];
  put_u16(h, tag);
  put_u32(h + 2, len);
  tp_buf_append(b, h, sizeof(h));
}

int tp_frame_end(tp_buf_t *b) { return tp_frame_end_tail(b, 0); }

int tp_frame_end_tail(tp_buf_t *b, uint32_t tail) {
  size_t plen;
  if (b->oom || b->frame_start + TP_FRAME_HDR > b->len)
    return -1;
  plen = b->len - b->frame_start - TP_FRAME_HDR + tail;
  if (plen > TP_FRAME_MAX) {
    b->len = b->frame_start; /* drop the oversized frame */
    return -1;
  }
  put_u32(b->data + b->frame_start, (uint32_t) plen);
  return 0;
}

int tp_msg_type_valid(unsigned type) {
  switch (type) {
  case TP_MSG_READY: case TP_MSG_OUTPUT: case TP_MSG_EXIT: case TP_MSG_STDIN_ACK:
  case TP_MSG_OK: case TP_MSG_ERR:
  case TP_MSG_EXEC: case TP_MSG_STDIN: case TP_MSG_STDIN_CLOSE: case TP_MSG_SIGNAL:
  case TP_MSG_RELEASE: case TP_MSG_PS: case TP_MSG_OUTPUT_ACK:
  case TP_MSG_FS_READ: case TP_MSG_FS_WRITE: case TP_MSG_FS_STAT: case TP_MSG_FS_LIST:
  case TP_MSG_FS_MKDIR: case TP_MSG_FS_REMOVE: case TP_MSG_FS_RENAME:
  case TP_MSG_FS_SETATTR: case TP_MSG_FS_SYMLINK: case TP_MSG_FS_OPEN:
  case TP_MSG_NET_LISTEN: case TP_MSG_NET_OPEN: case TP_MSG_NET_DATA: case TP_MSG_NET_ACK:
  case TP_MSG_NET_EOF: case TP_MSG_NET_CLOSE: case TP_MSG_NET_DNS: case TP_MSG_NET_CONNECT:
  case TP_MSG_NET_GIVE: case TP_MSG_NET_TAKEN:
  case TP_MSG_PTY_RESIZE: case TP_MSG_WATCH_ADD: case TP_MSG_WATCH_REMOVE: case TP_MSG_WATCH_EVENT:
  case TP_MSG_VM_INIT: case TP_MSG_VM_ATTACH: case TP_MSG_VM_LIMITS:
    return 1;
  default:
    return 0;
  }
}

long tp_frame_parse_header(const uint8_t *buf, size_t n, tp_frame_t *f) {
  if (n < TP_FRAME_HDR)
    return 0;
  uint32_t len = get_u32(buf);
  if (len > TP_FRAME_MAX || buf[4] != TP_PROTO_VERSION || !tp_msg_type_valid(buf[5]))
    return -1;
  if (n < (size_t) TP_FRAME_HDR + len)
    return 0;
  f->len = len;
  f->type = buf[5];
  f->flags = get_u16(buf + 6);
  f->id = get_u32(buf + 8);
  f->payload = buf + TP_FRAME_HDR;
  return (long) (TP_FRAME_HDR + len);
}

int tp_tag_kind(unsigned tag) {
  switch (tag) {
  case TP_TAG_VERSION: case TP_TAG_PID: case TP_TAG_STREAM: case TP_TAG_CODE:
  case TP_TAG_SIGNAL: case TP_TAG_ERRNO: case TP_TAG_FLAGS: case TP_TAG_OFFSET:
  case TP_TAG_LENGTH: case TP_TAG_SIZE: case TP_TAG_MODE: case TP_TAG_MTIME:
  case TP_TAG_UID: case TP_TAG_GID: case TP_TAG_TYPE: case TP_TAG_CREATED:
  case TP_TAG_SID: case TP_TAG_KIND: case TP_TAG_PORT: case TP_TAG_PIDS:
  case TP_TAG_COLS: case TP_TAG_ROWS: case TP_TAG_WATCH: case TP_TAG_EVENT:
  case TP_TAG_GRACE: case TP_TAG_FD:
    return TP_KIND_INT;
  case TP_TAG_MSG: case TP_TAG_ARG: case TP_TAG_ENV: case TP_TAG_CWD: case TP_TAG_PATH:
  case TP_TAG_PATH2: case TP_TAG_NAME: case TP_TAG_LINK: case TP_TAG_USER:
    return TP_KIND_STR;
  case TP_TAG_DATA: case TP_TAG_GROUPS:
    return TP_KIND_BYTES;
  case TP_TAG_ENTRY:
    return TP_KIND_NESTED;
  default:
    return 0;
  }
}

int tp_fields_parse(const uint8_t *p, uint32_t len, tp_field_t *out, int max) {
  uint32_t off = 0;
  int n = 0;
  while (off < len) {
    if (len - off < 6 || n >= max)
      return -1;
    uint16_t tag = get_u16(p + off);
    uint32_t flen = get_u32(p + off + 2);
    off += 6;
    if (flen > len - off)
      return -1;
    switch (tp_tag_kind(tag)) {
    case TP_KIND_INT:
      if (flen != 8)
        return -1;
      break;
    case TP_KIND_STR:
      if (flen > TP_STR_MAX || memchr(p + off, '\0', flen) != NULL)
        return -1;
      break;
    case TP_KIND_BYTES:
      if (flen > TP_CHUNK_MAX)
        return -1;
      break;
    case TP_KIND_NESTED:
      break;
    default:
      return -1;
    }
    out[n].tag = tag;
    out[n].len = flen;
    out[n].val = p + off;
    n++;
    off += flen;
  }
  return n;
}

const tp_field_t *tp_fields_get(const tp_field_t *fs, int n, uint16_t tag) {
  for (int i = 0; i < n; i++)
    if (fs[i].tag == tag)
      return &fs[i];
  return NULL;
}

int tp_fields_count(const tp_field_t *fs, int n, uint16_t tag) {
  int c = 0;
  for (int i = 0; i < n; i++)
    if (fs[i].tag == tag)
      c++;
  return c;
}

int tp_field_int(const tp_field_t *f, int64_t *out) {
  uint64_t u = 0;
  if (f == NULL || f->len != 8)
    return -1;
  for (int i = 0; i < 8; i++)
    u |= (uint64_t) f->val[i] << (8 * i);
  *out = (int64_t) u;
  return 0;
}

char *tp_field_strdup(const tp_field_t *f) {
  char *s = malloc((size_t) f->len + 1);
  if (s == NULL)
    return NULL;
  memcpy(s, f->val, f->len);
  s[f->len] = '\0';
  return s;
}
