package deployments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/processors/inference/onnx"
	"carehub/processors/marketplace"
)

// FeaturesKey is the model metadata (ONNX metadata_props) that names, as a JSON list of vital
// sign names, the columns of a model's one input: with it a model scores a patient's stored
// vitals, or vitals given by name, as the built-in skills do.
const FeaturesKey = "carehub.features"

// ModelTensor is a tensor of an invocation, shaped as the Open Inference Protocol v2 has it:
// inputs given to a model (datatype FP32) and the outputs it gives.
type ModelTensor struct {
	Name     string    `json:"name"`
	Shape    []int64   `json:"shape"`
	Datatype string    `json:"datatype"`
	Data     []float64 `json:"data"`
}

// Prediction is what a model deployment answers.
type Prediction struct {
	// Model names the model that ran: the SHA-256 of its file on the embedded runtime, or
	// protocol:name[/version] on an external inference server.
	Model string `json:"model"`
	// Features are the values the model was given, by vital sign name, in their canonical unit,
	// when it scored vitals (given or stored); ObservationIDs the stored ones used.
	Features       map[string]float64 `json:"features,omitempty"`
	ObservationIDs []string           `json:"observationIds,omitempty"`
	Outputs        []ModelTensor      `json:"outputs"`
	// Probability is the model's one output value, when it gives exactly one (a risk score).
	Probability *float64 `json:"probability,omitempty"`
}

// loadedModel is a model this node serves: one runtime session per replica.
type loadedModel struct {
	sha      string
	model    *onnx.Model
	features features
}

// models are the models an Invoker has loaded, by artifact and replica count.
type models struct {
	mu     sync.Mutex
	loaded map[string]*loadedModel
}

// get returns the loaded model sha with replicas sessions, loading it from the store once.
func (ms *models) get(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sha string, replicas int) (*loadedModel, error) {
	key := fmt.Sprintf("%s/%d", sha, replicas)
	ms.mu.Lock()
	defer ms.mu.Unlock() // loads are rare and take milliseconds: one at a time
	if m := ms.loaded[key]; m != nil {
		return m, nil
	}
	if err := onnx.Init(""); err != nil {
		return nil, fault.Wrap(fault.KindUnavailable, err, "the embedded ONNX Runtime is not available on this node")
	}
	var content []byte
	if err := q.QueryRow(ctx, `select content from model_artifacts where sha256 = $1`, sha).Scan(&content); err != nil {
		return nil, fmt.Errorf("model %s: %w", sha, err)
	}
	m, err := onnx.Load(content, replicas)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", sha, err)
	}
	sig := m.Signature()
	var inputs []string
	for _, in := range sig.Inputs {
		inputs = append(inputs, in.Name)
	}
	lm := &loadedModel{sha: sha, model: m, features: featuresOf(sig.Metadata, inputs)}
	if ms.loaded == nil {
		ms.loaded = map[string]*loadedModel{}
	}
	for k, old := range ms.loaded { // another replica count of the same model is superseded
		if old.sha == sha {
			old.model.Close()
			delete(ms.loaded, k)
		}
	}
	ms.loaded[key] = lm
	return lm, nil
}

// close frees every loaded model.
func (ms *models) close() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for k, m := range ms.loaded {
		m.model.Close()
		delete(ms.loaded, k)
	}
}

// features says how a model takes vitals: the vital signs, by name, that the columns of its one
// input are (FeaturesKey), and that input's name. A zero features takes tensors only.
type features struct {
	names []string
	input string
}

// featuresOf reads FeaturesKey from a model's metadata; a model with another number of inputs
// than one takes tensors only.
func featuresOf(metadata map[string]string, inputs []string) features {
	var f features
	if len(inputs) != 1 || json.Unmarshal([]byte(metadata[FeaturesKey]), &f.names) != nil {
		return features{}
	}
	f.input = inputs[0]
	return f
}

