package dhchap

import (
	"context"
	"testing"
)

// BenchmarkTransaction is one bidirectional authentication, both sides in
// this process, per DH group: what authenticating a queue costs in CPU.
func BenchmarkTransaction(b *testing.B) {
	host, ctrl := mustSecret(b, HashSHA256), mustSecret(b, HashSHA256)
	for _, g := range []DHGroupID{DHGroupNull, DHGroupFFDHE2048, DHGroupFFDHE4096, DHGroupFFDHE8192} {
		b.Run(g.String(), func(b *testing.B) {
			h, _ := NewHost(testHost, testSub, host, ctrl)
			c := NewController(testHost, testSub, fixedCreds(Credentials{Host: host, Controller: ctrl}), WithDHGroups(g))
			x := &direct{c: c}
			for i := 0; i < b.N; i++ {
				if _, err := h.Authenticate(context.Background(), x, uint16(i)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
