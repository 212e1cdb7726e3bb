package access_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"carehub/processors/access"
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
	// Non-patient ids stop at the cap (1,000 ids in all); patients are all kept.
	ids := rec.ResourceIDs()
	patients := 0
	for _, id := range ids {
		if id[:4] == "pat_" {
			patients++
		}
	}
	if patients != 100 || len(ids) < 1000 || len(ids) > 1100 {
		t.Fatalf("%d resource ids with %d patients; want every patient and about the cap of 1000", len(ids), patients)
	}
}
