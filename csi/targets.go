package csi

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/nprdma/nprdma/target/manage"
)

// Target is one nprdma-target the controller may place volumes on.
type Target struct {
	// Name names it in volume IDs: letters, digits, '.', '_', '-'. Renaming
	// a target orphans its volumes.
	Name string `json:"name"`
	// Manage is its management API: "unix:PATH" or HOST:PORT.
	Manage string `json:"manage"`
	// TokenFile holds the token of a TCP management endpoint.
	TokenFile string `json:"token_file,omitempty"`
	// Address is where hosts connect to it (its --listen).
	Address string `json:"address"`
}

// Config lists the targets (the --config file of nprdma-csi).
type Config struct {
	Targets []Target `json:"targets"`
}

// LoadConfig reads a Config from a JSON file; unknown fields are refused.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ParseTarget reads a --target flag: name=N,manage=ENDPOINT,address=ADDR[,token-file=F].
func ParseTarget(v string) (Target, error) {
	var t Target
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return t, fmt.Errorf("--target %q: %q is not key=value", v, kv)
		}
		switch k {
		case "name":
			t.Name = val
		case "manage":
			t.Manage = val
		case "address":
			t.Address = val
		case "token-file":
			t.TokenFile = val
		default:
			return t, fmt.Errorf("--target %q: unknown key %q (name, manage, address, token-file)", v, k)
		}
	}
	return t, nil
}

// targets holds the clients of the configured targets.
type targets struct {
	list    []Target
	mu      sync.Mutex
	clients map[string]*manage.Client
}

func newTargets(list []Target) (*targets, error) {
	seen := map[string]bool{}
	for _, t := range list {
		switch {
		case t.Name == "" || !nameRule.MatchString(t.Name):
			return nil, fmt.Errorf("target %q: a name is letters, digits, '.', '_' or '-'", t.Name)
		case seen[t.Name]:
			return nil, fmt.Errorf("target %q named twice", t.Name)
		case t.Manage == "" || t.Address == "":
			return nil, fmt.Errorf("target %s: manage and address are required", t.Name)
		}
		seen[t.Name] = true
	}
	return &targets{list: list, clients: map[string]*manage.Client{}}, nil
}

func (ts *targets) byName(name string) (Target, bool) {
	for _, t := range ts.list {
		if t.Name == name {
			return t, true
		}
	}
	return Target{}, false
}

// client is the management client of t (made once).
func (ts *targets) client(t Target) (*manage.Client, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if c := ts.clients[t.Name]; c != nil {
		return c, nil
	}
	c, err := manage.Dial(t.Manage, t.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", t.Name, err)
	}
	ts.clients[t.Name] = c
	return c, nil
}

// inventory is one target's inventory, or why it could not be had.
type inventory struct {
	target Target
	inv    manage.Inventory
	err    error
}

// inventories asks every target for its inventory, at once.
func (ts *targets) inventories(ctx context.Context) []inventory {
	out := make([]inventory, len(ts.list))
	var wg sync.WaitGroup
	for i, t := range ts.list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].target = t
			c, err := ts.client(t)
			if err != nil {
				out[i].err = err
				return
			}
			out[i].inv, out[i].err = c.Inventory(ctx)
		}()
	}
	wg.Wait()
	return out
}
