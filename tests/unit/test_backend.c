/* The backend interface and the daemon's mechanism, reached without Lua
 * but for the limits parser: the registry, each backend's check of a
 * start spec, the one cgroup-dir choice, the job helper on a real loop,
 * and a box start the daemon refuses before anything is queued. */
#include <errno.h>
#include <lauxlib.h>
#include <lualib.h>
#include <stdatomic.h>
#include <unistd.h>
#include <string.h>
#include <uv.h>

#include "backend.h"
#include "cgroup.h"
#include "daemon.h"
#include "dbox.h"
#include "job.h"
#include "l_core.h"
#include "tap.h"

static void test_registry(void) {
  const char *const *names = tp_backend_names();
  const tp_backend_t *lx = tp_backend_find("linux"), *vm = tp_backend_find("microvm");
  int n = 0;
  check(lx != NULL && strcmp(lx->name, "linux") == 0, "registry: linux is found by name");
  check(vm != NULL && strcmp(vm->name, "microvm") == 0, "registry: microvm is found by name");
  check(tp_backend_find("firecracker") == NULL, "registry: an unknown name is NULL");
  check(tp_backend_find(NULL) == NULL, "registry: NULL is NULL");
  for (; names[n] != NULL; n++) {
    const tp_backend_t *be = tp_backend_find(names[n]);
    check(be != NULL && strcmp(be->name, names[n]) == 0, "registry: name %s is its vtable's",
          names[n]);
    check(be != NULL && be->check_start && be->start && be->check_adopt && be->adopt &&
              be->destroy,
          "registry: %s fills every mandatory slot", names[n]);
  }
  check(n == 2 && strcmp(names[0], "linux") == 0, "registry: names in order, linux first");
  /* what differs between them is in the flags, not in a name test */
  check(lx != NULL && (lx->flags & TP_BACKEND_CG_BOX) && (lx->flags & TP_BACKEND_OOM_PROTECT),
        "flags: a linux box lives in its cgroup and its agent is OOM-protected");
  check(vm != NULL && vm->flags == 0, "flags: a microVM's cgroup holds only QEMU");
}

static tp_start_spec_t blank_spec(void) {
  tp_start_spec_t s;
  memset(&s, 0, sizeof(s));
  s.id = "box-1";
  s.dir = "/nonexistent/box-1";
  s.uid_base = s.gid_base = s.id_count = s.disk_bytes = TP_SPEC_UNSET;
  s.uid = s.gid = s.console_fd = TP_SPEC_UNSET;
  return s;
}

static void test_check_start(void) {
  const tp_backend_t *lx = tp_backend_find("linux"), *vm = tp_backend_find("microvm");
  const char *layers[] = {"/l0", NULL};
  const char *argv[] = {"/usr/bin/qemu-system-x86_64", NULL};
  int fds[] = {5};
  tp_error_t err = {0};
  tp_start_spec_t s = blank_spec();
  check(lx->check_start(&s, &err) < 0 && err.code == EINVAL && strstr(err.msg, "layers") != NULL,
        "linux check: layers are required (%s)", err.msg);
  s.layers = layers;
  s.n_layers = 1;
  check(lx->check_start(&s, &err) < 0 && strstr(err.msg, "uid_base") != NULL,
        "linux check: uid_base is required (%s)", err.msg);
  s.uid_base = 100000000;
  check(lx->check_start(&s, &err) == 0 && s.gid_base == 100000000 && s.id_count == 65536 &&
            s.disk_bytes == 0,
        "linux check: gid_base, id_count and disk get their defaults");
  s.n_layers = 129;
  check(lx->check_start(&s, &err) < 0 && strstr(err.msg, "129") != NULL,
        "linux check: at most 128 layers (%s)", err.msg);

  s = blank_spec();
  s.id = "Bad_Id";
  check(vm->check_start(&s, &err) < 0 && strstr(err.msg, "bad id") != NULL,
        "microvm check: the id must be a name (%s)", err.msg);
  s.id = "vm-1";
  s.uid = 0;
  check(vm->check_start(&s, &err) < 0 && strstr(err.msg, "unprivileged") != NULL,
        "microvm check: QEMU never runs as root (%s)", err.msg);
  s.uid = 100130000;
  s.gid = TP_SPEC_UNSET; /* the last check gave it uid's default */
  check(vm->check_start(&s, &err) < 0 && strstr(err.msg, "fds") != NULL,
        "microvm check: fds are required (%s)", err.msg);
  s.fds = fds;
  s.nfds = 1;
  check(vm->check_start(&s, &err) < 0 && strstr(err.msg, "argv") != NULL,
        "microvm check: argv is required (%s)", err.msg);
  s.argv = argv;
  s.argc = 1;
  check(vm->check_start(&s, &err) == 0 && s.gid == 100130000 && s.console_fd == -1,
        "microvm check: gid and console_fd get their defaults");

  tp_adopt_spec_t a = {.id = "vm-1", .dir = "/d", .pid = 1, .uid = 100130000, .start_time = 5};
  check(vm->check_adopt(&a, &err) < 0 && err.code == EINVAL,
        "microvm adopt: a record saying pid 1 is refused, as an expected failure");
  a.pid = 0;
  check(lx->check_adopt(&a, &err) < 0 && err.code == EINVAL,
        "linux adopt: a record saying pid 0 is refused");
}

