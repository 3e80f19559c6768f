package attach

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The record of an attach process changes until the process exits, and a
// clean teardown removes it, so a detach that only polls it can miss its
// last state: a controller found lost, or a namespace found changed, by the
// teardown itself, a moment before the record goes. So a detach asks for
// the outcome: it creates an empty outcome file before it signals the
// process (ExpectOutcome); the process writes its final record into every
// outcome file of its name before it exits (TellOutcome); the detach reads
// it once the process is gone (Outcome.Read) and removes it (Outcome.Close).
// Outcome files are hidden (attach/.NAME.outcome.PID-N, PID the waiter's):
// List does not see them.

// Outcome is the outcome file of one waiter (a detach) for an attach process.
type Outcome struct {
	path string
}

const outcomeInfix = ".outcome."

// ExpectOutcome creates an empty outcome file for the attach process of
// name: call it before telling the process to stop. Outcome files of name
// left by waiters that are gone (a detach killed while waiting) are removed.
func (d *Dir) ExpectOutcome(name string) (*Outcome, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	files, _ := d.outcomeFiles(name)
	for _, f := range files {
		if _, _, err := procStat(f.waiter); errors.Is(err, os.ErrNotExist) {
			os.Remove(f.path)
		}
	}
	f, err := os.CreateTemp(filepath.Join(d.root, "attach"), "."+name+outcomeInfix+strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return nil, fmt.Errorf("attachment %q: outcome file: %w", name, err)
	}
	f.Close()
	return &Outcome{path: f.Name()}, nil
}

// Read returns the final record the attach process wrote, once it has
// exited; ok is false if it wrote none (it was killed, or it is of a version
// without outcome files). A nil Outcome has none.
func (o *Outcome) Read() (rec Record, ok bool) {
	if o == nil {
		return Record{}, false
	}
	data, err := os.ReadFile(o.path)
	if err != nil || len(data) == 0 || json.Unmarshal(data, &rec) != nil {
		return Record{}, false
	}
	return rec, true
}

// Close removes the outcome file (a nil Outcome has none).
func (o *Outcome) Close() error {
	if o == nil {
		return nil
	}
	if err := os.Remove(o.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// TellOutcome writes rec, the final record of an attach process about to
// exit, into the outcome file of every waiter for rec.Name. It creates no
// file: a waiter that gave up has removed its own.
func (d *Dir) TellOutcome(rec Record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	data = append(data, '\n')
	files, err := d.outcomeFiles(rec.Name)
	errs := []error{err}
	for _, f := range files {
		w, err := os.OpenFile(f.path, os.O_WRONLY|os.O_TRUNC, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			_, err = w.Write(data)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("attachment %q: outcome: %w", rec.Name, err))
		}
	}
	return errors.Join(errs...)
}

type outcomeFile struct {
	path   string
	waiter int // its PID
}

// outcomeFiles lists the outcome files of name: .NAME.outcome.PID-N, where
// PID-N has no '.', so that no other name's files match (a name may itself
// contain ".outcome.").
func (d *Dir) outcomeFiles(name string) ([]outcomeFile, error) {
	dir := filepath.Join(d.root, "attach")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	var out []outcomeFile
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "."+name+outcomeInfix)
		if !ok || strings.Contains(rest, ".") || e.IsDir() {
			continue
		}
		pid, _, ok := strings.Cut(rest, "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil {
			continue
		}
		out = append(out, outcomeFile{path: filepath.Join(dir, e.Name()), waiter: n})
	}
	return out, nil
}
