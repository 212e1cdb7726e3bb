#!/usr/bin/env python3
"""Rebuild the demo deterioration model as a scikit-learn Pipeline and save it with joblib.

models/demo/deterioration.onnx is a standardised logistic regression written by
models/demo/train.py as  vitals -> Sub(mean) -> Mul(inv_scale) -> MatMul(weights) -> Add(bias)
-> Sigmoid. This script reads those four initializers with the `onnx` package and sets them on
an unfitted StandardScaler + LogisticRegression, so MLServer's scikit-learn runtime serves the
SAME model as the ONNX file (no re-training, no dependency on train.py's RNG or sklearn's solver).
predict_proba(x)[:, 1] equals the ONNX output up to float32 rounding (checked below against
models/demo/expected.json).

The pickle is made at test time into a temp dir; none is committed.
Usage: python export_sklearn.py --onnx models/demo/deterioration.onnx --out DIR/model.joblib
       [--expected models/demo/expected.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import joblib
import numpy as np
import onnx
from onnx import numpy_helper
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler


def build(onnx_path: str) -> Pipeline:
    model = onnx.load(onnx_path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    missing = {"mean", "inv_scale", "weights", "bias"} - inits.keys()
    if missing:
        raise SystemExit(f"{onnx_path}: initializers {sorted(missing)} not found (not train.py's graph?)")
    ops = [n.op_type for n in model.graph.node]
    if ops != ["Sub", "Mul", "MatMul", "Add", "Sigmoid"]:
        raise SystemExit(f"{onnx_path}: unexpected graph {ops}")
    mean = inits["mean"].astype(np.float64)
    scale = 1.0 / inits["inv_scale"].astype(np.float64)
    coef = inits["weights"].astype(np.float64).reshape(1, -1)
    intercept = inits["bias"].astype(np.float64).reshape(1)
    n = mean.shape[0]

    scaler = StandardScaler()
    scaler.mean_ = mean
    scaler.scale_ = scale
    scaler.var_ = scale**2
    scaler.n_features_in_ = n
    scaler.n_samples_seen_ = 1

    clf = LogisticRegression()
    clf.classes_ = np.array([0, 1])
    clf.coef_ = coef
    clf.intercept_ = intercept
    clf.n_features_in_ = n
    clf.n_iter_ = np.array([0])
    return Pipeline([("scaler", scaler), ("clf", clf)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--expected", help="expected.json to check predict_proba against")
    args = ap.parse_args()

    pipe = build(args.onnx)
    if args.expected:
        with open(args.expected) as f:
            exp = json.load(f)
        x = np.array([c["input"] for c in exp["cases"]], dtype=np.float32)
        want = np.array([c["output"] for c in exp["cases"]], dtype=np.float64)
        got = pipe.predict_proba(x)[:, 1]
        diff = float(np.max(np.abs(got - want)))
        if diff > exp.get("tolerance", 1e-5):
            print(f"export_sklearn: predict_proba differs from {args.expected} by {diff}", file=sys.stderr)
            return 1
    joblib.dump(pipe, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
