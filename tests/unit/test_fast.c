/* Unit tests for the C client of exec and run (runtime/client): its JSON
 * replies' reader (jansson within the client's bounds) with hostile text, its argv classifier against the Lua CLI's
 * parse, the conditions it leaves to the Lua CLI, and the whole client
 * (tp_fast_main, in a child) against a daemon played here that answers
 * well, lies, sends too much or breaks the grammar: a clear error and 125,
 * never a crash or a hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fargv.h"
#include "fast.h"
#include "fast_int.h"
#include "freply.h"
#include "sframe.h"
#include "tap.h"

/* ------------------------------------------------------------------ JSON */

static int parses(const char *s) {
  json_t *v = tp_freply_parse(s, strlen(s), NULL);
  json_decref(v);
  return v != NULL;
}

/* A text of n bytes: open, then fill up to n - strlen(close), then close. */
static char *text_of(const char *open, const char *fill, const char *close, size_t n) {
  char *s = malloc(n + 1);
  size_t have = strlen(open), fl = strlen(fill);
  memcpy(s, open, have);
  while (have + fl + strlen(close) <= n) {
    memcpy(s + have, fill, fl);
    have += fl;
  }
  strcpy(s + have, close);
  return s;
}

static void test_json(void) {
  static const char *const bad[] = {
    "", "{", "}", "{\"a\":1,}", "[1,]", "{\"a\" 1}", "{a:1}", "{\"a\":1} x", "[01]", "[-]", "[1.]",
    "[.5]", "[1e]", "[tru]", "[nul]", "[NaN]", "[\"a]", "[\"\\x\"]", "[\"\\u12\"]", "[\"a\tb\"]",
    "{\"a\":1 \"b\":2}", "[1 2]", "{\"a\":}", "['a']", "[\"\\u12g4\"]", "[\"\\u0000\"]", "[\"\\ud800x\"]",
    "[\"\xff\"]", "[\"\xc3\"]", "[1e400]",
  };
  static const char *const good[] = {
    "{}", "[]", "[0]", "[-0]", "[1.5e-3]", "[\"\"]", "[true,false,null]", " { \"a\" : [ 1 , { } ] } ",
    "[\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"]",
  };
  tp_error_t err;
  char buf[64], deep[80];
  int64_t v = 0;
  int ok = 1;
  json_t *j, *t;
  const char *s;
  char *big;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (parses(bad[i])) {
      diag("taken: %s", bad[i]);
      ok = 0;
    }
  check(ok, "json: %zu texts that break the grammar (or UTF-8, or hold a NUL) are refused",
        sizeof(bad) / sizeof(bad[0]));
  ok = 1;
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
    if (!parses(good[i])) {
      diag("refused: %s", good[i]);
      ok = 0;
    }
  check(ok, "json: %zu valid texts are taken", sizeof(good) / sizeof(good[0]));

  /* nesting: 32 levels are taken, 33 are not (jansson alone takes 2048) */
  memset(deep, '[', 32);
  memset(deep + 32, ']', 32);
  deep[64] = '\0';
  check(parses(deep), "json: 32 levels of nesting are taken");
  memset(deep, '[', 33);
  memset(deep + 33, ']', 33);
  deep[66] = '\0';
  check(tp_freply_parse(deep, 66, &err) == NULL && strstr(err.msg, "deep") != NULL,
        "json: 33 levels are refused (%s)", err.msg);
  /* values: the array and 16383 in it are taken, one more is not */
  big = text_of("[0", ",0", "]", 2 + 2 * (TP_FREPLY_VALUES - 2) + 1);
  check(parses(big), "json: %d values are taken", TP_FREPLY_VALUES);
  free(big);
  big = text_of("[0", ",0", "]", 2 + 2 * (TP_FREPLY_VALUES - 1) + 1);
  check(tp_freply_parse(big, strlen(big), &err) == NULL && strstr(err.msg, "too many") != NULL,
        "json: %d values are refused (%s)", TP_FREPLY_VALUES + 1, err.msg);
  free(big);
  /* 1 MiB of empty objects: jansson's allocations pass the budget */
  big = text_of("[{}", ",{}", "]", TP_FAST_LINE_MAX);
  check(tp_freply_parse(big, strlen(big), &err) == NULL && strstr(err.msg, "MiB") != NULL,
        "json: a line that takes more than %u MiB to hold is refused (%s)", TP_FREPLY_ALLOC >> 20, err.msg);
  free(big);
  /* and a 1 MiB string is within it */
  big = text_of("[\"", "x", "\"]", TP_FAST_LINE_MAX);
  check(parses(big), "json: a string of 1 MiB is taken");
  free(big);
  /* a NUL inside the text is a byte the grammar has no place for */
  j = tp_freply_parse("{\"a\":1}\0", 8, &err);
  check(j == NULL, "json: a NUL after the value is refused (%s)", err.msg);

  s = "{\"id\":3,\"a\":{\"b\":\"x\"},\"id\":4,\"n\":-1,\"f\":1.5,\"big\":9007199254740993,"
      "\"huge\":99999999999999999999999,\"e\":1e3,\"s\":\"a\\\"\\u00e9\\ud83d\\ude00\\n\"}";
  j = tp_freply_parse(s, strlen(s), &err);
  check(j != NULL, "json: an object is parsed (%s)", j ? "" : err.msg);
  check(tp_freply_int(json_object_get(j, "id"), &v) == 0 && v == 4,
        "json: a repeated key gives its last value, as lua-cjson does");
  t = json_object_get(j, "a");
  check(json_is_object(t) && tp_freply_str(json_object_get(t, "b"), buf, sizeof(buf)) == 1 && strcmp(buf, "x") == 0,
        "json: a nested member is found");
  check(json_object_get(j, "b") == NULL && json_object_get(j, "nope") == NULL,
        "json: members are looked up at their own level only");
  check(tp_freply_int(json_object_get(j, "n"), &v) == 0 && v == -1, "json: -1 is an integer");
  check(tp_freply_int(json_object_get(j, "f"), &v) < 0, "json: 1.5 is no integer");
  check(tp_freply_int(json_object_get(j, "big"), &v) < 0 && tp_freply_int(json_object_get(j, "huge"), &v) < 0,
        "json: past 2^53 is no integer (and past 2^63 no error)");
  check(tp_freply_int(json_object_get(j, "e"), &v) == 0 && v == 1000, "json: 1e3 is 1000");
  check(tp_freply_int(json_object_get(j, "s"), &v) < 0 && tp_freply_str(json_object_get(j, "n"), buf, sizeof(buf)) < 0,
        "json: a string is no number, a number no string");
  check(tp_freply_int(NULL, &v) < 0 && tp_freply_str(NULL, buf, sizeof(buf)) < 0 &&
            json_object_get(json_object_get(j, "n"), "x") == NULL,
        "json: a member that is not there, or of no object, is nothing");
  check(tp_freply_str(json_object_get(j, "s"), buf, sizeof(buf)) == 9 &&
            memcmp(buf, "a\"\xc3\xa9\xf0\x9f\x98\x80\n", 10) == 0,
        "json: escapes, \\u and a surrogate pair are unescaped to UTF-8");
  check(tp_freply_str(json_object_get(j, "s"), buf, 9) < 0, "json: a string that does not fit is refused");
  json_decref(j);

  {
    tp__fout_t w = { 0 };
    tp__fout_add(&w, json_pack("{s:s}", "k", "a\"b\\c\n\t\x01\x7f\xc3\xa9"));
    tp__fout_add(&w, json_pack("[i]", 2));
    check(!w.failed && w.len == 33 && memcmp(w.b, "{\"k\":\"a\\\"b\\\\c\\n\\t\\u0001\x7f\xc3\xa9\"}\n[2]\n", 33) == 0,
          "json: requests are written compact and escaped, one a line (%.*s)", (int) w.len, w.b);
    j = tp_freply_parse(w.b, 29, &err);
    check(j != NULL && tp_freply_str(json_object_get(j, "k"), buf, sizeof(buf)) == 11 &&
              strcmp(buf, "a\"b\\c\n\t\x01\x7f\xc3\xa9") == 0,
          "json: what is written reads back the same");
    json_decref(j);
    tp__fout_add(&w, json_pack("{s:s}", "k", "a\xff"));
    check(w.failed, "json: a string that is not UTF-8 fails the request, and it stays failed");
    tp__fout_free(&w);
    {
      tp__fast_t c;
      memset(&c, 0, sizeof(c));
      c.next_id = 5;
      const char *want = "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"m\",\"params\":{}}\n";
      check(tp__fast_call(&c, &w, "m", json_object()) == 5 && !w.failed && w.len == strlen(want) &&
                memcmp(w.b, want, w.len) == 0,
            "json: a call is written with its id, method and params");
      tp__fout_free(&w);
      tp__fast_call(&c, &w, "m", NULL);
      check(w.failed, "json: a call whose params could not be made is not written (no \"params\":null)");
      tp__fout_free(&w);
    }
  }
}

