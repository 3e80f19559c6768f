package loop_test

import (
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/loop"
)

func TestConformance(t *testing.T) {
	fabric := loop.NewFabric()
	h := conformance.Harness{
		NewProvider: func(t *testing.T) link.Provider { return loop.New(loop.WithFabric(fabric)) },
	}
	conformance.Run(t, h)
	t.Run("BusyPoll", func(t *testing.T) {
		h.CQOptions = []nprdma.CQOption{nprdma.WithBusyPoll(200 * time.Microsecond)}
		conformance.Run(t, h)
	})
}
