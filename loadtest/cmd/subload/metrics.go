package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// series is one scrape of the node's /metrics: the series subload reads, by name and labels.
type series map[string]float64

// kept reports whether a series is one subload reads: the FHIR subscriptions' own, the notifier's
// consumer's, and the observations stored.
func kept(name string) bool {
	return strings.HasPrefix(name, "carehub_fhir_subscriptions_") ||
		strings.HasPrefix(name, "carehub_consumer_") && strings.Contains(name, `consumer="fhir_subscriptions"`) ||
		strings.HasPrefix(name, "carehub_observations_stored_total")
}

// scrape reads url's Prometheus text exposition (nil and the error when it cannot).
func scrape(ctx context.Context, hc *http.Client, url string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := series{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || !kept(line) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] += v
		}
	}
	return out, sc.Err()
}

// delta is after - before, series by series (those of after).
func delta(before, after series) series {
	if after == nil {
		return nil
	}
	out := series{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// nodeFigures are a phase's figures from the node's metrics (zero when /metrics could not be
// read).
type nodeFigures struct {
	ObservationsStored   float64 `json:"observationsStored"`
	EventsNumbered       float64 `json:"eventsNumbered"`
	NotificationsOK      float64 `json:"notificationsSent"`
	NotificationsFailed  float64 `json:"notificationsFailed"`
	NotifierBatches      float64 `json:"notifierBatches"`
	NotifierRecords      float64 `json:"notifierRecords"`
	NotifierBatchMeanMs  float64 `json:"notifierBatchMeanMs"` // the notifier's handler, one poll
	EventToNotifiedMeanS float64 `json:"eventToNotificationMeanSeconds"`
	// Series is every kept series' change over the phase.
	Series series `json:"series,omitempty"`
}

func figures(d series) *nodeFigures {
	if d == nil {
		return nil
	}
	f := &nodeFigures{Series: d}
	for k, v := range d {
		switch {
		case strings.HasPrefix(k, "carehub_observations_stored_total"):
			f.ObservationsStored += v
		case strings.HasPrefix(k, "carehub_fhir_subscriptions_events_numbered_total"):
			f.EventsNumbered += v
		case strings.HasPrefix(k, "carehub_fhir_subscriptions_notifications_sent_total") && strings.Contains(k, `type="event-notification"`):
			if strings.Contains(k, `outcome="ok"`) {
				f.NotificationsOK += v
			} else {
				f.NotificationsFailed += v
			}
		case strings.HasPrefix(k, "carehub_consumer_batches_total"):
			f.NotifierBatches += v
		case strings.HasPrefix(k, "carehub_consumer_records_total"):
			f.NotifierRecords += v
		}
	}
	mean := func(prefix string) float64 {
		var sum, n float64
		for k, v := range d {
			switch {
			case strings.HasPrefix(k, prefix+"_sum"):
				sum += v
			case strings.HasPrefix(k, prefix+"_count"):
				n += v
			}
		}
		if n == 0 {
			return 0
		}
		return sum / n
	}
	f.NotifierBatchMeanMs = 1000 * mean("carehub_consumer_handler_seconds")
	f.EventToNotifiedMeanS = mean("carehub_fhir_subscriptions_event_to_notification_seconds")
	return f
}
