package nprdma

import (
	"context"
	"strings"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Schemes is a Provider that gives each address to the provider of its
// scheme — the text before the first ':' of an address such as
// "unix:/run/nprdma/target.sock" — and every other address to a default
// provider, so that one device listens and connects on several transports
// at once (a target serving tcp hosts and, over nprdma/shm, initiators on
// its own host). Its name is the default provider's.
type Schemes struct {
	def    link.Provider
	scheme map[string]link.Provider
}

// NewSchemes returns a provider that uses byScheme[s] for addresses
// "s:..." and def for the rest.
func NewSchemes(def link.Provider, byScheme map[string]link.Provider) *Schemes {
	m := make(map[string]link.Provider, len(byScheme))
	for s, p := range byScheme {
		m[s] = p
	}
	return &Schemes{def: def, scheme: m}
}

// For is the provider that serves addr.
func (s *Schemes) For(addr string) link.Provider {
	if name, _, ok := strings.Cut(addr, ":"); ok {
		if p := s.scheme[name]; p != nil {
			return p
		}
	}
	return s.def
}

// Name implements Provider.
func (s *Schemes) Name() string { return s.def.Name() }

// Listen implements Provider.
func (s *Schemes) Listen(addr string) (link.Listener, error) { return s.For(addr).Listen(addr) }

// Dial implements Provider.
func (s *Schemes) Dial(ctx context.Context, addr string, hello link.Hello) (link.Link, link.Hello, error) {
	return s.For(addr).Dial(ctx, addr, hello)
}
