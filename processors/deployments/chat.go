package deployments

import (
	"context"
	"errors"
	"net/http"
	"time"

	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/processors/inference/chat"
)

// ProtocolChat is OpenAI-compatible chat completions (vLLM, llama.cpp's server, TGI, Ollama):
// the backend of LLM agents (agents.SkillLLM).
const ProtocolChat = agents.ProtocolChat

// DefaultChatTimeout bounds one chat completion: generation takes longer than a model's scoring,
// and an async session's run must still end inside its worker's lease (agents.DefaultLease).
const DefaultChatTimeout = 20 * time.Second

// Chat sends an LLM agent's call to its deployment's chat backend (agents.Chatter), on a replica
// of this node, counted for the deployment's health as invocations are. A backend not covered by
// a business associate agreement gets a de-identified conversation (agents.ChatCall.Messages),
// whatever the deployment's mode: a patient's identifiers leave carehub only for a BAA. A deployment of another organization is NotFound;
// one not serving is Unavailable (PENDING) or a Conflict; a backend that fails, times out or
// has its circuit open is Unavailable; one that refuses the request is a Conflict.
func (inv *Invoker) Chat(ctx context.Context, call agents.ChatCall) (agents.ChatAnswer, error) {
	d, err := inv.deployment(ctx, call.DeploymentID)
	switch {
	case err != nil:
		return agents.ChatAnswer{}, err
	case d == nil || d.orgID != call.OrgID:
		return agents.ChatAnswer{}, fault.NotFound("deployment", call.DeploymentID)
	case d.status == StatusPending:
		return agents.ChatAnswer{}, fault.Unavailable("deployment %s is PENDING: it serves once RUNNING; retry shortly", d.id)
	case d.status == StatusStopped || d.status == StatusFailed:
		return agents.ChatAnswer{}, fault.Conflict("deployment %s is %s and serves no requests", d.id, d.status)
	case d.backend == nil || d.backend.Protocol != ProtocolChat:
		return agents.ChatAnswer{}, fault.Conflict("deployment %s has no %s backend", d.id, ProtocolChat)
	}
	deidentify := !d.backend.BAA
	msgs, err := call.Messages(deidentify)
	if err != nil {
		return agents.ChatAnswer{}, err
	}
	req := chat.Request{MaxTokens: call.MaxTokens}
	for _, m := range msgs {
		req.Messages = append(req.Messages, chat.Message{Role: m.Role, Content: m.Content})
	}
	var ans agents.ChatAnswer
	_, err = inv.invokeOnReplica(ctx, d, InvokeRequest{}, func(res *InvokeResult) error {
		res.Runtime = ProtocolChat
		resp, err := inv.complete(ctx, d, req)
		if err != nil {
			return err
		}
		ans = agents.ChatAnswer{Text: resp.Content, Model: ProtocolChat + ":" + d.backend.Model, FinishReason: resp.FinishReason,
			PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens, TotalTokens: resp.Usage.TotalTokens,
			Deidentified: deidentify}
		return nil
	})
	return ans, err
}

// complete sends req to d's chat backend through its circuit breaker. A failure before the
// request reached the server (connection refused, 503, 429) is retried once; a timeout is not,
// since generating again would double the wait.
func (inv *Invoker) complete(ctx context.Context, d *served, req chat.Request) (chat.Response, error) {
	r, err := inv.remotes.get(d.id, d.backend, d.credential, inv.cfg.ChatTimeout)
	if err != nil {
		return chat.Response{}, err
	}
	if err := r.allow(time.Now()); err != nil {
		return chat.Response{}, err
	}
	resp, err := r.chat.Complete(ctx, req)
	if chat.Retryable(err) && !timedOut(err) && ctx.Err() == nil {
		resp, err = r.chat.Complete(ctx, req)
	}
	r.record(err, time.Now())
	var se *chat.StatusError
	switch {
	case err == nil:
		return resp, nil
	case errors.As(err, &se) && se.StatusCode >= 400 && se.StatusCode < 500 && !chat.Retryable(err):
		return chat.Response{}, fault.Conflict("the chat backend refused the request (HTTP %d): %s", se.StatusCode, se.Message)
	case errors.As(err, &se) && se.StatusCode == http.StatusTooManyRequests:
		return chat.Response{}, fault.Wrap(fault.KindUnavailable, err, "the chat backend is busy (HTTP 429); retry shortly")
	default:
		return chat.Response{}, fault.Wrap(fault.KindUnavailable, err, "the deployment's chat backend did not answer: "+err.Error())
	}
}

// timedOut reports whether err is a timeout, the call's or the caller's.
func timedOut(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
