#include "base64.h"

#include <stdint.h>

static const char tp__b64_alpha[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t tp_b64_enclen(size_t n) { return (n + 2) / 3 * 4; }

size_t tp_b64_encode(const unsigned char *in, size_t n, char *out) {
  size_t i = 0, o = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t v = (uint32_t) in[i] << 16 | (uint32_t) in[i + 1] << 8 | in[i + 2];
    out[o++] = tp__b64_alpha[v >> 18 & 63];
    out[o++] = tp__b64_alpha[v >> 12 & 63];
    out[o++] = tp__b64_alpha[v >> 6 & 63];
    out[o++] = tp__b64_alpha[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t) in[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t) in[i + 1] << 8;
    out[o++] = tp__b64_alpha[v >> 18 & 63];
    out[o++] = tp__b64_alpha[v >> 12 & 63];
    out[o++] = i + 1 < n ? tp__b64_alpha[v >> 6 & 63] : '=';
    out[o++] = '=';
  }
  return o;
}

static int tp__b64_val(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

size_t tp_b64_decode(const char *in, size_t n, unsigned char *out) {
  size_t o = 0;
  if (n % 4 != 0)
    return (size_t) -1;
  for (size_t i = 0; i < n; i += 4) {
    int v[4], pad = 0;
    for (int k = 0; k < 4; k++) {
      unsigned char c = (unsigned char) in[i + k];
      if (c == '=' && i + 4 == n && k >= 2) {
        v[k] = 0;
        pad++;
        continue;
      }
      if (pad) /* data after padding */
        return (size_t) -1;
      v[k] = tp__b64_val(c);
      if (v[k] < 0)
        return (size_t) -1;
    }
    uint32_t w = (uint32_t) v[0] << 18 | (uint32_t) v[1] << 12 | (uint32_t) v[2] << 6 | (uint32_t) v[3];
    out[o++] = (unsigned char) (w >> 16);
    if (pad < 2)
      out[o++] = (unsigned char) (w >> 8);
    if (pad < 1)
      out[o++] = (unsigned char) w;
  }
  return o;
}
