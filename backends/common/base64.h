#ifndef TP_BASE64_H
#define TP_BASE64_H

#include <stddef.h>

/* Standard alphabet with padding.  out must hold tp_b64_enclen(n) bytes. */
size_t tp_b64_enclen(size_t n);
size_t tp_b64_encode(const unsigned char *in, size_t n, char *out);
/* Decodes into out (room for n / 4 * 3 bytes).  Returns the decoded length,
 * or (size_t) -1 for bad input: a character outside the alphabet, a length
 * that is not a multiple of 4, or padding anywhere but at the end. */
size_t tp_b64_decode(const char *in, size_t n, unsigned char *out);

#endif
