package patients

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
)

// A Group defined by characteristics (R4 Group.characteristic, actual false) names its members by
// what they are, not by a list: a Bulk Data export of it exports the patients that match every
// characteristic (or, with exclude, do not) when it is kicked off. The characteristics carehub
// understands, each by any of its codes:
//
//	gender     SNOMED 263495000, LOINC 76689-9, or the code "gender"; valueCodeableConcept male,
//	           female, other or unknown (administrative gender)
//	age        LOINC 30525-0, SNOMED 397669002, or "age"; valueRange of years (low, high or both)
//	condition  SNOMED 404684003 or 64572001, or "condition"; valueCodeableConcept: patients with a
//	           Condition of that code (system|code, or the code in any system)
//
// Any other characteristic is refused (422) naming it, rather than ignored: an export must not
// hold patients its cohort would not.
var characteristicCodes = map[string][]string{
	"gender":    {"http://snomed.info/sct|263495000", "http://loinc.org|76689-9", "gender"},
	"age":       {"http://loinc.org|30525-0", "http://snomed.info/sct|397669002", "age"},
	"condition": {"http://snomed.info/sct|404684003", "http://snomed.info/sct|64572001", "condition"},
}

type coding struct {
	System string `json:"system"`
	Code   string `json:"code"`
}

type codeableConcept struct {
	Coding []coding `json:"coding"`
	Text   string   `json:"text"`
}

type characteristic struct {
	Code                 codeableConcept  `json:"code"`
	ValueCodeableConcept *codeableConcept `json:"valueCodeableConcept"`
	ValueRange           *struct {
		Low  *struct{ Value *float64 } `json:"low"`
		High *struct{ Value *float64 } `json:"high"`
	} `json:"valueRange"`
	Exclude bool `json:"exclude"`
}

// kind is the characteristic carehub reads c as, or "".
func (c characteristic) kind() string {
	for kind, codes := range characteristicCodes {
		for _, cd := range c.Code.Coding {
			if slices.Contains(codes, cd.System+"|"+cd.Code) || (cd.System == "" && slices.Contains(codes, cd.Code)) {
				return kind
			}
		}
		if slices.Contains(codes, c.Code.Text) {
			return kind
		}
	}
	return ""
}

// characteristicMembers returns the patients the caller may read that match a Group's
// characteristics, in id order.
func (s *Service) characteristicMembers(ctx context.Context, chars []characteristic) ([]string, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	where := []string{"($1 = '' or p.org_id = $1)", "($2 or p.synthetic)"}
	args := []any{p.OrgFilter(), p.SeesRealPatients()}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	for i, c := range chars {
		bad := func(why string) error {
			field := fmt.Sprintf("characteristic[%d]", i)
			return fault.Validation("a Group characteristic cannot be exported", map[string]string{field: why})
		}
		var cond string
		switch c.kind() {
		case "gender":
			if c.ValueCodeableConcept == nil || len(c.ValueCodeableConcept.Coding) == 0 {
				return nil, bad("gender takes a valueCodeableConcept: male, female, other or unknown")
			}
			var genders []string
			for _, cd := range c.ValueCodeableConcept.Coding {
				if !slices.Contains([]string{"male", "female", "other", "unknown"}, cd.Code) {
					return nil, bad("gender " + strconv.Quote(cd.Code) + " is not male, female, other or unknown")
				}
				genders = append(genders, cd.Code)
			}
			cond = "p.gender = any(" + arg(genders) + ")"
		case "age":
			r := c.ValueRange
			if r == nil || ((r.Low == nil || r.Low.Value == nil) && (r.High == nil || r.High.Value == nil)) {
				return nil, bad("age takes a valueRange of years with a low, a high or both")
			}
			// A birth date may be a year or a month: its first day stands for it.
			age := "extract(year from age(current_date, left(p.birth_date || '-01-01', 10)::date))"
			parts := []string{"p.birth_date ~ '^[0-9]{4}(-[0-9]{2}(-[0-9]{2})?)?$'"}
			if r.Low != nil && r.Low.Value != nil {
				parts = append(parts, age+" >= "+arg(*r.Low.Value))
			}
			if r.High != nil && r.High.Value != nil {
				parts = append(parts, age+" <= "+arg(*r.High.Value))
			}
			cond = "(" + strings.Join(parts, " and ") + ")"
		case "condition":
			if c.ValueCodeableConcept == nil || len(c.ValueCodeableConcept.Coding) == 0 {
				return nil, bad("condition takes a valueCodeableConcept: the Condition's code")
			}
			var tokens []string
			for _, cd := range c.ValueCodeableConcept.Coding {
				tokens = append(tokens, cd.System+"|"+cd.Code)
			}
			cond = "exists (select 1 from fhir_resources c where c.org_id = p.org_id and c.type = 'Condition' and not c.deleted " +
				"and c.patient_id = p.id and c.codes && " + arg(tokens) + "::text[])"
		default:
			return nil, bad("only gender, age and condition characteristics are exported here (see docs/FHIR.md)")
		}
		if c.Exclude {
			cond = "not " + cond
		}
		where = append(where, cond)
	}
	rows, err := s.pool.Query(ctx, `select p.id from patients p where `+strings.Join(where, " and ")+` order by p.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("group characteristics: %w", err)
	}
	members, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("group characteristics: %w", err)
	}
	return members, nil
}

// unmarshalCharacteristics reads a Group's characteristics.
func unmarshalCharacteristics(doc json.RawMessage) ([]characteristic, error) {
	var g struct {
		Characteristic []characteristic `json:"characteristic"`
	}
	err := json.Unmarshal(doc, &g)
	return g.Characteristic, err
}
