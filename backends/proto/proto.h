/* tupper agent protocol, version 1.
 *
 * One byte stream (an inherited socketpair for the linux backend) carries
 * frames in both directions.  Everything is little endian.
 *
 *   header (12 bytes): u32 len | u8 version | u8 type | u16 flags | u32 id
 *   payload (len bytes): a sequence of fields
 *   field: u16 tag | u32 len | len bytes
 *
 * Integer fields are exactly 8 bytes (u64 or i64, two's complement).
 * String fields carry no NUL byte; the decoder rejects embedded NULs for
 * tags marked as strings.  Repeated tags are allowed only where noted.
 * A frame whose len exceeds TP_FRAME_MAX, whose version differs, whose
 * type is unknown, or whose fields do not parse is a protocol error: the
 * receiver closes the channel (the host then destroys the box).
 *
 * Requests (host -> agent) carry a non-zero id chosen by the host; the agent
 * answers every request exactly once, with TP_MSG_OK or TP_MSG_ERR and the
 * same id.  Events (agent -> host) carry id 0.
 */
#ifndef TP_PROTO_H
#define TP_PROTO_H

#include <stdint.h>

#define TP_PROTO_VERSION 1
#define TP_FRAME_HDR 12
#define TP_CHUNK_MAX (1024u * 1024u)                 /* data bytes per frame */
#define TP_FRAME_MAX (TP_CHUNK_MAX + 64u * 1024u)    /* payload bytes per frame */
#define TP_STDIN_QUEUE_MAX (4u * 1024u * 1024u)      /* agent-side stdin backlog */
#define TP_ARGS_MAX 4096                             /* ARG + ENV fields per exec */
#define TP_PATH_MAX 4096
#define TP_LIST_MAX 4000    /* entries per FS_LIST reply (below TP_FIELDS_MAX) */
#define TP_GROUPS_MAX 64                             /* ids in a GROUPS field */
#define TP_ID_MAX 65535                              /* largest UID, GID or group (a box maps 65536) */
#define TP_STR_MAX (TP_PATH_MAX * 8)                 /* bytes in any string field (ARG, ENV, ...) */
#define TP_AGENT_FD 3                                /* the channel's fd number inside the box */
#define TP_AGENT_LISTEN_FD 4 /* listening unix socket for a restarted daemon's new channel */

