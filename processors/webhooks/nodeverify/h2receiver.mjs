// A webhook receiver on Node.js's own HTTP/2 server (node:http2, nghttp2), HTTP/2 only, for
// processors/webhooks tests: it listens on 127.0.0.1 with the certificate and key at the paths
// in CERT and KEY, prints {"port": N} once listening, then one JSON line per request
// ({httpVersion, headers, bodyBase64}) and answers 204.
import { createSecureServer } from "node:http2";
import { readFileSync } from "node:fs";

const server = createSecureServer({
  cert: readFileSync(process.env.CERT),
  key: readFileSync(process.env.KEY),
  allowHTTP1: false,
});
server.on("request", (req, res) => {
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
});
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
