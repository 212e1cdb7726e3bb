// A webhook receiver on Node.js's own HTTP/1.1 server (node:http), plain http, for
// processors/webhooks tests: it closes a kept-alive connection after KEEPALIVE_MS idle (Node's
// default is 5 s), prints {"port": N} once listening, then one JSON line per request
// ({httpVersion, headers, bodyBase64}) and answers 204.
import { createServer } from "node:http";

const server = createServer((req, res) => {
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
server.keepAliveTimeout = Number(process.env.KEEPALIVE_MS || 5000);
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
