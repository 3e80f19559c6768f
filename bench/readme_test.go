package bench

import (
	"strings"
	"testing"
)

// TestStandingTable: one row per experiment, naming the figure furthest
// from its goal and counting the goals met; a goal judged on several figures
// is met only when every one is.
func TestStandingTable(t *testing.T) {
	five := func(name string, ratios ...float64) Figure {
		base := []float64{100, 100, 100, 100, 100}
		vals := make([]float64, len(ratios))
		for i, r := range ratios {
			vals[i] = 100 * r
		}
		return RoundsFigure(name, "x", "CLOCK", vals, base[:len(ratios)])
	}
	policy := Goal{Text: "hit ratio ≥ CLOCK's", Op: AtLeast, Threshold: 1}
	latency := Goal{Text: "p50 ≤ 1.1× fio", Op: AtMost, Threshold: 1.1}
	judged := func(f Figure, g Goal) Figure { return f.WithGoal(g) }
	e := &Experiment{Name: "swap-policy", Title: "policies", Status: StatusDone, Figures: []Figure{
		judged(five("zipf 1:2", 1.1, 1.2, 1.0, 1.3, 1.1), policy),
		judged(five("zipf+scan 1:8", 0.9, 1.0, 0.95, 1.05, 0.97), policy), // median 0.97: the worst, unmet
		judged(five("zipf 1:8", 1.0, 1.0, 1.02, 1.0, 1.0), policy),
		judged(five("p50", 1.0, 1.05, 0.9, 1.2, 1.0), latency),
		five("info", 2, 2, 2, 2, 2),
	}}
	one := &Experiment{Name: "startup", Status: StatusDone, Figures: []Figure{NewFigure("start-up", 1, "s", "pinned", 2).WithGoal(latency)}}
	run := &Run{Experiments: []*Experiment{e, one, {Name: "later", Status: StatusPending, Goals: []string{"someday"}}}}
	table := StandingTable(run, "docs/bench.md")
	for _, want := range []string{
		// Worst by margin: zipf+scan 1:8 at 0.97 of ≥ 1 (1.03 short) beats p50 at 1.00 of ≤ 1.1.
		"| [swap-policy](docs/bench.md#swap-policy--policies) | zipf+scan 1:8 vs CLOCK, ≥ 1 | 0.97 | 0.90–1.05 | ✘ 1 of 2 |",
		"| [startup](docs/bench.md#startup) | start-up vs pinned, ≤ 1.1 | 0.50 | 0.50–0.50 | not judged (1 of 5 rounds) |",
		"| [later](docs/bench.md#later) | someday | — | — | pending |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if n := strings.Count(table, "\n"); n != 2+3 {
		t.Errorf("table has %d lines, want a header of 2 and one row per experiment:\n%s", n, table)
	}
	if t.Failed() {
		t.Log(table)
	}

	doc := []byte("# x\n\nintro\n" + TableBegin + "\nold table\n" + TableEnd + "\n\nmore\n")
	out, err := UpdateStandingTable(doc, table)
	if err != nil {
		t.Fatal(err)
	}
	got, err := StandingTableIn(out)
	if err != nil || got != table || !strings.HasPrefix(string(out), "# x\n\nintro\n") || !strings.HasSuffix(string(out), TableEnd+"\n\nmore\n") {
		t.Fatalf("updated doc (%v):\n%s", err, out)
	}
	if _, err := UpdateStandingTable([]byte(TableEnd+TableBegin), table); err == nil {
		t.Fatal("markers out of order accepted")
	}
}
