package bench

import (
	"bytes"
	"fmt"
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
// per goal of each experiment. Figures judged against the same goal (a
// policy's six mixes, registration's sizes) share a row that shows the worst
// of them; the row is met only when all of them are. reportRel is the
// report's path relative to the README, for the links.
func StandingTable(run *Run, reportRel string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| experiment | goal (worst figure against its baseline) | median ratio | min–max | met |\n|---|---|---|---|---|\n")
	for _, e := range run.Experiments {
		link := fmt.Sprintf("[%s](%s#%s)", e.Name, reportRel, anchor(e))
		switch e.Status {
		case StatusPending, StatusNotRun:
			fmt.Fprintf(&b, "| %s | %s | — | — | %s |\n", link, cell(strings.Join(orNone(e.Goals), "; ")), e.Status)
			continue
		}
		rows := 0
		for _, g := range goalGroups(e) {
			w := g.worst
			name := w.Name
			if g.n > 1 {
				name = fmt.Sprintf("worst of %d: %s", g.n, w.Name)
			}
			if !strings.Contains(w.Name, " vs ") {
				name += " vs " + w.Baseline
			}
			fmt.Fprintf(&b, "| %s | %s, %s | %s | %s | %s |\n", link, cell(name),
				strings.TrimPrefix(w.Goal.Expression(), "ratio "), formatRatio(w), formatRange(w), g.verdict)
			rows++
		}
		if e.Status == StatusFailed {
			fmt.Fprintf(&b, "| %s | %s | — | — | failed |\n", link, cell(strings.Join(orNone(e.Goals), "; ")))
		} else if rows == 0 {
			fmt.Fprintf(&b, "| %s | (no goal: informational) | — | — | — |\n", link)
		}
	}
	return b.String()
}

type goalGroup struct {
	text    string
	n       int
	worst   Figure
	verdict string
}

// goalGroups groups an experiment's goal figures by goal text, in order of
// first appearance, keeping the figure furthest from its goal's side.
func goalGroups(e *Experiment) []goalGroup {
	var groups []goalGroup
	for _, f := range e.Figures {
		if f.Goal == nil {
			continue
		}
		i := 0
		for i < len(groups) && groups[i].text != f.Goal.Text {
			i++
		}
		if i == len(groups) {
			groups = append(groups, goalGroup{text: f.Goal.Text, worst: f})
		}
		g := &groups[i]
		g.n++
		if worse(f, g.worst) {
			g.worst = f
		}
	}
	for i := range groups {
		g := &groups[i]
		g.verdict = "✔"
		for _, f := range e.Figures {
			if f.Goal == nil || f.Goal.Text != g.text {
				continue
			}
			switch {
			case !f.Judged():
				g.verdict = fmt.Sprintf("not judged (%d of %d rounds)", f.Rounds(), MinRounds)
			case (f.Met == nil || !*f.Met) && g.verdict == "✔":
				g.verdict = "✘"
			}
		}
	}
	return groups
}

// worse reports whether a is further on the wrong side of its goal than b.
func worse(a, b Figure) bool {
	if a.BaselineValue == 0 {
		return b.BaselineValue != 0
	}
	if b.BaselineValue == 0 {
		return false
	}
	if a.Goal.Op == AtLeast {
		return a.Ratio < b.Ratio
	}
	return a.Ratio > b.Ratio
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