/* --------------------------------------------------------------- buffers */

/* The readers' and the requests' first bytes are in .bss: a line longer
 * than a reader's 64 KiB moves to the heap with what was read, and a
 * second request while the first holds the .bss bytes gets the heap. */
static void test_buffers(void) {
  static char first[TP__FLINE_FIRST];
  tp_error_t err;
  int sv[2];
  size_t big = TP__FLINE_FIRST + 40000, len, used;
  char *line, *text = malloc(big + 8);
  int ok;

  ok = text != NULL && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0;
  check(ok, "buffers: socketpair");
  if (!ok) {
    free(text);
    return;
  }
  for (size_t i = 0; i < big; i++)
    text[i] = (char) ('a' + i % 26);
  memcpy(text + big, "\nok\n", 4);
  /* a writer in a child: the socket holds less than the line */
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    for (size_t off = 0; off < big + 4;) {
      ssize_t w = write(sv[1], text + off, big + 4 - off);
      if (w <= 0)
        _exit(1);
      off += (size_t) w;
    }
    _exit(0);
  }
  close(sv[1]);
  tp__fline_t l;
  tp__fline_init(&l, sv[0], first);
  tp_error_clear(&err);
  while ((line = tp__fline_take(&l, &len, &used)) == NULL && tp__fline_fill(&l, &err) > 0)
    ;
  check(line != NULL && len == big && memcmp(line, text, big) == 0 && l.owned && l.buf != first,
        "buffers: a line of %zu bytes is read whole, the reader's .bss bytes moved to the heap (%s)", big,
        err.msg);
  if (line != NULL)
    tp__fline_drop(&l, used);
  while ((line = tp__fline_take(&l, &len, &used)) == NULL && tp__fline_fill(&l, &err) > 0)
    ;
  check(line != NULL && len == 2 && memcmp(line, "ok", 2) == 0, "buffers: the next line follows it");
  tp__fline_free(&l);
  close(sv[0]);
  waitpid(pid, NULL, 0);
  tp__fline_init(&l, -1, first);
  check(l.buf == first && l.cap == TP__FLINE_FIRST && !l.owned, "buffers: a new reader starts in .bss again");
  tp__fline_free(&l);

  {
    tp__fout_t w1 = { 0 }, w2 = { 0 }, w3 = { 0 };
    char *six = strndup(text, 6000);
    json_t *s = json_string(six); /* 6000 bytes: ["..."] and its newline are 6005 */
    free(six);
    tp__fout_add(&w1, json_pack("[i]", 1));
    tp__fout_add(&w2, json_pack("[i]", 2));
    check(w1.in_bss && !w2.in_bss && w1.len == 4 && w2.len == 4 && memcmp(w1.b, "[1]\n", 4) == 0 &&
              memcmp(w2.b, "[2]\n", 4) == 0,
          "buffers: a request while another holds the .bss bytes gets the heap");
    tp__fout_add(&w1, json_pack("[O]", s));
    tp__fout_add(&w1, json_pack("[O]", s));
    ok = !w1.failed && !w1.in_bss && w1.len == 4 + 2 * 6005 && memcmp(w1.b, "[1]\n[\"", 6) == 0 &&
         w1.b[w1.len - 1] == '\n';
    check(ok, "buffers: a request past 8 KiB moves to the heap with what it held (%zu bytes)", w1.len);
    tp__fout_add(&w3, json_pack("[i]", 3));
    check(w3.in_bss, "buffers: and leaves the .bss bytes to the next");
    tp__fout_free(&w1);
    tp__fout_free(&w2);
    tp__fout_free(&w3);
    json_decref(s);
  }
  free(text);
}

