/* Agent frames as Lua sees them: the fields of a frame from the agent
 * become a table (repeated tags arrays, nested groups arrays of tables),
 * and a request's table becomes a frame.  Every value is checked before
 * anything is encoded (STYLE 12). */
#include <lauxlib.h>
#include <string.h>

#include "l_core.h"

/* Field names as Lua sees them; repeated tags become arrays. */
static const char *const tp__tag_names[TP_TAG_MAX_] = {
    [TP_TAG_VERSION] = "version", [TP_TAG_PID] = "pid",       [TP_TAG_STREAM] = "stream",
    [TP_TAG_DATA] = "data",       [TP_TAG_CODE] = "code",     [TP_TAG_SIGNAL] = "signal",
    [TP_TAG_ERRNO] = "errno",     [TP_TAG_MSG] = "msg",       [TP_TAG_ARG] = "args",
    [TP_TAG_ENV] = "env",         [TP_TAG_CWD] = "cwd",       [TP_TAG_FLAGS] = "flags",
    [TP_TAG_PATH] = "path",       [TP_TAG_PATH2] = "path2",   [TP_TAG_OFFSET] = "offset",
    [TP_TAG_LENGTH] = "length",   [TP_TAG_SIZE] = "size",     [TP_TAG_MODE] = "mode",
    [TP_TAG_MTIME] = "mtime",     [TP_TAG_UID] = "uid",       [TP_TAG_GID] = "gid",
    [TP_TAG_TYPE] = "type",       [TP_TAG_NAME] = "name",     [TP_TAG_LINK] = "link",
    [TP_TAG_ENTRY] = "entries",   [TP_TAG_CREATED] = "created", [TP_TAG_COLS] = "cols",
    [TP_TAG_ROWS] = "rows",       [TP_TAG_WATCH] = "watch",   [TP_TAG_EVENT] = "event",
    [TP_TAG_SID] = "sid",         [TP_TAG_KIND] = "kind",     [TP_TAG_PORT] = "port",
    [TP_TAG_GRACE] = "grace",
    [TP_TAG_GROUPS] = "groups",   [TP_TAG_USER] = "user",
    [TP_TAG_PIDS] = "pids",
};

static int tp__tag_repeated(unsigned tag) {
  return tag == TP_TAG_ARG || tag == TP_TAG_ENV || tag == TP_TAG_ENTRY;
}

/* Pushes a table for fields[0..n).  nested: 1 inside an ENTRY.  Returns -1
 * (nothing pushed) for a hostile payload: a duplicated single field, an
 * ENTRY inside an ENTRY, a nested group that does not parse. */
/* `seen` below holds one bit per tag */
_Static_assert(TP_TAG_MAX_ <= 64, "tags must fit the uint64_t of tp_l_push_fields");

int tp_l_push_fields(lua_State *L, const tp_field_t *fs, int n, int nested,
                           tp_field_t *scratch, int scratch_max) {
  uint64_t seen = 0;
  lua_createtable(L, 0, n < 8 ? n : 8);
  for (int i = 0; i < n; i++) {
    const tp_field_t *f = &fs[i];
    const char *name = tp__tag_names[f->tag];
    if (!tp__tag_repeated(f->tag)) {
      if (seen & (UINT64_C(1) << f->tag))
        goto bad;
      seen |= UINT64_C(1) << f->tag;
    }
    switch (tp_tag_kind(f->tag)) {
    case TP_KIND_INT: {
      int64_t v;
      tp_field_int(f, &v);
      lua_pushinteger(L, (lua_Integer) v);
      lua_setfield(L, -2, name);
      break;
    }
    case TP_KIND_STR:
    case TP_KIND_BYTES:
      if (tp__tag_repeated(f->tag)) {
        if (lua_getfield(L, -1, name) != LUA_TTABLE) {
          lua_pop(L, 1);
          lua_newtable(L);
          lua_pushvalue(L, -1);
          lua_setfield(L, -3, name);
        }
        lua_pushlstring(L, (const char *) f->val, f->len);
        lua_rawseti(L, -2, (lua_Integer) luaL_len(L, -2) + 1);
        lua_pop(L, 1);
      } else {
        lua_pushlstring(L, (const char *) f->val, f->len);
        lua_setfield(L, -2, name);
      }
      break;
    case TP_KIND_NESTED: {
      int m;
      if (nested)
        goto bad;
      m = tp_fields_parse(f->val, f->len, scratch, scratch_max);
      if (m < 0)
        goto bad;
      if (lua_getfield(L, -1, name) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name);
      }
      if (tp_l_push_fields(L, scratch, m, 1, NULL, 0) < 0) {
        lua_pop(L, 1);
        goto bad;
      }
      lua_rawseti(L, -2, (lua_Integer) luaL_len(L, -2) + 1);
      lua_pop(L, 1);
      break;
    }
    default:
      goto bad;
    }
  }
  return 0;
