"""RSS per idle keep-alive connection: starts BINARY on one core thread, opens N
connections that each send one GET /health and keep the connection open, and reads
the server's VmRSS before and after. Usage: idle_rss.py BINARY N"""
import socket, subprocess, sys, time, re, resource
binary, n = sys.argv[1], int(sys.argv[2])
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
p = subprocess.Popen([binary, "--port", "0", "--threads", "1", "--io", "uring", "--log-level", "info", "--summary-interval-ms", "0"], stderr=subprocess.PIPE, text=True)
port = None
while port is None:
    line = p.stderr.readline()
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if m: port = int(m.group(1))
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{p.pid}/status").read()).group(1))
time.sleep(0.3)
before = rss()
socks = []
req = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(req); socks.append(s)
for s in socks:
    s.recv(4096)
time.sleep(0.5)
after = rss()
print(f"{n} idle connections: RSS {before} -> {after} KiB, {(after-before)*1024/n:.0f} bytes per connection")
p.terminate(); p.wait()
