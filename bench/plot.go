package bench

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The SVG charts are written by hand so that the report needs nothing beyond
// the standard library. The output is deterministic: the same data gives the
// same bytes, so regenerated reports diff cleanly.

// Axis configures one axis of a LineChart.
type Axis struct {
	Label string // with its unit, e.g. "latency (µs)"
	Log   bool   // base-10 logarithmic scale; non-positive points are skipped
	// Min and Max fix the range when Max > Min; otherwise it follows the data.
	Min, Max float64
	// Ticks replaces the automatic ticks (the range grows to include them).
	Ticks []float64
}

// Line is one series of a LineChart.
type Line struct {
	Label  string
	Points []Point
}

// LineChart draws x/y lines: latency CDFs, IOPS against queue depth,
// registration time against size on log-log axes.
type LineChart struct {
	Title         string
	X, Y          Axis
	Lines         []Line
	Width, Height int // pixels; 0 means 760×460
}

// Bars is one series of a BarChart: one value per category.
type Bars struct {
	Label  string
	Values []float64
}

// BarChart draws grouped bars: one group per category, one bar per series
// (e.g. ours, fio psync and fio libaio side by side for each percentile).
type BarChart struct {
	Title  string
	YLabel string
	// LogY draws a logarithmic value axis (bars rise from its lowest tick),
	// for values that span decades such as p50 next to p99 under load.
	LogY          bool
	Categories    []string
	Bars          []Bars
	Width, Height int
}

// palette is Okabe–Ito, readable for colour-blind readers; series beyond it
// repeat the colours with a dash pattern.
// The order keeps neighbouring series far apart (orange and vermilion, the
// two closest, are fourth and first).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

var dashes = []string{"", "6,3", "2,3", "8,3,2,3"}

func seriesStyle(i int) (color, dash string) {
	return palette[i%len(palette)], dashes[(i/len(palette))%len(dashes)]
}

const (
	fontSize   = 12
	charWidth  = 6.8 // average advance of the 12 px sans-serif font, for layout estimates
	legendRow  = 18
	markerMax  = 40 // series with at most this many points get markers
	plotRight  = 24
	plotLeft   = 76
	plotBottom = 56
)

type svgWriter struct {
	bytes.Buffer
}

func (w *svgWriter) printf(format string, args ...any) { fmt.Fprintf(&w.Buffer, format, args...) }

func (w *svgWriter) text(x, y float64, anchor, extra, s string) {
	w.printf(`<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", f1(x), f1(y), anchor, extra, xmlEscape(s))
}

func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

func xmlEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		case '\'':
			b.WriteString("&apos;")
		default:
			// XML 1.0 forbids most control characters even escaped.
			if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == utf8.RuneError {
				b.WriteRune('?')
				continue
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

func textWidth(s string) float64 { return float64(utf8.RuneCountInString(s)) * charWidth }

func (w *svgWriter) header(width, height int, title string) {
	w.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		width, height, width, height, fontSize)
	w.printf("<title>%s</title>\n", xmlEscape(title))
	w.printf(`<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	w.text(float64(width)/2, 24, "middle", ` font-size="16" font-weight="bold"`, title)
}

// legendLayout places legend entries in rows under the title, never over the
// data. It returns each entry's position and the height the rows take.
func legendLayout(labels []string, left, right float64) (pos [][2]float64, height float64) {
	x, y := left, 0.0
	for _, l := range labels {
		wEntry := 30 + textWidth(l) + 18
		if x > left && x+wEntry > right {
			x, y = left, y+legendRow
		}
		pos = append(pos, [2]float64{x, y})
		x += wEntry
	}
	if len(labels) == 0 {
		return nil, 0
	}
	return pos, y + legendRow
}

func (w *svgWriter) legend(labels []string, pos [][2]float64, top float64, bars bool) {
	w.printf(`<g class="legend">` + "\n")
	for i, l := range labels {
		color, dash := seriesStyle(i)
		x, y := pos[i][0], top+pos[i][1]
		if bars {
			w.printf(`<rect x="%s" y="%s" width="22" height="10" fill="%s"/>`+"\n", f1(x), f1(y+3), color)
		} else {
			w.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2.5"%s/>`+"\n",
				f1(x), f1(y+8), f1(x+22), f1(y+8), color, dashAttr(dash))
		}
		w.text(x+28, y+12, "start", "", l)
	}
	w.printf("</g>\n")
}

func dashAttr(dash string) string {
	if dash == "" {
		return ""
	}
	return ` stroke-dasharray="` + dash + `"`
}

// scale maps data values to pixels.
type scale struct {
	lo, hi   float64
	log      bool
	from, to float64
}

