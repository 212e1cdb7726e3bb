// Unit tests for apikey.js: node --test src/
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  STORAGE_KEY,
  authorization,
  graphiqlStorage,
  loadKey,
  normalizeKey,
  saveKey,
  withAuthorization,
} from './apikey.js';

class MemoryStorage {
  #m = new Map();
  get length() { return this.#m.size; }
  key(i) { return [...this.#m.keys()][i] ?? null; }
  getItem(k) { return this.#m.has(k) ? this.#m.get(k) : null; }
  setItem(k, v) { this.#m.set(k, String(v)); }
  removeItem(k) { this.#m.delete(k); }
}

test('authorization', () => {
  const cases = [
    ['plain key', 'chk_abc', 'Bearer chk_abc'],
    ['surrounding space', '  chk_abc \n', 'Bearer chk_abc'],
    ['already has scheme', 'Bearer chk_abc', 'Bearer chk_abc'],
    ['scheme in other case', 'bearer   chk_abc', 'Bearer chk_abc'],
    ['scheme twice', 'Bearer Bearer chk_abc', 'Bearer chk_abc'],
    ['empty', '', ''],
    ['only spaces', '   ', ''],
    ['only scheme', 'Bearer ', ''],
    ['not a string', undefined, ''],
    ['key that starts with bearer but no space', 'bearerish', 'Bearer bearerish'],
  ];
  for (const [name, input, want] of cases) {
    assert.equal(authorization(input), want, name);
  }
  assert.equal(normalizeKey(' Bearer x '), 'x');
});

test('withAuthorization', () => {
  const got = withAuthorization({ method: 'POST', headers: { 'content-type': 'application/json' } }, 'k1');
  assert.equal(got.method, 'POST');
  assert.equal(got.headers.get('authorization'), 'Bearer k1');
  assert.equal(got.headers.get('content-type'), 'application/json');

  const none = withAuthorization({ headers: {} }, '');
  assert.equal(none.headers.has('authorization'), false, 'no key, no header');

  const explicit = withAuthorization({ headers: { Authorization: 'Bearer other' } }, 'k1');
  assert.equal(explicit.headers.get('authorization'), 'Bearer other', 'headers editor wins');
});

test('key persistence', () => {
  const s = new MemoryStorage();
  assert.equal(loadKey(s), '');
  saveKey(s, 'Bearer chk_1');
  assert.equal(s.getItem(STORAGE_KEY), 'chk_1');
  assert.equal(loadKey(s), 'chk_1');
  saveKey(s, '  ');
  assert.equal(s.getItem(STORAGE_KEY), null, 'empty key removes the entry');

  const broken = { getItem() { throw new Error('denied'); }, setItem() { throw new Error('denied'); } };
  assert.equal(loadKey(broken), '');
  assert.doesNotThrow(() => saveKey(broken, 'k'));
});

test('graphiqlStorage only clears graphiql keys', () => {
  const s = new MemoryStorage();
  saveKey(s, 'chk_1');
  const g = graphiqlStorage(s);
  g.setItem('graphiql:tabState', '{}');
  g.setItem('graphiql:query', '{ a }');
  assert.equal(g.length, 2);
  assert.equal(g.getItem('graphiql:query'), '{ a }');
  g.clear();
  assert.equal(g.length, 0);
  assert.equal(loadKey(s), 'chk_1');
});
