/* Stream frames: the data plane between a client and the daemon
 * (docs/protocol.md, "Stream frames").  A data connection carries only
 * these once attached; this file is their codec, with every per-type rule
 * of the payload checked here, so that the connection (runtime/host/
 * stream.c), the fuzzer and any later user (snapshot and volume data)
 * agree on what a valid frame is.
 *
 *   header (12 bytes, little endian): u32 len | u8 version | u8 type |
 *                                     u16 flags (0) | u32 sid
 *
 * The peer is a client, less trusted than the agent: nothing here
 * allocates, and a frame is judged from its header and payload alone. */
#ifndef TP_SFRAME_H
#define TP_SFRAME_H

#include <stddef.h>
#include <stdint.h>

#define TP_SF_VERSION 1
#define TP_SF_HDR 12
#define TP_SF_DATA_MAX (1024u * 1024u)         /* bytes in one DATA frame */
#define TP_SF_MSG_MAX 4096u                    /* bytes of an ERROR's message */
#define TP_SF_CREDIT_MAX (1u << 30)            /* most bytes in one CREDIT */
#define TP_SF_CLIENT_SID 0x80000000u           /* ids from here: opened by a client */

enum tp_sf_type {
  TP_SF_OPEN = 1,   /* u32 kind, u32 window */
  TP_SF_DATA = 2,   /* 1..TP_SF_DATA_MAX bytes */
  TP_SF_END = 3,    /* empty, or u64 size */
  TP_SF_ERROR = 4,  /* u32 errno, message (0..TP_SF_MSG_MAX bytes) */
  TP_SF_CREDIT = 5, /* u32 bytes, 1..TP_SF_CREDIT_MAX */
};

enum tp_sf_kind {
  TP_SK_FILE_READ = 1,
  TP_SK_FILE_WRITE = 2,
  TP_SK_STDOUT = 3,
  TP_SK_STDERR = 4,
  TP_SK_STDIN = 5,
  TP_SK_PTY = 6,
  TP_SK_NET = 7,
  /* 8-15: snapshot and volume data */
  TP_SK_MAX_ = 15,
};

/* A parsed frame; the payload points into the caller's buffer. */
typedef struct tp_sframe_s {
  uint8_t type;
  uint32_t sid;
  uint32_t len;
  const uint8_t *payload;
  /* decoded from the payload, by type */
  uint32_t kind, window;  /* OPEN */
  uint64_t size;          /* END (has_size) */
  int has_size;
  uint32_t err;           /* ERROR */
  const char *msg;        /* ERROR: msg_len bytes, not NUL-terminated */
  uint32_t msg_len;
  uint32_t credit;        /* CREDIT */
} tp_sframe_t;

/* Looks at the n bytes of buf.  Returns 0 when more bytes are needed, the
 * whole frame's size when one is there (f filled in), or -1 when the
 * bytes there already break a rule; then *why says which (a static
 * string).  A header is judged as soon as it is whole, so a frame that
 * announces a wrong length is refused before its payload arrives. */
long tp_sframe_parse(const uint8_t *buf, size_t n, tp_sframe_t *f, const char **why);

/* Writes a header for a payload of len bytes into out (TP_SF_HDR bytes). */
void tp_sframe_header(uint8_t out[TP_SF_HDR], uint8_t type, uint32_t sid, uint32_t len);

/* Whole control frames into out (room for TP_SF_HDR + 8, or for ERROR
 * TP_SF_HDR + 4 + TP_SF_MSG_MAX); each returns the frame's size.  An
 * ERROR's message is cut at TP_SF_MSG_MAX bytes. */
size_t tp_sframe_open(uint8_t *out, uint32_t sid, uint32_t kind, uint32_t window);
size_t tp_sframe_end(uint8_t *out, uint32_t sid, int has_size, uint64_t size);
size_t tp_sframe_error(uint8_t *out, uint32_t sid, uint32_t err, const char *msg);
size_t tp_sframe_credit(uint8_t *out, uint32_t sid, uint32_t bytes);

#endif
