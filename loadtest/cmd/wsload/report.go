package main

import (
	"fmt"
	"io"
	"time"

	loadreport "carehub/loadtest/report"
	"carehub/loadtest/wsfleet"
)

// report is what a run measured; print writes it for people, -out as JSON.
type report struct {
	Config   reportConfig   `json:"config"`
	Connect  connectReport  `json:"connect"`
	Publish  publishReport  `json:"publish"`
	Delivery deliveryReport `json:"delivery"`
	Server   serverReport   `json:"server"`
	Client   clientReport   `json:"client"`
	// Series is the publishing and drain phases second by second (messages delivered per
	// second, publish → received latency, messages not yet delivered), for loadtest/report.
	Series []loadreport.Point `json:"-"`
}

type reportConfig struct {
	Conns       int     `json:"conns"`
	Idle        int     `json:"idle"`
	Projects    int     `json:"projects"`
	Groups      int     `json:"groups"`
	Rate        float64 `json:"rate"`
	Duration    string  `json:"duration"`
	Publish     string  `json:"publish"`
	Publishers  int     `json:"publishers"`
	PublishKeys int     `json:"publishKeys"`
	PayloadPad  int     `json:"payloadPadBytes"`
}

type connectReport struct {
	Opened     int             `json:"opened"`
	Failed     int             `json:"failed"`
	FirstError string          `json:"firstError,omitempty"`
	Seconds    float64         `json:"seconds"`
	Handshake  wsfleet.Summary `json:"handshake"` // dial → connection_ack
}

type publishReport struct {
	OK          int64           `json:"ok"`
	Failed      int64           `json:"failed"`
	RateLimited int64           `json:"rateLimited"`
	FirstError  string          `json:"firstError,omitempty"`
	Seconds     float64         `json:"seconds"`
	Rate        float64         `json:"rate"` // achieved, ok/seconds
	Call        wsfleet.Summary `json:"call"`
	Lag         wsfleet.Summary `json:"lag"` // call start behind schedule
}

type deliveryReport struct {
	Expected  int64           `json:"expected"` // Σ over published events of their subscribers
	Received  int64           `json:"received"`
	Rate      float64         `json:"messagesPerSecond"`
	FromCall  wsfleet.Summary `json:"publishCallToReceived"`
	FromEvent wsfleet.Summary `json:"eventTimestampToReceived"`
	Ended     map[string]int  `json:"connectionsEnded,omitempty"` // how connections ended during the run
}

type serverReport struct {
	Before    map[string]float64 `json:"before"`    // before connecting
	Connected map[string]float64 `json:"connected"` // all subscribed, before publishing
	After     map[string]float64 `json:"after"`     // after publishing and draining

	RSSPerConnKiB        float64 `json:"rssPerConnKiB"`
	HeapPerConnKiB       float64 `json:"heapInusePerConnKiB"`
	StackPerConnKiB      float64 `json:"stackInusePerConnKiB"`
	GoroutinesPerConn    float64 `json:"goroutinesPerConn"`
	CPUSeconds           float64 `json:"cpuSecondsPublishing"`
	CPUCores             float64 `json:"cpuCores"`
	CPUMicrosPerDelivery float64 `json:"cpuMicrosPerMessage"`
}

type clientReport struct {
	CPUSeconds float64 `json:"cpuSeconds"`
	CPUCores   float64 `json:"cpuCores"`
}

func (r *report) fill(cfg config, f *wsfleet.Fleet, p *wsfleet.Publisher, publishing, delivering time.Duration, clientCPU time.Duration) {
	r.Publish = publishReport{OK: p.OK.Load(), Failed: p.Failed.Load(), RateLimited: p.Limited.Load(), FirstError: p.FirstError(),
		Seconds: publishing.Seconds(), Rate: float64(p.OK.Load()) / publishing.Seconds(), Call: p.Call.Summary(), Lag: p.Lag.Summary()}
	r.Delivery = deliveryReport{Expected: p.Expected.Load(), Received: f.Received.Load(),
		Rate: float64(f.Received.Load()) / delivering.Seconds(), FromCall: f.FromCall.Summary(), FromEvent: f.FromEvent.Summary(), Ended: f.Ended()}
	total := float64(cfg.conns + cfg.idle)
	s := &r.Server
	s.RSSPerConnKiB = (s.Connected["process_resident_memory_bytes"] - s.Before["process_resident_memory_bytes"]) / total / 1024
	s.HeapPerConnKiB = (s.Connected["go_memstats_heap_inuse_bytes"] - s.Before["go_memstats_heap_inuse_bytes"]) / total / 1024
	s.StackPerConnKiB = (s.Connected["go_memstats_stack_inuse_bytes"] - s.Before["go_memstats_stack_inuse_bytes"]) / total / 1024
	s.GoroutinesPerConn = (s.Connected["go_goroutines"] - s.Before["go_goroutines"]) / total
	s.CPUSeconds = s.After["process_cpu_seconds_total"] - s.Connected["process_cpu_seconds_total"]
	s.CPUCores = s.CPUSeconds / delivering.Seconds()
	if r.Delivery.Received > 0 {
		s.CPUMicrosPerDelivery = s.CPUSeconds * 1e6 / float64(r.Delivery.Received)
	}
	r.Client = clientReport{CPUSeconds: clientCPU.Seconds(), CPUCores: clientCPU.Seconds() / delivering.Seconds()}
}

