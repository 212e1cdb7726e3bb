package fhir

// FHIR Subscriptions, the R4 topic-based backport (https://hl7.org/fhir/uv/subscriptions-backport/):
// the SubscriptionTopic catalogue, Subscription create, read, search and delete, $status,
// $events, $get-ws-binding-token and the websocket channel. processors/fhirsubs keeps the
// subscriptions, numbers their events from the event stream and delivers rest-hook notifications.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/gorilla/mux"

	"carehub/kernel/ids"
	"carehub/processors/fhirsubs"
)

// subscriptionBodyLimit bounds a Subscription resource.
const subscriptionBodyLimit = 64 << 10

// WebSocketPath is the websocket channel's endpoint under the base.
const WebSocketPath = "/$subscription-websocket"

// mountSubscriptions mounts the Subscriptions routes on authed and the websocket channel (which a
// binding token authenticates) on public; Mount calls it before the resource routes.
func (h handler) mountSubscriptions(public, authed *mux.Router) {
	if h.Subscriptions == nil {
		return
	}
	authed.HandleFunc(Base+"/SubscriptionTopic", h.topics).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/SubscriptionTopic/{id}", h.topic).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/Subscription", h.createSubscription).Methods(http.MethodPost)
	authed.HandleFunc(Base+"/Subscription", h.searchSubscriptions).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/Subscription/{id}", h.readSubscription).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/Subscription/{id}", h.deleteSubscription).Methods(http.MethodDelete)
	authed.HandleFunc(Base+"/Subscription/{id}", h.updateSubscription).Methods(http.MethodPut)
	authed.HandleFunc(Base+"/Subscription/{id}/$status", h.subscriptionStatus).Methods(http.MethodGet, http.MethodPost)
	authed.HandleFunc(Base+"/Subscription/{id}/$events", h.subscriptionEvents).Methods(http.MethodGet, http.MethodPost)
	authed.HandleFunc(Base+"/Subscription/{id}/$get-ws-binding-token", h.bindingToken).Methods(http.MethodGet, http.MethodPost)
	public.HandleFunc(Base+WebSocketPath, h.subscriptionSocket).Methods(http.MethodGet)
}

// topics lists the SubscriptionTopic catalogue as R4B resources in a searchset Bundle.
func (h handler) topics(w http.ResponseWriter, r *http.Request) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return
	}
	var entries []map[string]any
	for _, t := range fhirsubs.Topics {
		entries = append(entries, map[string]any{"fullUrl": baseURL(r) + "/SubscriptionTopic/" + t.ID, "resource": t.Resource4B(),
			"search": map[string]string{"mode": "match"}})
	}
	writeResource(w, http.StatusOK, map[string]any{"resourceType": "Bundle", "type": "searchset", "total": len(entries), "entry": entries})
}

func (h handler) topic(w http.ResponseWriter, r *http.Request) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return
	}
	t, ok := fhirsubs.LookupTopic(mux.Vars(r)["id"])
	if !ok {
		writeError(w, r, &statusError{status: http.StatusNotFound, msg: "no SubscriptionTopic " + strconv.Quote(mux.Vars(r)["id"]) +
			" (GET " + Base + "/SubscriptionTopic lists them)"})
		return
	}
	writeResource(w, http.StatusOK, t.Resource4B())
}

func (h handler) createSubscription(w http.ResponseWriter, r *http.Request) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return
	}
	body, err := readBody(w, r, subscriptionBodyLimit)
	if err != nil {
		writeError(w, r, err)
		return
	}
	doc, err := h.Subscriptions.Create(r.Context(), body)
	if err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	id, _ := idVersion(doc)
	w.Header().Set("Location", baseURL(r)+"/Subscription/"+ids.FHIR(id))
	writeResource(w, http.StatusCreated, doc)
}

func (h handler) readSubscription(w http.ResponseWriter, r *http.Request) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return
	}
	doc, err := h.Subscriptions.Read(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	writeResource(w, http.StatusOK, doc)
}

