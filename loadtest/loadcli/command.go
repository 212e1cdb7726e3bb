package loadcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	loadreport "carehub/loadtest/report"
)

// Command is the command line eventload and webhookload share: the node, the keys, the project,
// the load and the report's destinations. A tool embeds it in its own config.
type Command struct {
	Load
	URL     string
	Keys    []string
	Project string // id (prj_…) or name
	Quiet   bool   // no progress line
	JSON    string // -json: also write the report as JSON here (- for stdout)
	Results string // -results: write the report's JSON under this directory (loadtest/charts draws its chart and page)

	keys string // -key, split into Keys by Parse
}

// Help is the tool's own wording of the shared flags whose meaning differs between tools.
type Help struct {
	Key   string // -key: which scopes the keys need
	Rate  string // -rate: what is paced
	Batch string // -batch: how a batch is sent
	Drain string // -drain: what is waited for
}

// Flags registers the shared flags on fs with their defaults.
func (c *Command) Flags(fs *flag.FlagSet, h Help) {
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:8080", "base URL of a carehub node with the api role (loopback only)")
	fs.StringVar(&c.keys, "key", os.Getenv("CAREHUB_KEY"), h.Key+" (default $CAREHUB_KEY)")
	fs.StringVar(&c.Project, "project", "Sepsis Early Warning", "project id (prj_…) or name to publish into")
	fs.IntVar(&c.Clients, "c", 4, "concurrent publishing clients")
	fs.DurationVar(&c.Duration, "d", 10*time.Second, "length of the publishing phase")
	fs.Float64Var(&c.Rate, "rate", 0, h.Rate)
	fs.IntVar(&c.Max, "max", 0, "stop after this many publish calls (0: the duration alone bounds the run)")
	fs.IntVar(&c.Batch, "batch", 1, h.Batch)
	fs.DurationVar(&c.Drain, "drain", 30*time.Second, h.Drain)
	fs.IntVar(&c.Payload, "payload", 0, "extra bytes of filler in each event's payload")
	fs.StringVar(&c.JSON, "json", "", "also write the report as JSON to this file (- for stdout)")
	fs.StringVar(&c.Results, "results", "", "write the report's JSON under this directory (loadtest/charts draws its PNG chart and HTML page)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress line on stderr")
}

// Parse parses the command line into c (flag.Parse), splitting -key into Keys.
func (c *Command) Parse() {
	flag.Parse()
	c.Keys = Keys(c.keys)
}

// Validate checks the URL (loopback), that there is a key (noKey is the error otherwise) and the
// load's bounds, naming the flags.
func (c *Command) Validate(noKey string) error {
	var errs []error
	if err := LoopbackURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("-url: %w", err))
	}
	if len(c.Keys) == 0 {
		errs = append(errs, errors.New("-key: "+noKey))
	}
	if err := c.Load.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Report is a run's report: its text for stdout, and what loadtest/report charts.
type Report interface {
	Printer
	Chart() loadreport.Report
}

// Main parses the command line into c, checks it with validate (exit 2 when it fails), runs run
// until it ends or SIGINT/SIGTERM, finishes its report (Finish; run returns it also when it ends
// early with an error, nil when there is none) and exits 1 on an error. name prefixes the errors
// on stderr.
func Main[T any, R interface {
	*T
	Report
}](c *Command, name string, validate func() error, run func(ctx context.Context) (R, error)) {
	c.Parse()
	if err := validate(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	rep, err := run(ctx)
	if rep != nil {
		r := rep.Chart()
		r.Started = started
		if ferr := Finish(rep, c.JSON, c.Results, r); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
