package access

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
)

// Resource kinds services pass to Touch. Any other kind is recorded as a resource id only;
// KindPatient is also what the HIPAA audit log indexes and what makes an audited response wait
// for the broker's acknowledgement of its record before it is sent (DECISIONS §2).
const (
	KindPatient     = "patient"
	KindObservation = "observation"
	KindEncounter   = "encounter"
	KindSession     = "agent_session"
	KindRun         = "workflow_run"
)

// Bounds on what one request records: every patient id up to maxPatientIDs (patient lists are
// bounded by page limits far below it), other ids up to maxResourceIDs, so a request that reads
// a hundred patients with their observations still yields an audit record of sane size. Ids
// past a cap are not recorded but counted (Omitted), so the record can say it is incomplete and
// by how much; that count is exact up to omittedFactor times the cap and a lower bound beyond.
const (
	maxPatientIDs  = 10_000
	maxResourceIDs = 1_000
	omittedFactor  = 10
)

// Recorder collects the resource ids one request touched, for its audit record. It is safe for
// concurrent use: GraphQL resolves fields in parallel. The zero value is not usable; get one from
// WithRecorder.
type Recorder struct {
	mu        sync.Mutex
	seen      map[string]struct{}
	patients  []string
	resources []string // patients included
	others    int      // ids in resources that are not patients
	// Ids past a cap: distinct by a 64-bit hash, which keeps the memory of a huge read small;
	// a collision (odds about 1 in 10^9 at the bound) undercounts by one.
	seed             maphash.Seed
	omitted          map[uint64]struct{}
	patientsOmitted  int
	resourcesOmitted int
}

type recorderKey struct{}

// WithRecorder returns ctx carrying a new Recorder, and the Recorder. The audit middleware calls
// it once per audited request; services only call Touch.
func WithRecorder(ctx context.Context) (context.Context, *Recorder) {
	r := &Recorder{seen: map[string]struct{}{}, seed: maphash.MakeSeed()}
	return context.WithValue(ctx, recorderKey{}, r), r
}

// RecorderFrom returns the Recorder in ctx, or nil.
func RecorderFrom(ctx context.Context) *Recorder {
	r, _ := ctx.Value(recorderKey{}).(*Recorder)
	return r
}

// Touch records that the request in ctx read or changed resource id of kind (KindPatient, …).
// Services call it for every resource whose data they return or change, and for the patient of
// any patient-derived data (an observation's subject, a session's patientId). It is a no-op
// without a Recorder (test keys, background work) and for an empty id.
func Touch(ctx context.Context, kind, id string) {
	if id == "" {
		return
	}
	r := RecorderFrom(ctx)
	if r == nil {
		return
	}
	r.touch(kind, id)
}

func (r *Recorder) touch(kind, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.seen[id]; dup {
		return
	}
	if kind == KindPatient {
		if len(r.patients) >= maxPatientIDs {
			r.omit(id, &r.patientsOmitted, maxPatientIDs)
			return
		}
		r.patients = append(r.patients, id)
	} else {
		if r.others >= maxResourceIDs {
			r.omit(id, &r.resourcesOmitted, maxResourceIDs)
			return
		}
		r.others++
	}
	r.seen[id] = struct{}{}
	r.resources = append(r.resources, id)
}

// omit counts id, past the cap of its kind, once.
func (r *Recorder) omit(id string, count *int, limit int) {
	if *count >= omittedFactor*limit {
		return
	}
	if r.omitted == nil {
		r.omitted = map[uint64]struct{}{}
	}
	h := maphash.String(r.seed, id)
	if _, dup := r.omitted[h]; dup {
		return
	}
	r.omitted[h] = struct{}{}
	*count++
}

// Omitted returns how many distinct patient ids and other ids were touched past the caps and
// are therefore missing from PatientIDs and ResourceIDs: both zero unless the record is
// truncated. Each count is exact up to ten times its cap and a lower bound beyond.
func (r *Recorder) Omitted() (patients, resources int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.patientsOmitted, r.resourcesOmitted
}

// PatientIDs returns the distinct patient ids touched so far, in first-touch order.
func (r *Recorder) PatientIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.patients)
}

// ResourceIDs returns the distinct ids of every kind touched so far (patients included), in
// first-touch order.
func (r *Recorder) ResourceIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.resources)
}

// TouchedPatients reports whether any patient was touched: the response then carries patient
// data and its audit record must be durable before it is sent.
func (r *Recorder) TouchedPatients() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.patients) > 0
}

// Reset forgets everything recorded so far, for a request whose record goes out in parts (a
// streamed download: one record per part sent). An id touched again after it is recorded again,
// in the next part: each part's record lists what that part carried, and memory stays bounded
// by one part whatever the download's size.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = map[string]struct{}{}
	r.patients, r.resources, r.others = nil, nil, 0
	r.omitted, r.patientsOmitted, r.resourcesOmitted = nil, 0, 0
}