enum tp_msg_type {
  /* agent -> host events (id 0) */
  TP_MSG_READY = 1,        /* VERSION, PID (agent's own pid in the box), FLAGS? (TP_F_READY_*) */
  TP_MSG_OUTPUT = 2,       /* PID, STREAM, DATA */
  TP_MSG_EXIT = 3,         /* PID, CODE (exit status or -1), SIGNAL (0 or signo), FLAGS? (TP_F_EXIT_*) */
  TP_MSG_STDIN_ACK = 4,    /* PID SIZE: a TP_F_EXEC_CREDIT process's pipe took SIZE more bytes of
                              its queued stdin (agent -> host event) */
  /* agent -> host replies (id = request id) */
  TP_MSG_OK = 10,          /* fields depend on the request */
  TP_MSG_ERR = 11,         /* ERRNO, MSG */
  /* host -> agent requests */
  TP_MSG_EXEC = 20,        /* ARG+ ENV* CWD? FLAGS? (UID GID GROUPS? | USER)? -> OK(PID, and with USER:
                              UID CWD) */
  TP_MSG_STDIN = 21,       /* PID DATA -> OK */
  TP_MSG_STDIN_CLOSE = 22, /* PID -> OK */
  TP_MSG_SIGNAL = 23,      /* PID SIGNAL -> OK (signals the process group) */
  TP_MSG_RELEASE = 24,     /* PID -> OK: lets a child held by TP_F_EXEC_HOLD exec */
  TP_MSG_PS = 25,          /* -> OK(ENTRY*), ENTRY = nested PID ARG* : live processes */
  TP_MSG_OUTPUT_ACK = 26,  /* PID STREAM SIZE -> OK: the host took SIZE bytes of a TP_F_EXEC_CREDIT
                              process's output stream: that much more may be sent */
  TP_MSG_FS_READ = 30,     /* PATH OFFSET? LENGTH? -> OK(DATA SIZE) */
  TP_MSG_FS_WRITE = 31,    /* PATH DATA OFFSET? FLAGS? MODE? -> OK(SIZE) */
  TP_MSG_FS_STAT = 32,     /* PATH -> OK(TYPE SIZE MODE MTIME UID GID LINK?) */
  TP_MSG_FS_LIST = 33,     /* PATH -> OK(ENTRY*), ENTRY = NAME TYPE SIZE MODE MTIME UID GID LINK? */
  TP_MSG_FS_MKDIR = 34,    /* PATH MODE? FLAGS? -> OK(CREATED) */
  TP_MSG_FS_REMOVE = 35,   /* PATH FLAGS? -> OK */
  TP_MSG_FS_RENAME = 36,   /* PATH PATH2 -> OK */
  TP_MSG_FS_SETATTR = 37,  /* PATH MODE? MTIME? -> OK: chmod and/or set atime+mtime (seconds),
                              never following a final symlink (a symlink's MODE is ignored) */
  TP_MSG_FS_SYMLINK = 38,  /* PATH LINK -> OK: makes PATH a symlink to LINK (never replaces) */
  TP_MSG_FS_OPEN = 39,     /* PATH FLAGS? MODE? -> OK(TYPE SIZE MODE MTIME): opens PATH as FS_READ
                              (or, FLAGS TP_F_OPEN_WRITE, as FS_WRITE with its TRUNC APPEND
                              PARENTS) does, and sends the open file over the one socket that
                              came with the frame (SCM_RIGHTS on the channel, attached to the
                              frame's first byte): one byte with the fd, then it closes both.
                              Only agents with TP_F_READY_FS_FD know it (an older one takes an
                              unknown type for a protocol error) */
  /* FS_* (30-39) and WATCH_ADD also take UID GID GROUPS?: the agent performs
   * the operation with those filesystem ids and groups (setfsuid, setfsgid,
   * setgroups; GROUPS defaults to {GID}) and returns to root's right after;
   * a switch that fails fails the request.  Without them it acts as root. */
  /* 40-59: terminals and file watching */
  TP_MSG_PTY_RESIZE = 40,  /* PID COLS ROWS -> OK: a process started with TP_F_EXEC_PTY */
  TP_MSG_WATCH_ADD = 41,   /* PATH FLAGS? -> OK(WATCH): inotify on a directory */
  TP_MSG_WATCH_REMOVE = 42, /* WATCH -> OK */
  TP_MSG_WATCH_EVENT = 50, /* agent -> host event (id 0): WATCH EVENT NAME? MSG? */
  /* network relay (docs/network.md).  NET_LISTEN is a request; the others
   * are stream frames with id 0 that go both ways and get no reply. */
  TP_MSG_NET_LISTEN = 60,  /* -> OK: bind the proxy, SOCKS and DNS ports on 127.0.0.1 */
  TP_MSG_NET_OPEN = 61,    /* agent -> host: SID KIND: a connection was accepted (or, KIND
                              TP_NET_CONNECTED, a NET_CONNECT succeeded) */
  TP_MSG_NET_DATA = 62,    /* SID DATA (<= TP_NET_CHUNK): bytes of a stream */
  TP_MSG_NET_ACK = 63,     /* SID SIZE: the receiver delivered SIZE bytes: send credit */
  TP_MSG_NET_EOF = 64,     /* SID: the sender's side will send nothing more */
  TP_MSG_NET_CLOSE = 65,   /* SID ERRNO?: the stream is gone (either side; no reply) */
  TP_MSG_NET_DNS = 66,     /* SID DATA: a DNS query (agent -> host) or its answer */
  TP_MSG_NET_CONNECT = 67, /* host -> agent: SID PORT: connect to 127.0.0.1:PORT in the box */
  TP_MSG_NET_GIVE = 68,    /* host -> agent: SID: hand the stream's box socket to the host (a
                              linux box's agent with TP_F_READY_NET_FD; docs/network.md).
                              agent -> host: SID FD?: FD, the socket's number in the agent,
                              which keeps it until NET_TAKEN; no FD: declined, the stream
                              goes on in frames */
  TP_MSG_NET_TAKEN = 69,   /* host -> agent: SID SIZE: 1, the host took the socket of a
                              NET_GIVE (the agent closes its own and forgets the stream, no
                              NET_CLOSE); 0, it did not (the agent relays it again) */
  /* microvm (types 70-79): the guest of a microVM (backend "microvm") */
  TP_MSG_VM_INIT = 70,     /* NAME (hostname) MTIME (host clock, ns since the epoch) DATA? (up to
                              256 bytes of entropy) -> OK; sent after READY, on a cold boot and
                              on a start from a snapshot; ERR EOPNOTSUPP outside a VM.
                              GRACE? (seconds): how long the guest waits for a daemon once the
                              host end of its port closed (default 60) */
  /* microvm process trees and limits (types 82-84) */
  TP_MSG_VM_LIMITS = 82,   /* PIDS? -> OK: the guest box cgroup's pids.max (absent: no limit);
                              sent after VM_INIT; ERR EOPNOTSUPP outside a VM */
  /* microvm re-adoption (types 85-87) */
  TP_MSG_VM_ATTACH = 85,   /* -> OK: the first request of a daemon that (re)connected to a
                              guest's port: the agent drops what belonged to an earlier
                              connection (watches, network streams) even if it never saw that
                              one close; ERR EOPNOTSUPP outside a VM */
};