func (s scale) at(v float64) float64 {
	var t float64
	if s.log {
		t = (math.Log10(v) - math.Log10(s.lo)) / (math.Log10(s.hi) - math.Log10(s.lo))
	} else {
		t = (v - s.lo) / (s.hi - s.lo)
	}
	return s.from + t*(s.to-s.from)
}

// axisRange chooses the range and ticks of an axis for the given data.
func axisRange(a Axis, data []float64) (lo, hi float64, ticks []float64) {
	if a.Log {
		data = slices.DeleteFunc(slices.Clone(data), func(v float64) bool { return v <= 0 })
	}
	data = append(data, a.Ticks...)
	if a.Max > a.Min && (!a.Log || a.Min > 0) {
		lo, hi = a.Min, a.Max
	} else if len(a.Ticks) > 0 && len(data) > 0 {
		// Explicit ticks are the reader's grid: fit the range to them and
		// the data, with a little room so edge markers are not clipped.
		lo, hi = slices.Min(data), slices.Max(data)
		if a.Log {
			pad := math.Pow(hi/lo, 0.03)
			lo, hi = lo/pad, hi*pad
		} else {
			pad := (hi - lo) * 0.03
			lo, hi = lo-pad, hi+pad
		}
		if lo == hi {
			lo, hi = lo-1, hi+1
		}
	} else if len(data) == 0 {
		lo, hi = 0, 1
		if a.Log {
			lo, hi = 1, 10
		}
	} else {
		lo, hi = slices.Min(data), slices.Max(data)
		if a.Log {
			lo, hi = logFloor(lo), logCeil(hi)
			if lo == hi {
				lo, hi = lo/10, hi*10
			}
		} else {
			if lo == hi {
				pad := math.Max(math.Abs(lo)*0.1, 1)
				lo, hi = lo-pad, hi+pad
			}
			if lo > 0 && lo < 0.3*hi {
				lo = 0 // starting at zero keeps bar-like proportions honest
			}
			step := niceStep((hi - lo) / 5)
			lo, hi = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
		}
	}
	if len(a.Ticks) > 0 {
		ticks = slices.Clone(a.Ticks)
		slices.Sort(ticks)
		return lo, hi, ticks
	}
	if a.Log {
		return lo, hi, logTicks(lo, hi)
	}
	step := niceStep((hi - lo) / 5)
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		ticks = append(ticks, roundTo(v, step))
	}
	return lo, hi, ticks
}

// niceStep rounds a raw tick step to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 || !isFinite(raw) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch m := raw / p; {
	case m <= 1:
		return p
	case m <= 2:
		return 2 * p
	case m <= 5:
		return 5 * p
	}
	return 10 * p
}

func roundTo(v, step float64) float64 {
	r := math.Round(v/step) * step
	if math.Abs(r) < step*1e-9 {
		return 0
	}
	// Kill binary noise such as 0.30000000000000004.
	f, _ := strconv.ParseFloat(strconv.FormatFloat(r, 'g', 12, 64), 64)
	return f
}

var mantissas = []float64{1, 2, 5}

// logFloor rounds down to 1, 2 or 5 times a power of ten; logCeil up.
func logFloor(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for i := len(mantissas) - 1; i >= 0; i-- {
		if mantissas[i]*p <= v*(1+1e-9) {
			return mantissas[i] * p
		}
	}
	return p
}

func logCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range append(mantissas, 10) {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// logTicks puts ticks on the decades, adding 2 and 5 (then every integer
// mantissa) while there are too few to read the axis.
func logTicks(lo, hi float64) []float64 {
	for _, ms := range [][]float64{{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		var ticks []float64
		for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi*(1+1e-9); p *= 10 {
			for _, m := range ms {
				v := roundSig(m * p)
				if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
					ticks = append(ticks, v)
				}
			}
		}
		if len(ticks) >= 4 || len(ms) == 9 {
			return ticks
		}
	}
	return nil
}

func roundSig(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 10, 64), 64)
	return f
}

// formatNumber writes axis labels and values compactly: 0.5, 12, 1500,
// 20k, 1.5M.
func formatNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return strconv.FormatFloat(roundSig3(v/1e9), 'f', -1, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(roundSig3(v/1e6), 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(roundSig3(v/1e3), 'f', -1, 64) + "k"
	case a >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case a == 0:
		return "0"
	}
	return strconv.FormatFloat(roundSig3(v), 'f', -1, 64)
}

func roundSig3(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	return f
}

