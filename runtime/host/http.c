/* tupper: one bounded HTTP GET over libcurl (see http.h).
 *
 * libcurl is opened with dlopen at first use, not linked: it drags in some
 * thirty shared libraries (TLS, Kerberos, LDAP, ...) and loading them cost
 * every CLI verb about ten milliseconds of start-up (`tupper run -- true`
 * takes 18 ms in all).  Only a pull pays for them.  A file download is
 * hashed as it arrives, by libcrypto through crypto.h (opened the same way). */
#define CURL_DISABLE_TYPECHECK 1 /* its macros would wrap our pointers' calls */
#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crypto.h"
#include "http.h"
#include "utils.h"

typedef struct tp__xfer_s {
  const tp_http_spec_t *spec;
  tp_http_result_t *res;
  CURL *curl;
  int fd;                 /* file mode */
  tp_sha256_t md;         /* file mode: of the whole file */
  int64_t have;           /* bytes of the file already there (resume) */
  int64_t got;            /* body bytes of the final answer */
  size_t hdr_bytes;       /* header bytes of the current answer */
  int started;            /* the final answer's body began */
  int ok_body;            /* it is a 2xx body (file or memory), not an error body */
  size_t body_cap;
  tp_http_kind_t fail;    /* why a callback stopped the transfer */
  int errbody_full;       /* an error body reached its cap: the answer stands */
  char why[256];
} tp__xfer_t;

#define TP_SYM(name) __typeof__(name) *name
static struct {
  TP_SYM(curl_global_init);
  TP_SYM(curl_easy_init);
  TP_SYM(curl_easy_setopt);
  TP_SYM(curl_easy_perform);
  TP_SYM(curl_easy_getinfo);
  TP_SYM(curl_easy_cleanup);
  TP_SYM(curl_easy_strerror);
  TP_SYM(curl_slist_append);
  TP_SYM(curl_slist_free_all);
} tp__lib;
static pthread_once_t tp__lib_once = PTHREAD_ONCE_INIT;
static char tp__lib_err[256];

static void tp__lib_load(void) {
  void *curl = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
  struct { const char *name; void **slot; } syms[] = {
#define TP_CURL(n) {#n, (void **) &tp__lib.n}
      TP_CURL(curl_global_init),     TP_CURL(curl_easy_init),     TP_CURL(curl_easy_setopt),
      TP_CURL(curl_easy_perform),    TP_CURL(curl_easy_getinfo),  TP_CURL(curl_easy_cleanup),
      TP_CURL(curl_easy_strerror),   TP_CURL(curl_slist_append),  TP_CURL(curl_slist_free_all),
#undef TP_CURL
  };
  if (curl == NULL) {
    snprintf(tp__lib_err, sizeof(tp__lib_err), "cannot load libcurl.so.4 (install libcurl4): %s",
             dlerror());
    return;
  }
  for (size_t i = 0; i < TP_ARRAY_SIZE(syms); i++) {
    *syms[i].slot = dlsym(curl, syms[i].name);
    if (*syms[i].slot == NULL) {
      snprintf(tp__lib_err, sizeof(tp__lib_err), "libcurl lacks %s", syms[i].name);
      return;
    }
  }
  if (tp__lib.curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    snprintf(tp__lib_err, sizeof(tp__lib_err), "libcurl's global init failed");
    return;
  }
}

/* libcurl, and libcrypto for the downloads' digests (crypto.h). */
static int tp__lib_ready(tp_error_t *err) {
  pthread_once(&tp__lib_once, tp__lib_load);
  if (tp__lib_err[0] != '\0')
    return tp_error_set(err, ENOSYS, "%s", tp__lib_err);
  return tp_crypto_load(err);
}

int tp_http_global_init(tp_error_t *err) {
  return tp__lib_ready(err);
}

