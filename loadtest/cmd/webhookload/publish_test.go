package main

import (
	"encoding/json"
	"testing"
	"time"
)

func TestBatchBodyIsWhatTheReceiverReads(t *testing.T) {
	sent := time.Unix(1700000000, 123456789)
	for _, filler := range []string{"", `x"\<`} {
		body := newBatchBody("prj_1", "webhookload.rab.load", filler, 3).encode(2, 41, sent)
		var got []struct {
			ProjectID string `json:"projectId"`
			Type      string `json:"type"`
			Payload   struct {
				Client int    `json:"client"`
				Seq    int    `json:"seq"`
				SentAt int64  `json:"sentAt"`
				Filler string `json:"filler"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("filler %q: %v in %s", filler, err, body)
		}
		if len(got) != 3 {
			t.Fatalf("filler %q: %d events, want 3", filler, len(got))
		}
		for _, e := range got {
			p := e.Payload
			if e.ProjectID != "prj_1" || e.Type != "webhookload.rab.load" || p.Client != 2 || p.Seq != 41 ||
				p.SentAt != sent.UnixNano() || p.Filler != filler {
				t.Errorf("filler %q: event %+v", filler, e)
			}
		}
	}
}
