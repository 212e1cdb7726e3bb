// Builds the explorer into ../dist (index.html, app.js, app.css), which the Go
// package embeds. Run with `npm run build` after `npm ci`; the output is
// committed and must be byte-for-byte reproducible: the Go test
// TestBundleDrift builds into EXPLORER_DIST (a temporary directory) and fails
// when the result differs from the committed files.
import { createHash } from 'node:crypto';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const dist = process.env.EXPLORER_DIST || join(here, '..', 'dist');
const title = 'carehub GraphQL explorer (API 2.0)';
// Where the Go server mounts the explorer; assets are referenced absolutely.
const base = '/graphiql/';

// GraphiQL's stylesheet inlines ~370 kB of Roboto and Fira Code web fonts as
// data: URLs. The page uses system fonts instead (src/app.css), so drop them.
const stripWebFonts = {
  name: 'strip-web-fonts',
  setup(build) {
    build.onLoad({ filter: /[\\/]graphiql[\\/]dist[\\/]style\.css$/ }, async (args) => {
      const css = await readFile(args.path, 'utf8');
      return { contents: css.replace(/@font-face\s*\{[^}]*\}/g, ''), loader: 'css' };
    });
  },
};

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });

await esbuild.build({
  absWorkingDir: here,
  entryPoints: { app: 'src/index.jsx' },
  outdir: dist,
  bundle: true,
  minify: true,
  format: 'iife',
  platform: 'browser',
  target: ['es2020', 'chrome109', 'firefox115', 'safari16'],
  jsx: 'automatic',
  sourcemap: false,
  legalComments: 'eof',
  define: { 'process.env.NODE_ENV': '"production"' },
  plugins: [stripWebFonts],
  logLevel: 'warning',
});

const assets = {};
for (const name of ['app.js', 'app.css']) {
  const body = await readFile(join(dist, name));
  // The version query lets the server cache an asset for a year when the
  // request names its current hash (see explorer.go: assetVersion).
  assets[name] = { body, version: createHash('sha256').update(body).digest('hex').slice(0, 16) };
}

const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>${title}</title>
<link rel="stylesheet" href="${base}app.css?v=${assets['app.css'].version}">
<script defer src="${base}app.js?v=${assets['app.js'].version}"></script>
</head>
<body>
<noscript>The carehub GraphQL explorer needs JavaScript.</noscript>
<div id="root"></div>
</body>
</html>
`;
await writeFile(join(dist, 'index.html'), html);

// Nothing in dist may make the browser fetch from another origin: no external
// url() or @import in the stylesheet, no external src/href in the page. The
// JS bundle holds URL strings (docs links, React error links) that are only
// text; the end-to-end test (e2e.mjs) checks at run time that every request
// stays on the page's origin.
const css = assets['app.css'].body.toString('utf8');
const problems = [];
for (const m of css.matchAll(/url\(\s*(['"]?)([^'")]*)\1\s*\)/g)) {
  if (!m[2].startsWith('data:')) problems.push(`app.css: url(${m[2]})`);
}
if (/@import/.test(css)) problems.push('app.css: @import');
for (const m of html.matchAll(/(?:src|href)="([^"]*)"/g)) {
  if (!m[1].startsWith(base)) problems.push(`index.html: ${m[1]}`);
}
const js = assets['app.js'].body.toString('utf8');
if (/sourceMappingURL/.test(js + css)) problems.push('source map reference in bundle');
if (problems.length > 0) {
  console.error('dist references external resources:\n  ' + problems.join('\n  '));
  process.exit(1);
}

for (const name of ['index.html', 'app.js', 'app.css']) {
  const size = name === 'index.html' ? Buffer.byteLength(html) : assets[name].body.length;
  console.log(`dist/${name.padEnd(10)} ${(size / 1024).toFixed(1).padStart(7)} KiB`);
}
