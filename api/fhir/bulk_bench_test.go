package fhir_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"syscall"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

// BenchmarkBulkExport loads the Synthea patients (make synthea-deps, or CAREHUB_SYNTHEA_DIR: make
// bench-bulk makes 1,000) -copies times each (a patient's Bundle over the 16 MiB limit is left
// out and counted), then
// measures a system-level Bulk Data export as a client makes it (kick-off to the last file
// downloaded) against the stores' own raw read of the same rows in the same run: COPY of the
// organization's generic resources, patients, observations, encounters and reports to nowhere.
//
//	CAREHUB_BULK_COPIES=40 go test -run '^$' -bench BulkExport -benchtime 1x ./api/fhir/
//
// CAREHUB_BULK_CPUPROFILE=file writes this process's CPU profile of the export (not the load).
func BenchmarkBulkExport(b *testing.B) {
	providers, patients, ok := testenv.SyntheaBundles(b)
	if !ok {
		return
	}
	copies := 10
	if v := os.Getenv("CAREHUB_BULK_COPIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		copies = n
	}
	s := servertest.Start(b)
	c := &synClient{base: s.URL + "/fhir/R4", key: s.DemoKey()}
	ctx := context.Background()
	var skipped int
	load := func(f string) {
		body, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		status, out := c.post(ctx, "/", body)
		switch {
		case status == http.StatusRequestEntityTooLarge: // over the 16 MiB a Bundle may be (docs/LIMITS.md)
			skipped++
		case status != http.StatusOK:
			b.Fatalf("load %s: %d %s", filepath.Base(f), status, synOutcome(out))
		}
	}
	for _, f := range providers {
		load(f)
	}
	for range copies { // each copy a new set of patients: Synthea's transactions create them
		for _, f := range patients {
			load(f)
		}
	}

	// What autovacuum does in the minutes after a load of this size (vacuum for the visibility
	// map, analyze for the planner's statistics), done before anything is measured rather than
	// beside it: otherwise its workers took a core from whichever phase they overlapped.
	vacuumed := time.Now()
	if _, err := s.Pool().Exec(ctx, `vacuum (analyze)`); err != nil {
		b.Fatal(err)
	}
	b.Logf("vacuum (analyze) after the load: %s", time.Since(vacuumed).Round(time.Millisecond))

	org := s.OrgID(demo.DemoOrgSlug)
	var raw, exported int64
	var rawTook, exportTook time.Duration
	var rawCPU, manifestCPU, downloadCPU string
	for b.Loop() {
		start := markCPU()
		raw = 0
		for _, q := range []string{
			`copy (select resource from fhir_resources where org_id = '` + org + `' and not deleted) to stdout`,
			`copy (select * from patients where org_id = '` + org + `') to stdout`,
			`copy (select o.* from observations o join patients p on p.id = o.patient_id where p.org_id = '` + org + `') to stdout`,
			`copy (select e.* from encounters e join patients p on p.id = e.patient_id where p.org_id = '` + org + `') to stdout`,
			`copy (select r.* from reports r join patients p on p.id = r.patient_id where p.org_id = '` + org + `') to stdout`,
		} {
			conn, err := s.Pool().Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			tag, err := conn.Conn().PgConn().CopyTo(ctx, io.Discard, q)
			conn.Release()
			if err != nil {
				b.Fatalf("%s: %v", q, err)
			}
			raw += tag.RowsAffected()
		}
		rawTook, rawCPU = start.to(markCPU())

		stopProfile := profileCPU(b, os.Getenv("CAREHUB_BULK_CPUPROFILE"))
		start = markCPU()
		m := awaitManifest(b, kickOff(b, s, "/fhir/R4/$export", c.key), c.key)
		manifest := markCPU()
		_, manifestCPU = start.to(manifest)
		exported = 0
		for _, f := range m.Output { // as a client writing each file out as it comes
			lines := lineCounter(0)
			if status, _ := bulkGetTo(b, &lines, f.URL, c.key); status != http.StatusOK {
				b.Fatalf("GET %s: %d", f.URL, status)
			}
			exported += int64(lines)
		}
		_, downloadCPU = manifest.to(markCPU())
		exportTook, _ = start.to(markCPU())
		stopProfile()
	}
	rawRate, exportRate := float64(raw)/rawTook.Seconds(), float64(exported)/exportTook.Seconds()
	b.ReportMetric(exportRate, "exported/s")
	b.ReportMetric(rawRate, "raw-rows/s")
	b.ReportMetric(exportRate/rawRate, "ratio")
	b.Logf("%d patient Bundles loaded × %d (%d over the Bundle limit left out)", len(patients)-skipped/copies, copies, skipped/copies)
	b.Logf("export: %d resources in %s (%.0f/s); raw COPY of the same tables: %d rows in %s (%.0f/s); ratio %.2f",
		exported, exportTook.Round(time.Millisecond), exportRate, raw, rawTook.Round(time.Millisecond), rawRate, exportRate/rawRate)
	b.Logf("phases: raw COPY %s; kick-off to manifest %s; downloads %s", rawCPU, manifestCPU, downloadCPU)
}

// cpuMark is a moment: the wall clock, and the CPU time this process (carehub's node and the
// benchmark's client) and the test Postgres cluster have used.
type cpuMark struct {
	at       time.Time
	proc, pg time.Duration
}

func markCPU() cpuMark {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	pg, _ := pgtest.CPUTime() // 0 on a shared server
	return cpuMark{at: time.Now(), proc: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), pg: pg}
}

// to is the window from m to n: its length, and a line saying where the CPU went.
func (m cpuMark) to(n cpuMark) (time.Duration, string) {
	took := n.at.Sub(m.at)
	return took, fmt.Sprintf("%s (CPU: process %.1f s, Postgres %.1f s; %.2f cores busy)", took.Round(time.Millisecond),
		(n.proc - m.proc).Seconds(), (n.pg - m.pg).Seconds(), (n.proc-m.proc+n.pg-m.pg).Seconds()/took.Seconds())
}

// profileCPU starts a CPU profile into file (none when file is empty) and returns its stop.
func profileCPU(b *testing.B, file string) func() {
	if file == "" {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// lineCounter counts the lines written to it.
type lineCounter int

func (n *lineCounter) Write(p []byte) (int, error) {
	*n += lineCounter(bytes.Count(p, []byte("\n")))
	return len(p), nil
}
