/* The /dev every box has, on either backend: the same few character devices
 * (a linux box binds the host's nodes, a microVM's agent makes them) and the
 * same links.  Nothing else: no disks, no consoles, no agent port. */
#ifndef TUPPER_BOX_DEV_H
#define TUPPER_BOX_DEV_H

static const struct {
  const char *name;
  unsigned major, minor;
} tp_box_dev_nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                        {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};

static const struct {
  const char *name;
  const char *target;
} tp_box_dev_links[] = {
    {"ptmx", "pts/ptmx"},          {"fd", "/proc/self/fd"},
    {"stdin", "/proc/self/fd/0"},  {"stdout", "/proc/self/fd/1"},
    {"stderr", "/proc/self/fd/2"},
};

#define TP_BOX_DEV_NODES                                                       \
  (sizeof(tp_box_dev_nodes) / sizeof(tp_box_dev_nodes[0]))
#define TP_BOX_DEV_LINKS                                                       \
  (sizeof(tp_box_dev_links) / sizeof(tp_box_dev_links[0]))

#endif
