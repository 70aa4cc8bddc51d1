/* tp_dbox_t internals shared by dbox.c (channel), dbox_life.c (start,
 * adopt, destroy) and dbox_tree.c (process trees). */
#ifndef TP_DBOX_INT_H
#define TP_DBOX_INT_H

#include "dbox.h"

#define TP__DBOX_PATH_MAX 4096

/* A box object for dir with no process yet; NULL on ENOMEM. */
tp_dbox_t *tp__dbox_new(const tp_backend_t *be, uv_loop_t *loop, const char *dir);
/* Frees b's memory (its handles must be closed). */
void tp__dbox_free(tp_dbox_t *b);
/* Frees b once it is released, its handles closed and no job pending. */
void tp__dbox_maybe_free(tp_dbox_t *b);
/* A tree job ended (tree_jobs is down by one): runs a held destroy or
 * release once none is left, else frees b if it may. */
void tp__dbox_jobs_done(tp_dbox_t *b);
/* Closes the channel and the exit poll (if tp_dbox_on ran). */
void tp__dbox_stop(tp_dbox_t *b);
int tp__dbox_stop_chan(tp_dbox_t *b);
/* Removes the box's trees and its cgroup (after its processes are dead). */
void tp__dbox_drop_cgroups(tp_dbox_t *b, tp_error_t *err);

#endif