/* ------------------------------------------------------------------ argv */

/* Splits a command line at spaces (no quoting: the cases need none). */
static int words(char *line, char **argv, int max) {
  int n = 0;
  for (char *w = strtok(line, " "); w && n < max - 1; w = strtok(NULL, " "))
    argv[n++] = strcmp(w, "''") == 0 ? (char *) "" : w;
  argv[n] = NULL;
  return n;
}

static void test_argv(void) {
  /* what the Lua CLI's parse makes of each (cli.lua, cli_args.lua): mine
   * (1) with the fields the C client sends, or the Lua CLI's (0) */
  static const struct {
    const char *line;
    int mine;
    const char *id, *cmd0, *workdir, *image, *socket;
    int ncmd, nenv, interactive;
  } cases[] = {
#define LUA(l) { .line = l, .mine = 0 }
    { "tupper exec b -- true", 1, "b", "true", NULL, NULL, NULL, 1, 0, 0 },
    { "tupper exec b true x", 1, "b", "true", NULL, NULL, NULL, 2, 0, 0 },
    { "tupper exec -- b true", 1, "b", "true", NULL, NULL, NULL, 1, 0, 0 },
    { "tupper exec b -- -- x", 1, "b", "--", NULL, NULL, NULL, 2, 0, 0 },
    { "tupper exec b -- -x", 1, "b", "-x", NULL, NULL, NULL, 1, 0, 0 },
    { "tupper exec -e A=1 -eB=2 --env C=3 --env=D= -w /t b sh", 1, "b", "sh", "/t", NULL, NULL, 1, 4, 0 },
    { "tupper exec b -w/x -- ls", 1, "b", "ls", "/x", NULL, NULL, 1, 0, 0 },
    { "tupper exec --workdir= b ls", 1, "b", "ls", "", NULL, NULL, 1, 0, 0 },
    { "tupper exec -ie A=1 b cat", 1, "b", "cat", NULL, NULL, NULL, 1, 1, 1 },
    { "tupper exec --interactive b cat", 1, "b", "cat", NULL, NULL, NULL, 1, 0, 1 },
    { "tupper exec -iwe b cat", 1, "b", "cat", "e", NULL, NULL, 1, 0, 1 },
    { "tupper --socket /s exec b true", 1, "b", "true", NULL, NULL, "/s", 1, 0, 0 },
    { "tupper --socket=/s exec b true", 1, "b", "true", NULL, NULL, "/s", 1, 0, 0 },
    { "tupper run -- true", 1, NULL, "true", NULL, NULL, NULL, 1, 0, 0 },
    { "tupper run true", 1, NULL, "true", NULL, NULL, NULL, 1, 0, 0 },
    { "tupper run --rm --image default -e X=y -- sh -c x", 1, NULL, "sh", NULL, "default", NULL, 3, 1, 0 },
    { "tupper run --image=alpine --no-policy ls", 1, NULL, "ls", NULL, "alpine", NULL, 1, 0, 0 },
    LUA("tupper exec b"),                    /* missing CMD */
    LUA("tupper exec"),
    LUA("tupper run"),                       /* the image's command, or /bin/sh */
    LUA("tupper run --"),
    LUA("tupper exec -t b sh"),              /* a terminal: Lua's */
    LUA("tupper exec -it b sh"),
    LUA("tupper exec --tty b sh"),
    LUA("tupper exec --detach-keys x b sh"),
    LUA("tupper exec -h"),
    LUA("tupper exec --help b true"),
    LUA("tupper exec -x b true"),            /* unknown: the Lua CLI says so */
    LUA("tupper exec --nope b true"),
    LUA("tupper exec -e b true"),            /* not K=V */
    LUA("tupper exec -e =v b true"),
    LUA("tupper exec --interactive=1 b true"), /* a flag with a value */
    LUA("tupper exec -w"),
    LUA("tupper exec --image x b true"),     /* run's option, not exec's */
    LUA("tupper exec --rm b true"),
    { "tupper run --memory 1G --disk=512mib --cpus 0.5 --pids 10 --timeout 1h30m true", 1, NULL, "true", NULL,
      NULL, NULL, 1, 0, 0 },
    { "tupper run --timeout 5 --memory 64M --memory 7 true", 1, NULL, "true", NULL, NULL, NULL, 1, 0, 0 },
    LUA("tupper run --memory 1.5G true"),     /* a spelling the Lua parser takes: its own */
    LUA("tupper run --memory 1X true"),
    LUA("tupper run --memory 99999T true"),   /* past 2^46 */
    LUA("tupper run --disk '' true"),
    LUA("tupper run --pids 0 true"),
    LUA("tupper run --pids 0x10 true"),
    LUA("tupper run --cpus abc true"),
    LUA("tupper run --cpus 1e3 true"),
    LUA("tupper run --timeout 1y true"),
    LUA("tupper run --timeout 31d true"),
    LUA("tupper run --timeout 1H true"),
    LUA("tupper exec --memory 1G b true"),    /* run's, not exec's */
    LUA("tupper run --policy p.lua true"),
    LUA("tupper run --recipe python true"),
    LUA("tupper run -v v:/d true"),
    LUA("tupper run --allow a:1 true"),
    LUA("tupper run --metadata a=b true"),
    LUA("tupper --autostart exec b true"),   /* may start a daemon */
    LUA("tupper --state-dir /d exec b true"),
    LUA("tupper --socket"),
    LUA("tupper --socket '' exec b true"),
    LUA("tupper --version"),
    LUA("tupper -h exec b true"),
    LUA("tupper ls"),
    LUA("tupper execute b true"),
    LUA("tupper - exec b true"),
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char line[256], *argv[32];
    tp_fargv_t a;
    int argc, mine, ok;
    snprintf(line, sizeof(line), "%s", cases[i].line);
    argc = words(line, argv, 32);
    mine = tp_fargv_parse(argc, argv, &a);
    ok = mine == cases[i].mine;
    if (ok && mine) {
      ok = a.ncmd == cases[i].ncmd && strcmp(a.cmd[0], cases[i].cmd0) == 0 && a.nenv == cases[i].nenv &&
           a.interactive == cases[i].interactive &&
           (cases[i].id ? a.id && strcmp(a.id, cases[i].id) == 0 : a.id == NULL) &&
           (cases[i].workdir ? a.workdir && strcmp(a.workdir, cases[i].workdir) == 0 : a.workdir == NULL) &&
           (cases[i].image ? a.image && strcmp(a.image, cases[i].image) == 0 : a.image == NULL) &&
           (cases[i].socket ? a.socket && strcmp(a.socket, cases[i].socket) == 0 : a.socket == NULL);
    }
    check(ok, "argv: %s: %s", cases[i].line, cases[i].mine ? "the C client's" : "the Lua CLI's");
  }
  {
    char line[] = "tupper exec -e A=1 -e B=2 -e A=3 b env";
    char *argv[16];
    tp_fargv_t a;
    int argc = words(line, argv, 16);
    check(tp_fargv_parse(argc, argv, &a) == 1 && a.nenv == 3 && tp_fargv_key_len(a.env[2]) == 1 &&
              strcmp(a.env[2], "A=3") == 0,
          "argv: every -e is kept in order (the last of a key wins when sent)");
  }
  {
    char *argv[TP_FARGV_ENV_MAX * 2 + 8];
    char kv[TP_FARGV_ENV_MAX + 1][16];
    tp_fargv_t a;
    int n = 0;
    argv[n++] = "tupper";
    argv[n++] = "exec";
    for (int i = 0; i <= TP_FARGV_ENV_MAX; i++) {
      snprintf(kv[i], sizeof(kv[i]), "K%d=v", i);
      argv[n++] = "-e";
      argv[n++] = kv[i];
    }
    argv[n++] = "b";
    argv[n++] = "env";
    argv[n] = NULL;
    check(tp_fargv_parse(n, argv, &a) == 0, "argv: more than %d -e are the Lua CLI's", TP_FARGV_ENV_MAX);
  }
}

