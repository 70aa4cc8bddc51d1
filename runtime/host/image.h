/* tupper: the embedded default image (busybox), laid out on the host for
 * boxes of any backend. */
#ifndef TP_IMAGE_H
#define TP_IMAGE_H

#include <stddef.h>
#include <sys/types.h>

#include "error.h"

/* Lays out the embedded default image (busybox) at `rootfs` if it is not
 * there yet (atomically: built in a temp dir next to it, then renamed):
 * /bin/busybox plus one symlink per applet (applets: busybox --list-full
 * output, one path per line), /etc/passwd, /etc/group, /etc/hostname,
 * /etc/resolv.conf, /root, /tmp (1777), /home/user, /proc, /dev, /sys.
 * Every file is owned by uid_base/gid_base (root in the box). */
int tp_image_default_ensure(const char *rootfs, const void *busybox, size_t busybox_len,
                            const char *applets, size_t applets_len, uid_t uid_base,
                            gid_t gid_base, tp_error_t *err);

#endif
