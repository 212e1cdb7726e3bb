package fhir

// Transaction Bundles: every type served, all or nothing. The Patients and the generic store's
// resources are written in one Postgres transaction (patients.WriteTransaction), with every
// urn:uuid fullUrl and every conditional reference (Organization?identifier=…) resolved in every
// reference of every entry; the Observations then go through intake in one Kafka transaction. An
// Observation's id is known before it is sent (intake derives it from the client id this sets,
// the entry's uuid, and the final body), so a DiagnosticReport's result can name it. Should
// Kafka refuse the Observations, what the Postgres transaction wrote is removed before the 503:
// nothing of a refused transaction stays stored.

import (
	"encoding/json"
	"net/http"

	"carehub/api/envelope"
	"carehub/ingest/intake"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

func (h handler) transaction(r *http.Request, entries []inEntry) ([]entry, error) {
	list, bad := h.transactionEntries(r, entries)
	if len(bad) > 0 {
		return nil, transactionRefused(bad)
	}
	var obs []int
	for i, e := range list {
		if e.Type == "Observation" {
			obs = append(obs, i)
		}
	}
	if len(obs) > 0 { // before anything is written: intake would refuse them after
		if _, err := access.Require(r.Context(), access.WriteObservations); err != nil {
			return nil, err
		}
	}
	res, undo, err := h.Patients.WriteTransaction(r.Context(), list, intake.ClientObservationID, func(_ int, body []byte) error {
		if e := h.Intake.Check(body); e != nil {
			return entryFault(*e)
		}
		return nil
	})
	if refused, ok := err.(patients.EntryErrors); ok {
		return nil, transactionRefused(map[int]error(refused))
	}
	if err != nil {
		return nil, err
	}
	if len(obs) > 0 {
		if err := h.submitTransaction(r, res, obs); err != nil {
			if rerr := h.Patients.RemoveTransaction(r.Context(), undo); rerr != nil {
				envelope.LoggerFrom(r.Context()).Error("transaction: writes not removed after the observations were refused", "err", rerr)
			}
			return nil, err
		}
	}
	out := make([]entry, len(list))
	for i, e := range list {
		out[i] = transactionEntry(r, e.Type, res[i])
	}
	return out, nil
}

// transactionEntries reads the entries of a transaction; bad holds those refused as they stand.
func (h handler) transactionEntries(r *http.Request, entries []inEntry) ([]patients.TxEntry, map[int]error) {
	list := make([]patients.TxEntry, len(entries))
	bad := map[int]error{}
	for i, e := range entries {
		t, err := entryTarget(e)
		if err != nil {
			bad[i] = err
			continue
		}
		list[i] = patients.TxEntry{FullURL: e.FullURL, Type: t, Body: withoutServerElements(e.Resource)}
		cond := e.Request.IfNoneExist
		switch {
		case t == "Observation" && h.Intake == nil:
			bad[i] = &statusError{status: http.StatusMethodNotAllowed, msg: "this node does not run observation intake (the ingest role)"}
		case t == "Observation" && cond != "":
			bad[i] = &statusError{status: http.StatusBadRequest, param: "request.ifNoneExist", msg: "ifNoneExist is not supported for Observation"}
		case cond != "":
			c, err := parseCondition(t, cond, "request.ifNoneExist")
			if err != nil {
				bad[i] = err
				continue
			}
			if c.ident != nil { // matched in the transaction, under its lock
				list[i].IfNoneExist = c.ident
				continue
			}
			// Any other search is run as the search is, before the transaction: not atomic with
			// it (docs/FHIR.md).
			doc, err := h.match(r, t, c)
			if err != nil {
				bad[i] = err
				continue
			}
			if doc != nil {
				list[i].Existing, _ = idVersion(doc)
			}
		}
	}
	return list, bad
}

// submitTransaction sends the transaction's Observations through intake in one Kafka
// transaction and records the ids intake gave them.
func (h handler) submitTransaction(r *http.Request, res []patients.TxResult, obs []int) error {
	docs := make([]json.RawMessage, len(obs))
	for k, i := range obs {
		docs[k] = res[i].Body
	}
	sub, err := h.submit(r, "transaction", docs)
	if f := fault.As(err); f != nil {
		if rejected, ok := f.Details["rejected"].([]intake.EntryError); ok && len(rejected) > 0 {
			bad := map[int]error{} // intake's indexes are the Observations'; name the Bundle's entries
			for _, e := range rejected {
				if e.Index >= 0 && e.Index < len(obs) {
					bad[obs[e.Index]] = entryFault(e)
				}
			}
			return transactionRefused(bad)
		}
	}
	if err != nil {
		return err
	}
	for k, i := range obs {
		if k < len(sub.Answer.IDs) {
			if res[i].ID != "" && res[i].ID != sub.Answer.IDs[k] {
				// Not reached while intake derives ids as ClientObservationID says; were it to, a
				// reference to this Observation from another entry would dangle.
				envelope.LoggerFrom(r.Context()).Error("transaction: observation id differs from the one derived", "entry", i)
			}
			res[i].ID = sub.Answer.IDs[k]
		}
	}
	return nil
}

// transactionEntry is the transaction-response entry of one written entry.
func transactionEntry(r *http.Request, t string, res patients.TxResult) entry {
	id := ids.FHIR(res.ID)
	if t == "Observation" {
		return entry{Response: &entryResponse{Status: "201 Created", Location: "Observation/" + id + "/_history/1", Etag: `W/"1"`}}
	}
	_, version := idVersion(res.Doc)
	status := "201 Created"
	if !res.Created {
		status = "200 OK"
	}
	e := entry{FullURL: baseURL(r) + "/" + t + "/" + id, Resource: res.Doc, Response: &entryResponse{Status: status,
		Location: t + "/" + id + "/_history/" + version, Etag: `W/"` + version + `"`}}
	if minimal(r, t) {
		e.Resource = nil
	}
	return e
}

// genericBatchEntry creates one batch entry of the generic store. A reference to another entry
// (urn:uuid:) is refused: a batch's entries are independent (FHIR), so it could only dangle.
func (h handler) genericBatchEntry(r *http.Request, e inEntry) entry {
	t, _ := entryTarget(e)
	read := func(int64) ([]byte, error) { return e.Resource, nil }
	return genericEntry(r, t, h.createGeneric(r, t, e.Request.IfNoneExist, read))
}
