/* tupper: one bounded HTTP GET over libcurl, for the registry client.
 *
 * Blocking: the Lua binding (lhttp.c) runs it on the loop's worker
 * threads (job.h).  Every byte from the server is hostile: the body is capped (max_bytes), the
 * headers are capped, redirects are few and never go from https to http,
 * a stalled or dripping transfer ends (low-speed limit), and the whole
 * transfer has a deadline.  A body going to a file is hashed (SHA-256) as it
 * is written; a resumed one (offset > 0) hashes the bytes already there
 * first, so the digest is always of the whole file. */
#ifndef TP_HTTP_H
#define TP_HTTP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define TP_HTTP_HEADERS_MAX 65536   /* bytes of response headers, per response */
#define TP_HTTP_REQ_HEADERS_MAX 16  /* request headers the caller may add */
#define TP_HTTP_ERRBODY_MAX 65536   /* body kept of a non-2xx answer */

/* Why a fetch failed (besides the message). */
typedef enum {
  TP_HTTP_OK = 0,
  TP_HTTP_ENET,       /* DNS, connect, TLS, reset, timeout */
  TP_HTTP_ETOOBIG,    /* body beyond max_bytes, or headers beyond their cap */
  TP_HTTP_EREDIRECT,  /* too many redirects, or a refused scheme */
  TP_HTTP_ECANCEL,    /* cancelled */
  TP_HTTP_EIO,        /* the local file */
  TP_HTTP_EPROTO,     /* a malformed or lying answer (Content-Range, size) */
} tp_http_kind_t;

typedef struct tp_http_spec_s {
  const char *url;
  const char *headers[TP_HTTP_REQ_HEADERS_MAX + 1]; /* "Name: value", NULL ended */
  int64_t max_bytes;        /* body cap (whole file when resuming) */
  const char *file;         /* write a 2xx body here; NULL: into memory */
  int64_t offset;           /* resume from here (file mode): Range: bytes=offset- */
  int exact;                /* the body must be exactly max_bytes long */
  int allow_http;           /* the URL may be http:// (an insecure registry) */
  const char *ca_file;      /* extra CA bundle, or NULL: the system store */
  long connect_timeout;     /* seconds */
  long timeout;             /* seconds for the whole transfer, 0: none */
  long low_speed_time;      /* abort below low_speed_limit bytes/s for this long */
  long low_speed_limit;
  long max_redirects;
} tp_http_spec_t;

typedef struct tp_http_result_s {
  long status;
  tp_http_kind_t kind;
  char *content_type, *www_authenticate, *docker_digest, *location, *content_range;
  char *effective_url;
  char *body;               /* memory mode, or a non-2xx answer's body (capped) */
  size_t body_len;
  int64_t size;             /* file mode: bytes in the file at the end */
  char sha256[65];          /* file mode: hex digest of the whole file */
  _Atomic int64_t progress; /* bytes of body so far, readable from any thread */
  atomic_int cancel;        /* set from any thread: the transfer ends soon */
} tp_http_result_t;

/* Process-wide set-up; call once on the main thread before any fetch. */
int tp_http_global_init(tp_error_t *err);

/* Fetches spec->url.  Returns 0 when an answer arrived (whatever its status:
 * check res->status), -1 with err set and res->kind saying why. */
int tp_http_fetch(const tp_http_spec_t *spec, tp_http_result_t *res, tp_error_t *err);

/* Frees what tp_http_fetch allocated in res (not res itself). */
void tp_http_result_free(tp_http_result_t *res);

#endif
