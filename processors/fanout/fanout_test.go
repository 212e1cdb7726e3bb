package fanout

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/storage/kafka/kafkatest"
)

func startHub(t *testing.T) (*Hub, *kgo.Client, string) {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, "fanout")
	h, err := New(Config{Brokers: brokers, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return h, prod, topic
}

func produce(t *testing.T, cl *kgo.Client, n int, prefix string) {
	t.Helper()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		b, _ := json.Marshal(events.Event{ID: fmt.Sprintf("%s%d", prefix, i), Type: "x.y", ProjectID: "prj_1", CreatedAt: time.Now()})
		recs[i] = &kgo.Record{Key: []byte("prj_1"), Value: b}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitAssigned produces probe events until the hub has read one: it reads from the tail, so
// events produced before it has its partitions are (by design) not delivered.
func waitAssigned(t *testing.T, h *Hub, prod *kgo.Client) {
	t.Helper()
	probe := h.Subscribe(1000)
	defer probe.Close()
	deadline := time.After(20 * time.Second)
	for {
		produce(t, prod, 1, "probe")
		select {
		case <-probe.C:
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("hub never delivered a probe event")
		}
	}
}

func TestFanOutDeliversToEverySubscriberInOrder(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	a, b := h.Subscribe(100), h.Subscribe(100)
	defer a.Close()
	defer b.Close()
	produce(t, prod, 50, "e")
	for _, s := range []*Subscription{a, b} {
		for i := 0; i < 50; i++ {
			select {
			case ev := <-s.C:
				if ev.ID == "probe0" {
					i--
					continue
				}
				if want := fmt.Sprintf("e%d", i); ev.ID != want {
					t.Fatalf("event %d: got %s want %s", i, ev.ID, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("subscriber got %d of 50 events", i)
			}
		}
	}
}

func TestSlowSubscriberIsDroppedWithoutDelayingOthers(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	slow := h.Subscribe(5) // never read
	fast := h.Subscribe(1000)
	defer fast.Close()
	produce(t, prod, 200, "e")
	got := 0
	timeout := time.After(10 * time.Second)
	for got < 200 {
		select {
		case ev := <-fast.C:
			if ev.ID != "" && ev.ID[0] == 'e' {
				got++
			}
		case <-timeout:
			t.Fatalf("fast subscriber got %d of 200", got)
		}
	}
	// The slow subscriber's channel is closed after its buffered events, and it says why.
	n := 0
	for range slow.C {
		n++
	}
	if !slow.Overflowed() {
		t.Fatal("slow subscriber not marked overflowed")
	}
	if fast.Overflowed() {
		t.Fatal("fast subscriber marked overflowed")
	}
	if n > 5 {
		t.Fatalf("slow subscriber buffered %d events, more than its bound of 5", n)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	h, _, _ := startHub(t)
	s := h.Subscribe(1)
	s.Close()
	s.Close()
	if _, ok := <-s.C; ok {
		t.Fatal("channel open after Close")
	}
}