enum tp_tag {
  TP_TAG_VERSION = 1,  /* int */
  TP_TAG_PID = 2,      /* int */
  TP_TAG_STREAM = 3,   /* int: 1 stdout, 2 stderr */
  TP_TAG_DATA = 4,     /* bytes, <= TP_CHUNK_MAX */
  TP_TAG_CODE = 5,     /* int */
  TP_TAG_SIGNAL = 6,   /* int */
  TP_TAG_ERRNO = 7,    /* int */
  TP_TAG_MSG = 8,      /* string */
  TP_TAG_ARG = 9,      /* string, repeated */
  TP_TAG_ENV = 10,     /* string "K=V", repeated */
  TP_TAG_CWD = 11,     /* string */
  TP_TAG_FLAGS = 12,   /* int, bit set per request (TP_F_*) */
  TP_TAG_PATH = 13,    /* string */
  TP_TAG_PATH2 = 14,   /* string */
  TP_TAG_OFFSET = 15,  /* int */
  TP_TAG_LENGTH = 16,  /* int */
  TP_TAG_SIZE = 17,    /* int */
  TP_TAG_MODE = 18,    /* int (permission bits) */
  TP_TAG_MTIME = 19,   /* int (seconds since epoch) */
  TP_TAG_UID = 20,     /* int */
  TP_TAG_GID = 21,     /* int */
  TP_TAG_TYPE = 22,    /* int: TP_FT_* */
  TP_TAG_NAME = 23,    /* string */
  TP_TAG_LINK = 24,    /* string (symlink target) */
  TP_TAG_ENTRY = 25,   /* nested fields, repeated */
  TP_TAG_CREATED = 26, /* int 0/1 */
  TP_TAG_COLS = 27,    /* int: terminal columns, 1..TP_PTY_DIM_MAX */
  TP_TAG_ROWS = 28,    /* int: terminal rows, 1..TP_PTY_DIM_MAX */
  TP_TAG_WATCH = 29,   /* int: a watch id (> 0) */
  TP_TAG_EVENT = 30,   /* int: TP_WE_* */
  /* 31-34: accounts */
  TP_TAG_GROUPS = 31,  /* bytes: supplementary group ids, u32 each, 1..TP_GROUPS_MAX of them */
  TP_TAG_USER = 32,    /* string: an account name, looked up in the box's /etc/passwd and
                          /etc/group by the agent (EXEC; agents with TP_F_READY_EXEC_USER) */
  TP_TAG_SID = 40,     /* int: stream id (agent-made < 2^31, host-made >= 2^31) */
  TP_TAG_KIND = 41,    /* int: TP_NET_* */
  TP_TAG_PORT = 42,    /* int */
  TP_TAG_PIDS = 43,    /* int: most processes at once (VM_LIMITS) */
  TP_TAG_GRACE = 46,   /* int: seconds (VM_INIT) */
  TP_TAG_FD = 47,      /* int: a descriptor's number in the agent (NET_GIVE) */
  TP_TAG_MAX_ = 48
};

/* network relay: per-stream flow control.  A sender has at most a window
 * of a stream unacknowledged; a receiver buffers no more, and closes a
 * stream whose sender overruns it.  TP_NET_WINDOW is the box's (agent ->
 * host), TP_NET_WINDOW_DOWN the host's (host -> agent): downloads get the
 * larger one, since a stream moves at most a window per round trip through
 * the daemon and the agent, and the agent's buffer for it is the box's
 * own memory. */
#define TP_NET_WINDOW (256u * 1024u)
#define TP_NET_WINDOW_DOWN (768u * 1024u)
#define TP_NET_CHUNK (64u * 1024u)
#define TP_NET_STREAMS_MAX 64                        /* live streams per box */
#define TP_NET_DNS_MAX 4096                          /* bytes of one DNS message over UDP */
#define TP_NET_HTTP_PORT 3128
#define TP_NET_SOCKS_PORT 1080
#define TP_NET_DNS_PORT 53
enum tp_net_kind { TP_NET_HTTP = 1, TP_NET_SOCKS = 2, TP_NET_DNS_TCP = 3, TP_NET_CONNECTED = 4 };

