package main

import (
	"slices"
	"testing"
)

func TestInterspersedCtlArgs(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"t", "ctl", "create-ns", "NQN", "--size", "1GiB", "--name", "v"}, []string{"t", "ctl", "create-ns", "--size", "1GiB", "--name", "v", "NQN"}},
		{[]string{"t", "ctl", "--socket", "/s", "delete-ns", "NQN", "2", "--force"}, []string{"t", "ctl", "--socket", "/s", "delete-ns", "--force", "NQN", "2"}},
		{[]string{"t", "ctl", "--timeout=5s", "resize-ns", "--size=2G", "NQN", "1"}, []string{"t", "ctl", "--timeout=5s", "resize-ns", "--size=2G", "NQN", "1"}},
		{[]string{"t", "ctl", "add-host", "NQN", "H", "--dhchap-secret-file", "h.key", "--dhchap-ctrl-secret-file", "c.key"},
			[]string{"t", "ctl", "add-host", "--dhchap-secret-file", "h.key", "--dhchap-ctrl-secret-file", "c.key", "NQN", "H"}},
		{[]string{"t", "--memory", "1GiB"}, []string{"t", "--memory", "1GiB"}},
		{[]string{"t", "ctl", "list"}, []string{"t", "ctl", "list"}},
	} {
		if got := interspersed(c.in); !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, want %v", c.in, got, c.want)
		}
	}
}
