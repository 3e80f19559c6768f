package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgDoc is what the tests read back from a rendered chart.
type svgDoc struct {
	root    xml.StartElement
	title   string
	series  map[string][]xml.StartElement // data-series → elements inside its <g>
	texts   []string
	classes map[string][]string // text class → contents
}

// parseSVG checks that b is well-formed XML with an <svg> root and collects
// the series groups and texts.
func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	doc := svgDoc{series: map[string][]xml.StartElement{}, classes: map[string][]string{}}
	dec := xml.NewDecoder(bytes.NewReader(b))
	var stack []xml.StartElement
	var current string // series whose <g> we are in
	var seriesDepth int
	var textClass string
	inTitle, inText := false, false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, b)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if len(stack) == 0 {
				doc.root = el.Copy()
			}
			stack = append(stack, el.Copy())
			if el.Name.Local == "g" && attr(el, "class") == "series" {
				current, seriesDepth = attr(el, "data-series"), len(stack)
				doc.series[current] = nil
			} else if current != "" {
				doc.series[current] = append(doc.series[current], el.Copy())
			}
			inTitle = el.Name.Local == "title"
			inText = el.Name.Local == "text"
			textClass = attr(el, "class")
		case xml.EndElement:
			if current != "" && len(stack) == seriesDepth {
				current = ""
			}
			stack = stack[:len(stack)-1]
			inTitle, inText = false, false
		case xml.CharData:
			switch {
			case inTitle:
				doc.title = string(el)
			case inText:
				doc.texts = append(doc.texts, string(el))
				doc.classes[textClass] = append(doc.classes[textClass], string(el))
			}
		}
	}
	if len(stack) != 0 {
		t.Fatalf("unclosed elements: %v", stack)
	}
	if doc.root.Name.Local != "svg" || doc.root.Name.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element is %v, want svg in the SVG namespace", doc.root.Name)
	}
	return doc
}