/* FLAGS bits */
#define TP_F_EXEC_STDIN 0x1u      /* EXEC: keep a stdin pipe open (else /dev/null) */
#define TP_F_EXEC_HOLD 0x2u       /* EXEC: the child waits for RELEASE before it execs (the
                                     host moves it into its own cgroup meanwhile) */
#define TP_F_WRITE_TRUNC 0x1u     /* FS_WRITE: create/truncate before writing */
#define TP_F_WRITE_APPEND 0x2u    /* FS_WRITE: append */
#define TP_F_WRITE_PARENTS 0x4u   /* FS_WRITE: create missing parent dirs */
#define TP_F_OPEN_WRITE 0x8u      /* FS_OPEN: for writing (with FS_WRITE's TRUNC APPEND PARENTS);
                                     without it for reading */
#define TP_F_MKDIR_PARENTS 0x1u   /* FS_MKDIR: like mkdir -p */
#define TP_F_REMOVE_RECURSIVE 0x1u
#define TP_F_EXEC_TREE 0x8u       /* EXEC: the child joins the cgroup whose cgroup.procs fds came
                                     with this frame (SCM_RIGHTS on the channel, attached to the
                                     frame's first byte) before anything else: its tree's cgroup,
                                     made ahead by the host; no HOLD, no RELEASE */
#define TP_F_EXEC_PTY 0x4u        /* EXEC: stdin/stdout/stderr are a new terminal (its controlling
                                     one); COLS and ROWS give its size; output is STREAM 1 */
#define TP_F_WATCH_RECURSIVE 0x1u /* WATCH_ADD: subdirectories too, new ones as they appear */
#define TP_F_READY_NET_DOWN 0x1u  /* READY (FLAGS): this agent takes TP_NET_WINDOW_DOWN unacknowledged
                                      bytes of a download; without it (an agent of an older build,
                                      re-adopted) the host keeps to TP_NET_WINDOW */
#define TP_F_READY_EXEC_USER 0x2u /* READY (FLAGS): this agent takes USER in EXEC (it reads the box's
                                      /etc/passwd and /etc/group itself); without it the host
                                      looks the account up and sends UID GID GROUPS */
#define TP_F_READY_NET_FD 0x4u    /* READY (FLAGS): this agent answers NET_GIVE (hands a relayed
                                      stream's box socket to the host) */
#define TP_F_READY_FS_FD 0x8u     /* READY (FLAGS): this agent answers FS_OPEN (hands an open file
                                      of the box to the host over a socket of the request) */
#define TP_F_READY_NET_LISTEN 0x10u /* READY (FLAGS): this agent listens on its proxy, SOCKS
                                        and DNS ports already (a linux box's agent binds them
                                        before its first READY): the host sends no NET_LISTEN */
#define TP_F_EXIT_OOM 0x1u        /* EXIT (FLAGS, microVM guest agents): the guest kernel's OOM killer
                                     killed it (died of SIGKILL, or exited 137, and /proc/vmstat's
                                     oom_kill rose since the last process found so) */

#define TP_F_EXEC_CREDIT 0x10u    /* EXEC: output is flow-controlled: each stream may have at most
                                     TP_OUT_WINDOW bytes sent and not OUTPUT_ACKed (the agent stops
                                     reading the pipe, so the writer blocks); stdin sends STDIN_ACK */

#define TP_PTY_DIM_MAX 4096       /* most COLS or ROWS */
/* a TP_F_EXEC_CREDIT process: unacknowledged OUTPUT bytes per stream while it
 * runs (OUTPUT frames of up to TP_CHUNK_MAX); at its exit the agent drains
 * TP_OUT_DRAIN_MAX more per stream (and at most one read past it) before
 * EXIT, whatever the credit */
#define TP_OUT_WINDOW (2u * 1024u * 1024u)
#define TP_OUT_DRAIN_MAX TP_CHUNK_MAX

/* watch events (EVENT); NAME is the path relative to the watched directory */
enum tp_watch_event {
  TP_WE_CREATE = 1,   /* created, or moved in */
  TP_WE_WRITE = 2,    /* modified */
  TP_WE_REMOVE = 3,
  TP_WE_RENAME = 4,   /* moved away (the old name) */
  TP_WE_CHMOD = 5,    /* metadata changed */
  TP_WE_OVERFLOW = 6, /* events were lost (MSG says why); the watch goes on */
  TP_WE_END = 7,      /* the watch ended (its directory is gone; MSG says why) */
};

/* file types (TYPE) */
enum tp_file_type { TP_FT_FILE = 1, TP_FT_DIR = 2, TP_FT_SYMLINK = 3, TP_FT_OTHER = 4 };

#endif
