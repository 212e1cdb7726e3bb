// Drives a GraphQL WebSocket endpoint with the real client libraries: graphql-ws (protocol
// graphql-transport-ws) and subscriptions-transport-ws (legacy protocol graphql-ws). For each
// library it connects with the key, subscribes, takes WS_COUNT results, checks each has the
// shape {data: {<field>: <non-null>}} and no errors, then unsubscribes and disconnects.
//
// Environment:
//   WS_URL         ws:// address of the endpoint (required)
//   WS_KEY         value of Authorization in the connection params (required)
//   WS_QUERY       the subscription (required)
//   WS_VARIABLES   JSON object of variables (optional)
//   WS_FIELD       expected field under data (optional; default: the only one present)
//   WS_COUNT       results to take (default 3)
//   WS_LIBRARY     graphql-ws | subscriptions-transport-ws | all (default all)
//   WS_TIMEOUT_MS  per library (default 10000)
//
// Prints one JSON summary line on stdout; exits 0 when every library passed, 1 otherwise.
import { createClient } from 'graphql-ws';
import stws from 'subscriptions-transport-ws';
import WebSocket from 'ws';

const { SubscriptionClient } = stws;

function config() {
  const env = process.env;
  for (const name of ['WS_URL', 'WS_KEY', 'WS_QUERY']) {
    if (!env[name]) throw new Error(`${name} is required`);
  }
  const count = Number(env.WS_COUNT ?? 3);
  if (!Number.isInteger(count) || count < 1) throw new Error(`WS_COUNT must be a positive integer, got ${env.WS_COUNT}`);
  const library = env.WS_LIBRARY ?? 'all';
  const libraries = library === 'all' ? ['graphql-ws', 'subscriptions-transport-ws'] : [library];
  for (const l of libraries) {
    if (!runners[l]) throw new Error(`unknown WS_LIBRARY ${l}`);
  }
  return {
    url: env.WS_URL,
    key: env.WS_KEY,
    query: env.WS_QUERY,
    variables: env.WS_VARIABLES ? JSON.parse(env.WS_VARIABLES) : undefined,
    field: env.WS_FIELD || undefined,
    count,
    libraries,
    timeoutMs: Number(env.WS_TIMEOUT_MS ?? 10000),
  };
}

// checkShape returns why result is not {data: {<field>: <non-null>}}, or null.
function checkShape(result, field) {
  if (result === null || typeof result !== 'object') return `result is ${typeof result}`;
  if (result.errors && result.errors.length) return `result has errors: ${JSON.stringify(result.errors)}`;
  const data = result.data;
  if (data === null || typeof data !== 'object' || Array.isArray(data)) return `data is not an object: ${JSON.stringify(result)}`;
  const keys = Object.keys(data);
  const want = field ?? keys[0];
  if (field === undefined && keys.length !== 1) return `data has ${keys.length} fields, want 1`;
  if (!(want in data) || data[want] === null || data[want] === undefined) return `data.${want} missing or null: ${JSON.stringify(result)}`;
  return null;
}

function describe(err) {
  if (err === undefined || err === null) return String(err);
  if (err instanceof Error) return err.message;
  if (typeof err === 'object' && 'code' in err && 'reason' in err) return `socket closed ${err.code} ${err.reason}`;
  if (Array.isArray(err)) return err.map(describe).join('; ');
  if (typeof err === 'object' && 'message' in err) return err.message;
  return JSON.stringify(err);
}

// collect runs one library: start(onResult, onError) subscribes and returns a stop function.
function collect(cfg, start) {
  return new Promise((resolve) => {
    const received = [];
    let stop = () => {};
    let finished = false;
    const finish = (error) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      Promise.resolve()
        .then(() => stop())
        .catch(() => {})
        .then(() => resolve({ ok: !error, received: received.length, sample: received[0], error }));
    };
    const timer = setTimeout(() => finish(`timed out after ${cfg.timeoutMs}ms with ${received.length}/${cfg.count} results`), cfg.timeoutMs);
    try {
      stop = start(
        (result) => {
          if (finished) return;
          const bad = checkShape(result, cfg.field);
          if (bad) return finish(bad);
          received.push(result);
          if (received.length === cfg.count) finish(undefined);
        },
        (err) => finish(describe(err)),
      );
    } catch (err) {
      finish(describe(err));
    }
  });
}

const runners = {
  'graphql-ws': (cfg) => {
    const client = createClient({
      url: cfg.url,
      webSocketImpl: WebSocket,
      connectionParams: { Authorization: cfg.key },
      retryAttempts: 0,
    });
    return collect(cfg, (onResult, onError) => {
      const unsubscribe = client.subscribe(
        { query: cfg.query, variables: cfg.variables },
        { next: onResult, error: onError, complete: () => onError('completed before enough results') },
      );
      return async () => {
        unsubscribe(); // sends complete
        await client.dispose();
      };
    });
  },

  'subscriptions-transport-ws': (cfg) => {
    let client;
    return collect(cfg, (onResult, onError) => {
      client = new SubscriptionClient(
        cfg.url,
        {
          connectionParams: { Authorization: cfg.key },
          reconnect: false,
          // The library reports a refused init only here; the socket then just closes.
          connectionCallback: (err) => {
            if (err) onError(err);
          },
        },
        WebSocket,
      );
      client.onDisconnected(() => onError('disconnected'));
      const sub = client.request({ query: cfg.query, variables: cfg.variables }).subscribe({
        next: onResult,
        error: onError,
        complete: () => onError('completed before enough results'),
      });
      return () => {
        sub.unsubscribe(); // sends stop
        client.close();
      };
    });
  },
};

async function main() {
  let cfg;
  try {
    cfg = config();
  } catch (err) {
    console.log(JSON.stringify({ ok: false, error: err.message, results: [] }));
    process.exit(1);
  }
  const results = [];
  for (const library of cfg.libraries) {
    results.push({ library, ...(await runners[library](cfg)) });
  }
  const ok = results.every((r) => r.ok);
  console.log(JSON.stringify({ ok, results }));
  process.exit(ok ? 0 : 1);
}

main();