// searchSubscriptions lists the caller's subscriptions; status is the one parameter.
func (h handler) searchSubscriptions(w http.ResponseWriter, r *http.Request) {
	if err := checkFormat(r); err != nil {
		writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	for name := range q {
		if name != "status" && name != "_format" {
			writeError(w, r, badParam(name, "is not a search parameter of Subscription here (status is)"))
			return
		}
	}
	docs, err := h.Subscriptions.Search(r.Context(), q.Get("status"))
	if err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	entries := make([]map[string]any, 0, len(docs))
	for _, d := range docs {
		id, _ := idVersion(d)
		entries = append(entries, map[string]any{"fullUrl": baseURL(r) + "/Subscription/" + ids.FHIR(id), "resource": d,
			"search": map[string]string{"mode": "match"}})
	}
	writeResource(w, http.StatusOK, map[string]any{"resourceType": "Bundle", "type": "searchset", "total": len(entries), "entry": entries})
}

func (h handler) deleteSubscription(w http.ResponseWriter, r *http.Request) {
	if err := h.Subscriptions.Delete(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// updateSubscription: a subscription is changed by deleting it and creating another. The refusal
// comes after the checks a read makes, so it tells another tenant nothing.
func (h handler) updateSubscription(w http.ResponseWriter, r *http.Request) {
	if _, err := h.Subscriptions.Read(r.Context(), mux.Vars(r)["id"]); err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	writeError(w, r, &statusError{status: http.StatusMethodNotAllowed, code: "not-supported",
		msg: "a Subscription is not updated here: DELETE it and POST a new one (its events are numbered anew)"})
}

func (h handler) subscriptionStatus(w http.ResponseWriter, r *http.Request) {
	doc, err := h.Subscriptions.Status(r.Context(), mux.Vars(r)["id"], baseURL(r))
	if err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	writeResource(w, http.StatusOK, doc)
}

// subscriptionEvents is $events: eventsSinceNumber, eventsUntilNumber and content.
func (h handler) subscriptionEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	num := func(name string) (int64, error) {
		v := q.Get(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return 0, badParam(name, "is an event number (1 or more)")
		}
		return n, nil
	}
	since, err := num("eventsSinceNumber")
	if err == nil {
		var until int64
		until, err = num("eventsUntilNumber")
		content := q.Get("content")
		switch content {
		case "", fhirsubs.ContentEmpty, fhirsubs.ContentIDOnly, fhirsubs.ContentFull:
		default:
			err = badParam("content", "is empty, id-only or full-resource")
		}
		if err == nil {
			var doc json.RawMessage
			doc, err = h.Subscriptions.Events(r.Context(), mux.Vars(r)["id"], since, until, content, baseURL(r))
			if err == nil {
				writeResource(w, http.StatusOK, doc)
				return
			}
		}
	}
	writeErrorAt(w, r, err, "Subscription")
}

// bindingToken is $get-ws-binding-token: Parameters with token, expiration, subscription and
// websocket-url.
func (h handler) bindingToken(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	token, expires, err := h.Subscriptions.BindingToken(r.Context(), id)
	if err != nil {
		writeErrorAt(w, r, err, "Subscription")
		return
	}
	wsURL := "ws" + strings.TrimPrefix(baseURL(r), "http") + WebSocketPath
	writeResource(w, http.StatusOK, map[string]any{"resourceType": "Parameters", "parameter": []map[string]any{
		{"name": "token", "valueString": token},
		{"name": "expiration", "valueDateTime": expires.UTC().Format(time.RFC3339)},
		{"name": "subscription", "valueString": baseURL(r) + "/Subscription/" + ids.FHIR(ids.FromFHIR(id))},
		{"name": "websocket-url", "valueUrl": wsURL},
	}})
}

// bindTimeout bounds the wait for a socket's bind-with-token message.
const bindTimeout = 10 * time.Second

// Bounds of the websocket channel's bound sockets on a node: in all, per organization and per
// subscription. One more is closed with 1013 (try again later), so that one key's sockets cannot
// keep every other tenant's subscribers out.
const (
	MaxSubscriptionSockets       = 2000
	MaxSubscriptionSocketsPerOrg = 500
	MaxSocketsPerSubscription    = 4
)

// sockets counts the node's bound sockets: in all (""), by organization and by subscription.
var sockets = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// holdSocket counts one more bound socket of sub, or says which bound it would pass.
func holdSocket(sub fhirsubs.Subscription) (release func(), refused string) {
	sockets.Lock()
	defer sockets.Unlock()
	switch {
	case sockets.n[""] >= MaxSubscriptionSockets:
		return nil, "this node holds as many subscription sockets as it may"
	case sockets.n["org "+sub.OrgID] >= MaxSubscriptionSocketsPerOrg:
		return nil, "this node holds as many of the organization's subscription sockets as it may"
	case sockets.n["sub "+sub.ID] >= MaxSocketsPerSubscription:
		return nil, "this subscription has as many sockets bound on this node as it may"
	}
	keys := []string{"", "org " + sub.OrgID, "sub " + sub.ID}
	for _, k := range keys {
		sockets.n[k]++
	}
	return func() {
		sockets.Lock()
		defer sockets.Unlock()
		for _, k := range keys {
			if sockets.n[k]--; sockets.n[k] == 0 {
				delete(sockets.n, k)
			}
		}
	}, ""
}

// subscriptionSocket is the websocket channel: the client sends "bind-with-token <token>"; the
// server sends the handshake Bundle, then notification and heartbeat Bundles as text messages.
// A bad token closes the socket with 4403 and the reason.
func (h handler) subscriptionSocket(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered
	}
	defer c.CloseNow()
	c.SetReadLimit(4 << 10)
	// A socket that sends no bind in time is closed with a close frame saying why.
	silent := time.AfterFunc(bindTimeout, func() {
		c.Close(websocket.StatusPolicyViolation, "no bind-with-token within 10 s")
	})
	typ, msg, err := c.Read(r.Context())
	if !silent.Stop() {
		return
	}
	token, ok := strings.CutPrefix(strings.TrimSpace(string(msg)), "bind-with-token ")
	if err != nil || typ != websocket.MessageText || !ok {
		c.Close(websocket.StatusPolicyViolation, "send bind-with-token <token> first (a token from $get-ws-binding-token)")
		return
	}
	sub, err := h.Subscriptions.Bind(r.Context(), strings.TrimSpace(token))
	if err == nil {
		release, refused := holdSocket(sub)
		if refused != "" {
			c.Close(websocket.StatusTryAgainLater, refused+": try again later")
			return
		}
		defer release()
		// Reads go on in the background: they answer the client's pings and see its close.
		ctx := c.CloseRead(r.Context())
		err = h.Subscriptions.Stream(ctx, sub, baseURL(r), h.Wake, func(b []byte) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return c.Write(wctx, websocket.MessageText, b)
		})
		if ctx.Err() != nil {
			err = nil
		}
	}
	switch {
	case err == nil:
		c.Close(websocket.StatusNormalClosure, "")
	case errors.Is(err, fhirsubs.ErrBadToken):
		c.Close(4403, err.Error())
	default:
		reason := err.Error()
		if len(reason) > 120 {
			reason = reason[:120]
		}
		c.Close(websocket.StatusGoingAway, reason)
	}
}
