/* How runtime/host/cgroup.c counts a box's OOM kills, on a fake cgroup tree
 * in a temp dir (no root, no kernel): v2 reads the box's memory.events
 * (hierarchical: its subs' kills are in it), v1 sums the box's
 * memory.oom_control and each sub's (v1 counts a kill in the victim's own
 * cgroup only), a sub on v1 has its own count, a sub on v2 none (no memory
 * controller of its own), and a kernel without the counter gives -1.  The
 * real kernel's v1 behaviour is test_cgroup's (a hog in a sub). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgroup.h"
#include "tap.h"

static char base[] = "/tmp/tupper-cgoom.XXXXXX";

static void put(const char *rel, const char *text) {
  char p[512];
  FILE *f;
  snprintf(p, sizeof(p), "%s/%s", base, rel);
  f = fopen(p, "w");
  if (f == NULL) {
    check(0, "write %s", p);
    return;
  }
  fputs(text, f);
  fclose(f);
}

static void dir(const char *rel) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s", base, rel);
  if (mkdir(p, 0700) < 0)
    check(0, "mkdir %s", p);
}

static char *path(const char *rel) {
  char *p;
  if (asprintf(&p, "%s/%s", base, rel) < 0)
    return NULL;
  return p;
}

int main(void) {
  tp_cgroup_t box = {0}, sub = {0};
  tp_cgroup_stats_t st;
  tp_error_t err = {0};
  char *v2box, *v2sub, *v1box, *v1sub;

  if (mkdtemp(base) == NULL) {
    check(0, "mkdtemp");
    return tap_done();
  }
  /* v2: the box's memory.events counts its subs' kills; a sub has none */
  dir("v2");
  dir("v2/box");
  dir("v2/box/p1");
  put("v2/box/memory.events", "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n");
  v2box = path("v2/box");
  v2sub = path("v2/box/p1");
  box.version = sub.version = 2;
  box.id = sub.id = "box";
  sub.sub = "p1";
  box.path_v2 = v2box;
  sub.path_v2 = v2sub;
  check(tp_cgroup_oom_kills(&box) == 2, "v2: the box's memory.events oom_kill (%" PRId64 ")",
        tp_cgroup_oom_kills(&box));
  check(tp_cgroup_oom_kills(&sub) == -1, "v2: a sub without a memory controller has no count");
  check(tp_cgroup_stats(&box, &st, &err) == 0 && st.oom_kills == 2, "v2: stats say the same (%" PRId64 ")",
        st.oom_kills);
  put("v2/box/memory.events", "low 0\noom 0\n");
  check(tp_cgroup_oom_kills(&box) == -1, "v2: a kernel without oom_kill in memory.events gives -1");

  /* v1: the box's own count plus each sub's; other entries are not subs */
  memset(&box, 0, sizeof(box));
  memset(&sub, 0, sizeof(sub));
  dir("v1");
  dir("v1/box");
  dir("v1/box/p1-ab12");
  dir("v1/box/p2-cd34");
  dir("v1/box/Not_A_Sub");
  put("v1/box/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
  put("v1/box/p1-ab12/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  put("v1/box/p2-cd34/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  put("v1/box/Not_A_Sub/memory.oom_control", "oom_kill 100\n");
  put("v1/box/memory.limit_in_bytes", "67108864\n");
  v1box = path("v1/box");
  v1sub = path("v1/box/p1-ab12");
  box.version = sub.version = 1;
  box.id = sub.id = "box";
  sub.sub = "p1-ab12";
  box.path_v1[TP_CG_MEMORY] = v1box;
  sub.path_v1[TP_CG_MEMORY] = v1sub;
  check(tp_cgroup_oom_kills(&box) == 3, "v1: the box's count is its own and its subs' (%" PRId64 ")",
        tp_cgroup_oom_kills(&box));
  check(tp_cgroup_oom_kills(&sub) == 2, "v1: a sub's is its own (%" PRId64 ")", tp_cgroup_oom_kills(&sub));
  check(tp_cgroup_stats(&box, &st, &err) == 0 && st.oom_kills == 3, "v1: stats say the same (%" PRId64 ")",
        st.oom_kills);
  put("v1/box/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
  check(tp_cgroup_oom_kills(&box) == -1, "v1: a kernel without oom_kill (before 4.13) gives -1");
  box.path_v1[TP_CG_MEMORY] = NULL;
  check(tp_cgroup_oom_kills(&box) == -1, "v1: no memory hierarchy, no count");

  free(v2box);
  free(v2sub);
  free(v1box);
  free(v1sub);
  {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    check(system(cmd) == 0, "the fake tree is removed");
  }
  return tap_done();
}
