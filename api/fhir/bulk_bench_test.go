package fhir_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/demo"
)

// BenchmarkBulkExport loads the Synthea patients (make synthea-deps, or CAREHUB_SYNTHEA_DIR: make
// bench-bulk makes 1,000) -copies times each (a patient's Bundle over the 16 MiB limit is left
// out and counted), then
// measures a system-level Bulk Data export as a client makes it (kick-off to the last file
// downloaded) against the stores' own raw read of the same rows in the same run: COPY of the
// organization's generic resources, patients, observations, encounters and reports to nowhere.
//
//	CAREHUB_BULK_COPIES=40 go test -run '^$' -bench BulkExport -benchtime 1x ./api/fhir/
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

	org := s.OrgID(demo.DemoOrgSlug)
	var raw, exported int64
	var rawTook, exportTook time.Duration
	for b.Loop() {
		start := time.Now()
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
		rawTook = time.Since(start)

		start = time.Now()
		m := awaitManifest(b, kickOff(b, s, "/fhir/R4/$export", c.key), c.key)
		exported = 0
		for _, f := range m.Output {
			status, _, body := bulkGet(b, f.URL, c.key)
			if status != http.StatusOK {
				b.Fatalf("GET %s: %d", f.URL, status)
			}
			exported += int64(strings.Count(string(body), "\n"))
		}
		exportTook = time.Since(start)
	}
	rawRate, exportRate := float64(raw)/rawTook.Seconds(), float64(exported)/exportTook.Seconds()
	b.ReportMetric(exportRate, "exported/s")
	b.ReportMetric(rawRate, "raw-rows/s")
	b.ReportMetric(exportRate/rawRate, "ratio")
	b.Logf("%d patient Bundles loaded × %d (%d over the Bundle limit left out)", len(patients)-skipped/copies, copies, skipped/copies)
	b.Logf("export: %d resources in %s (%.0f/s); raw COPY of the same tables: %d rows in %s (%.0f/s); ratio %.2f",
		exported, exportTook.Round(time.Millisecond), exportRate, raw, rawTook.Round(time.Millisecond), rawRate, exportRate/rawRate)
}
