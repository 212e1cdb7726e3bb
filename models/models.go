// Package models holds the model files carehub ships: the demo catalogue's deterioration model
// (demo/), trained on synthetic vital signs by demo/train.py and exported to ONNX. Each is a few
// KB, checked in with the script that makes it, so that a fresh checkout serves a real model with
// no download.
package models

import (
	_ "embed"
	"encoding/json"
)

// Deterioration is demo/deterioration.onnx: P(deterioration within 12 h) from one row of vital
// signs (heart rate, respiratory rate, SpO2, systolic BP, temperature; its carehub.features
// metadata), a logistic regression on synthetic patients. Not for clinical use.
//
//go:embed demo/deterioration.onnx
var Deterioration []byte

// DeteriorationSignature is the signature and metadata ONNX Runtime reads from Deterioration, as
// processors/marketplace records a model's (its tests check that they agree).
const DeteriorationSignature = `{"inputs":[{"name":"vitals","datatype":"float","shape":[-1,5]}],"outputs":[{"name":"probability","datatype":"float","shape":[-1,1]}],"metadata":{"carehub.features":"[\"heart_rate\", \"respiratory_rate\", \"spo2\", \"systolic_bp\", \"temperature\"]","carehub.horizon_hours":"12","carehub.positive_rate":"0.1037","carehub.seed":"20261202","carehub.synthetic":"true","carehub.test_auc":"0.7543","carehub.units":"[\"beats/min\", \"breaths/min\", \"%\", \"mmHg\", \"degC\"]"}}`

//go:embed demo/expected.json
var deteriorationExpected []byte

// Case is one row of a model's expected outputs: its input and the output onnxruntime's own
// Python API gave for it when the model was made.
type Case struct {
	Name   string    `json:"name"`
	Input  []float64 `json:"input"`
	Output float64   `json:"output"`
}

// DeteriorationCases returns demo/expected.json: inputs of Deterioration (one row each, in its
// features' order) with the probabilities onnxruntime gave, and the tolerance a runtime must meet.
func DeteriorationCases() ([]Case, float64) {
	var doc struct {
		Tolerance float64 `json:"tolerance"`
		Cases     []Case  `json:"cases"`
	}
	if err := json.Unmarshal(deteriorationExpected, &doc); err != nil {
		panic("models: demo/expected.json: " + err.Error()) // embedded: checked by its tests
	}
	return doc.Cases, doc.Tolerance
}
