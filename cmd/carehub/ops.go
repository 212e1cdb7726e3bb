package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/cmd/carehub/node"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// openDatabase connects to carehub's database for an operator command: the configured URL, or
// the embedded cluster under the data dir, started for the command if no server is running and
// stopped again afterwards (a running server's cluster is left alone).
func openDatabase(ctx context.Context, cfg node.Config) (*pgxpool.Pool, func(), error) {
	logger := node.NewLogger(cfg)
	dsn := cfg.DatabaseURL
	var local *postgres.Local
	if dsn == "" {
		if err := node.CheckDataDir(cfg.DataDir); err != nil {
			return nil, nil, err
		}
		var err error
		local, err = postgres.StartLocal(ctx, filepath.Join(cfg.DataDir, "postgres"), postgres.LocalConfig{Logger: logger})
		if err != nil {
			return nil, nil, fmt.Errorf("embedded postgres: %w", err)
		}
		if err := local.EnsureDatabase(ctx, "carehub"); err != nil {
			return nil, nil, err
		}
		dsn = local.DSN("carehub")
	}
	pool, err := postgres.Connect(ctx, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("database: %w", err)
	}
	cleanup := func() {
		pool.Close()
		if local != nil && !local.Reused() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = local.Stop(sctx)
		}
	}
	if _, err := postgres.Migrate(ctx, pool, logger); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}
	return pool, cleanup, nil
}

func storeFlags(name string, cfg *node.Config) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	serverFlags(fs, cfg)
	return fs
}

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := node.Defaults()
	cfg.LogLevel = "warn"
	if err := parse(storeFlags("migrate", &cfg), args, stderr); err != nil {
		return err
	}
	pool, cleanup, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintln(stdout, "migrations up to date")
	_ = pool
	return nil
}

func cmdSeed(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := node.Defaults()
	cfg.LogLevel = "warn"
	if err := parse(storeFlags("seed", &cfg), args, stderr); err != nil {
		return err
	}
	pool, cleanup, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	sum, err := demo.Seed(ctx, pool, node.NewLogger(cfg))
	if err != nil {
		return err
	}
	if sum.Skipped {
		fmt.Fprintln(stdout, "database already has data; nothing seeded")
		return nil
	}
	return json.NewEncoder(stdout).Encode(sum)
}

const keysUsage = `Usage:
  carehub keys create [--data-dir DIR] --org <id|slug> --mode live|test --scopes a,b [--ip CIDR,...] [--name N] [--json]
  carehub keys create [--data-dir DIR] --platform [--mode live|test] [--json]
  carehub keys list   [--data-dir DIR] [--org <id|slug>] [--json]
  carehub keys rotate [--data-dir DIR] [--json] KEY_ID
  carehub keys revoke [--data-dir DIR] [--json] KEY_ID
`

func cmdKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return errUsage
	}
	sub, args := args[0], args[1:]
	cfg := node.Defaults()
	cfg.LogLevel = "warn"
	fs := storeFlags("keys "+sub, &cfg)
	var (
		org, mode, name  string
		scopes, ips      string
		platform, asJSON bool
	)
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	switch sub {
	case "create":
		fs.StringVar(&org, "org", "", "organization id or slug")
		fs.StringVar(&mode, "mode", "", "live or test (platform keys default to live)")
		fs.StringVar(&scopes, "scopes", "", "comma-separated scopes")
		fs.StringVar(&ips, "ip", "", "comma-separated IP allowlist (CIDRs)")
		fs.StringVar(&name, "name", "", "a label for the key")
		fs.BoolVar(&platform, "platform", false, "a platform operator key that sees all organizations")
	case "list":
		fs.StringVar(&org, "org", "", "organization id or slug (default: all)")
	case "rotate", "revoke":
	default:
		fmt.Fprintf(stderr, "carehub keys: unknown subcommand %q\n%s", sub, keysUsage)
		return errUsage
	}
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if (sub == "rotate" || sub == "revoke") != (fs.NArg() == 1) || (sub != "rotate" && sub != "revoke" && fs.NArg() > 0) {
		fmt.Fprint(stderr, keysUsage)
		return errUsage
	}
	if sub == "create" {
		if platform && org != "" {
			return fmt.Errorf("keys create: --platform and --org are exclusive")
		}
		if !platform && org == "" {
			return fmt.Errorf("keys create: --org is required (or --platform)")
		}
		if mode == "" && platform {
			mode = access.Live
		}
		if mode != access.Live && mode != access.Test {
			return fmt.Errorf("keys create: --mode must be live or test")
		}
	}
	pool, cleanup, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	keys := postgres.NewAPIKeys(pool)
	orgID := ""
	if org != "" {
		if err := pool.QueryRow(ctx, `select id from organizations where id = $1 or slug = $1`, org).Scan(&orgID); err != nil {
			return fmt.Errorf("organization %q not found", org)
		}
	}
	switch sub {
	case "create":
		ck, err := keys.Create(ctx, apikeys.NewKey{OrgID: orgID, Platform: platform, Name: name, Mode: mode,
			Scopes: splitList(scopes), IPAllowlist: splitList(ips)})
		if err != nil {
			return withFieldErrors(err)
		}
		return printCreated(stdout, ck, asJSON)
	case "list":
		list, err := keys.List(ctx, orgID)
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(stdout).Encode(list)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tORG\tMODE\tKEY\tSTATUS\tSCOPES\tCREATED")
		for _, k := range list {
			o := k.OrgID
			if k.Platform {
				o = "(platform)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s…%s\t%s\t%v\t%s\n", k.ID, o, k.Mode, k.Prefix, k.Last4, k.Status, k.Scopes, k.CreatedAt.Format(time.RFC3339))
		}
		return tw.Flush()
	case "rotate":
		ck, err := keys.Rotate(ctx, "", fs.Arg(0))
		if err != nil {
			return err
		}
		if !asJSON {
			fmt.Fprintf(stdout, "rotated %s: the old key stays valid for 24 hours\n", fs.Arg(0))
		}
		return printCreated(stdout, ck, asJSON)
	case "revoke":
		k, err := keys.Revoke(ctx, "", fs.Arg(0))
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(stdout).Encode(k)
		}
		fmt.Fprintf(stdout, "revoked %s\n", k.ID)
	}
	return nil
}

