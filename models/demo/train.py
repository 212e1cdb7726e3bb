#!/usr/bin/env python3
"""Train the carehub demo deterioration model and export it to ONNX.

Everything here is SYNTHETIC: no patient data is used or needed. The script

1. draws vital signs for a mix of stable and deteriorating synthetic patients
   (heart rate, respiratory rate, SpO2, systolic BP, temperature),
2. labels each row "deteriorates within the horizon" with a plausible
   early-warning-style rule (NEWS2-like deviations from normal) plus noise,
3. fits a standardised logistic regression (scikit-learn, fixed seed),
4. writes the model as a hand-built ONNX graph
       vitals[N,5] -> Sub(mean) -> Mul(1/scale) -> MatMul(W) -> Add(b) -> Sigmoid -> probability[N,1]
   (plain float32 tensors, no ONNX-ML ops, no maps or sequences),
5. runs the exported model with onnxruntime and writes expected.json: a few
   input rows and the exact outputs onnxruntime gives, for the Go tests.

NOT a clinical model. Usage: python train.py [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

SEED = 20261202
N_PATIENTS = 20_000
HORIZON_HOURS = 12
FEATURES = [
    ("heart_rate", "beats/min"),
    ("respiratory_rate", "breaths/min"),
    ("spo2", "%"),
    ("systolic_bp", "mmHg"),
    ("temperature", "degC"),
]
INPUT_NAME = "vitals"
OUTPUT_NAME = "probability"
OPSET = 17
IR_VERSION = 8  # old enough for any recent onnxruntime


def synth_vitals(rng: np.random.Generator, n: int) -> np.ndarray:
    """Vitals for n synthetic patients; ~25% drift towards physiological compromise."""
    sick = rng.random(n) < 0.25
    severity = np.where(sick, rng.beta(2.0, 3.0, n), 0.0)  # 0 (stable) .. 1
    hr = rng.normal(78, 11, n) + severity * rng.normal(35, 10, n)
    rr = rng.normal(16, 2.5, n) + severity * rng.normal(10, 3, n)
    spo2 = rng.normal(97, 1.3, n) - severity * np.abs(rng.normal(7, 3, n))
    sbp = rng.normal(124, 14, n) - severity * rng.normal(30, 12, n)
    fever = rng.random(n) < 0.6  # sepsis-like rise vs. hypothermic drop
    temp = rng.normal(36.9, 0.35, n) + severity * np.where(fever, rng.normal(1.6, 0.5, n), -rng.normal(1.2, 0.4, n))
    x = np.stack([
        np.clip(hr, 30, 200),
        np.clip(rr, 6, 45),
        np.clip(spo2, 70, 100),
        np.clip(sbp, 60, 220),
        np.clip(temp, 33.0, 42.0),
    ], axis=1)
    return x.astype(np.float32)


def synth_label(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """Deterioration within HORIZON_HOURS: NEWS2-like risk score, logistic link, plus noise."""
    hr, rr, spo2, sbp, temp = (x[:, i].astype(np.float64) for i in range(5))
    score = (
        0.045 * np.maximum(hr - 90, 0) + 0.06 * np.maximum(50 - hr, 0)
        + 0.22 * np.maximum(rr - 20, 0) + 0.25 * np.maximum(12 - rr, 0)
        + 0.55 * np.maximum(95 - spo2, 0)
        + 0.06 * np.maximum(110 - sbp, 0)
        + 0.9 * np.maximum(temp - 38.0, 0) + 1.2 * np.maximum(36.0 - temp, 0)
    )
    logit = -3.2 + score + rng.normal(0, 0.6, len(x))  # unobserved factors
    p = 1.0 / (1.0 + np.exp(-logit))
    return (rng.random(len(x)) < p).astype(np.int64)


def build_onnx(scaler: StandardScaler, clf: LogisticRegression, meta: dict) -> onnx.ModelProto:
    mean = scaler.mean_.astype(np.float32)
    inv_scale = (1.0 / scaler.scale_).astype(np.float32)
    w = clf.coef_.reshape(-1, 1).astype(np.float32)  # [5,1]
    b = clf.intercept_.reshape(1).astype(np.float32)  # [1]
    inits = [
        numpy_helper.from_array(mean, "mean"),
        numpy_helper.from_array(inv_scale, "inv_scale"),
        numpy_helper.from_array(w, "weights"),
        numpy_helper.from_array(b, "bias"),
    ]
    nodes = [
        helper.make_node("Sub", [INPUT_NAME, "mean"], ["centered"], name="center"),
        helper.make_node("Mul", ["centered", "inv_scale"], ["standardized"], name="scale"),
        helper.make_node("MatMul", ["standardized", "weights"], ["linear"], name="linear"),
        helper.make_node("Add", ["linear", "bias"], ["logit"], name="bias"),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT_NAME], name="sigmoid"),
    ]
    feat_doc = ", ".join(f"{n} ({u})" for n, u in FEATURES)
    graph = helper.make_graph(
        nodes,
        "carehub_demo_deterioration",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", len(FEATURES)])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["N", 1])],
        initializer=inits,
        doc_string=f"Input columns, in order: {feat_doc}. Output: P(deterioration within {HORIZON_HOURS} h).",
    )
    model = helper.make_model(
        graph,
        producer_name="carehub/models/demo/train.py",
        producer_version="1",
        opset_imports=[helper.make_opsetid("", OPSET)],
        doc_string="SYNTHETIC demo model (logistic regression on synthetic vitals). Not for clinical use.",
    )
    model.ir_version = IR_VERSION
    model.model_version = 1
    for k, v in meta.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=str(v)))
    onnx.checker.check_model(model, full_check=True)
    return model


# Hand-picked rows covering the range, plus a few random test rows.
NAMED_ROWS = {
    "stable adult": [72, 14, 98, 125, 36.8],
    "mild tachycardia": [104, 19, 96, 118, 37.4],
    "septic picture": [128, 28, 91, 88, 39.2],
    "hypoxic": [96, 26, 85, 130, 37.1],
    "hypothermic hypotensive": [52, 10, 94, 82, 35.0],
    "extreme": [180, 40, 75, 65, 41.0],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()

    rng = np.random.default_rng(SEED)
    x = synth_vitals(rng, N_PATIENTS)
    y = synth_label(rng, x)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)

    scaler = StandardScaler().fit(x_tr.astype(np.float64))
    clf = LogisticRegression(C=1.0, max_iter=1000, random_state=SEED).fit(scaler.transform(x_tr), y_tr)
    p_te = clf.predict_proba(scaler.transform(x_te))[:, 1]
    auc = roc_auc_score(y_te, p_te)

    meta = {
        "carehub.features": json.dumps([n for n, _ in FEATURES]),
        "carehub.units": json.dumps([u for _, u in FEATURES]),
        "carehub.horizon_hours": HORIZON_HOURS,
        "carehub.synthetic": "true",
        "carehub.seed": SEED,
        "carehub.test_auc": f"{auc:.4f}",
        "carehub.positive_rate": f"{y.mean():.4f}",
    }
    model = build_onnx(scaler, clf, meta)
    blob = model.SerializeToString()
    onnx_path = os.path.join(args.out_dir, "deterioration.onnx")
    with open(onnx_path, "wb") as f:
        f.write(blob)

    # Expected outputs, computed by onnxruntime itself from the bytes just written.
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    rows = np.array(list(NAMED_ROWS.values()), dtype=np.float32)
    rows = np.concatenate([rows, x_te[:6]], axis=0)
    names = list(NAMED_ROWS) + [f"test row {i}" for i in range(6)]
    (out,) = sess.run([OUTPUT_NAME], {INPUT_NAME: rows})
    assert out.shape == (len(rows), 1) and out.dtype == np.float32, (out.shape, out.dtype)
    ref = clf.predict_proba(scaler.transform(rows.astype(np.float64)))[:, 1]
    max_diff = float(np.max(np.abs(out[:, 0] - ref)))
    assert max_diff < 1e-5, f"onnx vs scikit-learn differ by {max_diff}"
    # Row-by-row (batch 1) must agree with the batch too.
    for i in range(len(rows)):
        (o1,) = sess.run([OUTPUT_NAME], {INPUT_NAME: rows[i : i + 1]})
        assert abs(float(o1[0, 0]) - float(out[i, 0])) < 1e-6

    expected = {
        "model": "deterioration.onnx",
        "model_sha256": hashlib.sha256(blob).hexdigest(),
        "onnxruntime_version": ort.__version__,
        "input": INPUT_NAME,
        "input_columns": [n for n, _ in FEATURES],
        "output": OUTPUT_NAME,
        "tolerance": 1e-5,
        # float32 values written as the shortest decimal that round-trips to the same float32
        "cases": [
            {"name": n, "input": [float(np.format_float_positional(v, unique=True)) for v in r],
             "output": float(np.format_float_positional(o, unique=True))}
            for n, r, o in zip(names, rows, out[:, 0])
        ],
    }
    exp_path = os.path.join(args.out_dir, "expected.json")
    with open(exp_path, "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")

    print(f"train rows {len(x_tr)}, test rows {len(x_te)}, positive rate {y.mean():.3f}, test AUC {auc:.4f}")
    print("coef (standardized):", dict(zip([n for n, _ in FEATURES], np.round(clf.coef_[0], 3))), "intercept", round(float(clf.intercept_[0]), 3))
    print(f"wrote {onnx_path} ({len(blob)} bytes, sha256 {expected['model_sha256'][:16]}...)")
    print(f"wrote {exp_path} ({len(expected['cases'])} cases, onnx vs scikit-learn max diff {max_diff:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