// inputs builds a model's inputs from req, recording problems in bad: tensors as given, or one
// row of f's features from vitals given by name or the patient's latest stored ones.
func (inv *Invoker) inputs(ctx context.Context, f features, req InvokeRequest, bad map[string]string) ([]ModelTensor, *Prediction) {
	pred := &Prediction{}
	if len(req.Inputs) > 0 {
		for i, t := range req.Inputs {
			if t.Datatype != "" && t.Datatype != "FP32" {
				bad[fmt.Sprintf("inputs[%d].datatype", i)] = "only FP32 is served"
			}
			// A number past FP32's range would reach the model as an infinity, and be scored.
			if j := slices.IndexFunc(t.Data, func(x float64) bool { return math.Abs(x) > math.MaxFloat32 }); j >= 0 {
				bad[fmt.Sprintf("inputs[%d].data[%d]", i, j)] = "outside FP32's range"
			}
		}
		return req.Inputs, pred
	}
	if f.names == nil {
		bad["inputs"] = "this model takes tensors: give inputs [{name, shape, datatype, data}]"
		return nil, nil
	}
	values := map[string]float64{}
	if len(req.Vitals) > 0 {
		for _, o := range vitalsObservations(req.Vitals, bad) {
			x, err := clinical.Normalize(o.Code, o.Value, o.Unit)
			vs, _ := clinical.VitalByCode(o.Code)
			if err != nil {
				bad["vitals."+vs.Name] = err.Error()
				continue
			}
			values[vs.Name] = x
		}
	} else {
		for _, n := range f.names {
			if _, ok := vitalCode(n); !ok {
				bad["patientId"] = fmt.Sprintf("the model names %q, which is not a vital sign carehub stores", n)
				return nil, nil
			}
		}
		stored, err := latestVitals(ctx, inv.s.pool, []string{req.PatientID}, f.names)
		if err != nil {
			bad["patientId"] = err.Error()
			return nil, nil
		}
		for _, n := range f.names {
			if v, ok := stored[req.PatientID][n]; ok {
				values[n] = v.value
				pred.ObservationIDs = append(pred.ObservationIDs, v.observationID)
			}
		}
	}
	row := make([]float64, len(f.names))
	var missing []string
	for i, name := range f.names {
		x, ok := values[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		row[i] = x
	}
	if len(missing) > 0 {
		field, what := "vitals", "give"
		if req.PatientID != "" {
			field, what = "patientId", "the patient has no stored observation of"
		}
		bad[field] = fmt.Sprintf("the model needs %v; %s %v", f.names, what, missing)
		return nil, nil
	}
	pred.Features = values
	return []ModelTensor{{Name: f.input, Shape: []int64{1, int64(len(row))}, Datatype: "FP32", Data: row}}, pred
}

// checkRequest checks that req names exactly one of inputs, vitals and patientId.
func checkRequest(req InvokeRequest) error {
	bad := map[string]string{}
	switch {
	case len(req.Inputs) > 0 && (req.PatientID != "" || len(req.Vitals) > 0):
		bad["inputs"] = "give inputs, vitals or patientId, one of them"
	case len(req.Inputs) == 0 && req.PatientID == "" && len(req.Vitals) == 0:
		bad["patientId"] = "give patientId (score the patient's stored vitals), vitals, or inputs (tensors)"
	case req.PatientID != "" && len(req.Vitals) > 0:
		bad["vitals"] = "give either patientId or vitals, not both"
	}
	if len(bad) > 0 {
		return fault.Validation("invalid invocation", bad)
	}
	return nil
}

// withOutputs sets pred's outputs, and its probability when the model gives one value.
func (pred *Prediction) withOutputs(out []ModelTensor) {
	pred.Outputs = out
	if len(out) == 1 && len(out[0].Data) == 1 && !math.IsNaN(out[0].Data[0]) {
		pred.Probability = &out[0].Data[0]
	}
}

// storedVital is a patient's latest stored value of a vital sign, in its canonical unit.
type storedVital struct {
	value         float64
	observationID string
}

// vitalCode is the LOINC code of the vital sign named name.
func vitalCode(name string) (string, bool) {
	for _, v := range clinical.VitalSigns() {
		if v.Name == name {
			return v.Code, true
		}
	}
	return "", false
}

// latestVitals returns, by patient, the latest stored value of each named vital sign, in its
// canonical unit: one query for a whole batch of patients (the scorer) or for one (an invoke).
// A name that is no vital sign, and a value whose unit does not convert, are left out.
func latestVitals(ctx context.Context, q agents.Querier, patients []string, names []string) (map[string]map[string]storedVital, error) {
	var codes []string
	byCode := map[string]string{}
	for _, n := range names {
		if code, ok := vitalCode(n); ok {
			codes = append(codes, code)
			byCode[code] = n
		}
	}
	out := map[string]map[string]storedVital{}
	err := agents.Latest(ctx, q, patients, codes, func(pid string, o clinical.Observation) {
		x, err := clinical.Normalize(o.Code, o.Value, o.Unit)
		if err != nil {
			return // unusable: as if absent
		}
		if out[pid] == nil {
			out[pid] = map[string]storedVital{}
		}
		out[pid][byCode[o.Code]] = storedVital{value: x, observationID: o.ID}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// invokeModel runs deployment d's model for req; the caller holds a replica.
func (inv *Invoker) invokeModel(ctx context.Context, p *access.Principal, d *served, req InvokeRequest, res *InvokeResult) error {
	if d.modelSHA == nil {
		return fault.Conflict("deployment %s serves no endpoint: its asset's version carries no model", d.id)
	}
	lm, err := inv.models.get(ctx, inv.s.pool, *d.modelSHA, d.replicas)
	if err != nil {
		return err
	}
	in, pred, err := inv.prepare(ctx, p, d, lm.features, req)
	if err != nil {
		return err
	}
	tensors := make(map[string]onnx.Tensor, len(in))
	for _, t := range in {
		data := make([]float32, len(t.Data))
		for i, x := range t.Data {
			data[i] = float32(x)
		}
		tensors[t.Name] = onnx.Tensor{Shape: t.Shape, Data: data}
	}
	out, err := lm.model.Run(ctx, tensors)
	if errors.Is(err, onnx.ErrInvalidInput) {
		return fault.Validation("the model cannot take these inputs", map[string]string{"inputs": err.Error()})
	}
	if err != nil {
		return fmt.Errorf("invoke %s: %w", d.id, err)
	}
	var outputs []ModelTensor
	for _, o := range lm.model.Signature().Outputs {
		t := out[o.Name]
		outputs = append(outputs, ModelTensor{Name: o.Name, Shape: t.Shape, Datatype: "FP32", Data: float64s(t.Data)})
	}
	pred.Model = lm.sha
	pred.withOutputs(outputs)
	res.Runtime, res.Prediction = marketplace.RuntimeONNX, pred
	return nil
}

// prepare checks req and the caller's right to its patient, and builds the model's inputs.
func (inv *Invoker) prepare(ctx context.Context, p *access.Principal, d *served, f features, req InvokeRequest) ([]ModelTensor, *Prediction, error) {
	if err := checkRequest(req); err != nil {
		return nil, nil, err
	}
	if req.PatientID != "" {
		if err := inv.patientVisible(ctx, p, d, req.PatientID); err != nil {
			return nil, nil, err
		}
	}
	bad := map[string]string{}
	in, pred := inv.inputs(ctx, f, req, bad)
	if len(bad) > 0 {
		return nil, nil, fault.Validation("invalid invocation", bad)
	}
	return in, pred, nil
}

func float64s(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}
