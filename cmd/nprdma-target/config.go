package main

import (
	"encoding/json"
	"fmt"
	"github.com/nprdma/nprdma/internal/sizes"
	"os"
	"strconv"
	"strings"
)

// fileConfig is the --config file: several subsystems and namespaces.
//
//	{"subsystems": [{"nqn": "nqn.2024-01.io.nprdma:db",
//	                 "allow_hosts": ["nqn.2014-08.org.nvmexpress:uuid:..."],
//	                 "allow_any_host": false,
//	                 "dhchap": [{"host": "nqn.2014-08.org.nvmexpress:uuid:...",
//	                             "secret_file": "/etc/nprdma/host1.key",
//	                             "ctrl_secret_file": "/etc/nprdma/ctrl1.key"}],
//	                 "namespaces": [{"nsid": 1, "backing": "/dev/nvme0n1", "budget": "2GiB"}]}]}
type fileConfig struct {
	Subsystems []subsystemSpec `json:"subsystems"`
}

type subsystemSpec struct {
	NQN          string   `json:"nqn"`
	AllowHosts   []string `json:"allow_hosts"`
	AllowAnyHost bool     `json:"allow_any_host"`
	// DHCHAP lists the hosts that must authenticate, with their key files.
	DHCHAP     []hostSecretSpec `json:"dhchap"`
	Namespaces []namespaceSpec  `json:"namespaces"`
}

type namespaceSpec struct {
	NSID    uint32 `json:"nsid"`
	Backing string `json:"backing"`
	// Budget is this namespace's DRAM budget ("1GiB"); without it the
	// namespace gets a share of --memory proportional to its size.
	Budget string `json:"budget"`
	budget int64
}

func loadConfig(path string) (fileConfig, error) {
	var c fileConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	if len(c.Subsystems) == 0 {
		return c, fmt.Errorf("config %s: no subsystem (a target with nothing to serve)", path)
	}
	for i := range c.Subsystems {
		s := &c.Subsystems[i]
		if s.NQN == "" {
			return c, fmt.Errorf("config %s: subsystem %d has no nqn", path, i)
		}
		if len(s.Namespaces) == 0 {
			return c, fmt.Errorf("config %s: subsystem %s has no namespace", path, s.NQN)
		}
		if s.AllowAnyHost && len(s.AllowHosts) > 0 {
			return c, fmt.Errorf("config %s: subsystem %s: allow_hosts and allow_any_host exclude each other", path, s.NQN)
		}
		seen := map[string]bool{}
		for _, h := range s.DHCHAP {
			if h.Host == "" || h.SecretFile == "" {
				return c, fmt.Errorf("config %s: subsystem %s: a dhchap entry needs host and secret_file", path, s.NQN)
			}
			if seen[h.Host] {
				return c, fmt.Errorf("config %s: subsystem %s: dhchap host %s given twice", path, s.NQN, h.Host)
			}
			seen[h.Host] = true
		}
		for j := range s.Namespaces {
			ns := &s.Namespaces[j]
			if ns.Backing == "" {
				return c, fmt.Errorf("config %s: subsystem %s namespace %d has no backing", path, s.NQN, j)
			}
			if ns.Budget != "" {
				if ns.budget, err = sizes.Parse(ns.Budget); err != nil {
					return c, fmt.Errorf("config %s: subsystem %s: %w", path, s.NQN, err)
				}
			}
		}
	}
	return c, nil
}

// parseBacking reads a --backing value: PATH[,nsid=N][,budget=SIZE].
func parseBacking(v string) (namespaceSpec, error) {
	parts := strings.Split(v, ",")
	ns := namespaceSpec{Backing: parts[0]}
	if ns.Backing == "" {
		return ns, fmt.Errorf("--backing %q: no path", v)
	}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return ns, fmt.Errorf("--backing %q: %q is not key=value", v, p)
		}
		switch k {
		case "nsid":
			n, err := strconv.ParseUint(val, 10, 32)
			if err != nil || n == 0 || n == 0xffffffff {
				return ns, fmt.Errorf("--backing %q: nsid %q is not in 1..4294967294", v, val)
			}
			ns.NSID = uint32(n)
		case "budget":
			b, err := sizes.Parse(val)
			if err != nil {
				return ns, fmt.Errorf("--backing %q: %w", v, err)
			}
			ns.budget, ns.Budget = b, val
		default:
			return ns, fmt.Errorf("--backing %q: unknown option %q (nsid, budget)", v, k)
		}
	}
	return ns, nil
}
