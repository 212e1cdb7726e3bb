package chat

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"carehub/processors/inference/chat/llamacpptest"
)

// These tests run a real llama-cpp-python server (llamacpptest: tests/llamacpp) serving a
// tiny random-weight model. They need the venv that tests/llamacpp/setup.sh makes; without
// it, or with a stale one, they fail and name the setup command.

func llamaClient(t *testing.T, srv *llamacpptest.Server, edit func(*Config)) *Client {
	t.Helper()
	cfg := Config{BaseURL: srv.URL, APIKey: srv.APIKey, Model: srv.Model, Timeout: 30 * time.Second}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// greedy asks for at most maxTokens tokens, deterministically.
func greedy(maxTokens int, msgs ...Message) Request {
	temp, seed := 0.0, int64(1)
	return Request{Messages: msgs, MaxTokens: maxTokens, Temperature: &temp, Seed: &seed}
}

func checkUsage(t *testing.T, what string, r Response, maxTokens int) {
	t.Helper()
	u := r.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens <= 0 || u.CompletionTokens > maxTokens ||
		u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("%s: usage %+v, want prompt > 0, 0 < completion <= %d, total = prompt + completion", what, u, maxTokens)
	}
}

func TestLlamaCppServer(t *testing.T) {
	srv := llamacpptest.Start(t)
	ctx := context.Background()
	c := llamaClient(t, srv, nil)

	t.Run("Ready", func(t *testing.T) {
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
		v1 := llamaClient(t, srv, func(cfg *Config) { cfg.BaseURL += "/v1/" })
		if err := v1.Ready(ctx); err != nil {
			t.Errorf("Ready with BaseURL ending in /v1/: %v", err)
		}
		// The server answers requests for an unknown model with its default one; Ready
		// is where a wrong name shows.
		other := llamaClient(t, srv, func(cfg *Config) { cfg.Model = "no-such-model" })
		if err := other.Ready(ctx); !errors.Is(err, ErrNotReady) {
			t.Errorf("Ready for an unknown model: %v, want ErrNotReady", err)
		}
	})

	t.Run("WrongKey", func(t *testing.T) {
		bad := llamaClient(t, srv, func(cfg *Config) { cfg.APIKey = "wrong-key" })
		_, err := bad.Complete(ctx, greedy(4, Message{Role: "user", Content: "hello"}))
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized || Retryable(err) {
			t.Errorf("wrong key: %v, want a non-retryable 401", err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong-key") {
			t.Errorf("error shows the key: %v", err)
		}
	})

	t.Run("Complete", func(t *testing.T) {
		const maxTokens = 8
		short := greedy(maxTokens, Message{Role: "user", Content: "hello"})
		long := greedy(maxTokens,
			Message{Role: "system", Content: "You are a care assistant. Answer in one short sentence."},
			Message{Role: "user", Content: "Summarize the vital signs note: heart rate 88, blood pressure 120/80, " +
				"temperature 37.2 °C, oxygen saturation 97 %. Is the patient stable?"})
		a, err := c.Complete(ctx, short)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Complete(ctx, long)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("short: %+v", a.Usage)
		t.Logf("long:  %+v", b.Usage)
		checkUsage(t, "short prompt", a, maxTokens)
		checkUsage(t, "long prompt", b, maxTokens)
		if b.Usage.PromptTokens <= a.Usage.PromptTokens+20 {
			t.Errorf("prompt tokens %d (long) vs %d (short): the count does not follow the prompt", b.Usage.PromptTokens, a.Usage.PromptTokens)
		}
		if a.Content == "" || a.Model == "" || a.ID == "" || a.FinishReason == "" {
			t.Errorf("response %+v: want content, model, id and finish reason", a)
		}
		again, err := c.Complete(ctx, short)
		if err != nil {
			t.Fatal(err)
		}
		if again.Content != a.Content || again.Usage != a.Usage {
			t.Errorf("greedy decoding differs between calls: %+v then %+v", a, again)
		}
	})

	t.Run("PromptOverContext", func(t *testing.T) {
		huge := greedy(4, Message{Role: "user", Content: strings.Repeat("vitals ", 2*llamacpptest.ContextSize)})
		_, err := c.Complete(ctx, huge)
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode/100 != 4 || Retryable(err) {
			t.Errorf("prompt over the context: %v, want a non-retryable 4xx", err)
		}
		t.Logf("prompt over the context: %v", err)
	})

	t.Run("KillRestart", func(t *testing.T) {
		srv.Kill()
		start := time.Now()
		_, err := c.Complete(ctx, greedy(4, Message{Role: "user", Content: "hello"}))
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Complete took %v against a killed server", d)
		}
		var te *TransportError
		if !errors.As(err, &te) || !Retryable(err) {
			t.Errorf("after Kill: %v, want a retryable TransportError", err)
		}
		if err := c.Ready(ctx); !Retryable(err) {
			t.Errorf("Ready after Kill: %v, want a retryable error", err)
		}
		srv.Restart(t)
		r, err := c.Complete(ctx, greedy(4, Message{Role: "user", Content: "hello"}))
		if err != nil {
			t.Fatalf("after Restart: %v\n%s", err, srv.Log())
		}
		checkUsage(t, "after Restart", r, 4)
	})
}
