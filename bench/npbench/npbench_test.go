package npbench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
)

// These run the experiments at tiny sizes so that they keep working: the
// records must be complete (figures with their goals, series behind every
// plot, placements) and every plot must render. Figures are logged, never
// asserted: timing belongs to the bench run.

func testEnv(t *testing.T) *bench.Env {
	return &bench.Env{Mode: bench.ModeQuick, OutDir: t.TempDir(), ScratchDir: t.TempDir()}
}

// checkRecord verifies an experiment record and logs its figures.
func checkRecord(t *testing.T, exp *bench.Experiment, goals []string) {
	t.Helper()
	if exp.Method == "" || len(exp.Params) == 0 || len(exp.Placements) == 0 {
		t.Errorf("record lacks method, params or placements")
	}
	for _, g := range goals {
		found := false
		for _, f := range exp.Figures {
			if f.Goal != nil && f.Goal.Text == g {
				found = true
				if f.Met == nil || f.BaselineValue == 0 || f.Value == 0 {
					t.Errorf("figure %q: goal not evaluated or a zero value (%+v)", f.Name, f)
				}
			}
		}
		if !found {
			t.Errorf("no figure carries the goal %q", g)
		}
	}
	for _, p := range exp.Plots {
		for _, s := range p.Series {
			if sr, ok := exp.SeriesByName(s); !ok || len(sr.Points) == 0 {
				t.Errorf("plot %s: series %s missing or empty", p.File, s)
			}
		}
		if svg, err := bench.RenderPlot(exp, p); err != nil || !strings.Contains(string(svg), "<svg") {
			t.Errorf("plot %s does not render: %v", p.File, err)
		}
	}
	for _, f := range exp.Figures {
		met := ""
		if f.Met != nil {
			met = fmt.Sprintf(" met=%v", *f.Met)
		}
		t.Logf("%s = %.4g %s vs %s %.4g (ratio %.3f)%s", f.Name, f.Value, f.Unit, f.Baseline, f.BaselineValue, f.Ratio, met)
	}
	for _, n := range exp.Notes {
		t.Logf("note: %s", n)
	}
}

func TestFabricSmall(t *testing.T) {
	cfg := FabricConfig{Samples: 50, Rounds: 2, Depths: []int{1, 4}, Sizes: []int{4 << 10, 128 << 10}, Run: 20 * time.Millisecond, ThroughputRounds: 1}
	mask, err := bench.Affinity(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exp, err := MeasureFabric(context.Background(), testEnv(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, exp, []string{ReadLatencyGoal.Text, ThroughputGoal.Text})
	for _, op := range []string{"READ", "WRITE", "SEND"} {
		if f, ok := exp.Figure("128 KiB " + op + " throughput QD1, one CPU"); !ok || f.Value <= 0 || f.BaselineValue <= 0 {
			t.Errorf("%s on one CPU: %+v, found %v", op, f, ok)
		}
	}
	one := exp.Placements[len(exp.Placements)-1]
	if !one.Pinned || one.Allowed != bench.FormatCPUList(mask[:1]) {
		t.Errorf("one-CPU runs' placement %+v, want pinned to CPU %d", one, mask[0])
	}
	// Every thread gets its mask back, those started while pinned too.
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		got, err := bench.Affinity(tid)
		if err == nil && !slices.Equal(got, mask) {
			t.Errorf("thread %d left on CPUs %v, want %v", tid, got, mask)
		}
	}
}

func TestRegistrationSmall(t *testing.T) {
	cfg := RegistrationConfig{Unpinned: []int64{1 << 30, 64 << 30, 1 << 40}, Pinned: []int64{4 << 20, 1 << 30}, Rounds: 2, PinnedRounds: 1}
	if testing.Short() {
		cfg.Pinned = []int64{4 << 20}
	}
	exp, err := MeasureRegistration(context.Background(), testEnv(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, exp, []string{UnpinnedGoal.Text, FlatGoal.Text})
	if _, ok := exp.Figure("pinned 4 MiB (Register, mlock)"); ok {
		t.Fatal("a pinned size without an unpinned partner got a ratio figure")
	}
}

func TestNPReadSmall(t *testing.T) {
	cfg := NPReadConfig{Samples: 40, NoFaultPairs: 2, Rounds: 2, ResidentPages: 64}
	exp, err := MeasureNPRead(context.Background(), testEnv(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, exp, []string{NPGoalTCP.Text, NPGoalLoop.Text, MinorGoal.Text, MajorGoal.Text})
}

func TestPoolSmall(t *testing.T) {
	exp, err := MeasurePool(context.Background(), testEnv(t), PoolConfig{Sizes: []int{4 << 10}, Run: 30 * time.Millisecond, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, exp, []string{PoolGoal.Text})
	f, ok := exp.Figure("tcp 4 KiB READ registrations avoided")
	if !ok || f.Value == 0 || f.Value+1 != f.BaselineValue {
		t.Fatalf("registrations avoided: %+v (want all gets but the first)", f)
	}
}

func TestSpecsMatchTheSuite(t *testing.T) {
	for name, spec := range map[string]func() bench.Spec{"fabric-ops": FabricSpec, "registration": RegistrationSpec,
		"np-read": NPReadSpec, "pool": PoolSpec} {
		sp := spec()
		if sp.Name != name || sp.Run == nil || sp.Title == "" || len(sp.Goals) == 0 {
			t.Errorf("%s: incomplete spec %+v", name, sp)
		}
	}
}

// TestSpecsRun runs the four experiments at their quick-mode sizes, as the
// suite would: NPRDMA_LONG=1 go test -run SpecsRun -v ./bench/npbench
func TestSpecsRun(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("set NPRDMA_LONG=1 to run the experiments at their quick-mode sizes")
	}
	for _, spec := range []bench.Spec{FabricSpec(), RegistrationSpec(), NPReadSpec(), PoolSpec()} {
		t.Run(spec.Name, func(t *testing.T) {
			exp, err := spec.Run(context.Background(), testEnv(t))
			if err != nil {
				t.Fatal(err)
			}
			checkRecord(t, exp, nil)
		})
	}
}

// TestPairedLatencies: each list holds its own function's durations, the
// warm-up is dropped, and the first of each pair alternates.
func TestPairedLatencies(t *testing.T) {
	var order []byte
	calls := 0
	a := func() (time.Duration, error) { calls++; order = append(order, 'a'); return time.Microsecond, nil }
	b := func() (time.Duration, error) { calls++; order = append(order, 'b'); return 2 * time.Microsecond, nil }
	la, lb, err := pairedLatencies(10, a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(la) != 10 || len(lb) != 10 || calls != 2*(10+bench.WarmUpOps(10)) {
		t.Fatalf("%d and %d samples from %d calls", len(la), len(lb), calls)
	}
	for i := range la {
		if la[i] != time.Microsecond || lb[i] != 2*time.Microsecond {
			t.Fatalf("sample %d: %v, %v", i, la[i], lb[i])
		}
	}
	if got := string(order[:8]); got != "abbaabba" && got != "baabbaab" {
		t.Fatalf("order %q: the first of each pair does not alternate", order)
	}
}