static void test_cgroup_dirs(void) {
  tp_cgroup_t cg;
  const char *dirs[TP_CG_NCTRL];
  char v2[] = "/sys/fs/cgroup/tupper/a";
  char mem[] = "/c/memory/tupper/a", pids[] = "/c/pids/tupper/a", cpu[] = "/c/cpu,cpuacct/tupper/a";
  char cpu2[] = "/c/cpu,cpuacct/tupper/a", frz[] = "/c/freezer/tupper/a";
  int n;

  memset(&cg, 0, sizeof(cg));
  cg.version = 2;
  cg.path_v2 = v2;
  n = tp_cgroup_dirs(&cg, dirs);
  check(n == 1 && strcmp(dirs[0], v2) == 0, "cgroup dirs: v2 has one");

  memset(&cg, 0, sizeof(cg));
  cg.version = 1;
  cg.path_v1[TP_CG_MEMORY] = mem;
  cg.path_v1[TP_CG_PIDS] = pids;
  cg.path_v1[TP_CG_CPU] = cpu;
  cg.path_v1[TP_CG_CPUACCT] = cpu2; /* the same hierarchy, another string */
  cg.path_v1[TP_CG_FREEZER] = frz;
  n = tp_cgroup_dirs(&cg, dirs);
  check(n == 4, "cgroup dirs: v1 lists a shared hierarchy once (%d)", n);
  check(n == 4 && dirs[0] == mem && dirs[1] == pids && dirs[2] == cpu && dirs[3] == frz,
        "cgroup dirs: v1 in controller order, the first controller's first");

  cg.path_v1[TP_CG_MEMORY] = NULL;
  n = tp_cgroup_dirs(&cg, dirs);
  check(n == 3 && dirs[0] == pids, "cgroup dirs: an unmounted controller is skipped");
}

static int limits_of(lua_State *L) {
  tp_cgroup_limits_t lim;
  tp_l_limits(L, 1, &lim, NULL);
  return 0;
}

static void test_limits(void) {
  lua_State *L = luaL_newstate();
  tp_cgroup_limits_t lim;
  int64_t disk = -1;
  int r;
  luaL_openlibs(L);
  r = luaL_dostring(L, "return { memory = 1048576, pids = 64, cpu_quota = 50000, disk = 4096 }");
  check(r == LUA_OK, "limits: a table");
  tp_l_limits(L, lua_gettop(L), &lim, &disk);
  check(lim.memory == 1048576 && lim.pids == 64 && lim.cpu_quota == 50000 && lim.cpu_period == 0 &&
            disk == 4096,
        "limits: every field read, an absent one is 0");
  lua_settop(L, 0);
  luaL_dostring(L, "return { memory = 12 }");
  tp_l_limits(L, 1, &lim, NULL);
  check(lim.memory == 12 && lim.pids == 0, "limits: without disk (set_limits)");
  lua_settop(L, 0);
  lua_pushcfunction(L, limits_of);
  luaL_dostring(L, "return { memory = 'lots' }");
  r = lua_pcall(L, 1, 0, 0);
  check(r != LUA_OK && strstr(lua_tostring(L, -1), "number expected") != NULL,
        "limits: a value that is not an integer raises (%s)", lua_tostring(L, -1));
  lua_close(L);
}

static atomic_int job_runs;
static int job_afters, job_status_sum;

static void job_work(void *data) {
  atomic_fetch_add(&job_runs, 1);
  (*(int *) data)++;
}