func attr(el xml.StartElement, name string) string {
	for _, a := range el.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func elements(els []xml.StartElement, name string) []xml.StartElement {
	var out []xml.StartElement
	for _, e := range els {
		if e.Name.Local == name {
			out = append(out, e)
		}
	}
	return out
}

func TestLineChartSeriesAndLegend(t *testing.T) {
	c := LineChart{
		Title: "IOPS against queue depth",
		X:     Axis{Label: "queue depth", Log: true, Ticks: []float64{1, 2, 4, 8, 16, 32}},
		Y:     Axis{Label: "IOPS"},
		Lines: []Line{
			{Label: "ours", Points: []Point{{1, 16000}, {2, 30000}, {4, 52000}, {8, 70000}, {16, 78000}, {32, 80000}}},
			{Label: "fio <psync> & co", Points: []Point{{1, 17000}, {32, 82000}}},
		},
	}
	doc := parseSVG(t, c.SVG())
	if doc.title != c.Title {
		t.Fatalf("title %q, want %q", doc.title, c.Title)
	}
	for _, l := range c.Lines {
		els, ok := doc.series[l.Label]
		if !ok {
			t.Fatalf("no series group for %q; have %v", l.Label, doc.series)
		}
		poly := elements(els, "polyline")
		if len(poly) != 1 {
			t.Fatalf("series %q: %d polylines", l.Label, len(poly))
		}
		if n := len(strings.Fields(attr(poly[0], "points"))); n != len(l.Points) {
			t.Fatalf("series %q: polyline has %d points, want %d", l.Label, n, len(l.Points))
		}
		if n := len(elements(els, "circle")); n != len(l.Points) {
			t.Fatalf("series %q: %d markers, want %d", l.Label, n, len(l.Points))
		}
		if !slices.Contains(doc.texts, l.Label) {
			t.Fatalf("legend lacks %q (texts %v)", l.Label, doc.texts)
		}
	}
	if got, want := doc.classes["xtick"], []string{"1", "2", "4", "8", "16", "32"}; !slices.Equal(got, want) {
		t.Fatalf("x ticks %v, want %v", got, want)
	}
	// With explicit ticks the axis ends near the last tick, not at the
	// next round number (50).
	lo, hi, _ := axisRange(c.X, []float64{1, 32})
	if lo < 0.85 || lo >= 1 || hi <= 32 || hi > 36 {
		t.Fatalf("x range [%v, %v] for ticks 1..32", lo, hi)
	}
	for _, lbl := range []string{"queue depth", "IOPS"} {
		if !slices.Contains(doc.texts, lbl) {
			t.Fatalf("axis label %q missing", lbl)
		}
	}
	// Different colours for the two series.
	c0 := attr(elements(doc.series["ours"], "polyline")[0], "stroke")
	c1 := attr(elements(doc.series[c.Lines[1].Label], "polyline")[0], "stroke")
	if c0 == c1 {
		t.Fatalf("both series drawn in %s", c0)
	}
}

func TestLineChartLogAxesSkipUnplottablePoints(t *testing.T) {
	c := LineChart{
		Title: "registration time against size",
		X:     Axis{Label: "size (bytes)", Log: true},
		Y:     Axis{Label: "time (µs)", Log: true},
		Lines: []Line{{Label: "pinned", Points: []Point{{0, 5}, {4096, 0}, {1 << 20, 300}, {1 << 30, 3e6}, {1 << 34, math.NaN()}, {1 << 35, 1e8}}}},
	}
	doc := parseSVG(t, c.SVG())
	poly := elements(doc.series["pinned"], "polyline")
	if len(poly) != 1 || len(strings.Fields(attr(poly[0], "points"))) != 3 {
		t.Fatalf("want 3 plotted points (zero, negative-log and NaN points skipped), got %v", poly)
	}
	// Decade ticks on the y axis: 100 µs .. 100 s spans 7 decades.
	yt := doc.classes["ytick"]
	if !slices.Contains(yt, "1000") || !slices.Contains(yt, "1M") {
		t.Fatalf("y ticks %v lack decades", yt)
	}
}

func TestCDFPlotHasFixedFractionAxis(t *testing.T) {
	e := &Experiment{Name: "x"}
	e.AddSeries(Series{Name: "a", Label: "ours", Points: []Point{{50, 0.5}, {60, 0.9}, {200, 1}}})
	e.AddSeries(Series{Name: "b", Points: []Point{{55, 0.5}, {70, 1}}})
	svg, err := RenderPlot(e, Plot{File: "x.svg", Kind: PlotCDF, Title: "cdf", XLabel: "latency (µs)", LogX: true, Series: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, svg)
	if got := doc.classes["ytick"]; !slices.Equal(got, []string{"0", "0.25", "0.5", "0.75", "0.9", "1"}) {
		t.Fatalf("CDF y ticks %v", got)
	}
	// Series without a label are named by their series name in the legend.
	if _, ok := doc.series["b"]; !ok {
		t.Fatalf("series b missing: %v", doc.series)
	}
	if _, ok := doc.series["ours"]; !ok {
		t.Fatalf("series ours missing: %v", doc.series)
	}
}

func TestBarChart(t *testing.T) {
	c := BarChart{
		Title:      "latency percentiles",
		YLabel:     "latency (µs)",
		Categories: []string{"QD1 p50", "QD1 p99", "QD32 p50", "QD32 p99"},
		Bars: []Bars{
			{Label: "ours", Values: []float64{58, 98, 390, 900}},
			{Label: "fio", Values: []float64{57, 97, 380, 850}},
			{Label: "libaio", Values: []float64{math.NaN(), math.NaN(), 370, 800}},
		},
	}
	doc := parseSVG(t, c.SVG())
	for _, b := range c.Bars {
		want := 0
		for _, v := range b.Values {
			if !math.IsNaN(v) {
				want++
			}
		}
		if got := len(elements(doc.series[b.Label], "rect")); got != want {
			t.Fatalf("series %q: %d bars, want %d", b.Label, got, want)
		}
	}
	if got := doc.classes["category"]; !slices.Equal(got, c.Categories) {
		t.Fatalf("categories %v, want %v", got, c.Categories)
	}
	if !slices.Contains(doc.classes["value"], "900") {
		t.Fatalf("value labels %v lack 900", doc.classes["value"])
	}
	// Taller value, taller bar.
	bars := elements(doc.series["ours"], "rect")
	if h0, h3 := attr(bars[0], "height"), attr(bars[3], "height"); parseF(t, h0) >= parseF(t, h3) {
		t.Fatalf("bar for 58 (%s px) not shorter than bar for 900 (%s px)", h0, h3)
	}
}

func TestBarChartLogY(t *testing.T) {
	c := BarChart{Title: "log bars", LogY: true, Categories: []string{"p50", "p99"},
		Bars: []Bars{{Label: "ours", Values: []float64{90, 25000}}, {Label: "fio", Values: []float64{0, 2500}}}}
	doc := parseSVG(t, c.SVG())
	if got := len(elements(doc.series["fio"], "rect")); got != 1 {
		t.Fatalf("a zero value on a log axis must not be drawn: %d bars", got)
	}
	ours := elements(doc.series["ours"], "rect")
	h0, h1 := parseF(t, attr(ours[0], "height")), parseF(t, attr(ours[1], "height"))
	// 90 and 25000 are 2.4 decades apart: on a log axis the small bar is
	// still a sizeable fraction of the large one (on a linear one, 0.4%).
	if h0 <= 0 || h0 < h1/4 || h0 >= h1 {
		t.Fatalf("log bars: heights %v and %v", h0, h1)
	}
	if yt := doc.classes["ytick"]; !slices.Contains(yt, "1000") || !slices.Contains(yt, "100") {
		t.Fatalf("log y ticks %v", yt)
	}
}

func parseF(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return f
}

func TestChartsAreDeterministic(t *testing.T) {
	c := LineChart{Title: "t", Lines: []Line{{Label: "a", Points: []Point{{1, 2}, {3, 4}}}, {Label: "b", Points: []Point{{2, 1}}}}}
	if !bytes.Equal(c.SVG(), c.SVG()) {
		t.Fatal("two renderings of one chart differ")
	}
	b := BarChart{Title: "b", Categories: []string{"x"}, Bars: []Bars{{Label: "a", Values: []float64{1}}}}
	if !bytes.Equal(b.SVG(), b.SVG()) {
		t.Fatal("two renderings of one bar chart differ")
	}
}

func TestEmptyAndDegenerateChartsRender(t *testing.T) {
	for _, c := range []LineChart{
		{Title: "empty"},
		{Title: "no points", Lines: []Line{{Label: "a"}}},
		{Title: "one point", Lines: []Line{{Label: "a", Points: []Point{{5, 5}}}}},
		{Title: "flat", Lines: []Line{{Label: "a", Points: []Point{{1, 7}, {2, 7}}}}},
		{Title: "log, nothing positive", X: Axis{Log: true}, Lines: []Line{{Label: "a", Points: []Point{{0, 1}}}}},
		{Title: "control \x01 chars", Lines: []Line{{Label: "bad\x00label", Points: []Point{{1, 1}, {2, 2}}}}},
	} {
		parseSVG(t, c.SVG())
	}
	parseSVG(t, BarChart{Title: "no bars"}.SVG())
	parseSVG(t, BarChart{Title: "zeros", Categories: []string{"a"}, Bars: []Bars{{Label: "z", Values: []float64{0}}}}.SVG())
}

func TestAxisTicks(t *testing.T) {
	_, _, ticks := axisRange(Axis{}, []float64{3000, 83000})
	for _, tk := range ticks {
		if math.Mod(tk, 20000) != 0 {
			t.Fatalf("linear ticks %v are not multiples of 20000", ticks)
		}
	}
	if ticks[0] != 0 || ticks[len(ticks)-1] < 83000 {
		t.Fatalf("linear ticks %v do not cover 0..83000", ticks)
	}
	lo, hi, ticks := axisRange(Axis{Log: true}, []float64{40, 300})
	if lo != 20 || hi != 500 || !slices.Equal(ticks, []float64{20, 50, 100, 200, 500}) {
		t.Fatalf("log axis for 40..300: range [%v, %v], ticks %v", lo, hi, ticks)
	}
	_, _, ticks = axisRange(Axis{Log: true}, []float64{1, 1e6})
	if !slices.Equal(ticks, []float64{1, 10, 100, 1000, 1e4, 1e5, 1e6}) {
		t.Fatalf("log ticks over six decades: %v", ticks)
	}
	_, _, ticks = axisRange(Axis{}, []float64{0.1, 0.3})
	if !slices.Contains(ticks, 0.3) {
		t.Fatalf("ticks %v suffer from binary noise", ticks)
	}
	for raw, want := range map[float64]float64{0.7: 1, 1.5: 2, 3: 5, 7: 10, 140: 200} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}

func TestFormatNumber(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 0.25: "0.25", 1.23456: "1.23", 58.14: "58.1", 150.4: "150", 2500: "2500",
		20000: "20k", 16612: "16.6k", 1.5e6: "1.5M", 3e9: "3G", -40: "-40",
	} {
		if got := formatNumber(v); got != want {
			t.Errorf("formatNumber(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestRenderPlotErrors(t *testing.T) {
	e := &Experiment{Name: "x"}
	e.AddSeries(Series{Name: "a", Points: []Point{{1, 1}}})
	if _, err := RenderPlot(e, Plot{File: "p.svg", Kind: PlotLine, Series: []string{"a", "missing"}}); err == nil || !strings.Contains(err.Error(), `no series "missing"`) {
		t.Fatalf("missing series: err = %v", err)
	}
	if _, err := RenderPlot(e, Plot{File: "p.svg", Kind: "pie", Series: []string{"a"}}); err == nil || !strings.Contains(err.Error(), "unknown kind") {
		t.Fatalf("unknown kind: err = %v", err)
	}
}

func TestBarPlotFromSeries(t *testing.T) {
	e := &Experiment{Name: "x"}
	e.AddSeries(Series{Name: "a", Label: "A", Points: []Point{{0, 10}, {2, 30}, {7, 99}, {0.5, 1}}})
	svg, err := RenderPlot(e, Plot{File: "b.svg", Kind: PlotBars, Categories: []string{"c0", "c1", "c2"}, Series: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, svg)
	// x=0 and x=2 are categories; 7 is out of range and 0.5 is not an index.
	if got := len(elements(doc.series["A"], "rect")); got != 2 {
		t.Fatalf("%d bars, want 2", got)
	}
}
