// Entry of the carehub GraphQL explorer: GraphiQL against the same-origin
// /graphql endpoint, with an API key field above it. Built by build.mjs into
// ../dist, which the Go package embeds.
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import { GraphiQL } from 'graphiql';
import { createClient } from 'graphql-ws';
import { useEffect, useMemo, useRef, useState } from 'react';
import { createRoot } from 'react-dom/client';

import 'graphiql/style.css';
import './app.css';

import {
  authorization,
  graphiqlStorage,
  loadKey,
  normalizeKey,
  saveKey,
  withAuthorization,
} from './apikey.js';

const DEFAULT_QUERY = `# carehub GraphQL explorer (API 2.0)
#
# Paste an API key in the field above,
# then press the run button (Ctrl-Enter).
# Subscriptions run over a WebSocket.

query Organizations {
  organizations {
    id
    name
    slug
    plan
  }
}
`;

// How long typing in the key field must pause before the schema is fetched
// again with the new key; requests always use the key as typed.
const APPLY_KEY_AFTER_MS = 400;

function endpoints(loc) {
  const ws = loc.protocol === 'https:' ? 'wss:' : 'ws:';
  return { http: loc.origin + '/graphql', ws: ws + '//' + loc.host + '/graphql' };
}

function App() {
  const session = window.sessionStorage;
  const [draft, setDraft] = useState(() => loadKey(session));
  const [appliedKey, setAppliedKey] = useState(draft);
  const [reveal, setReveal] = useState(false);
  // Read at request time so a query run right after pasting uses the new
  // key even before appliedKey catches up.
  const keyRef = useRef(draft);
  const storage = useMemo(() => graphiqlStorage(session), [session]);

  useEffect(() => {
    const t = setTimeout(() => setAppliedKey(normalizeKey(draft)), APPLY_KEY_AFTER_MS);
    return () => clearTimeout(t);
  }, [draft]);

  // A new fetcher per applied key makes GraphiQL introspect again with it and
  // gives subscriptions a socket authenticated with it.
  const { fetcher, wsClient } = useMemo(() => {
    const url = endpoints(window.location);
    const wsClient = createClient({
      url: url.ws,
      lazy: true,
      connectionParams: () => {
        const value = authorization(keyRef.current);
        return value ? { Authorization: value } : {};
      },
    });
    const fetcher = createGraphiQLFetcher({
      url: url.http,
      subscriptionUrl: url.ws,
      wsClient,
      fetch: (input, init) => window.fetch(input, withAuthorization(init, keyRef.current)),
    });
    return { fetcher, wsClient };
  }, [appliedKey]);

  useEffect(() => () => wsClient.dispose(), [wsClient]);

  const onKey = (value) => {
    keyRef.current = value;
    setDraft(value);
    saveKey(session, value);
  };

  const hasKey = normalizeKey(draft) !== '';
  return (
    <>
      <header className="ch-bar">
        <h1 className="ch-title">
          carehub GraphQL explorer <span className="ch-version">(API 2.0)</span>
        </h1>
        <label className="ch-key-label" htmlFor="ch-api-key">
          API key
        </label>
        <input
          id="ch-api-key"
          className="ch-key"
          name="api-key"
          type={reveal ? 'text' : 'password'}
          placeholder="Paste your API key"
          autoComplete="off"
          spellCheck={false}
          value={draft}
          onChange={(e) => onKey(e.target.value)}
        />
        <button
          type="button"
          className="ch-button"
          aria-label={reveal ? 'Hide API key' : 'Show API key'}
          aria-pressed={reveal}
          onClick={() => setReveal(!reveal)}
        >
          {reveal ? 'Hide' : 'Show'}
        </button>
        <button
          type="button"
          className="ch-button"
          aria-label="Forget API key"
          disabled={!hasKey}
          onClick={() => onKey('')}
        >
          Forget
        </button>
        <span className="ch-status" role="status">
          {hasKey ? 'Key kept for this browser tab only' : 'No key: requests are unauthenticated'}
        </span>
      </header>
      <main className="ch-graphiql">
        <GraphiQL fetcher={fetcher} defaultQuery={DEFAULT_QUERY} storage={storage} />
      </main>
    </>
  );
}

createRoot(document.getElementById('root')).render(<App />);
