/* Requests the real tupper-agent (agent_client.h) must refuse or survive:
 * missing, doubled and unexpected fields, host frames of event types, a
 * microVM guest's requests outside a microVM, a request sent byte by byte
 * and two in one write; then separate agents for frames whose fields or
 * header do not parse, which must answer ERR or exit, never die by a
 * signal.  Runs as root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "frame.h"
#include "tap.h"
#include "agent_client.h"

/* ---- requests and frames ----------------------------------------------------------------- */

/* The microVM guest's requests are refused by an agent that is not one
 * (a linux box's): nothing of the guest set-up runs in a box. */
static void test_vm_requests(host_t *h) {
  req_begin(h, TP_MSG_VM_ATTACH);
  expect_err(req_call(h), EOPNOTSUPP, "VM_ATTACH outside a microVM");
  tp_buf_t *b = req_begin(h, TP_MSG_VM_INIT);
  tp_frame_add_str(b, TP_TAG_NAME, "x");
  tp_frame_add_int(b, TP_TAG_MTIME, 1);
  tp_frame_add_int(b, TP_TAG_GRACE, 1);
  expect_err(req_call(h), EOPNOTSUPP, "VM_INIT outside a microVM");
}

static void test_bad_requests(host_t *h, const char *tmp) {
  tp_buf_t *b;
  msg_t *m;

  b = req_begin(h, TP_MSG_FS_READ);
  m = req_call(h);
  check(msg_errno(m) == EINVAL && msg_has_text(m, "no PATH"), "FS_READ without PATH -> ERR EINVAL");
  msg_free(m);
  b = req_begin(h, TP_MSG_EXEC);
  tp_frame_add_str(b, TP_TAG_ARG, "/bin/true");
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  expect_err(req_call(h), EINVAL, "EXEC with a PATH field");
  b = req_begin(h, TP_MSG_FS_STAT);
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  tp_frame_add_str(b, TP_TAG_PATH, "/");
  expect_err(req_call(h), EINVAL, "FS_STAT with PATH twice");
  b = req_begin(h, TP_MSG_FS_WRITE);
  tp_frame_add_str(b, TP_TAG_PATH, "/nonexistent/x");
  expect_err(req_call(h), EINVAL, "FS_WRITE without DATA");
  b = req_begin(h, TP_MSG_STDIN);
  tp_frame_add(b, TP_TAG_DATA, "x", 1);
  expect_err(req_call(h), EINVAL, "STDIN without PID");
  b = req_begin(h, TP_MSG_OK);
  expect_err(req_call(h), EINVAL, "an OK frame from the host");
  b = req_begin(h, TP_MSG_EXIT);
  tp_frame_add_int(b, TP_TAG_PID, 1);
  expect_err(req_call(h), EINVAL, "an EXIT frame from the host");
  /* a microVM guest's requests, refused by an agent that is not one */
  b = req_begin(h, TP_MSG_VM_LIMITS);
  tp_frame_add_int(b, TP_TAG_PIDS, 10);
  expect_err(req_call(h), EOPNOTSUPP, "VM_LIMITS outside a VM");

  /* An event-typed frame with id 0 is ignored; a request byte by byte, and
   * two requests in one write, are all answered. */
  tp_buf_reset(&h->req);
  tp_frame_begin(&h->req, TP_MSG_READY, 0);
  tp_frame_end(&h->req);
  h->cur_id = ++h->next_id;
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, h->cur_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, tmp);
  tp_frame_end(&h->req);
  for (size_t i = 0; i < h->req.len; i++)
    if (send_all(h, h->req.data + i, 1) < 0)
      break;
  m = wait_reply(h, h->cur_id);
  check(msg_is_ok(m) && msg_int(m, TP_TAG_TYPE, 0) == TP_FT_DIR,
        "an id-0 READY is ignored; a request sent byte by byte is answered");
  msg_free(m);

  tp_buf_reset(&h->req);
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, ++h->next_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, "/");
  tp_frame_end(&h->req);
  tp_frame_begin(&h->req, TP_MSG_FS_STAT, ++h->next_id);
  tp_frame_add_str(&h->req, TP_TAG_PATH, "relative");
  tp_frame_end(&h->req);
  send_all(h, h->req.data, h->req.len);
  m = wait_reply(h, h->next_id - 1);
  check(msg_is_ok(m), "first of two requests in one write -> OK");
  msg_free(m);
  expect_err(wait_reply(h, h->next_id), EINVAL, "second of two requests in one write");
}

