"""Drives a program on a real pseudo-terminal for the CLI specs
(cli_bytes_spec.lua): python3 pty_driver.py STEPS.json PROGRAM ARGS...

STEPS is a JSON list of ["expect", text] (wait up to 20 s for text in
what the program shows, after the previous match), ["send", text] (type
it), ["resize", rows, cols] (a new window size: the kernel sends SIGWINCH)
and ["sleep", seconds].  The terminal starts at 24 rows x 80 columns.
Prints one JSON line: {"ok", "failed" (the step that did not happen),
"exit" (the program's exit code), "out" (all it showed, latin-1)}."""
import fcntl
import json
import os
import pty
import select
import signal
import struct
import sys
import termios
import time

steps = json.load(open(sys.argv[1]))
argv = sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)


def setsize(rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


setsize(24, 80)
buf = b""
pos = 0
eof = False


def pump(timeout):
    global buf, eof
    r, _, _ = select.select([fd], [], [], timeout)
    if r:
        try:
            d = os.read(fd, 65536)
        except OSError:
            d = b""
        if not d:
            eof = True
        buf += d


def expect(text, t=20.0):
    global pos
    pat = text.encode()
    end = time.time() + t
    while True:
        i = buf.find(pat, pos)
        if i >= 0:
            pos = i + len(pat)
            return True
        if eof or time.time() > end:
            return False
        pump(0.1)


failed = None
for st in steps:
    if st[0] == "expect":
        if not expect(st[1]):
            failed = st
            break
    elif st[0] == "send":
        os.write(fd, st[1].encode())
    elif st[0] == "resize":
        setsize(st[1], st[2])
    elif st[0] == "sleep":
        time.sleep(st[1])

if failed:
    os.kill(pid, signal.SIGKILL)
status = None
end = time.time() + 20
while time.time() < end:
    pump(0.1)
    done, st = os.waitpid(pid, os.WNOHANG)
    if done:
        status = st
        for _ in range(50):
            if eof:
                break
            pump(0.05)
        break
if status is None:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
print(json.dumps({"ok": failed is None, "failed": failed, "exit": os.waitstatus_to_exitcode(status),
                  "out": buf.decode("latin-1")}))
