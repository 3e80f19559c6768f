package tcp_test

import (
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		NewProvider: func(t *testing.T) nprdma.Provider { return tcp.New() },
		ListenAddr:  "127.0.0.1:0",
	})
}