static void tp__fail(tp__xfer_t *x, tp_http_kind_t kind, const char *fmt, ...) TP_PRINTF(3, 4);
static void tp__fail(tp__xfer_t *x, tp_http_kind_t kind, const char *fmt, ...) {
  va_list ap;
  if (x->fail != TP_HTTP_OK)
    return;
  x->fail = kind;
  va_start(ap, fmt);
  vsnprintf(x->why, sizeof(x->why), fmt, ap);
  va_end(ap);
}

static void tp__clear_headers(tp_http_result_t *r) {
  char **all[] = {&r->content_type, &r->www_authenticate, &r->docker_digest, &r->location,
                  &r->content_range};
  for (size_t i = 0; i < TP_ARRAY_SIZE(all); i++) {
    free(*all[i]);
    *all[i] = NULL;
  }
}

static size_t tp__header_cb(char *buf, size_t size, size_t n, void *ud) {
  tp__xfer_t *x = ud;
  size_t len = size * n, name_len, vlen;
  const char *colon, *v;
  char **slot = NULL;
  static const struct { const char *name; size_t off; } want[] = {
      {"content-type", offsetof(tp_http_result_t, content_type)},
      {"www-authenticate", offsetof(tp_http_result_t, www_authenticate)},
      {"docker-content-digest", offsetof(tp_http_result_t, docker_digest)},
      {"location", offsetof(tp_http_result_t, location)},
      {"content-range", offsetof(tp_http_result_t, content_range)},
  };

  if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) { /* a new answer (after a redirect or 100) */
    x->hdr_bytes = 0;
    tp__clear_headers(x->res);
  }
  x->hdr_bytes += len;
  if (x->hdr_bytes > TP_HTTP_HEADERS_MAX) {
    tp__fail(x, TP_HTTP_ETOOBIG, "the server's headers exceed %d bytes", TP_HTTP_HEADERS_MAX);
    return 0;
  }
  colon = memchr(buf, ':', len);
  if (colon == NULL)
    return len;
  name_len = (size_t) (colon - buf);
  for (size_t i = 0; i < TP_ARRAY_SIZE(want); i++)
    if (strlen(want[i].name) == name_len && strncasecmp(buf, want[i].name, name_len) == 0)
      slot = (char **) ((char *) x->res + want[i].off);
  if (slot == NULL)
    return len;
  v = colon + 1;
  vlen = len - name_len - 1;
  while (vlen > 0 && (*v == ' ' || *v == '\t')) {
    v++;
    vlen--;
  }
  while (vlen > 0 && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
    vlen--;
  if (memchr(v, '\0', vlen) != NULL) {
    tp__fail(x, TP_HTTP_EPROTO, "a NUL byte in the server's headers");
    return 0;
  }
  if (*slot != NULL) /* WWW-Authenticate may repeat: the first one wins */
    return len;
  *slot = strndup(v, vlen);
  if (*slot == NULL) {
    tp__fail(x, TP_HTTP_EIO, "out of memory");
    return 0;
  }
  return len;
}

/* The final answer's first body bytes: decide where they go. */
static int tp__body_start(tp__xfer_t *x) {
  const tp_http_spec_t *s = x->spec;
  tp_http_result_t *r = x->res;
  curl_off_t clen = -1;
  x->started = 1;
  tp__lib.curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &r->status);
  x->ok_body = r->status >= 200 && r->status < 300;
  if (!x->ok_body) {
    x->body_cap = TP_HTTP_ERRBODY_MAX;
    return 0;
  }
  if (s->file != NULL) {
    if (r->status == 206) {
      long long start = -1, end = -1, total = -1;
      if (x->have == 0 || r->content_range == NULL ||
          sscanf(r->content_range, "bytes %lld-%lld/%lld", &start, &end, &total) < 2 ||
          start != x->have) {
        tp__fail(x, TP_HTTP_EPROTO, "the server answered a range it was not asked for (%s)",
                 r->content_range ? r->content_range : "no Content-Range");
        return -1;
      }
    } else if (x->have > 0) { /* it ignored the range: start over */
      tp_error_t herr = {0};
      if (ftruncate(x->fd, 0) < 0 || lseek(x->fd, 0, SEEK_SET) < 0) {
        tp__fail(x, TP_HTTP_EIO, "truncate %s: %s", s->file, strerror(errno));
        return -1;
      }
      tp_sha256_close(&x->md);
      if (tp_sha256_init(&x->md, &herr) < 0) {
        tp__fail(x, TP_HTTP_EIO, "%s", herr.msg);
        return -1;
      }
      x->have = 0;
    }
  }
  tp__lib.curl_easy_getinfo(x->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &clen);
  if (clen >= 0 && x->have + clen > s->max_bytes) {
    tp__fail(x, TP_HTTP_ETOOBIG, "the server announces %" PRId64 " bytes, more than the %" PRId64 " allowed",
             (int64_t) (x->have + clen), s->max_bytes);
    return -1;
  }
  if (s->file == NULL)
    x->body_cap = (size_t) s->max_bytes;
  return 0;
}

