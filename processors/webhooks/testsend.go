package webhooks

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/whsig"
)

// TestRequest names the destination of a test send: a subscription (its URL and secret) or a
// URL (checked like a subscription's, signed with a one-off secret).
type TestRequest struct {
	WebhookID string `json:"webhookId,omitempty"`
	URL       string `json:"url,omitempty"`
}

// TestRequestSent is the request a test send made.
type TestRequestSent struct {
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// TestResult is the attempt of a test send. Secret is the one-off secret of a send to a URL.
type TestResult struct {
	Success      bool            `json:"success"`
	StatusCode   *int            `json:"statusCode"`
	LatencyMs    int             `json:"latencyMs"`
	Error        *string         `json:"error"`
	Request      TestRequestSent `json:"request"`
	ResponseBody *string         `json:"responseBody"`
	Secret       string          `json:"secret,omitempty"`
	AttemptedAt  time.Time       `json:"attemptedAt"`
}

// Test signs and sends a sample workflow.run.completed event (POST /api/v1/webhooks/test) and
// returns the attempt. It records nothing: no delivery, no change to the subscription's status.
func (s *Service) Test(ctx context.Context, req TestRequest) (*TestResult, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if (req.WebhookID == "") == (req.URL == "") {
		return nil, fault.Validation("give either webhookId or url", map[string]string{"webhookId": "either webhookId or url is required"})
	}
	orgID, projectID, url := p.OrgID, "", req.URL
	var secrets []string
	var oneOff string
	if req.WebhookID != "" {
		var stored storedSecrets
		err := s.pool.QueryRow(ctx, `select org_id, project_id, url, `+secretColumns+`
from webhooks where id = $1 and deleted_at is null and ($2 = '' or org_id = $2)`, req.WebhookID, p.OrgFilter()).
			Scan(append([]any{&orgID, &projectID, &url}, stored.dest()...)...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fault.NotFound("webhook", req.WebhookID)
		}
		if err != nil {
			return nil, wrap("test webhook", err)
		}
		if secrets, err = s.box.secrets(req.WebhookID, stored); err != nil {
			return nil, wrap("test webhook", err)
		}
	} else {
		if err := s.checkURL(req.URL); err != nil {
			return nil, err
		}
		oneOff = whsig.NewSecret()
		secrets = []string{oneOff}
	}
	ev, err := SampleEvent(orgID, projectID)
	if err != nil {
		return nil, wrap("test webhook", err)
	}
	body, err := Body(ev)
	if err != nil {
		return nil, wrap("test webhook", err)
	}
	out := s.sender.send(ctx, url, ev.ID, body, secrets)
	res := &TestResult{
		Success:     out.Succeeded(),
		LatencyMs:   int(out.Latency.Milliseconds()),
		Request:     TestRequestSent{URL: url, Headers: flatten(out.Header), Body: string(body)},
		Secret:      oneOff,
		AttemptedAt: out.AttemptedAt.UTC(),
	}
	if out.StatusCode != 0 {
		res.StatusCode = &out.StatusCode
		res.ResponseBody = &out.ResponseBody
	}
	if out.Err != "" {
		res.Error = &out.Err
	}
	return res, nil
}

// SampleEvent is the workflow.run.completed event a test send delivers, with fresh ids.
func SampleEvent(orgID, projectID string) (events.Event, error) {
	return events.New(events.TypeWorkflowRunCompleted, orgID, projectID, events.SourceWorkflow, events.SeverityInfo, events.WorkflowRunCompleted{
		RunID:          ids.New(ids.Run),
		WorkflowID:     ids.New(ids.Workflow),
		Status:         "COMPLETED",
		DurationMs:     1840,
		AlertGenerated: true,
		Severity:       "HIGH",
	})
}

func flatten(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[http.CanonicalHeaderKey(k)] = v[0]
		}
	}
	return out
}
