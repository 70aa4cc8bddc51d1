/* The C client's command lines (fargv.h).  The walk over the words is
 * cli_args.parse's, kept in step with it: a word the Lua parser would
 * take differently, or refuse, makes the line the Lua CLI's. */
#include "fargv.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define TP__FARGV_SIZE_MAX (1ull << 46)        /* units.SIZE_MAX */
#define TP__FARGV_DURATION_MAX (30ull * 86400) /* units.DURATION_MAX, seconds */

/* n decimal digits at s (1..max of them, no more): their value, or -1. */
static long long tp__fargv_digits(const char *s, int max, int *n) {
  long long v = 0;
  int k = 0;
  while (isdigit((unsigned char) s[k]) && k < max)
    v = v * 10 + (s[k++] - '0');
  if (k == 0 || isdigit((unsigned char) s[k]))
    return -1;
  *n = k;
  return v;
}

/* A size units.size takes: digits and one of its units, at most 2^46. */
static int tp__fargv_size(const char *v) {
  static const struct { const char *u; unsigned shift; } U[] = {
    { "", 0 }, { "b", 0 }, { "k", 10 }, { "kb", 10 }, { "kib", 10 }, { "m", 20 }, { "mb", 20 },
    { "mib", 20 }, { "g", 30 }, { "gb", 30 }, { "gib", 30 }, { "t", 40 }, { "tb", 40 }, { "tib", 40 },
  };
  int n = 0;
  long long num = tp__fargv_digits(v, 12, &n);
  char unit[4];
  size_t ul;
  if (num < 0 || (ul = strlen(v + n)) >= sizeof(unit))
    return -1;
  for (size_t k = 0; k <= ul; k++)
    unit[k] = (char) tolower((unsigned char) v[n + k]);
  for (size_t k = 0; k < sizeof(U) / sizeof(U[0]); k++)
    if (strcmp(unit, U[k].u) == 0)
      return (unsigned long long) num <= (TP__FARGV_SIZE_MAX >> U[k].shift) ? 0 : -1;
  return -1;
}

/* --pids: a whole number of at least 1. */
static int tp__fargv_pids(const char *v) {
  int n;
  return v[0] != '0' && tp__fargv_digits(v, 9, &n) > 0 && v[n] == '\0' ? 0 : -1;
}

/* --cpus: digits, a fraction of at most 6. */
static int tp__fargv_cpus(const char *v) {
  int n, m;
  if (tp__fargv_digits(v, 4, &n) < 0)
    return -1;
  if (v[n] == '\0')
    return 0;
  return v[n] == '.' && tp__fargv_digits(v + n + 1, 6, &m) >= 0 && v[n + 1 + m] == '\0' ? 0 : -1;
}

/* --timeout: seconds, or parts like 1h30m (units.duration, lower case). */
static int tp__fargv_duration(const char *v) {
  unsigned long long total = 0;
  int n;
  long long num = tp__fargv_digits(v, 7, &n);
  if (num >= 0 && v[n] == '\0')
    return (unsigned long long) num <= TP__FARGV_DURATION_MAX ? 0 : -1;
  while (*v) {
    static const struct { const char *u; unsigned long long ms; } U[] = {
      { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 }, { "d", 86400000 },
    };
    size_t k;
    num = tp__fargv_digits(v, 7, &n);
    if (num < 0)
      return -1;
    v += n;
    for (k = 0; k < sizeof(U) / sizeof(U[0]); k++) {
      size_t l = strlen(U[k].u);
      if (strncmp(v, U[k].u, l) == 0 && !isalpha((unsigned char) v[l])) {
        total += (unsigned long long) num * U[k].ms;
        v += l;
        break;
      }
    }
    if (k == sizeof(U) / sizeof(U[0]) || total > TP__FARGV_DURATION_MAX * 1000)
      return -1;
  }
  return 0;
}

size_t tp_fargv_key_len(const char *kv) {
  const char *eq = strchr(kv, '=');
  return eq ? (size_t) (eq - kv) : strlen(kv);
}

/* -e's value: K=V with a key of at least one byte (cli_args: ^([^=]+)=(.*)$). */
static int tp__fargv_env(tp_fargv_t *a, const char *v) {
  const char *eq = strchr(v, '=');
  if (eq == NULL || eq == v || a->nenv >= TP_FARGV_ENV_MAX)
    return -1;
  a->env[a->nenv++] = v;
  return 0;
}

/* One option that takes a value (by its short letter), or a flag. */
static int tp__fargv_opt(tp_fargv_t *a, char o, const char *val) {
  switch (o) {
  case 'e': return tp__fargv_env(a, val);
  case 'w': a->workdir = val; return 0;
  case 'I': a->image = val; return 0;
  case 'i': a->interactive = 1; return 0;
  case 'r': return 0; /* run --rm: the default */
  case 'P': a->no_policy = 1; return 0;
  case 'M': a->memory = val; return tp__fargv_size(val);
  case 'D': a->disk = val; return tp__fargv_size(val);
  case 'C': a->cpus = val; return tp__fargv_cpus(val);
  case 'N': a->pids = val; return tp__fargv_pids(val);
  case 'T': a->timeout = val; return tp__fargv_duration(val);
  default: return -1;
  }
}

