package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// body is one pre-built transaction Bundle, posted byte for byte the same to every server.
type body struct {
	name    string
	data    []byte
	entries int // resources in it
	obs     int // Observations among them
}

// workload is what one scenario posts: its Bundles in order (clients take the next one, round
// robin), and for Synthea the provider Bundles every server needs first.
type workload struct {
	name      string
	bodies    []body
	providers []body // batch Bundles of conditional creates, posted once per server before any load
}

// vital is one LOINC vital sign: a normal range readings wander in, as loadtest's generator.
type vital struct {
	loinc, display, unit string
	lo, hi               float64
	decimals             int
}

var vitals = []vital{
	{"8867-4", "Heart rate", "/min", 55, 110, 0},
	{"9279-1", "Respiratory rate", "/min", 12, 24, 0},
	{"59408-5", "Oxygen saturation in Arterial blood by Pulse oximetry", "%", 91, 99, 0},
	{"8480-6", "Systolic blood pressure", "mm[Hg]", 100, 160, 0},
	{"8462-4", "Diastolic blood pressure", "mm[Hg]", 60, 95, 0},
	{"8310-5", "Body temperature", "Cel", 36.1, 38.4, 1},
}

// vitalsStart is when the first vitals Bundle's first Observation was taken.
var vitalsStart = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// vitalTaken is when Observation k of vitals Bundle i was taken (its effectiveDateTime), and
// vitalOf which vital it is: the search workload works out what a search must find from them.
func vitalTaken(i, k int) time.Time {
	return vitalsStart.Add(time.Duration(i)*time.Hour + time.Duration(k)*time.Minute)
}

func vitalOf(k int) vital { return vitals[k%len(vitals)] }

// vitalsWorkload builds n transaction Bundles, each a Patient and obs vital-sign Observations
// of it, referenced by the Patient's urn:uuid fullUrl, every entry a POST. The same seed gives
// the same bytes.
func vitalsWorkload(n, obs int, seed uint64) workload {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	uuid := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	}
	w := workload{name: "vitals"}
	for i := range n {
		pid := uuid()
		given := []string{"Ada", "Ben", "Chloe", "Dev", "Eli", "Fatima", "Goran", "Hana"}[r.IntN(8)]
		gender := []string{"female", "male"}[r.IntN(2)]
		birth := time.Date(1940+r.IntN(60), time.Month(1+r.IntN(12)), 1+r.IntN(28), 0, 0, 0, 0, time.UTC).Format("2006-01-02")
		buf := fmt.Appendf(nil, `{"resourceType":"Bundle","type":"transaction","entry":[`+
			`{"fullUrl":"urn:uuid:%s","resource":{"resourceType":"Patient","active":true,`+
			`"name":[{"family":"Vitals%04d","given":["%s"]}],"gender":"%s","birthDate":"%s"},`+
			`"request":{"method":"POST","url":"Patient"}}`, pid, i, given, gender, birth)
		base := make([]float64, len(vitals))
		for j, v := range vitals {
			base[j] = v.lo + (v.hi-v.lo)*(0.3+0.4*r.Float64())
		}
		for k := range obs {
			j := k % len(vitals)
			v := vitalOf(k)
			x := base[j] + (r.Float64()-0.5)*(v.hi-v.lo)*0.15
			x = math.Max(v.lo, math.Min(v.hi, x))
			value := strconv.FormatFloat(x, 'f', v.decimals, 64)
			at := vitalTaken(i, k).Format(time.RFC3339)
			buf = fmt.Appendf(buf, `,{"fullUrl":"urn:uuid:%s","resource":{"resourceType":"Observation","status":"final",`+
				`"category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs","display":"Vital Signs"}]}],`+
				`"code":{"coding":[{"system":"http://loinc.org","code":"%s","display":"%s"}],"text":"%s"},`+
				`"subject":{"reference":"urn:uuid:%s"},"effectiveDateTime":"%s",`+
				`"valueQuantity":{"value":%s,"unit":"%s","system":"http://unitsofmeasure.org","code":"%s"}},`+
				`"request":{"method":"POST","url":"Observation"}}`,
				uuid(), v.loinc, v.display, v.display, pid, at, value, v.unit, v.unit)
		}
		buf = append(buf, "]}"...)
		w.bodies = append(w.bodies, body{name: fmt.Sprintf("vitals-%04d", i), data: buf, entries: 1 + obs, obs: obs})
	}
	return w
}

// syntheaWorkload reads tests/synthea/generate.sh's output: the hospital and practitioner
// Bundles (hospitals first, as api/fhir's Synthea test posts them) and one transaction Bundle
// per patient, in name order.
func syntheaWorkload(dir string) (workload, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "fhir", "*.json"))
	if len(files) == 0 {
		return workload{}, fmt.Errorf("no Synthea Bundles in %s/fhir: run make synthea-deps", dir)
	}
	sort.Slice(files, func(i, j int) bool { return filepath.Base(files[i]) < filepath.Base(files[j]) })
	w := workload{name: "synthea"}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return workload{}, err
		}
		var b struct {
			Type  string `json:"type"`
			Entry []struct {
				Resource struct {
					ResourceType string `json:"resourceType"`
				} `json:"resource"`
			} `json:"entry"`
		}
		if err := json.Unmarshal(data, &b); err != nil {
			return workload{}, fmt.Errorf("%s: %w", f, err)
		}
		bd := body{name: strings.TrimSuffix(filepath.Base(f), ".json"), data: data, entries: len(b.Entry)}
		for _, e := range b.Entry {
			if e.Resource.ResourceType == "Observation" {
				bd.obs++
			}
		}
		base := filepath.Base(f)
		switch {
		case strings.HasPrefix(base, "hospitalInformation"), strings.HasPrefix(base, "practitionerInformation"):
			w.providers = append(w.providers, bd)
		case b.Type == "transaction":
			w.bodies = append(w.bodies, bd)
		default:
			return workload{}, fmt.Errorf("%s: a %s Bundle; Synthea's patients are transactions (tests/synthea/generate.sh)", f, b.Type)
		}
	}
	if len(w.bodies) == 0 {
		return workload{}, fmt.Errorf("no patient transaction Bundles in %s/fhir", dir)
	}
	return w, nil
}

func (w workload) resources() (entries, obs int) {
	for _, b := range w.bodies {
		entries += b.entries
		obs += b.obs
	}
	return entries, obs
}
