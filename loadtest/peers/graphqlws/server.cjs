'use strict';
// The graphql-ws peer of loadtest/cmd/peerbench's fan-out workload (issue 59): what a team would
// build on Node for carehub's subscriptions with the reference libraries. graphql-js executes an
// eventStream subscription shaped like carehub's (schemas/graphql/schema.graphql:
// eventStream(projectId, types): Event), graphql-ws serves it over ws (the
// graphql-transport-ws protocol carehub speaks), and kafkajs reads the one topic carehub's own
// fan-out reads (carehub.events.v1: each record the JSON envelope of kernel/events, keyed by
// project) from the same broker, from its end, and hands each record to every subscription that
// selects it. Packages (package.json, pinned by package-lock.json): graphql, graphql-ws, ws,
// kafkajs, and kafkajs-snappy for the Snappy batches carehub writes.
//
// Like carehub's hub (processors/fanout), subscriptions are indexed by project and, for exact
// types, by type, so a record visits only the subscriptions that may want it; each has a bounded
// queue and one that falls that far behind is ended. Unlike carehub, every subscription is
// executed on its own (graphql-ws's way): carehub shares one execution between identical
// subscriptions of one credential. There is no authentication, tenancy or redaction: the peer
// trusts every socket.
//
//   GRAPHQLWS_PEER_MODULES=~/.cache/carehub/peers/graphqlws KAFKA_BROKERS=127.0.0.1:9092 \
//     KAFKA_USER=… KAFKA_PASSWORD=… node loadtest/peers/graphqlws/server.cjs
//
// Environment: GRAPHQLWS_PEER_MODULES (the directory `make peers-deps` ran npm ci in: its
// node_modules hold the pinned packages), KAFKA_BROKERS (comma-separated), KAFKA_USER and
// KAFKA_PASSWORD (SASL/SCRAM-SHA-256; none when empty), KAFKA_TOPIC (default
// carehub.events.v1), PORT (default 0: any), HOST (default 127.0.0.1), QUEUE (events a
// subscription may have waiting before it is ended, default 256; carehub lets a subscription
// fall up to 8,192 events or 4 MiB behind in its hub and 64 frames in its socket). It prints one line
// `ready http://HOST:PORT/graphql pid=PID` on stdout once it listens and its consumer has
// joined its group; GET /stats answers its counters as JSON.

const http = require('node:http');
const path = require('node:path');
const { createRequire } = require('node:module');

const modules = process.env.GRAPHQLWS_PEER_MODULES;
if (!modules) {
  console.error('graphqlws-peer: GRAPHQLWS_PEER_MODULES is not set (make peers-deps installs the packages)');
  process.exit(2);
}
// The packages live in a cache directory, not beside this file: load them from there.
const load = createRequire(path.join(path.resolve(modules), 'package.json'));
const { buildSchema } = load('graphql');
const { useServer } = load('graphql-ws/use/ws');
const { WebSocketServer } = load('ws');
const { Kafka, logLevel, CompressionTypes, CompressionCodecs } = load('kafkajs');
// carehub's producers (franz-go) compress batches with Snappy, which kafkajs decodes only with a
// codec registered: kafkajs-snappy, the one its documentation names (pure JavaScript, snappyjs).
CompressionCodecs[CompressionTypes.Snappy] = load('kafkajs-snappy');

const brokers = (process.env.KAFKA_BROKERS || '').split(',').map((s) => s.trim()).filter(Boolean);
if (brokers.length === 0) {
  console.error('graphqlws-peer: KAFKA_BROKERS is not set');
  process.exit(2);
}
const topic = process.env.KAFKA_TOPIC || 'carehub.events.v1';
const host = process.env.HOST || '127.0.0.1';
const port = Number(process.env.PORT || 0);
const maxQueue = Number(process.env.QUEUE || 256);

const schema = buildSchema(`
  scalar JSON
  scalar DateTime

  type Event {
    id: ID!
    type: String!
    payload: JSON!
    source: String!
    timestamp: DateTime!
    projectId: ID!
    severity: String!
    redacted: Boolean!
  }

  type Query {
    health: String!
  }

  type Subscription {
    eventStream(projectId: ID!, types: [String!]): Event!
  }
`);

// matches reports whether type is selected by pattern: an exact type, prefix.* or *.
function matches(pattern, type) {
  if (pattern === '*') return true;
  if (pattern.endsWith('.*')) return type.startsWith(pattern.slice(0, -1));
  return pattern === type;
}

// Stream is one subscription's queue, the async iterator graphql-js's subscribe maps through
// execute: push never waits; a stream with maxQueue events waiting is ended (a slow consumer).
class Stream {
  constructor(hub, projectId, types) {
    this.hub = hub;
    this.projectId = projectId;
    this.types = types; // null: every type
    this.buf = [];
    this.head = 0;
    this.waiting = null;
    this.done = false;
  }

  push(ev) {
    if (this.done) return;
    if (this.waiting) {
      const resolve = this.waiting;
      this.waiting = null;
      resolve({ value: ev, done: false });
      return;
    }
    if (this.buf.length - this.head >= maxQueue) {
      this.hub.dropped++;
      this.end();
      return;
    }
    this.buf.push(ev);
  }

