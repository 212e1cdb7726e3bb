// A webhook receiver on Node.js's own servers, for processors/webhooks tests: with CERT and KEY
// (paths) its HTTP/2 server (node:http2, nghttp2), HTTP/2 only; without, its HTTP/1.1 server
// (node:http) over plain http, closing a kept-alive connection after KEEPALIVE_MS idle (Node's
// default is 5 s; Node 20 closes about a second after it). It listens on 127.0.0.1, prints
// {"port": N} once listening, then one JSON line per request ({httpVersion, headers,
// bodyBase64}) and answers 204.
import { createSecureServer } from "node:http2";
import { createServer } from "node:http";
import { readFileSync } from "node:fs";

const handle = (req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    process.stdout.write(JSON.stringify({
      httpVersion: req.httpVersion,
      headers: req.headers,
      bodyBase64: Buffer.concat(chunks).toString("base64"),
    }) + "\n");
    res.writeHead(204);
    res.end();
  });
};
let server;
if (process.env.CERT) {
  server = createSecureServer({
    cert: readFileSync(process.env.CERT),
    key: readFileSync(process.env.KEY),
    allowHTTP1: false,
  }, handle);
} else {
  server = createServer(handle);
  server.keepAliveTimeout = Number(process.env.KEEPALIVE_MS || 5000);
}
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