// frame draws the plot area, grid, ticks and axis labels.
func (w *svgWriter) frame(px, py, pw, ph float64, xs, ys scale, xticks, yticks []float64, xlabel, ylabel string) {
	w.printf(`<g class="grid" stroke="#e0e0e0" stroke-width="1">` + "\n")
	for _, t := range xticks {
		x := xs.at(t)
		w.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f1(x), f1(py), f1(x), f1(py+ph))
	}
	for _, t := range yticks {
		y := ys.at(t)
		w.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", f1(px), f1(y), f1(px+pw), f1(y))
	}
	w.printf("</g>\n")
	w.printf(`<g class="axes">` + "\n")
	w.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333333" stroke-width="1"/>`+"\n", f1(px), f1(py), f1(pw), f1(ph))
	for _, t := range xticks {
		x := xs.at(t)
		w.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n", f1(x), f1(py+ph), f1(x), f1(py+ph+5))
		w.text(x, py+ph+19, "middle", ` class="xtick"`, formatNumber(t))
	}
	for _, t := range yticks {
		y := ys.at(t)
		w.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333333"/>`+"\n", f1(px-5), f1(y), f1(px), f1(y))
		w.text(px-8, y+4, "end", ` class="ytick"`, formatNumber(t))
	}
	if xlabel != "" {
		w.text(px+pw/2, py+ph+44, "middle", ` class="xlabel"`, xlabel)
	}
	if ylabel != "" {
		cx, cy := 18.0, py+ph/2
		w.printf(`<text x="%s" y="%s" text-anchor="middle" class="ylabel" transform="rotate(-90 %s %s)">%s</text>`+"\n",
			f1(cx), f1(cy), f1(cx), f1(cy), xmlEscape(ylabel))
	}
	w.printf("</g>\n")
}

func size(w, h int) (int, int) {
	if w <= 0 {
		w = 760
	}
	if h <= 0 {
		h = 460
	}
	return w, h
}

