# An https server for pull_spec.lua that answers every request with a
# redirect to plain http (a downgrade tupper must refuse).
# python3 tls_redirect.py HOST PORT CERT KEY TARGET
import http.server, ssl, sys

host, port, cert, key, target = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass

srv = http.server.HTTPServer((host, port), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