static size_t tp__write_cb(char *buf, size_t size, size_t n, void *ud) {
  tp__xfer_t *x = ud;
  tp_http_result_t *r = x->res;
  size_t len = size * n;
  if (!x->started && tp__body_start(x) < 0)
    return 0;
  if (!x->ok_body || x->spec->file == NULL) { /* into memory, capped */
    size_t keep = len;
    if (r->body_len + len > x->body_cap) {
      if (x->ok_body) {
        tp__fail(x, TP_HTTP_ETOOBIG, "the answer exceeds %zu bytes", x->body_cap);
        return 0;
      }
      keep = x->body_cap - r->body_len;
      x->errbody_full = 1;
    }
    if (keep > 0) {
      char *nb = realloc(r->body, r->body_len + keep + 1);
      if (nb == NULL) {
        tp__fail(x, TP_HTTP_EIO, "out of memory");
        return 0;
      }
      r->body = nb;
      memcpy(r->body + r->body_len, buf, keep);
      r->body_len += keep;
      r->body[r->body_len] = '\0';
    }
    x->got += (int64_t) len;
    atomic_store(&r->progress, x->got);
    return x->errbody_full ? 0 : len;
  }
  if (x->have + x->got + (int64_t) len > x->spec->max_bytes) {
    tp__fail(x, TP_HTTP_ETOOBIG, "the server sent more than the %" PRId64 " bytes declared",
             x->spec->max_bytes);
    return 0;
  }
  for (size_t off = 0; off < len;) {
    ssize_t w = write(x->fd, buf + off, len - off);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      tp__fail(x, TP_HTTP_EIO, "write %s: %s", x->spec->file, strerror(errno));
      return 0;
    }
    off += (size_t) w;
  }
  tp_error_t herr;
  if (tp_sha256_update(&x->md, buf, len, &herr) < 0) {
    tp__fail(x, TP_HTTP_EIO, "%s", herr.msg);
    return 0;
  }
  x->got += (int64_t) len;
  atomic_store(&r->progress, x->have + x->got);
  return len;
}

static int tp__xferinfo_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                           curl_off_t ulnow) {
  tp__xfer_t *x = ud;
  if (atomic_load(&x->res->cancel)) {
    tp__fail(x, TP_HTTP_ECANCEL, "cancelled");
    return 1;
  }
  return 0;
}

/* Resume: hash the bytes already in the file; a file of another size than
 * the offset asked for is started over. */