/* ------------------------------------------------------------ conditions */

static void test_mine(const char *dir) {
  char *exec_argv[] = { "tupper", "exec", "b", "true", NULL };
  char *exec_i[] = { "tupper", "exec", "-i", "b", "cat", NULL };
  char *run_argv[] = { "tupper", "run", "true", NULL };
  char *run_np[] = { "tupper", "run", "--no-policy", "true", NULL };
  char *exec_long[] = { "tupper", "exec", NULL, "true", NULL };
  char longid[TP_FAST_ID_MAX + 1], cwd[4096], pol[4200], sub[4200];
  tp_fargv_t a;
  int saved_out = dup(1), saved_in = dup(0), devnull = open("/dev/null", O_WRONLY);
  int master = -1, slave = -1, p[2], f;

  /* the checks' own output is on fd 1: it points at /dev/null meanwhile */
  fflush(stdout);
  dup2(devnull, 1);
  int r_plain = tp_fast_mine(4, exec_argv, &a);
  int r_utf8 = 0;
  {
    char *bad_cmd[] = { "tupper", "exec", "box1", "echo", "\xff", NULL };
    char *bad_env[] = { "tupper", "exec", "-e", "A=\xc3", "box1", "true", NULL };
    char *bad_id[] = { "tupper", "exec", "b\xffx", "true", NULL };
    char *good[] = { "tupper", "exec", "-e", "A=\xc3\xa9", "box1", "echo", "\xf0\x9f\x98\x80", NULL };
    r_utf8 = tp_fast_mine(5, bad_cmd, &a) + 2 * tp_fast_mine(6, bad_env, &a) + 4 * tp_fast_mine(4, bad_id, &a) +
             8 * tp_fast_mine(7, good, &a);
  }
  setenv("TUPPER_CLIENT", "lua", 1);
  int r_lua = tp_fast_mine(4, exec_argv, &a);
  unsetenv("TUPPER_CLIENT");
  int r_tty = -1;
  if (openpty(&master, &slave, NULL, NULL, NULL) == 0) {
    dup2(slave, 1);
    r_tty = tp_fast_mine(4, exec_argv, &a);
    dup2(devnull, 1);
    dup2(slave, 2);
    r_tty += 2 * tp_fast_mine(4, exec_argv, &a);
    dup2(saved_out, 2); /* stderr back where the test runner had it */
    dup2(slave, 0);
    r_tty += 4 * tp_fast_mine(5, exec_i, &a);
    r_tty += 8 * !tp_fast_mine(4, exec_argv, &a); /* without -i stdin is not read */
    dup2(saved_in, 0);
  }
  close(0);
  int r_closed = tp_fast_mine(4, exec_argv, &a);
  dup2(saved_in, 0);
  pipe(p);
  dup2(p[0], 0);
  int r_pipe = tp_fast_mine(5, exec_i, &a);
  snprintf(pol, sizeof(pol), "%s/in", dir);
  f = open(pol, O_RDWR | O_CREAT | O_TRUNC, 0600);
  dup2(f, 0);
  int r_file = tp_fast_mine(5, exec_i, &a);
  dup2(saved_in, 0);
  close(f);
  close(p[0]);
  close(p[1]);
  /* run: a tupper.lua here or in a parent makes the policy the Lua CLI's */
  getcwd(cwd, sizeof(cwd));
  snprintf(sub, sizeof(sub), "%s/a/b", dir);
  snprintf(pol, sizeof(pol), "%s/a", dir);
  mkdir(pol, 0700);
  mkdir(sub, 0700);
  chdir(sub);
  int r_run = tp_fast_mine(3, run_argv, &a);
  snprintf(pol, sizeof(pol), "%s/a/tupper.lua", dir);
  f = open(pol, O_WRONLY | O_CREAT, 0600);
  close(f);
  int r_run_pol = tp_fast_mine(3, run_argv, &a);
  int r_run_np = tp_fast_mine(4, run_np, &a);
  int r_exec_pol = tp_fast_mine(4, exec_argv, &a);
  chdir(cwd);
  unlink(pol);
  memset(longid, 'x', TP_FAST_ID_MAX);
  longid[TP_FAST_ID_MAX] = '\0';
  exec_long[2] = longid;
  int r_long = tp_fast_mine(4, exec_long, &a);
  dup2(saved_out, 1);
  close(saved_out);
  close(saved_in);
  close(devnull);

  check(r_plain == 1, "mine: exec with no terminal is the C client's");
  check(r_lua == 0, "mine: TUPPER_CLIENT=lua asks for the Lua CLI");
  if (master >= 0) {
    check(r_tty == 0, "mine: a terminal on stdout or on stderr is the Lua CLI's (its filter), on stdin with -i too (%d)", r_tty);
    close(master);
    close(slave);
  }
  check(r_utf8 == 8, "mine: a word that is not UTF-8 is the Lua CLI's, UTF-8 is taken (%d)", r_utf8);
  check(r_pipe == 1, "mine: -i with a pipe on stdin is the C client's");
  check(r_closed == 0, "mine: a closed stdin is the Lua CLI's (a socket would take its number)");
  check(r_file == 1, "mine: -i with a regular file on stdin is the C client's");
  check(r_run == 1, "mine: run with no tupper.lua from here up is the C client's");
  check(r_run_pol == 0, "mine: run with a tupper.lua in a parent directory is the Lua CLI's");
  check(r_run_np == 1, "mine: run --no-policy ignores the tupper.lua");
  check(r_exec_pol == 1, "mine: exec sends no policy: a tupper.lua changes nothing");
  check(r_long == 0, "mine: an id of %d bytes is the Lua CLI's", TP_FAST_ID_MAX);
  snprintf(pol, sizeof(pol), "%s/a/b", dir);
  rmdir(pol);
  snprintf(pol, sizeof(pol), "%s/a", dir);
  rmdir(pol);
  snprintf(pol, sizeof(pol), "%s/in", dir);
  unlink(pol);
}

