package intake

import (
	"encoding/json"
	"fmt"

	"carehub/schemas/kafka/observation"
)

// Observation.component. A panel (the blood-pressure panel 85354-9 with systolic 8480-6 and
// diastolic 8462-4, as every BP cuff reports it) is stored as sent, and each component that is a
// vital sign carehub converts (vitalUnits) with a valueQuantity is also stored as an observation
// of its own: the shape every reader (NEWS2's systolic BP, trends, GraphQL by code) already
// queries, with derivedFrom naming the panel. Its id is derived from the panel's, so a retried
// panel stores its parts once. The answer lists the panel's id only.

// component is one element of Observation.component.
type component struct {
	Code *concept `json:"code"`
	value
}

// part is a component stored as an observation of its own.
type part struct {
	loinc   string
	reading reading
	raw     json.RawMessage // the component as sent
}

// components validates Observation.component and returns the parts to store on their own.
func components(raws []json.RawMessage) ([]part, *EntryError) {
	var parts []part
	for i, raw := range raws {
		at := fmt.Sprintf("component[%d].", i)
		var c component
		if err := json.Unmarshal(raw, &c); err != nil {
			e := decodeError(err)
			e.Code, e.Message = CodeInvalidValue, at+e.Message
			return nil, e
		}
		if c.Code == nil || len(c.Code.Coding) == 0 {
			return nil, entryErr(CodeMissingCode, "%scode.coding must hold at least one coding", at)
		}
		loinc := ""
		for _, cd := range c.Code.Coding {
			if cd.System == LOINCSystem && cd.Code != "" {
				loinc = cd.Code
				break
			}
		}
		r, e := c.value.read(loinc, at, false)
		if e != nil {
			return nil, e
		}
		if _, known := vitalUnits[loinc]; known && r.has {
			parts = append(parts, part{loinc: truncate(loinc), reading: r, raw: raw})
		}
	}
	return parts, nil
}

// sharedElements are the elements a part's resource copies from its panel.
var sharedElements = []string{"status", "category", "subject", "encounter", "effectiveDateTime", "effectiveInstant",
	"effectivePeriod", "issued", "performer", "device"}

// partMessages returns the messages of panel's parts; panel has its id and organization.
func partMessages(panel *observation.Message, parts []part) ([]observation.Message, error) {
	if len(parts) == 0 {
		return nil, nil
	}
	var src map[string]json.RawMessage
	if err := json.Unmarshal(panel.Observation, &src); err != nil {
		return nil, fmt.Errorf("observation component: %w", err)
	}
	derivedFrom, _ := json.Marshal([]map[string]string{{"reference": "Observation/" + panel.ID}})
	out := make([]observation.Message, 0, len(parts))
	for _, p := range parts {
		var resource map[string]json.RawMessage // code, valueQuantity, interpretation, referenceRange…
		if err := json.Unmarshal(p.raw, &resource); err != nil {
			return nil, fmt.Errorf("observation component: %w", err)
		}
		for _, k := range sharedElements {
			if v, ok := src[k]; ok {
				resource[k] = v
			}
		}
		resource["resourceType"] = json.RawMessage(`"Observation"`)
		resource["derivedFrom"] = derivedFrom
		b, err := json.Marshal(resource)
		if err != nil {
			return nil, fmt.Errorf("observation component: %w", err)
		}
		m := *panel
		m.ID = DerivedID(panel.OrgID, "component", panel.ID+"\x00"+p.loinc)
		m.Observation, m.LOINC, m.Code, m.ClientID = b, p.loinc, p.loinc, ""
		m.Value, m.Unit, m.NoValue = p.reading.value, p.reading.unit, false
		out = append(out, m)
	}
	return out, nil
}
