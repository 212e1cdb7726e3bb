// fhir-kit-client, a JavaScript FHIR client nobody at carehub wrote, against a live node:
// create a Patient and an Observation, read them, search with paging following the next links
// over several pages, create conditionally (If-None-Exist, as fhir-kit-client users do), and post
// a batch and a transaction Bundle to the base (the client posts them to [base]/). Every response
// the node gives is checked against FHIR R4 models: decoded by @ahryman40k/ts-fhir-types' R4
// io-ts codecs and validated by FHIR.js ("fhir", its bundled R4 StructureDefinitions).
//
//   node roundtrip.mjs BASE_URL API_KEY RUN_TAG
//
// Prints one line per check, "PASS name" or "FAIL name: detail", then "N passed, N failed";
// exits 1 on any failure. api/fhir's TestJavaScriptClient runs it (make node-deps installs).
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { Client } from 'fhir-kit-client';

const require = createRequire(import.meta.url);
const { R4 } = require('@ahryman40k/ts-fhir-types');
const { PathReporter } = require('io-ts/PathReporter');
const { isLeft } = require('fp-ts/Either');
const { Fhir } = require('fhir');

// Every response the client receives (fhir-kit-client fetches through the global fetch).
const responses = [];
const realFetch = globalThis.fetch;
globalThis.fetch = async (req, init) => {
  const res = await realFetch(req, init);
  const method = req.method ?? init?.method ?? 'GET';
  responses.push({ method, url: req.url ?? String(req), status: res.status, body: await res.clone().text() });
  return res;
};

let passed = 0;
let failed = 0;
function check(name, ok, detail = '') {
  if (ok) {
    passed++;
    console.log(`PASS ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}: ${detail}`);
  }
  return ok;
}

// step runs one step; an error the client throws fails that step and the run goes on.
async function step(name, fn) {
  try {
    return await fn();
  } catch (e) {
    const body = e.response?.data ? ` ${JSON.stringify(e.response.data).slice(0, 1500)}` : '';
    check(`${name}: ran`, false, `${e.message ?? e}${body}`);
    return undefined;
  }
}

const patient = (family, mrn) => ({
  resourceType: 'Patient',
  name: [{ family, given: ['Ada'] }],
  gender: 'female',
  birthDate: '1961-04-12',
  identifier: [{ system: 'urn:carehub-test:mrn', value: mrn }],
});

const heartRate = (subject, value) => ({
  resourceType: 'Observation',
  status: 'final',
  category: [{ coding: [{ system: 'http://terminology.hl7.org/CodeSystem/observation-category', code: 'vital-signs' }] }],
  code: { coding: [{ system: 'http://loinc.org', code: '8867-4', display: 'Heart rate' }] },
  subject: { reference: subject },
  effectiveDateTime: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
  valueQuantity: { value, unit: 'beats/minute', system: 'http://unitsofmeasure.org', code: '/min' },
});

const idOf = (location) => location.split('/_history')[0].split('/').pop();

