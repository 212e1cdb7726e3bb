package access_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"carehub/kernel/access"
)

func TestTouchWithoutRecorderIsNoop(t *testing.T) {
	access.Touch(context.Background(), access.KindPatient, "pat_1") // must not panic
	if access.RecorderFrom(context.Background()) != nil {
		t.Fatal("a recorder in an empty context")
	}
}

func TestRecorder(t *testing.T) {
	ctx, rec := access.WithRecorder(context.Background())
	if access.RecorderFrom(ctx) != rec {
		t.Fatal("RecorderFrom does not return the recorder")
	}
	access.Touch(ctx, access.KindObservation, "obs_1")
	access.Touch(ctx, access.KindPatient, "pat_2")
	access.Touch(ctx, access.KindPatient, "pat_1")
	access.Touch(ctx, access.KindPatient, "pat_2")
	access.Touch(ctx, access.KindPatient, "")
	if got := rec.PatientIDs(); !slices.Equal(got, []string{"pat_2", "pat_1"}) {
		t.Fatalf("PatientIDs = %v", got)
	}
	if got := rec.ResourceIDs(); !slices.Equal(got, []string{"obs_1", "pat_2", "pat_1"}) {
		t.Fatalf("ResourceIDs = %v", got)
	}
	if !rec.TouchedPatients() {
		t.Fatal("TouchedPatients = false")
	}
	// The returned slices are copies.
	rec.PatientIDs()[0] = "x"
	if rec.PatientIDs()[0] != "pat_2" {
		t.Fatal("PatientIDs exposes the recorder's slice")
	}
	_, empty := access.WithRecorder(context.Background())
	if empty.TouchedPatients() || len(empty.ResourceIDs()) != 0 {
		t.Fatal("a fresh recorder is not empty")
	}
}

// TestRecorderConcurrent is meant for -race: GraphQL resolves fields in parallel.
func TestRecorderConcurrent(t *testing.T) {
	ctx, rec := access.WithRecorder(context.Background())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				access.Touch(ctx, access.KindPatient, fmt.Sprintf("pat_%d", i%100))
				access.Touch(ctx, access.KindObservation, fmt.Sprintf("obs_%d_%d", g, i))
				_ = rec.PatientIDs()
			}
		}()
	}
	wg.Wait()
	if n := len(rec.PatientIDs()); n != 100 {
		t.Fatalf("%d distinct patients, want 100", n)
	}
	// Non-patient ids stop at their cap of 1,000; patients are all kept besides them.
	ids := rec.ResourceIDs()
	patients := 0
	for _, id := range ids {
		if id[:4] == "pat_" {
			patients++
		}
	}
	if patients != 100 || len(ids) != 1100 {
		t.Fatalf("%d resource ids with %d patients; want every patient and about the cap of 1000", len(ids), patients)
	}
}

// TestRecorderStatesTruncation: past its caps (10,000 patient ids, 1,000 other ids) a recorder
// keeps no more ids but counts the distinct ones it left out, so the audit record can say it is
// incomplete and by how much.
func TestRecorderStatesTruncation(t *testing.T) {
	ctx, rec := access.WithRecorder(context.Background())
	access.Touch(ctx, access.KindPatient, "pat_first")
	if p, r := rec.Omitted(); p != 0 || r != 0 {
		t.Fatalf("Omitted = %d, %d before any cap was reached", p, r)
	}
	const patients, others = 10_000 + 250, 1_000 + 40
	for pass := range 2 { // the second pass repeats every id: none may count twice
		for i := 1; i < patients; i++ {
			access.Touch(ctx, access.KindPatient, fmt.Sprintf("pat_%05d", i))
		}
		for i := range others {
			access.Touch(ctx, access.KindObservation, fmt.Sprintf("obs_%05d", i))
		}
		if got := len(rec.PatientIDs()); got != 10_000 {
			t.Fatalf("pass %d: %d patient ids kept, want the cap of 10000", pass, got)
		}
		p, r := rec.Omitted()
		if p != 250 || r != 40 {
			t.Fatalf("pass %d: Omitted = %d patients, %d others; want 250 and 40", pass, p, r)
		}
	}
	// An id recorded before the cap is still recorded once, never counted as omitted.
	access.Touch(ctx, access.KindPatient, "pat_first")
	if p, _ := rec.Omitted(); p != 250 {
		t.Fatalf("a recorded id was counted as omitted: %d", p)
	}
	// The count stops at ten times the cap (a lower bound from there), bounding its memory.
	for i := range 20_000 {
		access.Touch(ctx, access.KindObservation, fmt.Sprintf("obs_more_%05d", i))
	}
	if _, r := rec.Omitted(); r != 10*1_000 {
		t.Fatalf("omitted others = %d, want the counting bound of 10000", r)
	}
}
