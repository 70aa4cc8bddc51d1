/* tupper: the network relay's data path (docs/network.md), in C.
 *
 * The daemon's Lua half (lua/tupper/net/relay.lua) reads what a box asks
 * for on its proxy and SOCKS ports, judges it by the sandbox's rules once
 * per connection and connects upstream.  Once a connection is allowed and
 * established it hands the stream here: from then on the bytes move
 * between the agent's NET_* stream frames and the upstream TCP socket
 * without Lua, with the same per-stream flow control the agent speaks
 * (proto.h: at most TP_NET_WINDOW bytes of the box unacknowledged, and
 * TP_NET_WINDOW_DOWN bytes for the box).
 *
 * Threat model: the box's agent and the upstream server are both hostile.
 * A frame that breaks the protocol (a window overrun, an acknowledgement
 * of more than was sent, data after the box's end) ends that stream with
 * NET_CLOSE, as the Lua half does; nothing a peer sends grows memory past
 * the bounds below.
 *
 * Memory per relayed stream: box -> upstream, one buffer of TP_NET_WINDOW
 * plus the rewritten request head (the box cannot send more unacknowledged,
 * and bytes are acknowledged only once written upstream); upstream -> box,
 * nothing is read while TP_NET_WINDOW_DOWN bytes wait for the agent's
 * acknowledgement.  While the channel's write queue is empty a read is a
 * splice: from the upstream socket into the relay's pipe, the NET_DATA
 * head written to the channel, the bytes spliced after it (page
 * references: no copy in the daemon; the pipe is empty between calls).
 * What the channel does not take at once is read out of the pipe into the
 * relay's spare buffer (TP_NET_CHUNK) and queued, so the frame stays whole.
 * Otherwise reads (up to TP_NET_CHUNK each) land in place in NET_DATA
 * frames that go onto the channel in one write per two chunks, or sooner
 * once the socket is drained.  Either way what is unacknowledged, in the
 * channel's kernel buffer or its write queue, is at most the window.  In
 * all, per stream: TP_NET_WINDOW plus a head of at most as much (box ->
 * upstream), a batch of two chunks, and TP_NET_WINDOW_DOWN on the channel,
 * with the handed-over bytes (at most TP_NET_WINDOW_DOWN + TP_NET_CHUNK)
 * until they are sent: under 3 MiB, for at most TP_NET_STREAMS_MAX streams
 * a box; per box one pipe (two fds) and one spare chunk.  So an upstream
 * that stops reading blocks the box's writer, and one that floods waits on
 * the box.  A stream whose box socket the relay took (tp_netrelay_give)
 * holds that socket too (two fds a stream), reads nothing upstream while
 * what the pipe held (TP__NR_PIPE) waits for the box's socket, and
 * nothing from the box's socket while TP_NET_WINDOW plus the head wait
 * for the upstream: less than a framed stream.
 *
 * Each stream watches its socket with a uv_poll (readable while the window
 * has room, writable while the box's bytes wait) and does its own reads,
 * splices, sends and shutdown.  The daemon ignores SIGPIPE (a splice onto
 * a closed channel would raise it).
 *
 * Lifetime (libuv's rules): tp_netrelay_release is the owner's last call;
 * the relay is freed once its streams' handles are closed.  When the box
 * goes down or stops, every stream is closed quietly (no end callback) and
 * the relay lets go of the box. */
#ifndef TP_NETRELAY_H
#define TP_NETRELAY_H

#include <stddef.h>
#include <stdint.h>

#include "dbox.h"
#include "error.h"

typedef struct tp_netrelay_s tp_netrelay_t;

/* A stream ended by its peers (the agent closed it, the upstream failed,
 * a frame broke the protocol): to_up bytes of the box went upstream,
 * to_box bytes came back; err is 0 or an errno value.  sid is gone. */
typedef void (*tp_netrelay_end_cb)(tp_netrelay_t *nr, uint32_t sid, uint64_t to_up,
                                   uint64_t to_box, int err, void *data);

/* A stream as the Lua half hands it over. */
typedef struct tp_netrelay_take_s {
  uint32_t sid;            /* the agent's (1..2^31-1) */
  int fd;                  /* the connected upstream socket: taken, closed on failure too */
  const uint8_t *up;       /* bytes to write upstream first */
  size_t up_len;
  size_t up_head;          /* of up, the first up_head bytes are the daemon's (a rewritten
                              request head): never acknowledged to the box; the rest are
                              the box's unacknowledged bytes (in_unacked) */
  const uint8_t *down;     /* bytes read upstream, not yet sent to the box */
  size_t down_len;         /* at most TP_NET_WINDOW_DOWN + TP_NET_CHUNK */
  uint32_t out_unacked;    /* bytes sent to the box, not yet acknowledged */
  int box_eof;             /* the box sent NET_EOF */
  int up_eof;              /* the upstream ended */
  int eof_sent;            /* NET_EOF went to the box */
} tp_netrelay_take_t;

/* A relay on box b (one per box: EBUSY for a second).  window_down: the
 * bytes a stream may have unacknowledged towards the box, what its agent
 * takes (TP_NET_WINDOW_DOWN where its READY says TP_F_READY_NET_DOWN, else
 * TP_NET_WINDOW); EINVAL outside TP_NET_CHUNK..TP_NET_WINDOW_DOWN. */
tp_netrelay_t *tp_netrelay_new(tp_dbox_t *b, uint32_t window_down, tp_netrelay_end_cb on_end,
                               void *data, tp_error_t *err);
/* on: the box's agent answers NET_GIVE (its READY said TP_F_READY_NET_FD).
 * Then, on a linux box (whose PID 1 is the agent), a stream taken over is
 * asked for its box socket once a download fills its window (a small or
 * slow one never is, and pays no round trip): once the agent names it, the relay
 * takes it from the agent (pidfd_getfd), checks it is a TCP socket of the
 * box's network namespace on the proxy or SOCKS5 port, and moves the bytes
 * between that socket and the upstream itself, with no frames and no
 * agent in between.  Off (the default) on any other backend: a microVM's
 * pidfd is QEMU's. */
void tp_netrelay_give(tp_netrelay_t *nr, int on);
/* Takes over a stream.  EINVAL for a bad sid or inconsistent counts,
 * EEXIST for a sid it has, EPIPE once the box is gone; t->fd is closed on
 * any failure. */
int tp_netrelay_take(tp_netrelay_t *nr, const tp_netrelay_take_t *t, tp_error_t *err);
/* 1 if sid is relayed here. */
int tp_netrelay_has(const tp_netrelay_t *nr, uint32_t sid);
/* Live streams. */
int tp_netrelay_count(const tp_netrelay_t *nr);
/* Ends sid at the owner's request, with NET_CLOSE to the box if notify;
 * no end callback.  0, or -1 if sid is not here. */
int tp_netrelay_drop(tp_netrelay_t *nr, uint32_t sid, int notify);
/* The owner lets go: every stream is closed (no NET_CLOSE, no callback). */
void tp_netrelay_release(tp_netrelay_t *nr);

#endif
