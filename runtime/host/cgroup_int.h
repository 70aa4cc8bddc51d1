/* Box cgroups, internals shared by the front (cgroup.c: objects, create,
 * processes, kill, destroy, the parent dir) and the two versions
 * (cgroup_v1.c, cgroup_v2.c), as nsjail keeps cgroup.cc and cgroup2.cc;
 * cgroup_fs.c reads and writes the files. */
#ifndef TP_CGROUP_INT_H
#define TP_CGROUP_INT_H

#include "cgroup.h"

extern const char *const tp__cg_ctrl_name[TP_CG_NCTRL]; /* "memory", "pids", ... */

/* cgroup_fs.c */
long long tp__cg_now_ms(void); /* CLOCK_MONOTONIC */
void tp__cg_nap_ms(long ms);
/* Writes val to dir/file.  With `optional`, a missing file returns 1. */
int tp__cg_write(const char *dir, const char *file, const char *val, int optional,
                 tp_error_t *err);
/* dir/file's text (NUL-terminated, malloc'ed), or NULL and err. */
char *tp__cg_read(const char *dir, const char *file, tp_error_t *err);
/* The value of "key N" lines in text, -1 if absent. */
int64_t tp__cg_keyed(const char *text, const char *key);
/* 1 if word is one of text's space-separated words. */
int tp__cg_has_word(const char *text, const char *word);
/* dir/file as one number, or dir/file's "key N" line: -1 if absent. */
int64_t tp__cg_read_num(const char *dir, const char *file);
int64_t tp__cg_read_keyed(const char *dir, const char *file, const char *key);
int tp__cg_is_dir(const char *p);

/* cgroup_v1.c */
int tp__cg_v1_detect(tp_cgroup_root_t *root, tp_error_t *err);
/* period 0: cpu.cfs_period_us is left as it is (a new cgroup's, 100 ms). */
int tp__cg_v1_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, int64_t period,
                     tp_error_t *err);
int tp__cg_v1_wait_state(const char *dir, const char *want, long long deadline, tp_error_t *err);
/* Freezes or thaws (freezer.state) and waits; a failed freeze is undone. */
int tp__cg_v1_freeze(const char *dir, int frozen, long long deadline, tp_error_t *err);
void tp__cg_v1_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st);
/* memory.oom_control oom_kill of cg, plus its subs' for a box; -1 if none. */
int64_t tp__cg_v1_oom_kills(const tp_cgroup_t *cg);

/* cgroup_v2.c */
/* root->dir is a cgroup2 mount: that is the hierarchy. */
int tp__cg_v2_detect(tp_cgroup_root_t *root, tp_error_t *err);
int tp__cg_v2_enable(const char *dir, unsigned want, unsigned need, tp_error_t *err);
int tp__cg_v2_limits(const tp_cgroup_t *cg, const tp_cgroup_limits_t *lim, int64_t period,
                     tp_error_t *err);
int tp__cg_v2_wait_event(const char *dir, const char *key, int64_t want, long long deadline,
                         tp_error_t *err);
/* Freezes or thaws (cgroup.freeze) and waits; a failed freeze is undone. */
int tp__cg_v2_freeze(const char *dir, int frozen, long long deadline, tp_error_t *err);
void tp__cg_v2_stats(const tp_cgroup_t *cg, tp_cgroup_stats_t *st);

#endif
