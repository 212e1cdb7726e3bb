package rest

import (
	"context"
	"fmt"
	"net/http"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/processors/deployments"
)

// Invoker is what the invoke route needs of the deployment runtime (*deployments.Invoker).
type Invoker interface {
	Invoke(ctx context.Context, deploymentID string, req deployments.InvokeRequest) (*deployments.InvokeResult, error)
}

// InvokeRoutes mounts the endpoint of deployments on authed (exec:agents, checked by the
// invoker):
//
//	POST /v1/deployments/{id}/invoke   run the deployment's runtime once
//
// The body is {patientId, input} (score the patient's stored observations) or {vitals, input}
// (score the values given, e.g. {"vitals": {"respiratory_rate": 26, "spo2": 91}}); input carries
// skill options. 200 answers deployments.InvokeResult. A deployment whose replicas on this node
// are all busy queues the request briefly, then answers 503 UNAVAILABLE with Retry-After: 1; a
// PENDING deployment answers 503 with Retry-After: 1 as well. A deployment on an external
// inference server answers Server-Timing: backend;dur=<ms>, the server's round trip.
func InvokeRoutes(authed *mux.Router, inv Invoker) {
	h := &invokeHandler{inv: inv}
	authed.HandleFunc("/v1/deployments/{id}/invoke", h.invoke).Methods(http.MethodPost)
}

type invokeHandler struct{ inv Invoker }

func (h *invokeHandler) invoke(w http.ResponseWriter, r *http.Request) {
	var req deployments.InvokeRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	res, err := h.inv.Invoke(r.Context(), mux.Vars(r)["id"], req)
	if err != nil {
		if fault.KindOf(err) == fault.KindUnavailable {
			// Load shedding and a deployment still starting are expected answers, not failures of
			// the node: no error log line per refused request (the invoker counts them).
			w.Header().Set("Retry-After", "1")
			status, obj := envelope.NewErrorObject(r, err)
			envelope.WriteJSON(w, status, envelope.ErrorBody{Error: obj})
			return
		}
		envelope.WriteError(w, r, err)
		return
	}
	if res.Backend > 0 { // the external server's share of the answer's time (W3C Server Timing)
		w.Header().Set("Server-Timing", fmt.Sprintf("backend;dur=%.3f", float64(res.Backend.Microseconds())/1000))
	}
	envelope.WriteJSON(w, http.StatusOK, res)
}
