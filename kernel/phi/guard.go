package phi

import (
	"context"
	"slices"

	"carehub/kernel/access"
	"carehub/kernel/events"
)

// Reader is what one reader of patient data may see: a credential, or a webhook subscription
// (the credential that configured it, recorded on it).
type Reader struct {
	Patients     bool // holds read:patients
	Observations bool // holds read:observations
	Live         bool // may see real (non-synthetic) patients
}

// ReaderOf returns the reader p is; nil reads nothing.
func ReaderOf(p *access.Principal) Reader {
	if p == nil {
		return Reader{}
	}
	return Reader{Patients: p.Has(access.ReadPatients), Observations: p.Has(access.ReadObservations), Live: p.SeesRealPatients()}
}

// ReaderFrom returns the reader a stored grant describes (Grant's inverse).
func ReaderFrom(scopes []string, mode string) Reader {
	return Reader{Patients: slices.Contains(scopes, access.ReadPatients), Observations: slices.Contains(scopes, access.ReadObservations),
		Live: mode == access.Live}
}

// Grant returns the patient scopes r holds and its mode, as a webhook subscription stores them.
func (r Reader) Grant() (scopes []string, mode string) {
	scopes = []string{}
	if r.Patients {
		scopes = append(scopes, access.ReadPatients)
	}
	if r.Observations {
		scopes = append(scopes, access.ReadObservations)
	}
	mode = access.Test
	if r.Live {
		mode = access.Live
	}
	return scopes, mode
}

// And returns the reader that sees only what both r and o see.
func (r Reader) And(o Reader) Reader {
	return Reader{Patients: r.Patients && o.Patients, Observations: r.Observations && o.Observations, Live: r.Live && o.Live}
}

// holds reports whether r has the scopes n requires.
func (r Reader) holds(n Need) bool {
	return r.Patients && (n < NeedObservations || r.Observations)
}

// SeesAll reports whether r may see the patient data of every record it can be shown: every
// scope of the rule and live mode.
func (r Reader) SeesAll() bool { return r.Patients && r.Observations && r.Live }

// StatsPrivate is what event statistics keep from a reader that does not see all patient data
// (storage.AggregateQuery.Private): the payload values of every catalogued patient event type
// (types) and of any event naming a patient, but for the types whose redacted payload keeps both
// the status and the run time (open; agent sessions: their status and latencyMs are no patient
// data). Neither is nil.
func StatsPrivate() (types, open []string) {
	types, open = []string{}, []string{}
	for _, c := range Events {
		types = append(types, c.Type)
		if slices.Contains(c.Keep, "status") && !slices.ContainsFunc(c.Fields, isRunTime) {
			open = append(open, c.Type)
		}
	}
	return types, open
}

// isRunTime reports whether a payload field is one the statistics measure as a run time.
func isRunTime(field string) bool {
	return field == "latencyMs" || field == "durationMs" || field == "duration_ms"
}

// Subject is one classified record to decide on.
type Subject struct {
	OrgID    string   // the organization the record belongs to
	Patients []string // the patients it names
	// Unidentified: it also names a patient it does not identify (Naming.Unidentified), whom a
	// test reader cannot be shown to be synthetic.
	Unidentified bool
	Need         Need
}

// Event is an event as served to one reader.
type Event struct {
	events.Event
	// Redacted is true when the payload's patient data was removed (RedactPayload).
	Redacted bool
}

// PatientKinds tells synthetic patients from real ones: Synthetic returns the organization of each
// synthetic patient among ids (real and unknown ones are absent). storage/postgres's
// SyntheticPatients reads the patients table.
type PatientKinds interface {
	Synthetic(ctx context.Context, ids []string) (map[string]string, error)
}

// Guard serves patient data only to readers that may see it. It is safe for concurrent use if
// its PatientKinds is.
type Guard struct{ patients PatientKinds }

// NewGuard returns a guard that tells synthetic patients from real ones with patients.
func NewGuard(patients PatientKinds) *Guard { return &Guard{patients: patients} }

// Allow reports, for each subject, whether r may see its patient data: r holds the scopes of
// its Need, and every patient it names is one r sees. A live reader sees every patient; a test
// reader only synthetic patients of the subject's organization, so a patient that is unknown
// there, or unidentified, counts as real. A subject naming no patient needs the scopes only.
func (g *Guard) Allow(ctx context.Context, r Reader, subjects []Subject) ([]bool, error) {
	out := make([]bool, len(subjects))
	var ask []string
	for i, s := range subjects {
		out[i] = r.holds(s.Need) && (r.Live || !s.Unidentified)
		if out[i] && !r.Live {
			ask = append(ask, s.Patients...)
		}
	}
	if len(ask) == 0 {
		return out, nil
	}
	synthetic, err := g.patients.Synthetic(ctx, ask)
	if err != nil {
		return nil, err
	}
	for i, s := range subjects {
		if !out[i] || r.Live {
			continue
		}
		for _, id := range s.Patients {
			if org, ok := synthetic[id]; !ok || org != s.OrgID {
				out[i] = false
			}
		}
	}
	return out, nil
}

// Serve is ServeFor the caller in ctx.
func (g *Guard) Serve(ctx context.Context, subjects []Subject) ([]bool, error) {
	return g.ServeFor(ctx, ReaderOf(access.From(ctx)), subjects)
}

// ServeFor is Allow, and touches every patient of each allowed subject (access.Touch), so that
// the audit record of the request in ctx names them (a no-op outside a request).
func (g *Guard) ServeFor(ctx context.Context, r Reader, subjects []Subject) ([]bool, error) {
	ok, err := g.Allow(ctx, r, subjects)
	if err != nil {
		return nil, err
	}
	for i, s := range subjects {
		if ok[i] {
			for _, id := range s.Patients {
				access.Touch(ctx, access.KindPatient, id)
			}
		}
	}
	return ok, nil
}

// Events is EventsFor the caller in ctx.
func (g *Guard) Events(ctx context.Context, evs []events.Event) ([]Event, error) {
	return g.EventsFor(ctx, ReaderOf(access.From(ctx)), evs)
}

// EventsFor returns evs as reader r may see them: an event carrying patient data (ClassifyEvent)
// that r may not see has its payload redacted (RedactPayload). The patients of the patient data
// it serves are touched, as by ServeFor.
func (g *Guard) EventsFor(ctx context.Context, r Reader, evs []events.Event) ([]Event, error) {
	out := make([]Event, len(evs))
	var subjects []Subject
	var at []int
	for i, ev := range evs {
		out[i] = Event{Event: ev}
		if s, ok := ClassifyEvent(ev.Type, ev.Payload); ok {
			s.OrgID = ev.OrgID
			subjects = append(subjects, s)
			at = append(at, i)
		}
	}
	if len(subjects) == 0 {
		return out, nil
	}
	ok, err := g.ServeFor(ctx, r, subjects)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		if !ok[j] {
			out[i] = RedactEvent(out[i].Event)
		}
	}
	return out, nil
}

// RedactEvent returns ev with its patient data removed, whoever reads it: what a stream serves
// when it cannot decide.
func RedactEvent(ev events.Event) Event {
	if _, ok := ClassifyEvent(ev.Type, ev.Payload); !ok {
		return Event{Event: ev}
	}
	ev.Payload = RedactPayload(ev.Type, ev.Payload)
	return Event{Event: ev, Redacted: true}
}
