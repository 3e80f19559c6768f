package target_test

import (
	"strings"
	"testing"

	"github.com/nprdma/nprdma/target"
)

func TestSplitBudget(t *testing.T) {
	cases := []struct {
		name         string
		memory       int64
		sizes, fixed []int64
		want         []int64
	}{
		// 20 MiB fixed; the 80 MiB left split 3:1.
		{"proportional", 100 << 20, []int64{300 << 20, 100 << 20, 1 << 30}, []int64{0, 0, 20 << 20}, []int64{60 << 20, 20 << 20, 20 << 20}},
		// A share never exceeds its namespace: the rest stays free.
		{"capped at the size", 1 << 30, []int64{64 << 20, 192 << 20}, []int64{0, 0}, []int64{64 << 20, 192 << 20}},
		{"by size", 3 << 20, []int64{1 << 30, 2 << 30}, []int64{0, 0}, []int64{1 << 20, 2 << 20}},
		// Shares are whole blocks, rounded down (a hair under 1 MiB here),
		// and never below 16 of them.
		{"whole blocks, at least 16", 1 << 20, []int64{1 << 40, 1 << 20}, []int64{0, 0}, []int64{255 * 4096, 16 * 4096}},
		{"all fixed", 10 << 20, []int64{1 << 30}, []int64{10 << 20}, []int64{10 << 20}},
		{"none", 10 << 20, nil, nil, []int64{}},
	}
	for _, c := range cases {
		got, err := target.SplitBudget(c.memory, c.sizes, c.fixed)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("%s: %v, want %v", c.name, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("%s: %v, want %v", c.name, got, c.want)
			}
		}
	}
}

func TestSplitBudgetRefusesMoreThanMemory(t *testing.T) {
	_, err := target.SplitBudget(10<<20, []int64{1 << 30, 1 << 30}, []int64{8 << 20, 4 << 20})
	if err == nil || !strings.Contains(err.Error(), "12.0 MiB") || !strings.Contains(err.Error(), "10.0 MiB") {
		t.Fatalf("budgets beyond the memory: %v, want an error naming both sums", err)
	}
	if _, err := target.SplitBudget(1<<20, []int64{1}, nil); err == nil {
		t.Fatal("sizes without their fixed budgets accepted")
	}
}