bad:
  lua_pop(L, 1);
  return -1;
}

/* Validates one value of fields table t for tag; raises on a wrong type. */
static void tp__check_field(lua_State *L, unsigned tag, int idx) {
  const char *name = tp__tag_names[tag];
  size_t len;
  switch (tp_tag_kind(tag)) {
  case TP_KIND_INT:
    if (!lua_isinteger(L, idx))
      luaL_error(L, "field '%s' must be an integer", name);
    break;
  case TP_KIND_STR:
  case TP_KIND_BYTES: {
    const char *s = lua_tolstring(L, idx, &len);
    if (s == NULL || lua_type(L, idx) != LUA_TSTRING)
      luaL_error(L, "field '%s' must be a string", name);
    if (len > TP_CHUNK_MAX)
      luaL_error(L, "field '%s' is longer than %d bytes", name, (int) TP_CHUNK_MAX);
    if (tp_tag_kind(tag) == TP_KIND_STR && memchr(s, '\0', len) != NULL)
      luaL_error(L, "field '%s' contains a NUL byte", name);
    break;
  }
  default:
    luaL_error(L, "field '%s' cannot be sent", name);
  }
}

void tp_l_check_fields(lua_State *L, int idx) {
  /* pass 1: every value has the right type (may raise: nothing held yet) */
  for (unsigned tag = 1; tag < TP_TAG_MAX_; tag++) {
    if (tp__tag_names[tag] == NULL) /* a gap in the tag numbers (ranges reserved per feature) */
      continue;
    if (lua_getfield(L, idx, tp__tag_names[tag]) != LUA_TNIL) {
      if (tp__tag_repeated(tag)) {
        luaL_checktype(L, -1, LUA_TTABLE);
        lua_Integer n = (lua_Integer) luaL_len(L, -1);
        if (n > TP_ARGS_MAX)
          luaL_error(L, "field '%s' has too many items", tp__tag_names[tag]);
        for (lua_Integer i = 1; i <= n; i++) {
          lua_rawgeti(L, -1, i);
          tp__check_field(L, TP_TAG_ARG, -1);
          lua_pop(L, 1);
        }
      } else {
        tp__check_field(L, tag, -1);
      }
    }
    lua_pop(L, 1);
  }
}

int tp_l_encode_fields(lua_State *L, int idx, unsigned type, uint32_t id, tp_buf_t *buf) {
  tp_frame_begin(buf, (uint8_t) type, id);
  for (unsigned tag = 1; tag < TP_TAG_MAX_; tag++) {
    if (tp__tag_names[tag] == NULL)
      continue;
    lua_getfield(L, idx, tp__tag_names[tag]);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      continue;
    }
    if (tp__tag_repeated(tag)) {
      lua_Integer n = (lua_Integer) luaL_len(L, -1);
      for (lua_Integer i = 1; i <= n; i++) {
        size_t len;
        lua_rawgeti(L, -1, i);
        const char *s = lua_tolstring(L, -1, &len);
        tp_frame_add(buf, (uint16_t) tag, s, (uint32_t) len);
        lua_pop(L, 1);
      }
    } else if (tp_tag_kind(tag) == TP_KIND_INT) {
      tp_frame_add_int(buf, (uint16_t) tag, (int64_t) lua_tointeger(L, -1));
    } else {
      size_t len;
      const char *s = lua_tolstring(L, -1, &len);
      tp_frame_add(buf, (uint16_t) tag, s, (uint32_t) len);
    }
    lua_pop(L, 1);
  }
  return tp_frame_end(buf);
}
