package rest

import (
	"math"
	"net/http"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/fault"
	"carehub/processors/webhooks"
)

// WebhookRoutes mounts webhook management on r (DECISIONS §5): reading, changing, deleting and
// (our extension) creating subscriptions, rotating secrets, deliveries with their attempts,
// redelivery and recovery under /v1/webhooks, and the signed test send POST /api/v1/webhooks/test.
// r must run the authentication middleware and the body limit: svc checks scopes and tenancy from the request
// context (another organization's ids are NOT_FOUND). The spec's list, GET /v1/webhooks, is
// mounted elsewhere.
func WebhookRoutes(r *mux.Router, svc *webhooks.Service) {
	h := webhookAdmin{svc: svc}
	// Delivery routes first: /v1/webhooks/{id} must not take "deliveries" for an id.
	r.HandleFunc("/v1/webhooks/deliveries/{id}", h.delivery).Methods(http.MethodGet)
	r.HandleFunc("/v1/webhooks/deliveries/{id}/redeliver", h.redeliver).Methods(http.MethodPost)
	r.HandleFunc("/v1/webhooks", h.create).Methods(http.MethodPost)
	r.HandleFunc("/v1/webhooks/{id}", h.get).Methods(http.MethodGet)
	r.HandleFunc("/v1/webhooks/{id}", h.update).Methods(http.MethodPatch)
	r.HandleFunc("/v1/webhooks/{id}", h.delete).Methods(http.MethodDelete)
	r.HandleFunc("/v1/webhooks/{id}/rotate-secret", h.rotate).Methods(http.MethodPost)
	r.HandleFunc("/v1/webhooks/{id}/deliveries", h.deliveries).Methods(http.MethodGet)
	r.HandleFunc("/v1/webhooks/{id}/recover", h.recover).Methods(http.MethodPost)
	r.HandleFunc("/api/v1/webhooks/test", h.test).Methods(http.MethodPost)
}

type webhookAdmin struct{ svc *webhooks.Service }

type createWebhookRequest struct {
	ProjectID        string   `json:"projectId"`
	URL              string   `json:"url"`
	Events           []string `json:"events"`
	webhooks.Options          // the optional delivery settings (issue 55)
}

func (h webhookAdmin) create(w http.ResponseWriter, r *http.Request) {
	var req createWebhookRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	if req.ProjectID == "" {
		envelope.WriteError(w, r, fault.Validation("projectId is required ("+envelope.FindProject+")", map[string]string{"projectId": "required"}))
		return
	}
	sub, err := h.svc.Create(r.Context(), req.ProjectID, req.URL, req.Events, req.Options)
	envelope.Respond(w, r, http.StatusCreated, sub, err)
}

func (h webhookAdmin) get(w http.ResponseWriter, r *http.Request) {
	sub, err := h.svc.Get(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusOK, sub, err)
}

type updateWebhookRequest struct {
	URL    *string   `json:"url"`
	Events *[]string `json:"events"`
	Status *string   `json:"status"`
	webhooks.Options
}

func (h webhookAdmin) update(w http.ResponseWriter, r *http.Request) {
	var req updateWebhookRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	u := webhooks.Update{URL: req.URL, Status: req.Status, Options: req.Options}
	if req.Events != nil {
		u.Events = *req.Events
		if u.Events == nil {
			u.Events = []string{} // "events": [] is a validation error, not "unchanged"
		}
	}
	sub, err := h.svc.Update(r.Context(), mux.Vars(r)["id"], u)
	envelope.Respond(w, r, http.StatusOK, sub, err)
}

func (h webhookAdmin) delete(w http.ResponseWriter, r *http.Request) {
	if err := h.svc.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h webhookAdmin) rotate(w http.ResponseWriter, r *http.Request) {
	sub, err := h.svc.RotateSecret(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusOK, sub, err)
}

// deliveriesMeta pages a delivery listing by offset; NextOffset is null on the last page.
type deliveriesMeta struct {
	Limit      int  `json:"limit"`
	Offset     int  `json:"offset"`
	NextOffset *int `json:"nextOffset"`
}

func (h webhookAdmin) deliveries(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	limit := q.Int("limit", 20, 1, 100)
	offset := q.Int("offset", 0, 0, math.MaxInt32)
	status := q.Enum("status", webhooks.DeliveryPending, webhooks.DeliveryDelivering, webhooks.DeliverySucceeded,
		webhooks.DeliveryFailed, webhooks.DeliveryCancelled)
	if err := q.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	list, err := h.svc.Deliveries(r.Context(), mux.Vars(r)["id"], status, limit, offset)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	meta := deliveriesMeta{Limit: limit, Offset: offset}
	if len(list) == limit {
		next := offset + limit
		meta.NextOffset = &next
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[webhooks.Delivery]{Data: list, Meta: meta})
}

// deliveryView is a delivery with the body it sends and its attempts, oldest first.
type deliveryView struct {
	*webhooks.Delivery
	Attempts []webhooks.Attempt `json:"attempts"`
}

func (h webhookAdmin) delivery(w http.ResponseWriter, r *http.Request) {
	d, err := h.svc.Delivery(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	attempts, err := h.svc.Attempts(r.Context(), []string{d.ID})
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	view := deliveryView{Delivery: d, Attempts: attempts[d.ID]}
	if view.Attempts == nil {
		view.Attempts = []webhooks.Attempt{}
	}
	envelope.WriteJSON(w, http.StatusOK, view)
}

func (h webhookAdmin) redeliver(w http.ResponseWriter, r *http.Request) {
	d, err := h.svc.Redeliver(r.Context(), mux.Vars(r)["id"])
	envelope.Respond(w, r, http.StatusAccepted, d, err)
}

type recoverRequest struct {
	Since string `json:"since"`
	// Status is which finished deliveries to schedule again: failed (the default) or all
	// (succeeded, failed and cancelled).
	Status string `json:"status"`
}

func (h webhookAdmin) recover(w http.ResponseWriter, r *http.Request) {
	var req recoverRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	since, err := time.Parse(time.RFC3339Nano, req.Since)
	if err != nil {
		envelope.WriteError(w, r, fault.Validation("since must be an ISO 8601 timestamp", map[string]string{"since": "required, ISO 8601 (RFC 3339)"}))
		return
	}
	var all bool
	switch req.Status {
	case "", webhooks.DeliveryFailed:
	case "all":
		all = true
	default:
		envelope.WriteError(w, r, fault.Validation("status must be failed or all", map[string]string{"status": "failed (the default) or all"}))
		return
	}
	n, err := h.svc.Recover(r.Context(), mux.Vars(r)["id"], since, all)
	envelope.Respond(w, r, http.StatusAccepted, map[string]int{"recovered": n}, err)
}

func (h webhookAdmin) test(w http.ResponseWriter, r *http.Request) {
	var req webhooks.TestRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	res, err := h.svc.Test(r.Context(), req)
	envelope.Respond(w, r, http.StatusOK, res, err)
}