// SVG renders the chart.
func (c LineChart) SVG() []byte {
	width, height := size(c.Width, c.Height)
	var xdata, ydata []float64
	for _, l := range c.Lines {
		for _, p := range l.Points {
			if c.usable(p) {
				xdata, ydata = append(xdata, p.X), append(ydata, p.Y)
			}
		}
	}
	labels := make([]string, len(c.Lines))
	for i, l := range c.Lines {
		labels[i] = l.Label
	}
	px := float64(plotLeft)
	pw := float64(width) - px - plotRight
	pos, lh := legendLayout(labels, px, px+pw)
	legendTop := 38.0
	py := legendTop + lh + 10
	ph := float64(height) - py - plotBottom

	xlo, xhi, xticks := axisRange(c.X, xdata)
	ylo, yhi, yticks := axisRange(c.Y, ydata)
	xs := scale{lo: xlo, hi: xhi, log: c.X.Log, from: px, to: px + pw}
	ys := scale{lo: ylo, hi: yhi, log: c.Y.Log, from: py + ph, to: py}

	var w svgWriter
	w.header(width, height, c.Title)
	w.printf(`<defs><clipPath id="plot-area"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath></defs>`+"\n",
		f1(px), f1(py), f1(pw), f1(ph))
	w.frame(px, py, pw, ph, xs, ys, inRange(xticks, xlo, xhi), inRange(yticks, ylo, yhi), c.X.Label, c.Y.Label)
	for i, l := range c.Lines {
		color, dash := seriesStyle(i)
		var pts []string
		var coords [][2]float64
		for _, p := range l.Points {
			if !c.usable(p) {
				continue
			}
			x, y := xs.at(p.X), ys.at(p.Y)
			pts = append(pts, f1(x)+","+f1(y))
			coords = append(coords, [2]float64{x, y})
		}
		w.printf(`<g class="series" data-series="%s" clip-path="url(#plot-area)">`+"\n", xmlEscape(l.Label))
		if len(pts) > 1 {
			w.printf(`<polyline fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"%s points="%s"/>`+"\n",
				color, dashAttr(dash), strings.Join(pts, " "))
		}
		if len(coords) <= markerMax {
			for _, xy := range coords {
				w.printf(`<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", f1(xy[0]), f1(xy[1]), color)
			}
		}
		w.printf("</g>\n")
	}
	w.legend(labels, pos, legendTop, false)
	w.printf("</svg>\n")
	return w.Bytes()
}

func (c LineChart) usable(p Point) bool {
	if !isFinite(p.X) || !isFinite(p.Y) {
		return false
	}
	return (!c.X.Log || p.X > 0) && (!c.Y.Log || p.Y > 0)
}

func inRange(ticks []float64, lo, hi float64) []float64 {
	eps := (hi - lo) * 1e-9
	return slices.DeleteFunc(slices.Clone(ticks), func(t float64) bool { return t < lo-eps || t > hi+eps })
}

// SVG renders the chart.
func (c BarChart) SVG() []byte {
	width, height := size(c.Width, c.Height)
	labels := make([]string, len(c.Bars))
	var ydata []float64
	for i, b := range c.Bars {
		labels[i] = b.Label
		for _, v := range b.Values {
			if isFinite(v) {
				ydata = append(ydata, v)
			}
		}
	}
	px := float64(plotLeft)
	pw := float64(width) - px - plotRight
	pos, lh := legendLayout(labels, px, px+pw)
	legendTop := 38.0
	py := legendTop + lh + 10
	ph := float64(height) - py - plotBottom

	// Linear bars start at zero; both kinds leave headroom for the value
	// labels.
	var ylo, yhi float64
	var yticks []float64
	if c.LogY {
		ydata = slices.DeleteFunc(ydata, func(v float64) bool { return v <= 0 })
		if len(ydata) > 0 {
			// A decade below the smallest value, so that it still shows
			// as a bar rather than a sliver.
			ydata = append(ydata, slices.Max(ydata)*1.5, slices.Min(ydata)/10)
		}
		ylo, yhi, yticks = axisRange(Axis{Log: true}, ydata)
	} else {
		top := 1.0
		if len(ydata) > 0 && slices.Max(ydata) > 0 {
			top = slices.Max(ydata) * 1.12
		}
		ylo, yhi, yticks = axisRange(Axis{}, []float64{0, top})
	}
	ys := scale{lo: ylo, hi: yhi, log: c.LogY, from: py + ph, to: py}

	var w svgWriter
	w.header(width, height, c.Title)
	w.frame(px, py, pw, ph, scale{lo: 0, hi: 1, from: px, to: px + pw}, ys, nil, yticks, "", c.YLabel)
	ncat := max(len(c.Categories), 1)
	gw := pw / float64(ncat)
	bw := gw * 0.8 / float64(max(len(c.Bars), 1))
	for ci, cat := range c.Categories {
		w.text(px+gw*(float64(ci)+0.5), py+ph+19, "middle", ` class="category"`, cat)
	}
	for si, b := range c.Bars {
		color, _ := seriesStyle(si)
		w.printf(`<g class="series" data-series="%s">`+"\n", xmlEscape(b.Label))
		for ci := range c.Categories {
			if ci >= len(b.Values) || !isFinite(b.Values[ci]) || c.LogY && b.Values[ci] <= 0 {
				continue
			}
			v := math.Max(b.Values[ci], 0)
			x := px + gw*float64(ci) + gw*0.1 + bw*float64(si)
			y := ys.at(v)
			w.printf(`<rect class="bar" x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n",
				f1(x), f1(y), f1(bw-1), f1(py+ph-y), color)
			w.text(x+bw/2, y-4, "middle", ` font-size="10" class="value"`, formatNumber(b.Values[ci]))
		}
		w.printf("</g>\n")
	}
	w.legend(labels, pos, legendTop, true)
	w.printf("</svg>\n")
	return w.Bytes()
}

// RenderPlot draws one plot of an experiment from its series.
func RenderPlot(e *Experiment, p Plot) ([]byte, error) {
	series := make([]Series, 0, len(p.Series))
	for _, name := range p.Series {
		s, ok := e.SeriesByName(name)
		if !ok {
			return nil, fmt.Errorf("plot %s of experiment %s: no series %q", p.File, e.Name, name)
		}
		series = append(series, s)
	}
	label := func(s Series) string {
		if s.Label != "" {
			return s.Label
		}
		return s.Name
	}
	switch p.Kind {
	case PlotLine, PlotCDF:
		c := LineChart{Title: p.Title,
			X: Axis{Label: p.XLabel, Log: p.LogX, Ticks: p.XTicks},
			Y: Axis{Label: p.YLabel, Log: p.LogY}}
		if p.Kind == PlotCDF {
			c.Y = Axis{Label: p.YLabel, Min: 0, Max: 1, Ticks: []float64{0, 0.25, 0.5, 0.75, 0.9, 1}}
			if c.Y.Label == "" {
				c.Y.Label = "fraction of operations ≤ x"
			}
		}
		for _, s := range series {
			c.Lines = append(c.Lines, Line{Label: label(s), Points: s.Points})
		}
		return c.SVG(), nil
	case PlotBars:
		c := BarChart{Title: p.Title, YLabel: p.YLabel, LogY: p.LogY, Categories: p.Categories}
		for _, s := range series {
			vals := make([]float64, len(p.Categories))
			for i := range vals {
				vals[i] = math.NaN()
			}
			for _, pt := range s.Points {
				if i := int(pt.X); i >= 0 && i < len(vals) && float64(i) == pt.X {
					vals[i] = pt.Y
				}
			}
			c.Bars = append(c.Bars, Bars{Label: label(s), Values: vals})
		}
		return c.SVG(), nil
	}
	return nil, fmt.Errorf("plot %s of experiment %s: unknown kind %q", p.File, e.Name, p.Kind)
}
