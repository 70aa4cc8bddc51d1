#ifndef TP_NSPID_H
#define TP_NSPID_H

#include <stddef.h>
#include <sys/types.h>

#include "error.h"

/* Finds, among host pids `candidates`, the one whose innermost pid (as its
 * box sees it) is box_pid.  ESRCH if none. */
int tp_nspid_host_pid(const pid_t *candidates, size_t n, pid_t box_pid, pid_t *host,
                      tp_error_t *err);

#endif
