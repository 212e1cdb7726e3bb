// API key handling for the explorer. The key is a credential, so it lives in
// sessionStorage (gone when the tab closes) and never in localStorage.

export const STORAGE_KEY = 'carehub.explorer.apiKey';

const bearerPrefix = /^bearer(\s+|$)/i;

// normalizeKey trims what the user pasted and drops a leading "Bearer " so a
// key pasted together with its scheme is not sent as "Bearer Bearer ...".
export function normalizeKey(raw) {
  if (typeof raw !== 'string') return '';
  let key = raw.trim();
  while (bearerPrefix.test(key)) key = key.replace(bearerPrefix, '').trim();
  return key;
}

// authorization returns the Authorization header value for a key, or '' when
// there is no key (then no header is sent at all).
export function authorization(raw) {
  const key = normalizeKey(raw);
  return key ? 'Bearer ' + key : '';
}

// withAuthorization returns fetch init with the Authorization header set from
// the key, unless the request already carries one (typed in the headers
// editor), which then wins.
export function withAuthorization(init, raw) {
  const value = authorization(raw);
  const headers = new Headers(init && init.headers);
  if (value && !headers.has('authorization')) headers.set('Authorization', value);
  return { ...init, headers };
}

export function loadKey(storage) {
  try {
    return normalizeKey(storage.getItem(STORAGE_KEY) || '');
  } catch {
    return '';
  }
}

export function saveKey(storage, raw) {
  const key = normalizeKey(raw);
  try {
    if (key) storage.setItem(STORAGE_KEY, key);
    else storage.removeItem(STORAGE_KEY);
  } catch {
    // Storage can be disabled (private mode, policy); the key then only lives
    // in memory for this page.
  }
}

// graphiqlStorage adapts sessionStorage to GraphiQL's Storage contract. GraphiQL
// keeps tabs, responses and history there; responses can carry patient data,
// so they must not outlive the browser tab. clear() and length only touch
// GraphiQL's own "graphiql:" keys so the API key survives a GraphiQL reset.
export function graphiqlStorage(storage) {
  const own = (k) => k.startsWith('graphiql:');
  const keys = () => {
    const out = [];
    for (let i = 0; i < storage.length; i++) {
      const k = storage.key(i);
      if (k !== null && own(k)) out.push(k);
    }
    return out;
  };
  return {
    getItem: (k) => storage.getItem(k),
    setItem: (k, v) => storage.setItem(k, v),
    removeItem: (k) => storage.removeItem(k),
    clear: () => keys().forEach((k) => storage.removeItem(k)),
    get length() {
      return keys().length;
    },
  };
}
