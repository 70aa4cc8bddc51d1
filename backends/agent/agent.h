/* tupper-agent: internal API shared by agent.c (main loop, channel, request
 * dispatch), agent_proc.c (exec, stdin, signals, reaping) and agent_fs.c
 * (file operations).
 *
 * The agent is single threaded: one poll() loop over the channel, a signalfd
 * for SIGCHLD and the pipes of the processes it started.  All its state lives
 * in one agent_t owned by main().  A request handler adds its reply fields to
 * a->out, where the dispatcher has already begun an OK frame; on failure it
 * fills err and returns -1, and the dispatcher answers ERR instead.  Events
 * (OUTPUT, EXIT) are only sent from the loop, never while a handler runs, so
 * the OK carrying a pid always precedes that pid's events. */
#ifndef TP_AGENT_H
#define TP_AGENT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "error.h"
#include "frame.h"

#define AGENT_CHAN_FD TP_AGENT_FD
#define AGENT_PROC_MAX 1024                 /* live (unreaped) processes */
#define AGENT_OUTPUT_CHUNK (64u * 1024u)    /* DATA bytes per OUTPUT frame */
#define AGENT_DRAIN_MAX TP_CHUNK_MAX        /* per stream, once its process exited */
#define AGENT_POLL_MAX (2 + 3 * AGENT_PROC_MAX)
#define AGENT_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* One queued piece of a process's stdin. */
typedef struct agent_chunk_s {
  struct agent_chunk_s *next;
  size_t len;
  size_t off;                 /* bytes already written */
  uint8_t data[];
} agent_chunk_t;

typedef struct agent_proc_s {
  pid_t pid;                  /* 0: free slot; also the process group id */
  int out_fd;                 /* read end of its stdout, -1 once closed */
  int err_fd;                 /* read end of its stderr, -1 once closed */
  int in_fd;                  /* write end of its stdin, -1 if none or closed */
  int in_close;               /* close in_fd once the queue drained */
  agent_chunk_t *q_head;
  agent_chunk_t *q_tail;
  size_t queued;              /* bytes not yet written */
} agent_proc_t;

/* A validated request: header fields plus its top-level fields. */
typedef struct agent_req_s {
  uint32_t id;
  uint8_t type;
  int n;
  const tp_field_t *fields;
} agent_req_t;

/* What a pollfd entry past the first two refers to. */
typedef struct agent_pollref_s {
  int16_t slot;
  int16_t stream;             /* 0 stdin, 1 stdout, 2 stderr */
} agent_pollref_t;

typedef struct agent_s {
  int chan;                   /* the channel (SOCK_STREAM) */
  int sigfd;                  /* signalfd for SIGCHLD */
  int dead;                   /* the channel reached EOF or failed */
  uint8_t *rbuf;              /* TP_FRAME_HDR + TP_FRAME_MAX bytes */
  size_t rlen;
  tp_buf_t out;               /* the frame being built and sent */
  uint8_t *fsbuf;             /* TP_CHUNK_MAX bytes, for FS_READ */
  struct rlimit nofile;       /* RLIMIT_NOFILE as inherited, restored in children */
  mode_t umask;               /* umask as inherited, restored in children */
  int nprocs;
  agent_proc_t procs[AGENT_PROC_MAX];
  tp_field_t fields[TP_FIELDS_MAX];
  struct pollfd pfds[AGENT_POLL_MAX];
  agent_pollref_t prefs[AGENT_POLL_MAX];
  uint8_t iobuf[AGENT_OUTPUT_CHUNK];
} agent_t;

/* agent.c: logging, the channel and request helpers. */
void agent_log(const char *fmt, ...) TP_PRINTF(1, 2);
/* Begins an event frame (id 0) in a->out. */
void agent_event_begin(agent_t *a, uint8_t type);
/* Ends the frame in a->out and writes it whole; on a channel error marks
 * the agent dead.  Returns 0 or -1. */
int agent_send(agent_t *a);

/* Checks that every field of r has a tag in `allowed` (a bit per tag) and that
 * only tags in `repeated` occur more than once. */
int agent_req_check(const agent_req_t *r, uint32_t allowed, uint32_t repeated, const char *what,
                    tp_error_t *err);
const tp_field_t *agent_req_get(const agent_req_t *r, uint16_t tag);
/* The integer field `tag`, or def when absent. */
int64_t agent_req_int(const agent_req_t *r, uint16_t tag, int64_t def);
/* Copies the string field `tag` into buf (TP_PATH_MAX + 1 bytes): required,
 * absolute, at most TP_PATH_MAX bytes. */
int agent_req_path(const agent_req_t *r, uint16_t tag, const char *what, char *buf, tp_error_t *err);

#define AGENT_TAG(t) (1u << (t))

/* agent_proc.c */
int agent_proc_exec(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_stdin(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_stdin_close(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_proc_signal(agent_t *a, const agent_req_t *r, tp_error_t *err);
/* Adds the pipes of live processes to a->pfds from index `first`; returns
 * the new count. */
int agent_proc_poll_fill(agent_t *a, int first);
/* Handles readiness of entries first..n-1 (output, stdin writes). */
void agent_proc_poll_handle(agent_t *a, int first, int n);
/* Reaps every exited child: EXIT for ours, silently for orphans. */
void agent_proc_reap(agent_t *a);
/* Channel gone: SIGKILLs every process group, reaps what it can. */
void agent_proc_kill_all(agent_t *a);

/* agent_fs.c */
int agent_fs_read(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_write(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_stat(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_list(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_mkdir(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_remove(agent_t *a, const agent_req_t *r, tp_error_t *err);
int agent_fs_rename(agent_t *a, const agent_req_t *r, tp_error_t *err);

#endif
