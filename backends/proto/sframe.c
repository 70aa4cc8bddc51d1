/* Stream frame codec (sframe.h). */
#include "sframe.h"

#include <string.h>

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t) (v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) | ((uint32_t) p[3] << 24);
}

/* The payload length a header may announce for its type, or -1. */
static int tp__sframe_len_ok(uint8_t type, uint32_t len, const char **why) {
  switch (type) {
  case TP_SF_OPEN:
    if (len == 8)
      return 0;
    *why = "OPEN payload is not 8 bytes";
    return -1;
  case TP_SF_DATA:
    if (len >= 1 && len <= TP_SF_DATA_MAX)
      return 0;
    *why = len == 0 ? "empty DATA frame" : "DATA frame over 1048576 bytes";
    return -1;
  case TP_SF_END:
    if (len == 0 || len == 8)
      return 0;
    *why = "END payload is not 0 or 8 bytes";
    return -1;
  case TP_SF_ERROR:
    if (len >= 4 && len <= 4 + TP_SF_MSG_MAX)
      return 0;
    *why = "ERROR payload is not 4 to 4100 bytes";
    return -1;
  case TP_SF_CREDIT:
    if (len == 4)
      return 0;
    *why = "CREDIT payload is not 4 bytes";
    return -1;
  default:
    *why = "unknown frame type";
    return -1;
  }
}

long tp_sframe_parse(const uint8_t *buf, size_t n, tp_sframe_t *f, const char **why) {
  const char *dummy;
  uint32_t len;
  if (why == NULL)
    why = &dummy;
  if (n < TP_SF_HDR)
    return 0;
  len = get_u32(buf);
  if (buf[4] != TP_SF_VERSION) {
    *why = "wrong frame version";
    return -1;
  }
  if (buf[6] != 0 || buf[7] != 0) {
    *why = "frame flags are not 0";
    return -1;
  }
  if (tp__sframe_len_ok(buf[5], len, why) < 0)
    return -1;
  if (n - TP_SF_HDR < len)
    return 0;
  memset(f, 0, sizeof(*f));
  f->type = buf[5];
  f->sid = get_u32(buf + 8);
  f->len = len;
  f->payload = buf + TP_SF_HDR;
  switch (f->type) {
  case TP_SF_OPEN:
    f->kind = get_u32(f->payload);
    f->window = get_u32(f->payload + 4);
    if (f->kind == 0 || f->kind > TP_SK_MAX_) {
      *why = "OPEN of an unknown kind";
      return -1;
    }
    break;
  case TP_SF_END:
    if (len == 8) {
      f->has_size = 1;
      f->size = (uint64_t) get_u32(f->payload) | ((uint64_t) get_u32(f->payload + 4) << 32);
    }
    break;
  case TP_SF_ERROR:
    f->err = get_u32(f->payload);
    f->msg = (const char *) f->payload + 4;
    f->msg_len = len - 4;
    break;
  case TP_SF_CREDIT:
    f->credit = get_u32(f->payload);
    if (f->credit == 0 || f->credit > TP_SF_CREDIT_MAX) {
      *why = "CREDIT of 0 or over 2^30 bytes";
      return -1;
    }
    break;
  default:
    break;
  }
  if (f->sid == 0 && f->type != TP_SF_ERROR) {
    *why = "frame on stream 0 (only ERROR may use it)";
    return -1;
  }
  return (long) (TP_SF_HDR + len);
}

void tp_sframe_header(uint8_t out[TP_SF_HDR], uint8_t type, uint32_t sid, uint32_t len) {
  put_u32(out, len);
  out[4] = TP_SF_VERSION;
  out[5] = type;
  out[6] = out[7] = 0;
  put_u32(out + 8, sid);
}

size_t tp_sframe_open(uint8_t *out, uint32_t sid, uint32_t kind, uint32_t window) {
  tp_sframe_header(out, TP_SF_OPEN, sid, 8);
  put_u32(out + TP_SF_HDR, kind);
  put_u32(out + TP_SF_HDR + 4, window);
  return TP_SF_HDR + 8;
}

size_t tp_sframe_end(uint8_t *out, uint32_t sid, int has_size, uint64_t size) {
  tp_sframe_header(out, TP_SF_END, sid, has_size ? 8 : 0);
  if (!has_size)
    return TP_SF_HDR;
  put_u32(out + TP_SF_HDR, (uint32_t) size);
  put_u32(out + TP_SF_HDR + 4, (uint32_t) (size >> 32));
  return TP_SF_HDR + 8;
}

size_t tp_sframe_error(uint8_t *out, uint32_t sid, uint32_t err, const char *msg) {
  size_t m = msg ? strlen(msg) : 0;
  if (m > TP_SF_MSG_MAX)
    m = TP_SF_MSG_MAX;
  tp_sframe_header(out, TP_SF_ERROR, sid, (uint32_t) (4 + m));
  put_u32(out + TP_SF_HDR, err);
  if (m)
    memcpy(out + TP_SF_HDR + 4, msg, m);
  return TP_SF_HDR + 4 + m;
}

size_t tp_sframe_credit(uint8_t *out, uint32_t sid, uint32_t bytes) {
  tp_sframe_header(out, TP_SF_CREDIT, sid, 4);
  put_u32(out + TP_SF_HDR, bytes);
  return TP_SF_HDR + 4;
}