/* A separate agent for a frame whose fields do not parse (unknown tag): it
 * may answer ERR or close the channel, but must not die by a signal. */
static void test_hostile_fields(const char *agent, const char *tmp) {
  host_t h;
  uint8_t raw[64];
  size_t n;
  int status;
  msg_t *m;

  if (agent_start(&h, agent, tmp, NULL) < 0) {
    check(0, "start a second agent");
    return;
  }
  /* EXEC: ARG "/bin/true", then a field with tag 99 */
  memset(raw, 0, sizeof(raw));
  n = TP_FRAME_HDR;
  raw[n] = TP_TAG_ARG;
  raw[n + 2] = 9;
  memcpy(raw + n + 6, "/bin/true", 9);
  n += 15;
  raw[n] = 99;
  raw[n + 2] = 8;
  n += 14;
  raw[0] = (uint8_t) (n - TP_FRAME_HDR);
  raw[4] = TP_PROTO_VERSION;
  raw[5] = TP_MSG_EXEC;
  raw[8] = 7;
  check(send_all(&h, raw, n) == 0, "send EXEC with an unknown field tag");
  m = wait_reply(&h, 7);
  if (m != NULL) {
    check(msg_errno(m) == EINVAL, "unknown field tag -> ERR EINVAL");
    msg_free(m);
    /* the channel is still in sync */
    m = path_req(&h, TP_MSG_FS_STAT, "/");
    check(msg_is_ok(m), "the agent still answers after a malformed request");
    msg_free(m);
    close(h.fd);
    h.fd = -1;
  } else {
    check(h.eof, "unknown field tag -> the agent closed the channel");
  }
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status), "the agent exited without a signal (status 0x%x)", status);
  host_free(&h);
}

/* Separate agents for frames whose header does not parse: they must exit
 * (the host then destroys the box), without a signal. */
static void test_hostile_header(const char *agent, const char *tmp, uint32_t len, uint8_t version,
                                uint8_t type, const char *what) {
  host_t h;
  uint8_t raw[TP_FRAME_HDR] = {0};
  long long deadline;
  int status;

  if (agent_start(&h, agent, tmp, NULL) < 0) {
    check(0, "start an agent");
    return;
  }
  for (int i = 0; i < 4; i++)
    raw[i] = (uint8_t) (len >> (8 * i));
  raw[4] = version;
  raw[5] = type;
  raw[8] = 1;
  send_all(&h, raw, sizeof(raw));
  deadline = now_ms() + TIMEOUT_MS;
  while (pump(&h, deadline) == 0)
    ;
  check(h.eof && h.bad_frames == 0, "%s: the agent closes the channel", what);
  status = agent_wait(&h);
  check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 0,
        "%s: the agent exits with an error, not a signal (status 0x%x)", what, status);
  host_free(&h);
}

int main(void) {
  const char *agent;
  char tmp[PATH_MAX];
  host_t h;
  int r;

  if ((agent = agent_test_begin("test_agent_proto", tmp, &r)) == NULL)
    return r;
  if (agent_session(&h, "test_agent_proto", agent, tmp, NULL) < 0)
    return 1;
  test_bad_requests(&h, tmp);
  test_vm_requests(&h);
  agent_session_close(&h);

  test_hostile_fields(agent, tmp);
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION + 1, TP_MSG_FS_STAT, "bad version");
  test_hostile_header(agent, tmp, TP_FRAME_MAX + 1, TP_PROTO_VERSION, TP_MSG_FS_STAT, "oversized len");
  test_hostile_header(agent, tmp, 0, TP_PROTO_VERSION, 99, "unknown type");
  return agent_test_end(tmp);
}