// withFieldErrors spells out the per-field messages of a validation fault, which the API
// returns as details but an operator only sees if they are in the error line.
func withFieldErrors(err error) error {
	f := fault.As(err)
	if f == nil {
		return err
	}
	fields, _ := f.Details["fields"].(map[string]any)
	if len(fields) == 0 {
		return err
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s: %v", k, fields[k])
	}
	return fmt.Errorf("%s (%s)", f.Message, strings.Join(parts, "; "))
}

func printCreated(w io.Writer, ck *apikeys.CreatedKey, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(map[string]any{"id": ck.ID, "key": ck.Secret, "orgId": ck.OrgID,
			"mode": ck.Mode, "scopes": ck.Scopes, "platform": ck.Platform, "createdAt": ck.CreatedAt})
	}
	fmt.Fprintf(w, "id:     %s\nkey:    %s\nmode:   %s\nscopes: %v\n\nStore the key now: carehub keeps only its hash and cannot show it again.\n",
		ck.ID, ck.Secret, ck.Mode, ck.Scopes)
	return nil
}

// demoKeyFile keeps the demo key's secret in the data dir (0600, beside sealing.key), so that each
// `make run` prints the same key rather than minting another live key with every scope.
const demoKeyFile = "demo.key"

// printDemoKey prints the demo organization's live key with every scope, with curl examples, so
// `make run` ends with something a newcomer can paste. The key an earlier start of the same data
// dir made is printed again while it still works (not revoked, rotated or for another database);
// only otherwise is one minted and kept.
func printDemoKey(ctx context.Context, s *node.Node, dataDir string, w io.Writer) error {
	var orgID string
	if err := s.Pool().QueryRow(ctx, `select id from organizations where slug = $1`, demo.DemoOrgSlug).Scan(&orgID); err != nil {
		return fmt.Errorf("demo organization %s: %w", demo.DemoOrgSlug, err)
	}
	keys := postgres.NewAPIKeys(s.Pool())
	path := filepath.Join(dataDir, demoKeyFile)
	secret, err := keptDemoKey(ctx, keys, path, orgID)
	if err != nil {
		return err
	}
	if secret == "" {
		ck, err := keys.Create(ctx, apikeys.NewKey{OrgID: orgID, Name: "make run", Mode: access.Live, Scopes: access.Scopes})
		if err != nil {
			return err
		}
		secret = ck.Secret
		if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
			return fmt.Errorf("keep the demo key: %w", err)
		}
	}
	base := s.URL()
	keysCmd := "bin/carehub keys create"
	if dataDir != node.DefaultDataDir {
		keysCmd += " --data-dir " + dataDir
	}
	fmt.Fprintf(w, `
A live API key for the demo organization %[1]s (every scope; kept in %[5]s for the next start):

  export CAREHUB_KEY=%[2]s

Try:
  curl -s %[3]s/v1/organizations -H "Authorization: Bearer $CAREHUB_KEY"
  curl -s %[3]s/graphql -H "Authorization: Bearer $CAREHUB_KEY" -H 'Content-Type: application/json' \
       -d '{"query":"{ organizations { id name slug plan } }"}'
  curl -s '%[3]s/v1/assets?type=agent&limit=5' -H "Authorization: Bearer $CAREHUB_KEY"

Explorer: %[3]s/graphiql (paste the key)    Metrics: %[3]s/metrics    Health: %[3]s/readyz
More keys: %[4]s --org %[1]s --mode test --scopes read:patients
Stop with Ctrl-C; data stays in the data dir for the next start.
`, demo.DemoOrgSlug, secret, base, keysCmd, path)
	return nil
}

// keptDemoKey returns the secret in path when it is a usable live key with every scope of the
// demo organization in this database, else "".
func keptDemoKey(ctx context.Context, keys *postgres.APIKeys, path, orgID string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the kept demo key: %w", err)
	}
	secret := strings.TrimSpace(string(b))
	k, err := keys.Lookup(ctx, secret)
	if errors.Is(err, apikeys.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	everyScope := !slices.ContainsFunc(access.Scopes, func(sc string) bool { return !slices.Contains(k.Scopes, sc) })
	if k.OrgID != orgID || k.Mode != access.Live || !k.Usable(time.Now()) || !everyScope {
		return "", nil
	}
	return secret, nil
}
