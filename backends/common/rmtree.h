/* tupper: removing a tree that untrusted code wrote (a box's upper dir, an
 * image layer being unpacked). */
#ifndef TP_RMTREE_H
#define TP_RMTREE_H

#include "error.h"

/* rm -rf of dir_path without ever following a symlink (openat + O_NOFOLLOW +
 * unlinkat); crossing into another filesystem is refused.  ENOENT is success. */
int tp_rmtree(const char *dir_path, tp_error_t *err);

#endif
