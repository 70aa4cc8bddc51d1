"""Peers of tests/spec/netrelay_spec.lua, on both sides of the network relay.

Upstream servers (on the host's loopback):
  stall PORT       accepts connections and never reads from them
  cut PORT N       answers any request with a 200 that promises 2*N body
                   bytes, sends N, then closes the connection
Clients (run in the box's network namespace):
  socks-get URL            SOCKS5 (remote name) GET of URL: prints the body's
                           sha256 and length
  socks-push HOST PORT S   SOCKS5 connect, then sends for S seconds as fast
                           as the relay takes it: prints the bytes sent and
                           the seconds the last send waited
"""
import hashlib
import socket
import struct
import sys
import time


def serve(port, handle):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    held = []
    while True:
        c, _ = ls.accept()
        held.append(c)  # kept open: a stalled peer stays stalled
        handle(c)


def cut(c, n):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = c.recv(65536)
        if not d:
            return
        buf += d
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * n))
    c.sendall(b"x" * n)
    c.close()


def socks(host, port):
    s = socket.create_connection(("127.0.0.1", 1080))
    s.sendall(b"\x05\x01\x00")
    assert s.recv(2) == b"\x05\x00", "SOCKS greeting refused"
    h = host.encode()
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(h)]) + h + struct.pack(">H", port))
    rep = b""
    while len(rep) < 10:
        d = s.recv(10 - len(rep))
        if not d:
            raise SystemExit("SOCKS connect: closed")
        rep += d
    if rep[1] != 0:
        raise SystemExit("SOCKS connect refused: %d" % rep[1])
    return s


def socks_get(url):
    rest = url.split("://", 1)[1]
    hostport, path = rest.split("/", 1)
    host, port = hostport.split(":")
    s = socks(host, int(port))
    s.sendall(("GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n" % (path, hostport)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise SystemExit("no response head")
        buf += d
    body = buf.split(b"\r\n\r\n", 1)[1]
    h = hashlib.sha256(body)
    n = len(body)
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        h.update(d)
        n += len(d)
    print(h.hexdigest(), n)


def socks_push(host, port, secs):
    s = socks(host, port)
    s.setblocking(False)
    chunk = b"p" * 65536
    sent, last, start = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - start < secs:
        try:
            sent += s.send(chunk)
            last = time.monotonic()
        except BlockingIOError:
            time.sleep(0.01)
    print(sent, "%.2f" % (time.monotonic() - last))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "stall":
        serve(int(sys.argv[2]), lambda c: None)
    elif mode == "cut":
        n = int(sys.argv[3])
        serve(int(sys.argv[2]), lambda c: cut(c, n))
    elif mode == "socks-get":
        socks_get(sys.argv[2])
    elif mode == "socks-push":
        socks_push(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        raise SystemExit("unknown mode " + mode)