/* ------------------------------------------------------- a daemon played */

#define FELL_BACK 200 /* the child's exit when tp_fast_main left it to Lua */

typedef struct scen_s {
  const char *name;
  const char *hello;   /* the reply to hello; NULL: 2 MiB without a newline */
  const char *start;   /* the reply to process.start; NULL: none (hello ends it) */
  int frames;          /* 1: stdout's "hi\n" and both ENDs; 2: a bad frame; 0: none */
  const char *after;   /* lines on the control connection after the frames */
  int code;            /* the exit code expected */
  const char *err;     /* in stderr */
  const char *want;    /* in the process.start request */
  int old_channel;     /* stream.channel refuses the client's token (a daemon before them) */
  int attach_refused;  /* the attach is answered with an error: 1 each time, 2 the first time only */
} scen_t;

#define HELLO_OK "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocol\":1,\"streams\":1,\"process_streams\":1}}"
#define HELLO_WAIT \
  "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocol\":1,\"streams\":1,\"process_streams\":1,\"attach_wait\":5000}}"
#define START_OK "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"pid\":7,\"streams\":{\"stdout\":1,\"stderr\":2}}}"
#define EXIT(f) "{\"jsonrpc\":\"2.0\",\"method\":\"process.exit\",\"params\":{\"sandbox\":\"box1\",\"pid\":7," f "}}\n"