  next() {
    if (this.head < this.buf.length) {
      const value = this.buf[this.head++];
      if (this.head === this.buf.length) {
        this.buf = [];
        this.head = 0;
      }
      return Promise.resolve({ value, done: false });
    }
    if (this.done) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => {
      this.waiting = resolve;
    });
  }

  return() {
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  throw(err) {
    this.end();
    return Promise.reject(err);
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  end() {
    if (this.done) return;
    this.done = true;
    this.hub.remove(this);
    if (this.waiting) {
      const resolve = this.waiting;
      this.waiting = null;
      resolve({ value: undefined, done: true });
    }
  }
}

// Hub indexes the streams by project, then by exact type; streams with a pattern (or no
// types) are visited for every event of their project.
class Hub {
  constructor() {
    this.projects = new Map(); // projectId → { exact: Map<type, Set<Stream>>, patterns: Set<Stream> }
    this.count = 0;
    this.records = 0;
    this.pushed = 0;
    this.dropped = 0;
    this.undecodable = 0;
  }

  subscribe(projectId, types) {
    const s = new Stream(this, projectId, types);
    let p = this.projects.get(projectId);
    if (!p) {
      p = { exact: new Map(), patterns: new Set() };
      this.projects.set(projectId, p);
    }
    if (s.types && s.types.every((t) => !t.endsWith('*'))) {
      for (const t of s.types) {
        let set = p.exact.get(t);
        if (!set) {
          set = new Set();
          p.exact.set(t, set);
        }
        set.add(s);
      }
    } else {
      p.patterns.add(s);
    }
    this.count++;
    return s;
  }

  remove(s) {
    const p = this.projects.get(s.projectId);
    if (!p) return;
    let removed = p.patterns.delete(s);
    if (s.types) {
      for (const t of s.types) {
        const set = p.exact.get(t);
        if (set && set.delete(s)) {
          removed = true;
          if (set.size === 0) p.exact.delete(t);
        }
      }
    }
    if (removed) this.count--;
  }

  route(ev) {
    const p = this.projects.get(ev.projectId);
    if (!p) return;
    const set = p.exact.get(ev.type);
    if (set) {
      for (const s of set) {
        s.push(ev);
        this.pushed++;
      }
    }
    for (const s of p.patterns) {
      if (s.types === null || s.types.some((t) => matches(t, ev.type))) {
        s.push(ev);
        this.pushed++;
      }
    }
  }
}

const hub = new Hub();
const fields = schema.getSubscriptionType().getFields();
fields.eventStream.subscribe = (_root, args) => hub.subscribe(args.projectId, args.types ?? null);
fields.eventStream.resolve = (ev) => ev;
const eventFields = schema.getType('Event').getFields();
eventFields.timestamp.resolve = (ev) => ev.createdAt;
eventFields.redacted.resolve = () => false;

const server = http.createServer((req, res) => {
  if (req.url === '/stats') {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({
      sockets: wss.clients.size,
      subscriptions: hub.count,
      records: hub.records,
      pushed: hub.pushed,
      dropped: hub.dropped,
      undecodable: hub.undecodable,
      memory: process.memoryUsage(),
    }));
    return;
  }
  res.writeHead(404);
  res.end();
});
const wss = new WebSocketServer({ server, path: '/graphql' });
// No onConnect: every connection_init is acknowledged (carehub checks the Authorization key).
const disposable = useServer({ schema }, wss);

const kafka = new Kafka({
  clientId: 'graphqlws-peer',
  brokers,
  sasl: process.env.KAFKA_USER ? { mechanism: 'scram-sha-256', username: process.env.KAFKA_USER, password: process.env.KAFKA_PASSWORD || '' } : undefined,
  logLevel: logLevel.WARN,
});
// A group of its own, from the topic's end, as carehub's hub reads it; carehub's hub also reads
// uncommitted records (franz-go's default), so this one does too.
const consumer = kafka.consumer({
  groupId: `graphqlws-peer-${process.pid}-${Date.now()}`,
  maxWaitTimeInMs: 100,
  readUncommitted: true,
  sessionTimeout: 10000,
  heartbeatInterval: 1000,
});

async function main() {
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const joined = new Promise((resolve) => consumer.on(consumer.events.GROUP_JOIN, resolve));
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: false });
  await consumer.run({
    eachBatch: async ({ batch }) => {
      for (const m of batch.messages) {
        hub.records++;
        let ev;
        try {
          ev = JSON.parse(m.value.toString());
        } catch {
          hub.undecodable++;
          continue;
        }
        hub.route(ev);
      }
    },
  });
  await joined;
  const addr = server.address();
  process.stdout.write(`ready http://${addr.address}:${addr.port}/graphql pid=${process.pid}\n`);
}

let stopping = false;
async function stop(code) {
  if (stopping) return;
  stopping = true;
  try {
    await consumer.disconnect();
  } catch (err) {
    console.error('graphqlws-peer: kafka disconnect:', err.message);
  }
  await disposable.dispose();
  server.close();
  process.exit(code);
}
process.on('SIGTERM', () => stop(0));
process.on('SIGINT', () => stop(0));
main().catch((err) => {
  console.error('graphqlws-peer:', err);
  stop(1);
});
