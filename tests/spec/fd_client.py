#!/usr/bin/env python3
"""A client of fs.read_fd / fs.write_fd for fs_fd_spec.lua, talking to the
daemon's socket as any program may: it sends one request and reports, as
one JSON line, the reply and what came with it (how many fds, the file's
type and access mode), then does what ACTION asks with the fd.

usage: fd_client.py SOCKET METHOD PARAMS_JSON [ACTION]
ACTION: write:TEXT   write TEXT through the fd
        read         read the fd to its end (reported as "data")
        hold:PATH    wait until PATH exists (the spec changed the box), then
                     write "held" through the fd
        gone         send the request and close the connection at once
"""
import fcntl
import json
import os
import socket
import stat
import sys
import time


def main():
    path, method, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    action = sys.argv[4] if len(sys.argv) > 4 else ""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    req = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    s.sendall((json.dumps(req) + "\n").encode())
    if action == "gone":
        s.close()
        print(json.dumps({"gone": True}))
        return
    buf, fds = b"", []
    s.settimeout(30)
    while b"\n" not in buf:
        data, got, _, _ = socket.recv_fds(s, 65536, 4)
        fds += got
        if not data:
            break
        buf += data
    out = {"fds": len(fds)}
    try:
        out["reply"] = json.loads(buf.split(b"\n", 1)[0] or b"null")
    except ValueError:
        out["reply"] = None
    fd = fds[0] if fds else None
    for extra in fds[1:]:
        os.close(extra)
    if fd is not None:
        st = os.fstat(fd)
        out["type"] = "reg" if stat.S_ISREG(st.st_mode) else "other"
        acc = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        out["acc"] = {os.O_RDONLY: "r", os.O_WRONLY: "w", os.O_RDWR: "rw"}[acc]
        try:
            if action.startswith("write:"):
                out["wrote"] = os.write(fd, action[6:].encode())
            elif action == "read":
                chunks = []
                while True:
                    b = os.read(fd, 65536)
                    if not b:
                        break
                    chunks.append(b)
                out["data"] = b"".join(chunks).decode(errors="replace")
            elif action.startswith("hold:"):
                print(json.dumps(out), flush=True)
                deadline = time.time() + 30
                while not os.path.exists(action[5:]) and time.time() < deadline:
                    time.sleep(0.01)
                out = {"wrote": os.write(fd, b"held")}
        except OSError as e:
            out["err"] = e.strerror
        os.close(fd)
    print(json.dumps(out), flush=True)


main()
