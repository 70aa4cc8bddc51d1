/* The agent's directory watches (WATCH_ADD, WATCH_REMOVE, WATCH_EVENT) on
 * one channel to the real tupper-agent (agent_client.h): recursive and flat
 * watches, directories made and moved while watched, the end of a watch
 * whose root goes, and the caps on directories and watches.  Runs as root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "tap.h"
#include "agent_client.h"

/* ---- watching ---------------------------------------------------------------------------- */

static void test_watch(host_t *h, const char *tmp) {
  char w[PATH_MAX], many[PATH_MAX], file[PATH_MAX], d[PATH_MAX];
  int64_t rec, flat, gone;
  int ok = 1;

  join(w, tmp, "/w");
  check(mkdir(w, 0755) == 0 && mkdir(join(d, w, "/sub"), 0755) == 0, "make w/sub");
  rec = watch_add(h, w, TP_F_WATCH_RECURSIVE);
  flat = watch_add(h, w, 0);
  check(rec > 0 && flat > 0 && rec != flat, "WATCH_ADD recursive and flat on one directory -> two ids");

  check(sh_in(h, w, "mkdir -p sub/new/deep"), "mkdir -p sub/new/deep");
  check(wait_wev(h, rec, TP_WE_CREATE, "sub/new") && wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep"),
        "recursive: CREATE for a new directory and for the one made in it at once");
  check(sh_in(h, w, "echo x > sub/new/deep/f"), "write a file in it");
  check(wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep/f") && wait_wev(h, rec, TP_WE_WRITE, "sub/new/deep/f"),
        "CREATE and WRITE three levels down");
  check(sh_in(h, w, "mv sub/new/deep/f sub/new/deep/g"), "rename it");
  check(wait_wev(h, rec, TP_WE_RENAME, "sub/new/deep/f") && wait_wev(h, rec, TP_WE_CREATE, "sub/new/deep/g"),
        "RENAME for the old name, CREATE for the new one");
  check(sh_in(h, w, "chmod 600 sub/new/deep/g"), "chmod it");
  check(wait_wev(h, rec, TP_WE_CHMOD, "sub/new/deep/g"), "CHMOD");
  check(sh_in(h, w, "rm sub/new/deep/g"), "remove it");
  check(wait_wev(h, rec, TP_WE_REMOVE, "sub/new/deep/g"), "REMOVE");
  check(sh_in(h, w, "mv sub/new moved && echo y > moved/deep/h"), "move a watched directory up a level");
  check(wait_wev(h, rec, TP_WE_RENAME, "sub/new") && wait_wev(h, rec, TP_WE_CREATE, "moved") &&
            wait_wev(h, rec, TP_WE_CREATE, "moved/deep/h"),
        "a moved directory is watched under its new name");
  check(sh_in(h, w, "echo z > top"), "a file at the top");
  check(wait_wev(h, flat, TP_WE_CREATE, "top") && wait_wev(h, rec, TP_WE_CREATE, "top"),
        "both watches see the top level");
  check(!wev_has(h, flat, TP_WE_CREATE, "sub/new/deep") && !wev_has(h, flat, TP_WE_CREATE, "moved/deep/h"),
        "the flat watch reports nothing below the top level");

  expect_ok(unwatch_req(h, flat), "WATCH_REMOVE");
  expect_err(unwatch_req(h, flat), ENOENT, "WATCH_REMOVE twice");
  expect_err(unwatch_req(h, -1), EINVAL, "WATCH_REMOVE without WATCH");
  expect_err(watch_req(h, "relative", 0), EINVAL, "WATCH_ADD of a relative path");
  expect_err(watch_req(h, NULL, 0), EINVAL, "WATCH_ADD without PATH");
  expect_err(watch_req(h, join(d, w, "/nonexistent"), 0), ENOENT, "WATCH_ADD of nothing");
  expect_err(watch_req(h, join(file, w, "/top"), 0), ENOTDIR, "WATCH_ADD of a file");
  expect_err(watch_req(h, w, 0x80), EINVAL, "WATCH_ADD with unknown FLAGS");

  /* the root going away ends the watch */
  join(d, tmp, "/gone");
  check(mkdir(d, 0755) == 0, "make gone/");
  gone = watch_add(h, d, TP_F_WATCH_RECURSIVE);
  check(gone > 0 && rmdir(d) == 0, "watch it, remove it");
  check(wait_wev(h, gone, TP_WE_END, ""), "END when the watched directory is gone");
  expect_err(unwatch_req(h, gone), ENOENT, "an ended watch is forgotten");

  /* more directories than a watch may hold */
  join(many, tmp, "/many");
  ok = mkdir(many, 0755) == 0;
  for (int i = 0; ok && i < AGENT_WATCH_DIRS_MAX_T; i++) {
    char name[32];
    snprintf(name, sizeof(name), "/d%d", i);
    ok = mkdir(join(d, many, name), 0755) == 0;
  }
  check(ok, "make %d directories", AGENT_WATCH_DIRS_MAX_T);
  expect_err(watch_req(h, many, TP_F_WATCH_RECURSIVE), ENOSPC, "WATCH_ADD of a tree past the cap");
  {
    int64_t id = watch_add(h, many, 0);
    check(id > 0, "a flat watch of it is fine");
    msg_free(unwatch_req(h, id));
  }

  /* too many watches */
  {
    int64_t ids[80];
    int n = 0;
    msg_t *m = NULL;
    for (; n < 80; n++) {
      m = watch_req(h, tmp, 0);
      if (!msg_is_ok(m))
        break;
      ids[n] = msg_int(m, TP_TAG_WATCH, -1);
      msg_free(m);
      m = NULL;
    }
    check(n < 80 && msg_errno(m) == EMFILE, "WATCH_ADD past the cap -> ERR EMFILE (after %d)", n);
    msg_free(m);
    for (int i = 0; i < n; i++)
      msg_free(unwatch_req(h, ids[i]));
  }
  expect_ok(unwatch_req(h, rec), "WATCH_REMOVE the recursive one");
}

int main(void) {
  const char *agent;
  char tmp[PATH_MAX];
  host_t h;
  int r;

  if ((agent = agent_test_begin("test_agent_watch", tmp, &r)) == NULL)
    return r;
  if (agent_session(&h, "test_agent_watch", agent, tmp, NULL) < 0)
    return 1;
  test_watch(&h, tmp);
  agent_session_close(&h);
  return agent_test_end(tmp);
}