func (r *report) print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "wsload: %d subscriptions + %d idle, %d project(s) × %d type group(s), %s publishing at %.0f/s for %s\n",
		c.Conns, c.Idle, c.Projects, c.Groups, c.Publish, c.Rate, c.Duration)
	fmt.Fprintf(w, "connect:   %d open, %d failed in %.1fs; dial → ack %s\n", r.Connect.Opened, r.Connect.Failed, r.Connect.Seconds, ms(r.Connect.Handshake))
	if r.Connect.FirstError != "" {
		fmt.Fprintf(w, "           first error: %s\n", r.Connect.FirstError)
	}
	s := r.Server
	if s.Connected != nil {
		mib := func(m map[string]float64, k string) float64 { return m[k] / (1 << 20) }
		fmt.Fprintf(w, "server:    RSS %.0f → %.0f MiB (%.1f KiB per connection); heap in use %.0f → %.0f MiB (%.1f KiB per connection); "+
			"stacks %.0f → %.0f MiB (%.1f KiB per connection); goroutines %.0f → %.0f (%.1f per connection)\n",
			mib(s.Before, "process_resident_memory_bytes"), mib(s.Connected, "process_resident_memory_bytes"), s.RSSPerConnKiB,
			mib(s.Before, "go_memstats_heap_inuse_bytes"), mib(s.Connected, "go_memstats_heap_inuse_bytes"), s.HeapPerConnKiB,
			mib(s.Before, "go_memstats_stack_inuse_bytes"), mib(s.Connected, "go_memstats_stack_inuse_bytes"), s.StackPerConnKiB,
			s.Before["go_goroutines"], s.Connected["go_goroutines"], s.GoroutinesPerConn)
	}
	if r.Publish.Seconds == 0 {
		return
	}
	p := r.Publish
	fmt.Fprintf(w, "publish:   %d ok (%.0f/s achieved of %.0f/s), %d failed, %d rate-limited; call %s; behind schedule %s\n",
		p.OK, p.Rate, c.Rate, p.Failed, p.RateLimited, ms(p.Call), ms(p.Lag))
	if p.FirstError != "" {
		fmt.Fprintf(w, "           first error: %s\n", p.FirstError)
	}
	d := r.Delivery
	loss := 0.0
	if d.Expected > 0 {
		loss = 100 * float64(d.Expected-d.Received) / float64(d.Expected)
	}
	fmt.Fprintf(w, "delivery:  %d of %d expected messages (%.2f%% missing), %.0f messages/s\n", d.Received, d.Expected, loss, d.Rate)
	fmt.Fprintf(w, "latency:   publish call start → received %s\n", ms(d.FromCall))
	fmt.Fprintf(w, "           event timestamp → received   %s\n", ms(d.FromEvent))
	for _, k := range sortedKeys(d.Ended) {
		fmt.Fprintf(w, "ended:     %d × %s\n", d.Ended[k], k)
	}
	fmt.Fprintf(w, "server:    %.1f CPU-s while publishing and draining (%.2f cores), %.1f µs per delivered message; slow-consumer closes %.0f, hub drops %.0f\n",
		s.CPUSeconds, s.CPUCores, s.CPUMicrosPerDelivery,
		s.After["carehub_ws_slow_consumer_closes_total"]-s.Connected["carehub_ws_slow_consumer_closes_total"],
		s.After["carehub_fanout_slow_subscribers_dropped_total"]-s.Connected["carehub_fanout_slow_subscribers_dropped_total"])
	fmt.Fprintf(w, "client:    %.1f CPU-s (%.2f cores) — wsload shares the machine with the node\n", r.Client.CPUSeconds, r.Client.CPUCores)
}

func ms(s wsfleet.Summary) string {
	if s.Count == 0 {
		return "(none)"
	}
	return fmt.Sprintf("p50 %.1fms p90 %.1fms p99 %.1fms p99.9 %.1fms max %.1fms (n=%d)", s.P50, s.P90, s.P99, s.P999, s.Max, s.Count)
}