static int tp__open_file(tp__xfer_t *x, tp_error_t *err) {
  const tp_http_spec_t *s = x->spec;
  struct stat st;
  unsigned char buf[65536];
  x->fd = open(s->file, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (x->fd < 0)
    return tp_error_errno(err, errno, "open %s", s->file);
  if (fstat(x->fd, &st) < 0)
    return tp_error_errno(err, errno, "stat %s", s->file);
  if (!S_ISREG(st.st_mode))
    return tp_error_set(err, EINVAL, "%s is not a regular file", s->file);
  if (s->offset <= 0 || st.st_size != s->offset || s->offset > s->max_bytes) {
    if (ftruncate(x->fd, 0) < 0)
      return tp_error_errno(err, errno, "truncate %s", s->file);
    x->have = 0;
    return 0;
  }
  for (int64_t done = 0; done < s->offset;) {
    ssize_t n = read(x->fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return tp_error_errno(err, n < 0 ? errno : EIO, "read %s", s->file);
    if (tp_sha256_update(&x->md, buf, (size_t) n, err) < 0)
      return tp_error_prefix(err, "hash %s", s->file);
    done += n;
  }
  x->have = s->offset;
  return 0;
}

int tp_http_fetch(const tp_http_spec_t *spec, tp_http_result_t *res, tp_error_t *err) {
  tp__xfer_t x = {.spec = spec, .res = res, .fd = -1};
  struct curl_slist *hdrs = NULL;
  char range[64], curl_err[CURL_ERROR_SIZE] = "";
  const char *eff = NULL;
  int https = strncmp(spec->url, "https://", 8) == 0;
  int ret = -1;
  CURLcode c;

  res->kind = TP_HTTP_OK;
  if (tp__lib_ready(err) < 0) {
    res->kind = TP_HTTP_EIO;
    return -1;
  }
  if (!https && !(spec->allow_http && strncmp(spec->url, "http://", 7) == 0)) {
    res->kind = TP_HTTP_EREDIRECT;
    return tp_error_set(err, EPROTO, "refusing %.200s: only https (plain http only for registries marked insecure)",
                        spec->url);
  }
  if (spec->file != NULL && tp_sha256_init(&x.md, err) < 0) {
    res->kind = TP_HTTP_EIO;
    goto out;
  }
  x.curl = tp__lib.curl_easy_init();
  if (x.curl == NULL) {
    res->kind = TP_HTTP_EIO;
    tp_error_set(err, ENOMEM, "http: out of memory");
    goto out;
  }
  if (spec->file != NULL && tp__open_file(&x, err) < 0) {
    res->kind = TP_HTTP_EIO;
    goto out;
  }
  for (int i = 0; i < TP_HTTP_REQ_HEADERS_MAX && spec->headers[i] != NULL; i++) {
    struct curl_slist *nl = tp__lib.curl_slist_append(hdrs, spec->headers[i]);
    if (nl == NULL) {
      res->kind = TP_HTTP_EIO;
      tp_error_set(err, ENOMEM, "http: out of memory");
      goto out;
    }
    hdrs = nl;
  }
  if (x.have > 0) {
    struct curl_slist *nl;
    snprintf(range, sizeof(range), "Range: bytes=%" PRId64 "-", x.have);
    nl = tp__lib.curl_slist_append(hdrs, range);
    if (nl == NULL) {
      res->kind = TP_HTTP_EIO;
      tp_error_set(err, ENOMEM, "http: out of memory");
      goto out;
    }
    hdrs = nl;
  }
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_URL, spec->url);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_NOSIGNAL, 1L);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_ERRORBUFFER, curl_err);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_USERAGENT, "tupper/0.1");
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_HTTPHEADER, hdrs);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_PROTOCOLS_STR, https ? "https" : "http,https");
  /* never from https down to http; an insecure (http) registry may go up */
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_REDIR_PROTOCOLS_STR, https ? "https" : "http,https");
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_FOLLOWLOCATION, spec->max_redirects > 0 ? 1L : 0L);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_MAXREDIRS, spec->max_redirects);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_CONNECTTIMEOUT, spec->connect_timeout > 0 ? spec->connect_timeout : 30L);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_TIMEOUT, spec->timeout);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_LOW_SPEED_TIME, spec->low_speed_time > 0 ? spec->low_speed_time : 30L);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_LOW_SPEED_LIMIT, spec->low_speed_limit > 0 ? spec->low_speed_limit : 1024L);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) spec->max_bytes);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_HEADERFUNCTION, tp__header_cb);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_HEADERDATA, &x);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_WRITEFUNCTION, tp__write_cb);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_WRITEDATA, &x);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_XFERINFOFUNCTION, tp__xferinfo_cb);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_XFERINFODATA, &x);
  tp__lib.curl_easy_setopt(x.curl, CURLOPT_NOPROGRESS, 0L);
  if (spec->ca_file != NULL)
    tp__lib.curl_easy_setopt(x.curl, CURLOPT_CAINFO, spec->ca_file);

  c = tp__lib.curl_easy_perform(x.curl);
  if (tp__lib.curl_easy_getinfo(x.curl, CURLINFO_EFFECTIVE_URL, &eff) == CURLE_OK && eff != NULL)
    res->effective_url = strdup(eff);
  if (res->status == 0)
    tp__lib.curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, &res->status);

  if (c == CURLE_WRITE_ERROR && x.errbody_full && x.fail == TP_HTTP_OK)
    c = CURLE_OK; /* an error answer whose body we stopped reading */
  if (c != CURLE_OK) {
    if (x.fail != TP_HTTP_OK) {
      res->kind = x.fail;
      tp_error_set(err, x.fail == TP_HTTP_EIO ? EIO : EPROTO, "%s", x.why);
    } else if (c == CURLE_TOO_MANY_REDIRECTS) {
      res->kind = TP_HTTP_EREDIRECT;
      tp_error_set(err, ELOOP, "more than %ld redirects", spec->max_redirects);
    } else if (c == CURLE_UNSUPPORTED_PROTOCOL) {
      res->kind = TP_HTTP_EREDIRECT;
      tp_error_set(err, EPROTO, "refused a redirect to another scheme (https never goes down to http)");
    } else if (c == CURLE_FILESIZE_EXCEEDED) {
      res->kind = TP_HTTP_ETOOBIG;
      tp_error_set(err, EFBIG, "the server announces more than the %" PRId64 " bytes allowed", spec->max_bytes);
    } else {
      res->kind = TP_HTTP_ENET;
      tp_error_set(err, c == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT : ECONNREFUSED, "%s",
                   curl_err[0] ? curl_err : tp__lib.curl_easy_strerror(c));
    }
    goto out;
  }
  if (!x.started) { /* an empty body: the write callback never ran */
    tp__lib.curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, &res->status);
    x.ok_body = res->status >= 200 && res->status < 300;
    if (x.ok_body && spec->file != NULL && x.have > 0 && res->status != 206) {
      if (ftruncate(x.fd, 0) < 0) {
        res->kind = TP_HTTP_EIO;
        tp_error_errno(err, errno, "truncate %s", spec->file);
        goto out;
      }
      tp_sha256_close(&x.md);
      if (tp_sha256_init(&x.md, err) < 0) {
        res->kind = TP_HTTP_EIO;
        goto out;
      }
      x.have = 0;
    }
  }
  if (x.ok_body && spec->exact && x.have + x.got != spec->max_bytes) {
    res->kind = TP_HTTP_EPROTO;
    tp_error_set(err, EPROTO, "the server sent %" PRId64 " bytes where %" PRId64 " were declared",
                 x.have + x.got, spec->max_bytes);
    goto out;
  }
  if (x.ok_body && spec->file != NULL) {
    if (fdatasync(x.fd) < 0) {
      res->kind = TP_HTTP_EIO;
      tp_error_errno(err, errno, "sync %s", spec->file);
      goto out;
    }
    if (tp_sha256_final(&x.md, res->sha256, err) < 0) {
      res->kind = TP_HTTP_EIO;
      goto out;
    }
    res->size = x.have + x.got;
  }
  ret = 0;
out:
  if (x.curl != NULL)
    tp__lib.curl_easy_cleanup(x.curl);
  tp__lib.curl_slist_free_all(hdrs);
  tp_sha256_close(&x.md);
  if (x.fd >= 0)
    close(x.fd);
  return ret;
}

void tp_http_result_free(tp_http_result_t *res) {
  tp__clear_headers(res);
  free(res->effective_url);
  free(res->body);
  res->effective_url = res->body = NULL;
}
