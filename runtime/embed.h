#ifndef TP_EMBED_H
#define TP_EMBED_H

#include <stddef.h>

extern const unsigned char tp_blob_agent_start[], tp_blob_agent_end[];
extern const unsigned char tp_blob_busybox_start[], tp_blob_busybox_end[];
extern const unsigned char tp_blob_applets_start[], tp_blob_applets_end[];

#define TP_BLOB_SIZE(name) ((size_t) (tp_blob_##name##_end - tp_blob_##name##_start))

/* Embedded Lua sources (generated): module name -> source. */
typedef struct tp_lua_src_s {
  const char *name;   /* "tupper.daemon.main", or "recipes/default" */
  const char *src;
  size_t len;
} tp_lua_src_t;

extern const tp_lua_src_t tp_lua_sources[];
extern const size_t tp_lua_sources_count;

#endif