static void job_after(void *data, int status) {
  job_afters++;
  job_status_sum += status;
  check(*(int *) data == 1, "job: after() sees what work() did");
}

static void test_job(void) {
  uv_loop_t loop;
  int data[4] = {0};
  int ok = 1;
  uv_loop_init(&loop);
  for (int i = 0; i < 4; i++)
    ok &= tp_job_queue(&loop, job_work, job_after, &data[i]) == 0;
  check(ok, "job: four queued");
  uv_run(&loop, UV_RUN_DEFAULT);
  check(atomic_load(&job_runs) == 4 && job_afters == 4 && job_status_sum == 0,
        "job: each ran once in the pool, then on the loop");
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "job: the loop closes (the helper freed its requests)");
}

static atomic_int long_now, long_most, long_release;
static int long_afters, short_done;

static void long_work(void *data) {
  int now = atomic_fetch_add(&long_now, 1) + 1, most = atomic_load(&long_most);
  (void) data;
  while (now > most && !atomic_compare_exchange_weak(&long_most, &most, now))
    ;
  for (int i = 0; i < 10000 && !atomic_load(&long_release); i++) /* 10 s at most */
    usleep(1000);
  atomic_fetch_sub(&long_now, 1);
}

static void long_after(void *data, int status) {
  (void) data;
  long_afters += status == 0;
}

static void short_work(void *data) { (void) data; }
static void short_after(void *data, int status) {
  (void) data;
  short_done = status == 0;
}

/* Six long jobs (downloads, unpacks) that do not end until told: at most
 * half the pool runs them, and a short one (a box's) queued after them
 * runs meanwhile. */
static void test_job_long(void) {
  uv_loop_t loop;
  int ok = 1, max = tp_job_long_max();
  uv_loop_init(&loop);
  for (int i = 0; i < 6; i++)
    ok &= tp_job_queue_long(&loop, long_work, long_after, NULL) == 0;
  ok &= tp_job_queue(&loop, short_work, short_after, NULL) == 0;
  check(ok && max >= 1, "job: six long jobs and a short one queued (at most %d long at once)", max);
  for (int i = 0; i < 5000 && !short_done; i++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  check(short_done && long_afters == 0,
        "job: the short one ran while the long ones held their threads (%d running)",
        atomic_load(&long_now));
  atomic_store(&long_release, 1);
  uv_run(&loop, UV_RUN_DEFAULT);
  check(long_afters == 6 && atomic_load(&long_most) <= max,
        "job: all six ran, at most %d at once (%d)", max, atomic_load(&long_most));
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "job: the loop closes");
}

static void never_cb(void *data, tp_dbox_t *b, const tp_error_t *err) {
  (void) b;
  (void) err;
  *(int *) data = 1;
}

static void test_start_refused(void) {
  const tp_backend_t *lx = tp_backend_find("linux");
  const char *layers[] = {"/l0", NULL};
  tp_daemon_t d;
  tp_dbox_start_t req;
  tp_error_t err = {0};
  uv_loop_t loop;
  int called = 0;
  uv_loop_init(&loop);
  tp_daemon_init(&d, "", 0);
  memset(&req, 0, sizeof(req));
  req.spec = blank_spec();
  req.spec.layers = layers;
  req.spec.n_layers = 1;
  req.spec.uid_base = 100000000;
  req.limits.memory = 1 << 20;
  check(tp_dbox_start(&d, &loop, lx, &req, never_cb, &called, &err) < 0 &&
            err.code == EOPNOTSUPP && strstr(err.msg, "limits need cgroups") != NULL,
        "start: limits on a box that lives in its cgroup need cgroups (%s)", err.msg);
  check(d.n_be == 0, "start: refused before the backend's state was made");
  req.spec.n_layers = 0;
  check(tp_dbox_start(&d, &loop, lx, &req, never_cb, &called, &err) < 0 && err.code == EINVAL,
        "start: the backend's check runs first (%s)", err.msg);
  uv_run(&loop, UV_RUN_DEFAULT);
  check(!called, "start: a refused start never calls back");
  tp_daemon_close(&d);
  tp_job_stop(&loop); /* the loop's workers, made at its first job */
  uv_run(&loop, UV_RUN_DEFAULT);
  check(uv_loop_close(&loop) == 0, "start: the loop closes");
}

int main(void) {
  test_registry();
  test_check_start();
  test_cgroup_dirs();
  test_limits();
  test_job();
  test_job_long();
  test_start_refused();
  return tap_done();
}
