// Verifies recorded carehub webhook deliveries with the reference Standard Webhooks library.
//
// stdin: a JSON array of {name, secret, headers: {name: value}, bodyBase64} — the raw body as
// base64, so the bytes checked are exactly the bytes that were sent.
// stdout: one JSON line per delivery: {name, ok, error?}.
// Exit status: 0 when every delivery verifies, 1 when any does not, 2 on unreadable input.
//
// Run by processors/webhooks tests (npm ci first when node_modules is missing).
import { Webhook } from "standardwebhooks";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);

let deliveries;
try {
  deliveries = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  if (!Array.isArray(deliveries)) throw new Error("expected a JSON array");
} catch (err) {
  console.error(`verify.mjs: bad input: ${err.message}`);
  process.exit(2);
}

let failed = 0;
for (const [i, d] of deliveries.entries()) {
  const name = d.name ?? String(i);
  try {
    const body = Buffer.from(d.bodyBase64, "base64");
    new Webhook(d.secret).verify(body, d.headers);
    console.log(JSON.stringify({ name, ok: true }));
  } catch (err) {
    failed++;
    console.log(JSON.stringify({ name, ok: false, error: String(err.message ?? err) }));
  }
}
process.exit(failed === 0 ? 0 : 1);
