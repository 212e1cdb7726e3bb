package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	obswriter "carehub/processors/observations"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// The consumers check waits until a member of each group the node started holds every
// partition of its topic.
func TestConsumersCheckWaitsForAssignment(t *testing.T) {
	cl := kafkatest.Client(t)
	ns := kafka.Namespace(kafkatest.Name(t, "readyz"))
	s := &Node{kcl: cl, ns: ns, topics: ns.Topics(), started: []string{"postgres", "kafka", "observation-writer"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(ctx, cl, kafka.Layout{Partitions: 3}, s.topics.Observations); err != nil {
		t.Fatal(err)
	}
	groups := s.consumerGroups()
	if len(groups) != 1 || groups[0].group != ns.Name(obswriter.DefaultGroup) || groups[0].topic != s.topics.Observations {
		t.Fatalf("groups %+v", groups)
	}
	if w := waiting(s.consumerLags(ctx, groups)); w != "waiting: observation-writer holds 0 of 3 partitions" {
		t.Fatalf("no member: %q", w)
	}
	member := kafkatest.Client(t, consume.GroupOpts(groups[0].group, groups[0].topic)...)
	testenv.Eventually(t, 30*time.Second, "the member to hold every partition", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		member.PollFetches(pctx)
		cancel()
		member.AllowRebalance()
		lags := s.consumerLags(ctx, groups)
		return waiting(lags) == "" && lags[0].Assigned == 3
	})
}

// The ring keeps the last error lines with their context keys, nothing else of them, and
// passes every line on as the node's handler would log it.
func TestRecentErrorsKeepContextOnly(t *testing.T) {
	ring := &errorRing{}
	var out bytes.Buffer
	l := slog.New(ringHandler{Handler: slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), ring: ring}).
		With("component", "eventlog", "patient_id", "pat_1")
	l.Info("not an error")
	l.Error("store failed", "err", errors.New("dial tcp: connection refused"), "payload", `{"name":"x"}`, "offset", 7)
	got := ring.recent()
	if len(got) != 1 || got[0].Message != "store failed" ||
		fmt.Sprint(got[0].Attrs) != "map[component:eventlog err:dial tcp: connection refused offset:7]" {
		t.Fatalf("kept %+v", got)
	}
	if !strings.Contains(out.String(), `"patient_id":"pat_1"`) || strings.Contains(out.String(), "not an error") {
		t.Fatalf("the node's handler logged %s", out.String())
	}
	for i := range 2 * recentErrors {
		l.Error("again", "offset", i)
	}
	got = ring.recent()
	if len(got) != recentErrors || got[len(got)-1].Attrs["offset"] != fmt.Sprint(2*recentErrors-1) {
		t.Fatalf("kept %d, last %+v", len(got), got[len(got)-1])
	}
}

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("kafka ping: %w", context.DeadlineExceeded), "no answer within 2s"},
		{fmt.Errorf("failed to connect to `user=carehub`: dial error: %w", errors.New("server is shutting down")), "server is shutting down"},
		{errors.New(strings.Repeat("x", 300)), strings.Repeat("x", 100) + "…"},
	} {
		if got := reason(tc.err); got != tc.want {
			t.Errorf("reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
