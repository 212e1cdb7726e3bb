package rest

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/processors/marketplace"
)

// ModelStore is what the model routes need of the marketplace (*marketplace.Service).
type ModelStore interface {
	AttachModel(ctx context.Context, assetID string, content []byte) (art *marketplace.ModelArtifact, created bool, err error)
	AttachModelFrom(ctx context.Context, assetID, url, sha256 string) (art *marketplace.ModelArtifact, created bool, err error)
	Model(ctx context.Context, assetID string) (*marketplace.ModelArtifact, error)
}

// ModelRoutes mounts the model of a MODEL asset's version on authed, whose body limit must be
// marketplace.MaxModelBytes:
//
//	PUT /v1/assets/{id}/model   attach an ONNX file (application/octet-stream), or the file at
//	                            a URL pinned by its SHA-256 (application/json {"url", "sha256"}),
//	                            publish:assets, the submitting organization, before the review decides
//	GET /v1/assets/{id}/model   the model's SHA-256, size and signature (inputs, outputs, metadata)
//
// PUT answers 201 with the artifact, or 200 when the version already carries the same file; a
// file the embedded ONNX Runtime cannot load is 422, another file for the same version 409.
func ModelRoutes(authed *mux.Router, s ModelStore) {
	h := &modelHandler{s: s}
	authed.HandleFunc("/v1/assets/{id}/model", h.attach).Methods(http.MethodPut)
	authed.HandleFunc("/v1/assets/{id}/model", h.get).Methods(http.MethodGet)
}

type modelHandler struct{ s ModelStore }

func (h *modelHandler) attach(w http.ResponseWriter, r *http.Request) {
	// The scope before the body: a caller who may not attach a model does not get to send 32 MiB.
	if _, err := access.Require(r.Context(), access.PublishAssets); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/octet-stream" && mt != "application/json" {
		envelope.WriteError(w, r, fault.New(fault.KindUnsupportedMedia, "a model is uploaded as application/octet-stream (the .onnx file's bytes) "+
			`or named as application/json {"url": "https://…", "sha256": "…"}`))
		return
	}
	var art *marketplace.ModelArtifact
	var created bool
	if mt == "application/json" {
		var src struct {
			URL    string `json:"url"`
			SHA256 string `json:"sha256"`
		}
		if err := envelope.DecodeJSON(r, &src); err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		art, created, err = h.s.AttachModelFrom(r.Context(), mux.Vars(r)["id"], src.URL, src.SHA256)
	} else {
		content, rerr := io.ReadAll(r.Body)
		if rerr != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](rerr); ok {
				rerr = fault.New(fault.KindTooLarge, "a model file is at most %d MiB", marketplace.MaxModelBytes>>20)
			}
			envelope.WriteError(w, r, rerr)
			return
		}
		art, created, err = h.s.AttachModel(r.Context(), mux.Vars(r)["id"], content)
	}
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	envelope.WriteJSON(w, status, art)
}

func (h *modelHandler) get(w http.ResponseWriter, r *http.Request) {
	art, err := h.s.Model(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, art)
}