// eventually polls fn until it returns a truthy value: carehub acknowledges an Observation once
// its log holds it, before a search sees it.
async function eventually(fn, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await fn();
    if (got || Date.now() > deadline) return got;
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function main() {
  const [base, key, tag] = process.argv.slice(2);
  const client = new Client({ baseUrl: base, bearerToken: key });

  // create, read
  const p = await client.create({ resourceType: 'Patient', body: patient(`Js${tag}`, `js-${tag}`) });
  check('create Patient', p.id && p.meta?.versionId === '1', JSON.stringify(p));
  const readP = await client.read({ resourceType: 'Patient', id: p.id });
  check('read Patient', readP.name?.[0]?.family === `Js${tag}`, JSON.stringify(readP));
  const o = await client.create({ resourceType: 'Observation', body: heartRate(`Patient/${p.id}`, 77) });
  check('create Observation', Boolean(o.id), JSON.stringify(o));
  // carehub acknowledges an Observation once its log holds it: a read may 404 for a moment.
  const t0 = Date.now();
  const readO = await eventually(() => client.read({ resourceType: 'Observation', id: o.id }).catch((e) => {
    if (e.response?.status === 404) return null;
    throw e;
  }));
  check(`read Observation (readable after ${Date.now() - t0} ms)`,
    readO?.valueQuantity?.value === 77 && readO.subject?.reference === `Patient/${p.id}`, JSON.stringify(readO));

  // search with paging: 7 patients, 3 a page, nextPage over the next links
  await step('search with paging', async () => {
    for (let i = 0; i < 7; i++) {
      await client.create({ resourceType: 'Patient', body: patient(`JsPaged${tag}`, `js-paged-${i}-${tag}`) });
    }
    let page = await client.search({ resourceType: 'Patient', searchParams: { family: `JsPaged${tag}`, _count: 3 } });
    const ids = [];
    let pages = 0;
    while (page) {
      pages++;
      ids.push(...(page.entry ?? []).map((e) => e.resource.id));
      if (pages > 10) break;
      page = await client.nextPage({ bundle: page }); // false without a next link
    }
    check('search follows next links over 3 pages', pages === 3 && ids.length === 7 && new Set(ids).size === 7,
      `${ids.length} resources (${new Set(ids).size} distinct) in ${pages} pages`);
  });
  await step('search Observation', async () => {
    const b = await eventually(async () => {
      const r = await client.search({ resourceType: 'Observation', searchParams: { patient: p.id, code: 'http://loinc.org|8867-4' } });
      return r.total ? r : null;
    });
    check('search Observation by patient and code', b?.total === 1 && b.entry[0].resource.id === o.id, JSON.stringify(b));
  });

  // conditional create: If-None-Exist finds the patient, or creates a missing one
  await step('conditional create', async () => {
    const again = await client.create({ resourceType: 'Patient', body: patient(`JsOther${tag}`, `js-${tag}`),
      options: { headers: { 'If-None-Exist': `identifier=urn:carehub-test:mrn|js-${tag}` } } });
    check('conditional create finds the existing patient', again.id === p.id, JSON.stringify(again));
    const fresh = await client.create({ resourceType: 'Patient', body: patient(`JsNew${tag}`, `js-new-${tag}`),
      options: { headers: { 'If-None-Exist': `identifier=urn:carehub-test:mrn|js-new-${tag}` } } });
    check('conditional create creates a missing patient', fresh.id && fresh.id !== p.id, JSON.stringify(fresh));
    const all = await client.search({ resourceType: 'Patient', searchParams: { identifier: `urn:carehub-test:mrn|js-${tag}` } });
    check('conditional create made no duplicate', all.total === 1, JSON.stringify(all.entry?.map((e) => e.resource.id)));
  });

  // batch and transaction to the base: a Patient and an Observation; in the transaction the
  // Observation names the new Patient by its urn:uuid, in the batch the stored one.
  for (const kind of ['batch', 'transaction']) {
    await step(kind, async () => {
      const full = `urn:uuid:${randomUUID()}`;
      const obs = heartRate(kind === 'batch' ? `Patient/${p.id}` : full, 64);
      const body = { resourceType: 'Bundle', type: kind, entry: [
        { fullUrl: full, resource: patient(`Js${kind}${tag}`, `js-${kind}-${tag}`), request: { method: 'POST', url: 'Patient' } },
        { resource: obs, request: { method: 'POST', url: 'Observation' } },
      ] };
      const res = await (kind === 'batch' ? client.batch({ body }) : client.transaction({ body }));
      const statuses = (res.entry ?? []).map((e) => e.response?.status ?? '');
      if (!check(`${kind} Bundle posted to the base`, res.type === `${kind}-response` && statuses.length === 2 && statuses.every((s) => s.startsWith('201')),
        JSON.stringify(res).slice(0, 800))) {
        return;
      }
      const subject = kind === 'batch' ? p.id : idOf(res.entry[0].response.location);
      const oid = idOf(res.entry[1].response.location);
      const found = await eventually(async () => {
        const r = await client.search({ resourceType: 'Observation', searchParams: { patient: subject, _id: oid } });
        return r.total ? r : null;
      });
      check(`the ${kind}'s Observation is stored for ${kind === 'batch' ? 'the stored' : 'its new'} Patient`,
        found?.total === 1 && found.entry[0].resource.subject.reference === `Patient/${subject}`, JSON.stringify(found).slice(0, 600));
    });
  }
}

// Every response body as an R4 resource: the io-ts codec of its type decodes it, and FHIR.js
// finds no error in it.
function parseAll() {
  const fhirjs = new Fhir();
  const bad = [];
  for (const r of responses) {
    let doc;
    try {
      doc = JSON.parse(r.body);
    } catch (e) {
      bad.push(`${r.method} ${r.url} -> ${r.status}: not JSON: ${r.body.slice(0, 200)}`);
      continue;
    }
    const codec = R4[`RTTI_${doc.resourceType}`];
    if (!codec) {
      bad.push(`${r.method} ${r.url} -> ${r.status}: no R4 resource type ${doc.resourceType}`);
      continue;
    }
    const decoded = codec.decode(doc);
    if (isLeft(decoded)) {
      bad.push(`${r.method} ${r.url} -> ${r.status}: ts-fhir-types: ${PathReporter.report(decoded).slice(0, 3).join('; ').slice(0, 600)}`);
      continue;
    }
    const v = fhirjs.validate(doc);
    const errors = (v.messages ?? []).filter((m) => m.severity === 'error');
    if (errors.length) {
      bad.push(`${r.method} ${r.url} -> ${r.status}: FHIR.js: ${errors.map((m) => `${m.location}: ${m.message}`).join('; ').slice(0, 600)}`);
    }
  }
  check(`every response is R4 (ts-fhir-types R4 codecs and FHIR.js): ${responses.length - bad.length} of ${responses.length}`,
    bad.length === 0 && responses.length > 0, `\n  ${bad.join('\n  ')}`);
}

await step('fhir-kit-client', main);
parseAll();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
