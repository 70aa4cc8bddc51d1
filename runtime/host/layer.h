/* Image layers and blobs of the image store (lua/tupper/images.lua).
 *
 * A layer blob (a tar, gzip'ed or zstd'ed or plain, as OCI images ship
 * them) is unpacked once into <layers_dir>/<diff-id hex>/, a directory the
 * overlay of every box of that image uses read-only.  Every byte of it is
 * hostile (docs/images.md, "Safety rules"):
 *  - entry paths are cleaned: absolute paths and ".." are refused, "." and
 *    empty components dropped; every directory on the way is opened with
 *    O_NOFOLLOW from the layer's root, so nothing is ever written through
 *    a symlink (a symlink entry is stored, never followed);
 *  - hardlinks only to regular files or symlinks of the same layer;
 *  - device nodes, fifos and sockets are refused, but a char 0:0 (overlay's
 *    whiteout); ".wh.NAME" becomes a whiteout of NAME, ".wh..wh..opq" marks
 *    its directory opaque (trusted.overlay.opaque=y); no xattr of the tar is
 *    kept (so no file capability and no trusted.overlay.* from an image);
 *  - owners shift into the boxes' range: uid u -> uid_base + u; a uid or gid
 *    at or past id_count is refused; setuid/setgid bits stay as the image
 *    says (the overlay is mounted nosuid: they never raise anything);
 *  - caps on the uncompressed stream, on file bytes (apparent sizes, so a
 *    sparse file counts in full) and on entries: a decompression bomb stops
 *    with a clear error;
 *  - everything goes into a temp dir next to the target, renamed into place
 *    only when the whole stream was read and both digests matched: a bad or
 *    truncated blob leaves nothing.
 * Blocking (reads, writes, hashing): run it in the thread pool. */
#ifndef TP_LAYER_H
#define TP_LAYER_H

#include <stdint.h>
#include <sys/types.h>

#include "error.h"

#define TP_DIGEST_LEN 71 /* "sha256:" + 64 hex */

typedef struct tp_layer_opts_s {
  uid_t uid_base; /* host uid of uid 0 in the layer */
  gid_t gid_base;
  uint32_t id_count;       /* uids and gids 0..id_count-1 are allowed */
  uint64_t max_tar_bytes;  /* the uncompressed stream */
  uint64_t max_bytes;      /* sum of the files' sizes */
  uint64_t max_entries;    /* files, dirs, links made (implicit parents too) */
  const char *want_digest; /* "sha256:<hex>" of the blob, or NULL: not checked */
  const char *want_diff_id; /* "sha256:<hex>" of the uncompressed tar, or NULL */
} tp_layer_opts_t;

typedef struct tp_layer_info_s {
  char digest[TP_DIGEST_LEN + 1];  /* of the blob as read */
  char diff_id[TP_DIGEST_LEN + 1]; /* of the uncompressed tar */
  uint64_t tar_bytes, bytes, entries;
  int existed; /* the layer dir was there already (another unpack won) */
} tp_layer_info_t;

/* Unpacks the layer blob at `blob` into <layers_dir>/<diff-id hex>. */
int tp_layer_unpack(const char *blob, const char *layers_dir, const tp_layer_opts_t *opts,
                    tp_layer_info_t *info, tp_error_t *err);

/* Copies the file at src (at most max_bytes) into <blobs_dir>/<hex> of its
 * sha256 (atomically, through a temp file there); digest gets
 * "sha256:<hex>".  With want non-NULL, a different digest is refused and
 * nothing is left.  blobs_dir NULL: only hashes. */
int tp_blob_put(const char *src, const char *blobs_dir, const char *want, uint64_t max_bytes,
                char digest[TP_DIGEST_LEN + 1], tp_error_t *err);

/* Writes the tree at dir (never following a symlink, staying on its
 * filesystem) as an uncompressed pax tar to the new file out_path (0600).
 * Owners inside [uid_base, uid_base + id_count) are shifted back to
 * 0..id_count-1 (a tree laid out for boxes, as the default image); others
 * are kept (and refused by tp_layer_unpack when past id_count). */
int tp_tar_dir(const char *dir, const char *out_path, uid_t uid_base, gid_t gid_base,
               uint32_t id_count, tp_error_t *err);

/* 1 if s is "sha256:" and 64 lowercase hex digits. */
int tp_digest_valid(const char *s);

#endif
