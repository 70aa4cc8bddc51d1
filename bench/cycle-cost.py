"""bench/cycle-cost's client: IDLE idle boxes, 20 warm-up cycles, then N
cycles of create -> process.start 'true' -> its exit -> kill, one at a
time; prints the daemon's loop thread (its main thread) CPU a cycle from
/proc/PID/task/PID/schedstat, then kills the idle boxes."""
import json
import socket
import sys

path, n, idle, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
f = sock.makefile("rwb")
last_id = 0


def call(method, params, wait_exit=False):
    global last_id
    last_id += 1
    f.write((json.dumps({"jsonrpc": "2.0", "id": last_id, "method": method, "params": params}) + "\n").encode())
    f.flush()
    result, exited = None, not wait_exit
    while result is None or not exited:
        line = f.readline()
        if not line:
            sys.exit("the daemon closed the connection")
        msg = json.loads(line)
        if msg.get("id") == last_id:
            if "error" in msg:
                sys.exit("%s: %s" % (method, msg["error"]))
            result = msg["result"]
        elif msg.get("method") == "process.exit":
            exited = True
    return result


def loop_ns():
    with open("/proc/%d/task/%d/schedstat" % (pid, pid)) as st:
        return int(st.read().split()[0])


def cycle():
    sid = call("sandbox.create", {"limits": {"memory": "64M"}})["id"]
    call("process.start", {"sandbox": sid, "cmd": "true", "timeout": "10m"}, wait_exit=True)
    call("sandbox.kill", {"id": sid})


call("hello", {"protocol": 1})
ids = [call("sandbox.create", {})["id"] for _ in range(idle)]
for _ in range(20):
    cycle()
t0 = loop_ns()
for _ in range(n):
    cycle()
print("%d cycles beside %d idle boxes: the loop thread's CPU %.1f us a cycle" % (n, idle, (loop_ns() - t0) / n / 1000))
for i in ids:
    call("sandbox.kill", {"id": i})
