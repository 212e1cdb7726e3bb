package graphql

import (
	"context"
	"encoding/json"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/processors/patients"
)

// nestedFHIRDefault is the number of observations or encounters a patient lists without a limit
// argument (DECISIONS §7), and the most it lists with one.
const nestedFHIRDefault = 100

type patientResolver struct {
	p *patients.Patient
	l *loaders
}

func (l *loaders) patients(ps []patients.Patient) []*patientResolver {
	l.hintPatients(ps)
	out := make([]*patientResolver, len(ps))
	for i := range ps {
		out[i] = &patientResolver{&ps[i], l}
	}
	return out
}

func (r *patientResolver) ID() gql.ID           { return gql.ID(r.p.ID) }
func (r *patientResolver) ResourceType() string { return "Patient" }
func (r *patientResolver) Name() []JSON         { return nonNilJSON(jsonList(r.p.Name)) }
func (r *patientResolver) Gender() *string      { return r.p.Gender }
func (r *patientResolver) BirthDate() *string   { return r.p.BirthDate }
func (r *patientResolver) Address() *[]JSON     { return optJSONList(r.p.Address) }
func (r *patientResolver) Telecom() *[]JSON     { return optJSONList(r.p.Telecom) }
func (r *patientResolver) RiskLevel() *string   { return r.p.RiskLevel }
func (r *patientResolver) Synthetic() bool      { return r.p.Synthetic }
func (r *patientResolver) Programs() []string   { return nonNil(r.p.Programs) }

type observationsArgs struct {
	Limit       *int32
	Code        *string
	Since, From *DateTime
}

// Observations needs read:observations (checked by the service, so a key without it gets a
// FORBIDDEN error on this field and the rest of the patient).
func (r *patientResolver) Observations(ctx context.Context, args observationsArgs) ([]*observationResolver, error) {
	limit, err := limitArg(args.Limit, nestedFHIRDefault, nestedFHIRDefault)
	if err != nil {
		return nil, err
	}
	f := patients.ObservationFilter{Limit: limit}
	if args.Code != nil {
		f.Code = *args.Code
	}
	if f.Since, err = fromArg(args.From, args.Since); err != nil {
		return nil, err
	}
	obs, err := r.l.observations(f).Load(ctx, r.p.ID)
	if err != nil {
		return nil, err
	}
	out := make([]*observationResolver, len(obs))
	for i := range obs {
		out[i] = &observationResolver{&obs[i]}
	}
	return out, nil
}

func (r *patientResolver) Encounters(ctx context.Context, args struct{ Limit *int32 }) ([]*encounterResolver, error) {
	limit, err := limitArg(args.Limit, nestedFHIRDefault, nestedFHIRDefault)
	if err != nil {
		return nil, err
	}
	encs, err := r.l.encounters(limit).Load(ctx, r.p.ID)
	if err != nil {
		return nil, err
	}
	out := make([]*encounterResolver, len(encs))
	for i := range encs {
		out[i] = &encounterResolver{&encs[i]}
	}
	return out, nil
}

type observationResolver struct{ o *patients.Observation }

func (r *observationResolver) ID() gql.ID           { return gql.ID(r.o.ID) }
func (r *observationResolver) ResourceType() string { return "Observation" }
func (r *observationResolver) Status() string       { return r.o.Status }
func (r *observationResolver) Code() JSON           { return JSON{raw: r.o.Code} }
func (r *observationResolver) Subject() JSON        { return JSON{raw: r.o.Subject} }
func (r *observationResolver) ValueQuantity() *JSON { return optJSON(r.o.ValueQuantity()) }
func (r *observationResolver) EffectiveDateTime() *DateTime {
	return optDateTime(r.o.EffectiveAt)
}

type encounterResolver struct{ e *patients.Encounter }

func (r *encounterResolver) ID() gql.ID           { return gql.ID(r.e.ID) }
func (r *encounterResolver) ResourceType() string { return "Encounter" }
func (r *encounterResolver) Status() string       { return r.e.Status }
func (r *encounterResolver) Class() JSON          { return JSON{raw: r.e.Class} }
func (r *encounterResolver) Subject() JSON        { return JSON{raw: r.e.Subject} }
func (r *encounterResolver) Period() *JSON        { return optJSON(r.e.Period) }

func nonNilJSON(s []JSON) []JSON {
	if s == nil {
		return []JSON{}
	}
	return s
}

func optJSONList(raw json.RawMessage) *[]JSON {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	l := nonNilJSON(jsonList(raw))
	return &l
}