static int wait_fd(int fd, int ms) {
  struct pollfd pf = { .fd = fd, .events = POLLIN };
  return poll(&pf, 1, ms) == 1;
}

/* Reads from fd until n lines came (or 5 s passed); what came in buf. */
static size_t read_lines(int fd, char *buf, size_t cap, int n) {
  size_t have = 0;
  while (have + 1 < cap && wait_fd(fd, 5000)) {
    ssize_t r = read(fd, buf + have, cap - 1 - have);
    int lines = 0;
    if (r <= 0)
      break;
    have += (size_t) r;
    buf[have] = '\0';
    for (char *q = buf; (q = strchr(q, '\n')) != NULL; q++)
      lines++;
    if (lines >= n)
      break;
  }
  buf[have] = '\0';
  return have;
}

static void put(int fd, const void *b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0)
      return; /* the client went: what it did is judged by its exit */
    b = (const char *) b + w;
    n -= (size_t) w;
  }
}

static void puts_line(int fd, const char *s) {
  put(fd, s, strlen(s));
  put(fd, "\n", 1);
}

static int accept_one(int lfd) {
  if (!wait_fd(lfd, 5000))
    return -1;
  return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static char *slurp(const char *path) {
  static char buf[8192];
  int fd = open(path, O_RDONLY);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
  buf[n > 0 ? n : 0] = '\0';
  if (fd >= 0)
    close(fd);
  return buf;
}

static void run_scen(const char *dir, const scen_t *s) {
  char sock[100], out[300], errp[300], req[65536];
  struct sockaddr_un sa;
  int lfd, cfd = -1, dfd = -1, status = 0, code = -1;
  char *argv[] = { "tupper", "exec", "-e", "A=1", "-e", "A=2", "-w", "/tmp", "box1", "echo", "a\"b", NULL };
  pid_t pid;

  snprintf(sock, sizeof(sock), "%s/d.sock", dir);
  snprintf(out, sizeof(out), "%s/out", dir);
  snprintf(errp, sizeof(errp), "%s/err", dir);
  unlink(sock);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
  lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0) {
    check(0, "%s: listen: %s", s->name, strerror(errno));
    return;
  }
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600), e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int c = 0;
    dup2(o, 1);
    dup2(e, 2);
    setenv("TUPPER_SOCKET", sock, 1);
    unsetenv("TUPPER_CLIENT");
    alarm(10); /* a hang is a failure, not a stuck test */
    if (!tp_fast_main(11, argv, &c))
      c = FELL_BACK;
    _exit(c);
  }
  cfd = accept_one(lfd);
  if (cfd >= 0) {
    char token[64] = "", *t;
    /* hello, stream.channel with the client's token and process.start, in one write */
    read_lines(cfd, req, sizeof(req), 3);
    check(strstr(req, "\"hello\"") != NULL && strstr(req, "\"stream.channel\"") != NULL &&
              strstr(req, "\"process.start\"") != NULL,
          "%s: hello, stream.channel and process.start come at once", s->name);
    if (s->want)
      check(strstr(req, s->want) != NULL, "%s: process.start says %s (%s)", s->name, s->want, req);
    if ((t = strstr(req, "\"token\":\"")) != NULL)
      sscanf(t + 9, "%63[^\"]", token);
    check(strlen(token) == 32 && strspn(token, "0123456789abcdef") == 32, "%s: the channel's token is %s",
          s->name, token);
    if (s->hello == NULL) {
      static char big[2 * 1024 * 1024];
      memset(big, 'x', sizeof(big));
      put(cfd, big, sizeof(big));
    } else {
      puts_line(cfd, s->hello);
    }
    /* the attach comes without waiting for any reply */
    dfd = accept_one(lfd);
    if (dfd >= 0)
      read_lines(dfd, req, sizeof(req), 1);
    check(dfd >= 0 && strstr(req, "\"stream.attach\"") != NULL && strstr(req, token) != NULL,
          "%s: the attach names the token (%s)", s->name, req);
    if (s->start != NULL && s->old_channel) {
      puts_line(cfd, "{\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-32602,\"message\":\"unknown parameter 'token'\"}}");
      puts_line(cfd, s->start);
    } else if (s->start != NULL && dfd >= 0) {
      const char *att = s->attach_refused
                            ? "{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32602,\"message\":\"no\"}}"
                            : "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocol\":1,\"window\":4194304,\"frame_max\":1048576}}";
      char ch[128];
      snprintf(ch, sizeof(ch), "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"token\":\"%s\"}}", token);
      puts_line(cfd, ch);
      puts_line(dfd, att);
      if (s->attach_refused) {
        /* refused (as if read before its channel): the client attaches
         * once more, and takes a second refusal as the end */
        int d2 = accept_one(lfd);
        if (d2 >= 0)
          read_lines(d2, req, sizeof(req), 1);
        check(d2 >= 0 && strstr(req, token) != NULL, "%s: a second attach with the token (%s)", s->name, req);
        close(dfd);
        dfd = d2;
        if (dfd >= 0)
          puts_line(dfd, s->attach_refused == 2
                             ? "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocol\":1,\"window\":4194304,\"frame_max\":1048576}}"
                             : att);
      }
      puts_line(cfd, s->start);
      if (s->frames) {
        uint8_t f[256];
        size_t n = 0;
        n += tp_sframe_open(f + n, 1, TP_SK_STDOUT, 0);
        n += tp_sframe_open(f + n, 2, TP_SK_STDERR, 0);
        if (s->frames == 2) {
          memcpy(f + n, "\x05\x00\x00\x00\x09\x02\x00\x00\x01\x00\x00\x00hi\n!!", 17); /* version 9 */
          n += 17;
        } else {
          tp_sframe_header(f + n, TP_SF_DATA, 1, 3);
          memcpy(f + n + TP_SF_HDR, "hi\n", 3);
          n += TP_SF_HDR + 3;
          n += tp_sframe_end(f + n, 1, 1, 3);
          n += tp_sframe_end(f + n, 2, 1, 0);
        }
        put(dfd, f, n);
      }
      if (s->after)
        put(cfd, s->after, strlen(s->after));
    }
  }
  /* the client decides when it is done: the connections stay open until
   * then, unless the scenario closes them ("after" NULL with a start) */
  if (s->start != NULL && s->after == NULL && cfd >= 0) {
    close(cfd);
    cfd = -1;
  }
  if (waitpid(pid, &status, 0) == pid)
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
  if (cfd >= 0)
    close(cfd);
  if (dfd >= 0)
    close(dfd);
  close(lfd);
  unlink(sock);
  {
    char *e = slurp(errp);
    check(code == s->code && (s->err == NULL || strstr(e, s->err) != NULL),
          "%s: exit %d (want %d), stderr: %s", s->name, code, s->code, e);
  }
  if (s->frames == 1 && s->code != FELL_BACK)
    check(strcmp(slurp(out), "hi\n") == 0, "%s: stdout has the process's bytes", s->name);
  unlink(out);
  unlink(errp);
}

