package command

import (
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v2"
)

// LogLevelFlag is --log-level, at level def unless given.
func LogLevelFlag(def string) cli.Flag {
	return &cli.StringFlag{Name: "log-level", Value: def, Usage: "log level: debug, info, warn, error"}
}

// Logger is the log of a command: text on the app's ErrWriter (stderr), at
// the level --log-level names.
func Logger(cc *cli.Context) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(cc.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", cc.String("log-level"))
	}
	return slog.New(slog.NewTextHandler(cc.App.ErrWriter, &slog.HandlerOptions{Level: l})), nil
}
