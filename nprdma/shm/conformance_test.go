package shm_test

import (
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/shm"
)

func TestConformance(t *testing.T) {
	h := conformance.Harness{
		NewProvider:   func(t *testing.T) link.Provider { return shm.New() },
		SharesInPlace: true,
	}
	conformance.Run(t, h)
	t.Run("BusyPoll", func(t *testing.T) {
		h.CQOptions = []nprdma.CQOption{nprdma.WithBusyPoll(200 * time.Microsecond)}
		conformance.Run(t, h)
	})
	t.Run("Pread", func(t *testing.T) {
		h.NewProvider = func(t *testing.T) link.Provider { return shm.New(shm.WithInPlaceReads(shm.InPlacePread)) }
		conformance.Run(t, h)
	})
}
