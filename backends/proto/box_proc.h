/* The /proc of every box, on either backend, hardened as container
 * runtimes do: files masked (/dev/null over them, read-only), hardware dirs
 * emptied (an empty read-only tmpfs), kernel knobs read-only.  A linux box's
 * proc is the host kernel's, a microVM's the guest's: a name the kernel
 * lacks is skipped, not an error. */
#ifndef TUPPER_BOX_PROC_H
#define TUPPER_BOX_PROC_H

static const char *const tp_box_proc_masked[] = {
    "kcore", "keys",          "key-users",     "timer_list", "sched_debug",
    "kmsg",  "latency_stats", "sysrq-trigger", "config.gz"};
static const char *const tp_box_proc_emptied[] = {"acpi", "scsi", "asound",
                                                  "firmware"};
static const char *const tp_box_proc_readonly[] = {"sys", "bus", "fs", "irq"};

#define TP_BOX_PROC_N(a) (sizeof(a) / sizeof((a)[0]))

#endif
