package loop_test

import (
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/loop"
)

func TestConformance(t *testing.T) {
	fabric := loop.NewFabric()
	conformance.Run(t, conformance.Harness{
		NewProvider: func(t *testing.T) nprdma.Provider { return loop.New(loop.WithFabric(fabric)) },
	})
}
