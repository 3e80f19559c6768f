package command

import (
	"fmt"

	"github.com/nprdma/nprdma/internal/sizes"
	"github.com/urfave/cli/v2"
)

// SizeFlag is the size flag name holds, in bytes (sizes.Parse: "4GiB",
// "512MiB", "1G"); an empty value is 0. Its error names the flag.
func SizeFlag(cc *cli.Context, name string) (int64, error) {
	v := cc.String(name)
	if v == "" {
		return 0, nil
	}
	n, err := sizes.Parse(v)
	if err != nil {
		return 0, fmt.Errorf("--%s: %w", name, err)
	}
	return n, nil
}
