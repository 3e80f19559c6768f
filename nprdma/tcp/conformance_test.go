package tcp_test

import (
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

func TestConformance(t *testing.T) {
	h := conformance.Harness{
		NewProvider: func(t *testing.T) link.Provider { return tcp.New() },
		ListenAddr:  "127.0.0.1:0",
	}
	conformance.Run(t, h)
	// Busy-polling CQs: waiters spin on the socket before they block.
	t.Run("BusyPoll", func(t *testing.T) {
		h.CQOptions = []nprdma.CQOption{nprdma.WithBusyPoll(200 * time.Microsecond)}
		conformance.Run(t, h)
	})
}