static void test_daemon(const char *dir) {
  static const scen_t scens[] = {
    { "exit code", HELLO_OK, START_OK, 1, EXIT("\"exit_code\":3,\"signal\":0"), 3, NULL,
      "{\"sandbox\":\"box1\",\"argv\":[\"echo\",\"a\\\"b\"],\"env\":{\"A\":\"2\"},\"cwd\":\"/tmp\",\"stdin\":false,\"streams\":true}", 0, 0 },
    { "signal", HELLO_OK, START_OK, 1, EXIT("\"exit_code\":-1,\"signal\":9"), 137, NULL, NULL, 0, 0 },
    { "oom", HELLO_OK, START_OK, 1, EXIT("\"exit_code\":-1,\"signal\":9,\"oom_killed\":true"), 137,
      "out of memory", NULL, 0, 0 },
    { "no exit code", HELLO_OK, START_OK, 1, EXIT("\"signal\":0"), 125, NULL, NULL, 0, 0 },
    { "another pid's exit first",
      HELLO_OK, START_OK, 1,
      "{\"jsonrpc\":\"2.0\",\"method\":\"process.exit\",\"params\":{\"sandbox\":\"box1\",\"pid\":8,\"exit_code\":9}}\n"
      "{\"jsonrpc\":\"2.0\",\"method\":\"process.exit\",\"params\":{\"sandbox\":\"box2\",\"pid\":7,\"exit_code\":9}}\n"
      "{\"jsonrpc\":\"2.0\",\"method\":\"other\"}\n" EXIT("\"exit_code\":4"), 4, NULL, NULL, 0, 0 },
    { "hello too long", NULL, NULL, 0, NULL, 125, "longer than", NULL, 0, 0 },
    { "hello malformed", "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{", NULL, 0, NULL, 125, "malformed", NULL, 0, 0 },
    { "hello nested too deep",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
      NULL, 0, NULL, 125, "deep", NULL, 0, 0 },
    { "hello not an object", "[1]", NULL, 0, NULL, 125, "not an object", NULL, 0, 0 },
    { "hello neither result nor error", "{\"jsonrpc\":\"2.0\",\"id\":1}", NULL, 0, NULL, 125, "neither", NULL, 0, 0 },
    { "hello refused", "{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32602,\"message\":\"protocol 1?\"}}",
      NULL, 0, NULL, 125, "tupper: hello: protocol 1?", NULL, 0, 0 },
    { "a daemon without process streams", "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"streams\":1}}", NULL, 0,
      NULL, FELL_BACK, NULL, NULL, 0, 0 },
    { "start: ENOENT", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32003,\"message\":\"exec 'echo': nope\",\"data\":{\"code\":\"ENOENT\"}}}",
      0, NULL, 127, "tupper: exec 'echo': nope", NULL, 0, 0 },
    { "start: EACCES", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32003,\"message\":\"m\",\"data\":{\"code\":\"EACCES\"}}}", 0,
      NULL, 126, "tupper: m", NULL, 0, 0 },
    { "start: no such sandbox", HELLO_OK, "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32000,\"message\":\"no sandbox 'box1'\"}}",
      0, NULL, 125, "tupper: no sandbox 'box1'", NULL, 0, 0 },
    { "start: no pid", HELLO_OK, "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"streams\":{\"stdout\":1,\"stderr\":2}}}", 0,
      NULL, 125, "no pid", NULL, 0, 0 },
    { "start: one stream twice", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"pid\":7,\"streams\":{\"stdout\":1,\"stderr\":1}}}", 0, NULL, 125,
      "twice", NULL, 0, 0 },
    { "start: a client's stream id", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"pid\":7,\"streams\":{\"stdout\":2147483648,\"stderr\":1}}}", 0, NULL,
      125, "no stdout stream", NULL, 0, 0 },
    { "start: pid 1.5", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"pid\":1.5,\"streams\":{\"stdout\":1,\"stderr\":2}}}", 0, NULL, 125,
      "no pid", NULL, 0, 0 },
    { "the daemon goes before the exit", HELLO_OK, START_OK, 1, NULL, 125, "lost the connection", NULL, 0, 0 },
    { "a bad frame", HELLO_OK, START_OK, 2, EXIT("\"exit_code\":0"), 125, "output stream failed", NULL, 0, 0 },
    { "with attach_wait", HELLO_WAIT, START_OK, 1, EXIT("\"exit_code\":5"), 5, NULL, NULL, 0, 0 },
    { "the attach refused once, then taken", HELLO_WAIT, START_OK, 1, EXIT("\"exit_code\":6"), 6, NULL, NULL, 0, 2 },
    { "the attach refused: no fall back once the start is out", HELLO_OK, START_OK, 0, EXIT("\"exit_code\":0"),
      125, "refused the data connection", NULL, 0, 1 },
    { "a daemon that takes no token of the client's: the start failed, the Lua CLI's", HELLO_OK,
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":-32600,\"message\":\"'streams': no data connection\"}}", 0,
      NULL, FELL_BACK, NULL, NULL, 1, 0 },
    { "a daemon that takes no token of the client's yet started it", HELLO_OK, START_OK, 0, NULL, 125,
      "without its data connection", NULL, 1, 0 },
  };
  for (size_t i = 0; i < sizeof(scens) / sizeof(scens[0]); i++)
    run_scen(dir, &scens[i]);
}

int main(void) {
  char dir[] = "/tmp/tupper-test-fast.XXXXXX";
  signal(SIGPIPE, SIG_IGN);
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_json();
  test_buffers();
  test_argv();
  test_mine(dir);
  test_daemon(dir);
  rmdir(dir);
  printf("1..%d\n", tap_num);
  return tap_failed ? 1 : 0;
}
