package shm_test

import (
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/shm"
)

func TestConformance(t *testing.T) {
	h := conformance.Harness{
		NewProvider: func(t *testing.T) nprdma.Provider { return shm.New() },
	}
	conformance.Run(t, h)
	t.Run("BusyPoll", func(t *testing.T) {
		h.CQOptions = []nprdma.CQOption{nprdma.WithBusyPoll(200 * time.Microsecond)}
		conformance.Run(t, h)
	})
}
