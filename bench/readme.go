package bench

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
)

// The README's short results table sits between these markers; the bench
// rewrites what is between them (see UpdateStandingTable).
const (
	TableBegin = "<!-- bench-table:begin -->"
	TableEnd   = "<!-- bench-table:end -->"
)

// StandingTable renders the README's one-screen summary of a run: one row
// per experiment. The row names the experiment's figure furthest from its
// goal (by its median ratio against the threshold), that figure's median
// and min–max, and how many of the experiment's goals are met (a goal that
// several figures are judged against, such as a policy's six mixes, is met
// when all of them are). reportRel is the report's path relative to the
// README, for the links.
func StandingTable(run *Run, reportRel string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| experiment | furthest from its goal | median ratio | min–max | goals met |\n|---|---|---|---|---|\n")
	for _, e := range run.Experiments {
		link := fmt.Sprintf("[%s](%s#%s)", e.Name, reportRel, anchor(e))
		switch e.Status {
		case StatusPending, StatusNotRun:
			fmt.Fprintf(&b, "| %s | %s | — | — | %s |\n", link, cell(strings.Join(orNone(e.Goals), "; ")), e.Status)
			continue
		case StatusFailed:
			fmt.Fprintf(&b, "| %s | %s | — | — | failed |\n", link, cell(shorten(e.Error, 100)))
			continue
		}
		var worst *Figure
		goals, met, judged := map[string]bool{}, map[string]bool{}, true
		for i := range e.Figures {
			f := &e.Figures[i]
			if f.Goal == nil {
				continue
			}
			if _, seen := goals[f.Goal.Text]; !seen {
				goals[f.Goal.Text], met[f.Goal.Text] = true, true
			}
			judged = judged && f.Judged()
			if f.Met == nil || !*f.Met {
				met[f.Goal.Text] = false
			}
			if worst == nil || margin(*f) > margin(*worst) {
				worst = f
			}
		}
		if worst == nil {
			fmt.Fprintf(&b, "| %s | (no goal: informational) | — | — | — |\n", link)
			continue
		}
		n := 0
		for _, ok := range met {
			if ok {
				n++
			}
		}
		verdict := fmt.Sprintf("%s %d of %d", map[bool]string{true: "✔", false: "✘"}[n == len(goals)], n, len(goals))
		if !judged {
			verdict = fmt.Sprintf("not judged (%d of %d rounds)", worst.Rounds(), MinRounds)
		}
		name := worst.Name
		if !strings.Contains(name, " vs ") {
			name += " vs " + worst.Baseline
		}
		fmt.Fprintf(&b, "| %s | %s, %s | %s | %s | %s |\n", link, cell(name),
			strings.TrimPrefix(worst.Goal.Expression(), "ratio "), formatRatio(*worst), formatRange(*worst), verdict)
	}
	return b.String()
}

// margin is how far a figure's median ratio is on the wrong side of its
// goal's threshold, as a factor (above 1: not met); no ratio is the worst.
func margin(f Figure) float64 {
	switch {
	case f.BaselineValue == 0 || f.Ratio <= 0 || f.Goal.Threshold <= 0:
		return math.Inf(1)
	case f.Goal.Op == AtLeast:
		return f.Goal.Threshold / f.Ratio
	}
	return f.Ratio / f.Goal.Threshold
}

// UpdateStandingTable replaces what lies between TableBegin and TableEnd in
// doc with table. It fails when the markers are missing or out of order.
func UpdateStandingTable(doc []byte, table string) ([]byte, error) {
	i, j, err := tableBounds(doc)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Write(doc[:i])
	out.WriteString("\n")
	out.WriteString(table)
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// StandingTableIn returns what lies between the markers of doc.
func StandingTableIn(doc []byte) (string, error) {
	i, j, err := tableBounds(doc)
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(string(doc[i:j]), "\n"), nil
}

// tableBounds returns where the table's text starts (just after TableBegin)
// and ends (at TableEnd) in doc.
func tableBounds(doc []byte) (start, end int, err error) {
	i := bytes.Index(doc, []byte(TableBegin))
	j := bytes.Index(doc, []byte(TableEnd))
	if i < 0 || j < 0 || j < i {
		return 0, 0, fmt.Errorf("no %s … %s markers", TableBegin, TableEnd)
	}
	return i + len(TableBegin), j, nil
}

// WriteStandingTable rewrites the table in the README at readmePath from
// run; reportRel is the report's path relative to the README.
func WriteStandingTable(run *Run, readmePath, reportRel string) error {
	doc, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	out, err := UpdateStandingTable(doc, StandingTable(run, reportRel))
	if err != nil {
		return fmt.Errorf("%s: %w", readmePath, err)
	}
	return writeFileAtomic(readmePath, out)
}
