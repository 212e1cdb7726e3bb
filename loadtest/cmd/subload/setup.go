package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/tick"
	"carehub/processors/fhirsubs"
)

// setupWorkers is how many calls set-up makes at once.
const setupWorkers = 8

// client calls the node with the keys in turn, retrying what the node refuses for load (429,
// 503 with Retry-After).
type client struct {
	byKey []*pipelinetest.Client
	next  atomic.Uint64
}

func (c *client) pick() *pipelinetest.Client {
	return c.byKey[c.next.Add(1)%uint64(len(c.byKey))]
}

// rest calls method path (in as JSON, out decoded), retrying refusals for up to a minute.
func (c *client) rest(ctx context.Context, method, path string, in, out any) error {
	deadline := time.Now().Add(time.Minute)
	for {
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := c.pick().REST(callCtx, method, path, in, out)
		cancel()
		wait, refused := refusal(err)
		if !refused || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		tick.Sleep(ctx, max(wait, 100*time.Millisecond))
	}
}

// refusal reports whether err is the node refusing load (429, or 503 with Retry-After).
func refusal(err error) (time.Duration, bool) {
	if wait, ok := pipelinetest.RateLimited(err); ok {
		return wait, true
	}
	var se *pipelinetest.StatusError
	if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable {
		return se.RetryAfter, true
	}
	return 0, false
}

// parallel runs fn(i) for i in [0, n), setupWorkers at a time, and returns the first error.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range min(setupWorkers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// createPatients creates n patients with POST /fhir/R4/Patient and returns their FHIR ids.
func createPatients(ctx context.Context, c *client, n int, run string) ([]string, error) {
	out := make([]string, n)
	err := parallel(ctx, n, func(ctx context.Context, i int) error {
		body := map[string]any{"resourceType": "Patient",
			"name":   []any{map[string]any{"family": "Subload" + run, "given": []string{"P" + strconv.Itoa(i)}}},
			"gender": "female", "birthDate": "1970-03-04",
			"identifier": []any{map[string]any{"system": "urn:carehub:subload", "value": run + "-" + strconv.Itoa(i)}}}
		var got struct{ ID string }
		if err := c.rest(ctx, http.MethodPost, "/fhir/R4/Patient", body, &got); err != nil {
			return fmt.Errorf("create patient %d: %w", i, err)
		}
		if got.ID == "" {
			return fmt.Errorf("create patient %d: no id in the answer", i)
		}
		out[i] = got.ID
		return nil
	})
	return out, err
}

const backport = "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"

// subscription is the rest-hook Subscription of observation-created for patient (a FHIR id),
// id-only, to endpoint.
func subscription(patient, endpoint string, maxCount int) map[string]any {
	ch := map[string]any{"type": fhirsubs.ChannelRestHook, "endpoint": endpoint, "payload": "application/fhir+json",
		"_payload": map[string]any{"extension": []any{map[string]any{"url": backport + "backport-payload-content", "valueCode": fhirsubs.ContentIDOnly}}}}
	if maxCount > 0 {
		ch["extension"] = []any{map[string]any{"url": backport + "backport-max-count", "valuePositiveInt": maxCount}}
	}
	return map[string]any{"resourceType": "Subscription", "status": "requested", "reason": "subload",
		"criteria": fhirsubs.TopicBase + "observation-created",
		"_criteria": map[string]any{"extension": []any{map[string]any{"url": backport + "backport-filter-criteria",
			"valueString": "Observation?patient=Patient/" + patient}}},
		"channel": ch}
}

// createSubscriptions creates one subscription per patient, subscription i's endpoint
// receiver/s/i, and hands each secret to the tracker. It returns the subscriptions' ids.
func createSubscriptions(ctx context.Context, c *client, t *tracker, patients []string, receiver string, maxCount int) ([]string, error) {
	out := make([]string, len(patients))
	err := parallel(ctx, len(patients), func(ctx context.Context, i int) error {
		var got struct {
			ID        string
			Status    string
			Extension []struct{ URL, ValueString string }
		}
		if err := c.rest(ctx, http.MethodPost, "/fhir/R4/Subscription", subscription(patients[i], receiver+"/s/"+strconv.Itoa(i), maxCount), &got); err != nil {
			return fmt.Errorf("create subscription %d: %w", i, err)
		}
		for _, e := range got.Extension {
			if e.URL == fhirsubs.ExtSigningSecret {
				t.setSecret(i, e.ValueString)
			}
		}
		if got.ID == "" {
			return fmt.Errorf("create subscription %d: no id in the answer", i)
		}
		out[i] = got.ID
		return nil
	})
	return out, err
}

// searchIDs lists the ids of the subscriptions of status (at most the node's 500 newest).
func searchIDs(ctx context.Context, c *client, status string) ([]string, error) {
	var b struct {
		Entry []struct {
			Resource struct{ ID string } `json:"resource"`
		} `json:"entry"`
	}
	if err := c.rest(ctx, http.MethodGet, "/fhir/R4/Subscription?status="+status, nil, &b); err != nil {
		return nil, err
	}
	ids := make([]string, len(b.Entry))
	for i, e := range b.Entry {
		ids[i] = e.Resource.ID
	}
	return ids, nil
}

// awaitActive waits until none of ids is requested or in error (the handshake made every one
// active), at most timeout, reporting progress on logw.
func awaitActive(ctx context.Context, c *client, ids []string, timeout time.Duration, logw io.Writer) error {
	deadline := time.Now().Add(timeout)
	mine := map[string]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	last := time.Now()
	for {
		waiting := 0
		for _, status := range []string{fhirsubs.StatusRequested, fhirsubs.StatusError} {
			list, err := searchIDs(ctx, c, status)
			if err != nil {
				return fmt.Errorf("search subscriptions: %w", err)
			}
			waiting += len(slices.DeleteFunc(list, func(id string) bool { return !mine[id] }))
		}
		if waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d or more subscriptions still requested or in error after %v", waiting, timeout)
		}
		if time.Since(last) > 5*time.Second {
			fmt.Fprintf(logw, "subload: %d+ subscriptions not active yet\n", waiting)
			last = time.Now()
		}
		if !tick.Sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// deleteSubscriptions deletes ids (a run against a node of its own leaves none behind).
func deleteSubscriptions(ctx context.Context, c *client, ids []string) error {
	return parallel(ctx, len(ids), func(ctx context.Context, i int) error {
		if ids[i] == "" {
			return nil
		}
		return c.rest(ctx, http.MethodDelete, "/fhir/R4/Subscription/"+ids[i], nil, nil)
	})
}