/* The long options of the verb: its letter above, and whether it takes a
 * value; 0 for one the C client leaves to the Lua CLI. */
static char tp__fargv_long(tp_fargv_verb_t verb, const char *name, size_t len, int *valued) {
  static const struct { const char *name; char o; int valued, run_only; } L[] = {
    { "env", 'e', 1, 0 }, { "workdir", 'w', 1, 0 }, { "interactive", 'i', 0, 0 },
    { "image", 'I', 1, 1 }, { "rm", 'r', 0, 1 }, { "no-policy", 'P', 0, 1 },
    { "memory", 'M', 1, 1 }, { "disk", 'D', 1, 1 }, { "cpus", 'C', 1, 1 }, { "pids", 'N', 1, 1 },
    { "timeout", 'T', 1, 1 },
  };
  for (size_t k = 0; k < sizeof(L) / sizeof(L[0]); k++) {
    if (strlen(L[k].name) == len && memcmp(L[k].name, name, len) == 0) {
      if (L[k].run_only && verb != TP_FV_RUN)
        return 0;
      *valued = L[k].valued;
      return L[k].o;
    }
  }
  return 0;
}

/* The verb's words (after it), as cli_args.parse walks them. */
static int tp__fargv_verb(tp_fargv_t *a, int argc, char *const *argv, int i) {
  int cmd_at = a->verb == TP_FV_EXEC ? 1 : 0; /* positionals before CMD */
  int npos = 0, no_opts = 0;
  for (; i < argc; i++) {
    const char *w = argv[i];
    if (!no_opts && strcmp(w, "--") == 0) {
      no_opts = 1;
    } else if (!no_opts && strncmp(w, "--", 2) == 0) {
      const char *name = w + 2, *eq = strchr(name, '=');
      size_t len = eq ? (size_t) (eq - name) : strlen(name);
      int valued = 0;
      char o = tp__fargv_long(a->verb, name, len, &valued);
      const char *val = NULL;
      if (o == 0)
        return 0;
      if (!valued) {
        if (eq)
          return 0; /* "takes no value": the Lua CLI says so */
      } else if (eq) {
        val = eq + 1;
      } else {
        if (i + 1 >= argc)
          return 0;
        val = argv[++i];
      }
      if (tp__fargv_opt(a, o, val) < 0)
        return 0;
    } else if (!no_opts && w[0] == '-' && w[1] != '\0') {
      for (size_t j = 1; w[j] != '\0'; j++) {
        char o = w[j];
        if (o == 'i') {
          a->interactive = 1;
          continue;
        }
        if (o != 'e' && o != 'w')
          return 0; /* -t, -h, -v, ... or unknown: the Lua CLI's */
        if (w[j + 1] != '\0') {
          if (tp__fargv_opt(a, o, w + j + 1) < 0)
            return 0;
        } else {
          if (i + 1 >= argc || tp__fargv_opt(a, o, argv[++i]) < 0)
            return 0;
        }
        break;
      }
    } else if (npos == cmd_at) {
      a->cmd = argv + i;
      a->ncmd = argc - i;
      return 1;
    } else {
      a->id = w; /* exec's one positional */
      npos++;
    }
  }
  return 0; /* no command: `run` then runs the image's or /bin/sh, exec refuses */
}

int tp_fargv_parse(int argc, char *const *argv, tp_fargv_t *a) {
  int i = 1;
  memset(a, 0, sizeof(*a));
  /* the global options: up to the first word that is not one */
  while (i < argc && argv[i][0] == '-' && strcmp(argv[i], "-") != 0) {
    const char *w = argv[i];
    if (strcmp(w, "--socket") == 0) {
      if (i + 1 >= argc)
        return 0;
      a->socket = argv[i + 1];
      i += 2;
    } else if (strncmp(w, "--socket=", 9) == 0) {
      a->socket = w + 9;
      i++;
    } else {
      return 0; /* --state-dir and --autostart start daemons; -h, --version: the Lua CLI's */
    }
  }
  if (a->socket != NULL && a->socket[0] == '\0')
    return 0;
  if (i >= argc)
    return 0;
  if (strcmp(argv[i], "exec") == 0)
    a->verb = TP_FV_EXEC;
  else if (strcmp(argv[i], "run") == 0)
    a->verb = TP_FV_RUN;
  else
    return 0;
  if (!tp__fargv_verb(a, argc, argv, i + 1)) {
    a->verb = TP_FV_NONE;
    return 0;
  }
  return 1;
}
