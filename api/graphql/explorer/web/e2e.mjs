// End-to-end check of the explorer in headless Chromium, as a person would
// use it: open BASE_URL/graphiql, paste the API key, run the default query
// and wait for the response pane to show EXPECT.
//
//   BASE_URL=http://127.0.0.1:8080 API_KEY=chk_... EXPECT=demo-health \
//   SCREENSHOT=/tmp/explorer.png node e2e.mjs
//
// Env: BASE_URL, API_KEY, EXPECT (required); SCREENSHOT (PNG path, optional);
// TIMEOUT_MS (default 30000); CHROMIUM (default /usr/bin/chromium).
// Exits 0 when the page works; 1 with a reason otherwise. Besides the
// response it fails on page errors, CSP violations, a request to any other
// origin, a query sent without "Authorization: Bearer <key>", and the key
// landing in localStorage.
import { chromium } from 'playwright-core';

const env = (name, fallback) => {
  const v = process.env[name];
  if (v !== undefined && v !== '') return v;
  if (fallback !== undefined) return fallback;
  console.error(`e2e: ${name} is required`);
  process.exit(2);
};

const baseURL = env('BASE_URL').replace(/\/+$/, '');
const apiKey = env('API_KEY');
const expected = env('EXPECT');
const screenshot = process.env.SCREENSHOT || '';
const timeout = Number(env('TIMEOUT_MS', '30000'));
const executablePath = env('CHROMIUM', '/usr/bin/chromium');

const origin = new URL(baseURL).origin;
const bareKey = apiKey.trim().replace(/^bearer\s+/i, '');
const wantAuth = 'Bearer ' + bareKey;

const problems = [];
const graphqlPosts = [];

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
  timeout,
});

let ok = false;
let page;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(timeout);

  page.on('request', (req) => {
    const url = req.url();
    if (url.startsWith('data:') || url.startsWith('blob:')) return;
    if (new URL(url).origin !== origin) problems.push(`request to another origin: ${url}`);
    if (req.method() === 'POST' && new URL(url).pathname === '/graphql') graphqlPosts.push(req);
  });
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    // The explorer's first schema fetch runs before a key is pasted; a 401
    // for it is expected and shows up as a failed-resource console error.
    if (msg.type() === 'error' && /Content Security Policy|Refused to/i.test(msg.text())) {
      problems.push(`CSP violation: ${msg.text()}`);
    }
  });

  const resp = await page.goto(origin + '/graphiql', { waitUntil: 'load' });
  if (!resp || !resp.ok()) throw new Error(`GET /graphiql: status ${resp && resp.status()}`);
  if (!(await page.title()).includes('carehub GraphQL explorer')) {
    throw new Error(`unexpected title ${JSON.stringify(await page.title())}`);
  }

  const keyField = page.getByLabel('API key', { exact: true });
  await keyField.waitFor({ state: 'visible' });
  await page.locator('.graphiql-execute-button').waitFor({ state: 'visible' });

  // Pasting a key makes the explorer fetch the schema again with it; wait
  // for that so the run below does not race the fetcher being replaced.
  const introspected = page.waitForResponse(
    (r) =>
      new URL(r.url()).pathname === '/graphql' &&
      r.request().method() === 'POST' &&
      r.request().headers()['authorization'] === wantAuth &&
      /IntrospectionQuery/.test(r.request().postData() || ''),
  );
  await keyField.fill(apiKey);
  await introspected;

  await page.locator('.graphiql-execute-button').click();
  await page.waitForFunction(
    (want) => {
      const pane = document.querySelector('.graphiql-response');
      return pane !== null && pane.innerText.includes(want);
    },
    expected,
    { timeout },
  );

  const runs = graphqlPosts.filter((r) => /organizations/.test(r.postData() || '') && !/IntrospectionQuery/.test(r.postData() || ''));
  if (runs.length === 0) problems.push('no query request was seen');
  for (const r of runs) {
    const got = r.headers()['authorization'];
    if (got !== wantAuth) problems.push(`query sent with Authorization ${got === undefined ? '(none)' : 'not "Bearer <key>"'}`);
  }

  const stored = await page.evaluate(() => ({
    session: Object.keys(sessionStorage).map((k) => sessionStorage.getItem(k)),
    local: Object.keys(localStorage).map((k) => localStorage.getItem(k)),
  }));
  if (!stored.session.includes(bareKey)) problems.push('key not kept in sessionStorage');
  if (stored.local.some((v) => v && v.includes(bareKey))) problems.push('key found in localStorage');

  ok = problems.length === 0;
} catch (err) {
  problems.push(err instanceof Error ? err.message.split('\n')[0] : String(err));
} finally {
  if (page && screenshot) {
    try {
      await page.screenshot({ path: screenshot });
      console.log(`e2e: screenshot ${screenshot}`);
    } catch (err) {
      console.error(`e2e: screenshot failed: ${err.message}`);
    }
  }
  if (!ok && page) {
    const pane = await page
      .evaluate(() => document.querySelector('.graphiql-response')?.innerText ?? '(no response pane)')
      .catch(() => '(page gone)');
    console.error(`e2e: response pane: ${pane.slice(0, 2000)}`);
  }
  await browser.close();
}

if (!ok) {
  // Never print the key itself.
  for (const p of problems) console.error(`e2e: FAIL: ${p.split(bareKey).join('<key>')}`);
  process.exit(1);
}
console.log(`e2e: ok: ${origin}/graphiql answered the default query with ${JSON.stringify(expected)}`);
