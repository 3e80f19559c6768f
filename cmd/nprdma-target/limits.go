package main

import (
	"fmt"

	"github.com/nprdma/nprdma/target"
	"github.com/urfave/cli/v2"
)

// limitFlag is one of the target's connection limits on the command line:
// its flag, the target's default, the largest value the protocol can carry
// and the option that sets it.
type limitFlag struct {
	name   string
	def    int
	max    int
	usage  string
	option func(int) target.Option
}

// limitFlags are the limits a target enforces against hosts; --help and
// docs/target.md say what a host sees when one is reached.
var limitFlags = []limitFlag{
	{name: "max-connections", def: target.DefaultMaxConnections, max: 1 << 30, option: target.WithMaxConnections,
		usage: "queues (queue pairs) of all hosts together, whether they have sent Connect yet or not; a host takes one admin queue plus its I/O queues. " +
			"A connection request beyond the limit is refused with the NVMe-oF REJECT status \"no resources\" and logged; a slot frees when a queue closes"},
	{name: "max-controllers", def: target.DefaultMaxControllers, max: 0xffef, option: target.WithMaxControllers,
		usage: "controllers (host associations with a subsystem) alive at once; a Connect beyond the limit fails with the NVMe status Controller Busy"},
	{name: "max-io-queues", def: target.DefaultMaxIOQueues, max: 0xffff, option: target.WithMaxIOQueues,
		usage: "I/O queues of one controller; a host asking for more is granted this many (Set Features Number of Queues), and a queue ID beyond it is refused (REJECT \"invalid QID\")"},
	{name: "max-namespaces", def: target.DefaultMaxNamespaces, max: 1 << 30, option: target.WithMaxNamespaces,
		usage: "namespaces of one subsystem; a subsystem given more (--backing or --config) is refused at start"},
}

// limitCLIFlags are the limits as urfave flags; --help shows the defaults.
func limitCLIFlags() []cli.Flag {
	out := make([]cli.Flag, 0, len(limitFlags))
	for _, l := range limitFlags {
		out = append(out, &cli.IntFlag{Name: l.name, Value: l.def, Usage: l.usage})
	}
	return out
}

// limits are the values of the limit flags, by flag name.
type limits map[string]int

// limitsFromFlags reads and checks the limit flags: each must be in
// [1, its protocol maximum]. Zero is refused rather than read as "no
// limit", so that a typo cannot switch a protection off.
func limitsFromFlags(get func(name string) int) (limits, error) {
	out := limits{}
	for _, l := range limitFlags {
		v := get(l.name)
		if v < 1 || v > l.max {
			return nil, fmt.Errorf("--%s %d: want 1 to %d", l.name, v, l.max)
		}
		out[l.name] = v
	}
	return out, nil
}

// options are the target options that set the limits.
func (ls limits) options() []target.Option {
	out := make([]target.Option, 0, len(limitFlags))
	for _, l := range limitFlags {
		if v, ok := ls[l.name]; ok {
			out = append(out, l.option(v))
		}
	}
	return out
}

// checkNamespaces refuses a subsystem with more namespaces than
// --max-namespaces before anything is opened; the target would refuse the
// extra ones only after the others are loaded, naming its option rather
// than the flag.
func (ls limits) checkNamespaces(subs []subsystemSpec) error {
	max, ok := ls["max-namespaces"]
	if !ok {
		return nil
	}
	for _, s := range subs {
		if len(s.Namespaces) > max {
			return fmt.Errorf("subsystem %s has %d namespaces, more than --max-namespaces %d", s.NQN, len(s.Namespaces), max)
		}
	}
	return nil
}
