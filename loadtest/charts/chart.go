package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
)

type series struct {
	name  string
	color color.Color
	y     func(Point) float64
}

// panel is one chart of the stack: a title, a y label and its lines over time, on a linear
// y axis from 0, or a logarithmic one (logY) that leaves out the points at 0 (nothing measured).
func panel(r Report, title, ylabel string, logY bool, lines ...series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = ylabel
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for _, s := range lines {
		xys := make(plotter.XYs, 0, len(r.Series))
		for _, pt := range r.Series {
			if y := finite(s.y(pt)); !logY || y > 0 {
				xys = append(xys, plotter.XY{X: pt.Seconds, Y: y})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", s.name, err)
		}
		l.Color, l.Width = s.color, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	if logY { // a log axis needs a range above 0, also when nothing or one value was measured
		if p.Y.Min <= 0 || math.IsInf(p.Y.Min, 0) {
			p.Y.Min = 1
		}
		if !(p.Y.Max > p.Y.Min) {
			p.Y.Max = 10 * p.Y.Min
		}
	}
	return p, nil
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// Chart draws throughput, latency percentiles and lag over time, stacked, as a PNG.
func Chart(r Report) ([]byte, error) {
	if len(r.Series) == 0 {
		// One point at zero, so that an empty run still has a chart that says so.
		r.Series = []Point{{}}
	}
	panels := [][]*plot.Plot{}
	add := func(p *plot.Plot, err error) error {
		if err == nil {
			panels = append(panels, []*plot.Plot{p})
		}
		return err
	}
	if err := add(panel(r, r.Scenario+": throughput", r.Unit, false,
		series{"rate", blue, func(p Point) float64 { return p.Rate }},
		series{"refused/s", red, func(p Point) float64 { return float64(p.Refused) }})); err != nil {
		return nil, err
	}
	if err := add(panel(r, "latency", "ms", false,
		series{"p50", green, func(p Point) float64 { return p.P50Ms }},
		series{"p99", orange, func(p Point) float64 { return p.P99Ms }})); err != nil {
		return nil, err
	}
	if r.EndToEnd != "" {
		// Logarithmic: a queue's seconds and a quiet run's milliseconds in one panel.
		if err := add(panel(r, r.EndToEnd+", by when sent", "ms (log scale)", true,
			series{"p50", green, func(p Point) float64 { return p.EndToEndP50Ms }},
			series{"p99", orange, func(p Point) float64 { return p.EndToEndP99Ms }})); err != nil {
			return nil, err
		}
	}
	if r.LagName != "" {
		if err := add(panel(r, "lag", r.LagName, false, series{r.LagName, red, func(p Point) float64 { return p.Lag }})); err != nil {
			return nil, err
		}
	}
	img := vgimg.New(vg.Points(900), vg.Points(float64(260*len(panels))))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	canvases := plot.Align(panels, tiles, dc)
	for i := range panels {
		panels[i][0].Draw(canvases[i][0])
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("chart PNG: %w", err)
	}
	return buf.Bytes(), nil
}
