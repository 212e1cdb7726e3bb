package clinical

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC)

func at(h float64) time.Time { return t0.Add(time.Duration(math.Round(h * float64(time.Hour)))) }

func pts(hv ...float64) []Point {
	var out []Point
	for i := 0; i+1 < len(hv); i += 2 {
		out = append(out, Point{Time: at(hv[i]), Value: hv[i+1]})
	}
	return out
}

func TestTrendDirections(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   string
		points []Point
		dir    Direction
		rate   *float64 // nil: no slope
		change float64
	}{
		// Slope (18−16)/1 h = 2/h over 1 h: change 2 = tolerance 2 → rising.
		{"rr at tolerance", LOINCRespiratoryRate, pts(0, 16, 1, 18), DirectionRising, f(2), 2},
		{"rr below tolerance", LOINCRespiratoryRate, pts(0, 16, 1, 17.9), DirectionStable, f(1.9), 1.9},
		// 16, 18, 20 at 0, 1, 2 h: slope 2/h, change 4.
		{"rr rising", LOINCRespiratoryRate, pts(0, 16, 1, 18, 2, 20), DirectionRising, f(2), 4},
		{"spo2 falling", LOINCOxygenSaturation, pts(0, 98, 1, 96, 2, 94), DirectionFalling, f(-2), -4},
		{"spo2 falling at tolerance", LOINCOxygenSaturation, pts(0, 98, 4, 96), DirectionFalling, f(-0.5), -2},
		// 80, 95, 78, 82 at 0..3 h: mean t 1.5, mean y 83.75,
		// Σdt·dy = 5.625 − 5.625 − 2.875 − 2.625 = −5.5, Σdt² = 5,
		// slope −1.1/h, change −3.3: stable although last − first is 2 and
		// max − min is 17.
		{"hr noisy", LOINCHeartRate, pts(0, 80, 1, 95, 2, 78, 3, 82), DirectionStable, f(-1.1), -3.3},
		// Half-hour steps: 37.0, 37.2, 37.5 at 0, 0.5, 1 h: mean t 0.5,
		// mean y 37.2333; Σdt·dy = (−0.5)(−0.2333) + 0 + (0.5)(0.2667) = 0.25,
		// Σdt² = 0.5, slope 0.5/h, change 0.5 = tolerance → rising.
		{"temperature rising", LOINCBodyTemperature, pts(0, 37.0, 0.5, 37.2, 1, 37.5), DirectionRising, f(0.5), 0.5},
		// 36.0, 36.0, 36.5 at 0, 35, 70 min: slope 17.5/2450 per minute =
		// 0.4286/h, change exactly 0.5 = tolerance, but float arithmetic
		// gives 0.49999999999999994: the 1e-9 allowance keeps it rising.
		{"temperature float edge", LOINCBodyTemperature, pts(0, 36.0, 35.0/60, 36.0, 70.0/60, 36.5), DirectionRising, f(0.429), 0.5},
		{"gcs falling", LOINCGlasgowComaScore, pts(0, 15, 2, 14), DirectionFalling, f(-0.5), -1},
		{"sbp flat", LOINCSystolicBP, pts(0, 120, 1, 120, 2, 120), DirectionStable, f(0), 0},
		{"single point", LOINCHeartRate, pts(1, 88), DirectionUnknown, nil, 0},
		{"same instant", LOINCHeartRate, pts(1, 88, 1, 120), DirectionUnknown, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Trend(map[string][]Point{tc.code: tc.points}, Window{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("%d trends, want 1", len(got))
			}
			tr := got[0]
			if tr.Direction != tc.dir || tr.Change != tc.change {
				t.Errorf("direction %s change %v, want %s %v", tr.Direction, tr.Change, tc.dir, tc.change)
			}
			if (tr.RatePerHour == nil) != (tc.rate == nil) || (tc.rate != nil && *tr.RatePerHour != *tc.rate) {
				t.Errorf("rate %v, want %v", deref(tr.RatePerHour), deref(tc.rate))
			}
			if tr.Count != len(tc.points) {
				t.Errorf("count %d, want %d", tr.Count, len(tc.points))
			}
		})
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestTrendSummary(t *testing.T) {
	series := map[string][]Point{
		// Out of order on purpose; the 07:00 point is outside the window.
		LOINCHeartRate: {
			{Time: at(2), Value: 78}, {Time: at(0), Value: 80}, {Time: at(-1), Value: 200},
			{Time: at(3), Value: 82}, {Time: at(1), Value: 95},
		},
		LOINCRespiratoryRate: pts(0, 16),
		"0000-0":             pts(0, 1, 1, 2), // not a vital sign: ignored
	}
	got, err := Trend(series, Window{Start: at(0), End: at(3)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Code != LOINCRespiratoryRate || got[1].Code != LOINCHeartRate {
		t.Fatalf("trends %+v, want respiratory rate then heart rate (table order)", got)
	}
	hr := got[1]
	want := VitalTrend{
		Code: LOINCHeartRate, Name: "heart_rate", Unit: "/min", Count: 4,
		First: 80, Last: 82, Min: 78, Max: 95, FirstAt: at(0), LastAt: at(3),
		RatePerHour: f(-1.1), Change: -3.3, Tolerance: 10, Direction: DirectionStable,
	}
	if !reflect.DeepEqual(hr, want) {
		t.Errorf("heart rate trend\n got %+v\nwant %+v", hr, want)
	}
}

func TestWindowContains(t *testing.T) {
	w := Window{Start: at(0), End: at(2)}
	for _, tc := range []struct {
		t    time.Time
		want bool
	}{{at(-0.001), false}, {at(0), true}, {at(1), true}, {at(2), true}, {at(2.001), false}} {
		if got := w.Contains(tc.t); got != tc.want {
			t.Errorf("Contains(%s) = %v, want %v", tc.t, got, tc.want)
		}
	}
	if !(Window{}).Contains(at(-1000)) || !(Window{End: at(0)}).Contains(at(-1000)) || (Window{End: at(0)}).Contains(at(1)) {
		t.Error("open bounds mishandled")
	}
}

func TestTrendInvalid(t *testing.T) {
	_, err := Trend(map[string][]Point{LOINCOxygenSaturation: pts(0, 97, 1, 140)}, Window{})
	var ie *InputError
	if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidInput) || len(ie.Invalid) != 1 || ie.Invalid[0].Parameter != "spo2" {
		t.Errorf("error %v, want one invalid spo2", err)
	}
	// An implausible value outside the window does not matter.
	if _, err := Trend(map[string][]Point{LOINCOxygenSaturation: pts(0, 97, 5, 140)}, Window{End: at(1)}); err != nil {
		t.Errorf("error %v for a value outside the window", err)
	}
}
