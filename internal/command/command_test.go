package command_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/internal/command"
)

// run runs an app with flags whose action is action, and returns what it
// wrote to ErrWriter and its error.
func run(t *testing.T, flags []cli.Flag, action cli.ActionFunc, args ...string) (string, error) {
	t.Helper()
	var errOut bytes.Buffer
	app := &cli.App{Name: "test", Flags: flags, Action: action, Writer: io.Discard, ErrWriter: &errOut}
	err := app.Run(append([]string{"test"}, args...))
	return errOut.String(), err
}

func TestLogger(t *testing.T) {
	logAll := func(cc *cli.Context) error {
		log, err := command.Logger(cc)
		if err != nil {
			return err
		}
		log.Debug("at-debug")
		log.Info("at-info")
		log.Warn("at-warn")
		return nil
	}
	flags := []cli.Flag{command.LogLevelFlag("warn")}
	for _, c := range []struct {
		args       []string
		shown, not []string
	}{
		{nil, []string{"at-warn"}, []string{"at-info", "at-debug"}},
		{[]string{"--log-level", "info"}, []string{"at-info", "at-warn"}, []string{"at-debug"}},
		{[]string{"--log-level", "debug"}, []string{"at-debug", "at-info", "at-warn"}, nil},
	} {
		out, err := run(t, flags, logAll, c.args...)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		for _, s := range c.shown {
			if !strings.Contains(out, s) {
				t.Errorf("%q: %s not logged: %q", c.args, s, out)
			}
		}
		for _, s := range c.not {
			if strings.Contains(out, s) {
				t.Errorf("%q: %s logged: %q", c.args, s, out)
			}
		}
	}
	if _, err := run(t, flags, logAll, "--log-level", "loud"); err == nil || !strings.Contains(err.Error(), `--log-level "loud"`) {
		t.Fatalf("--log-level loud: %v, want an error naming the flag", err)
	}
}

func TestUnknownCommand(t *testing.T) {
	var errOut bytes.Buffer
	app := &cli.App{Name: "tool", ErrWriter: &errOut, CommandNotFound: command.UnknownCommand, HideHelpCommand: true,
		Commands: []*cli.Command{{Name: "attach"}, {Name: "secret", Hidden: true}, {Name: "list"}}}
	code := -1
	defer func(old func(int)) { cli.OsExiter = old }(cli.OsExiter)
	cli.OsExiter = func(c int) { code = c }
	app.Run([]string{"tool", "atach"})
	want := `tool: unknown command "atach" (commands: attach, list; --help for more)` + "\n"
	if code != 2 || errOut.String() != want {
		t.Fatalf("exit %d, said %q; want exit 2, %q", code, errOut.String(), want)
	}
}

func TestServeMetrics(t *testing.T) {
	reg := command.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "command_test_total"})
	reg.MustRegister(c)
	c.Add(7)
	e, err := command.ServeMetrics("127.0.0.1:0", command.MetricsHandler(reg))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.URL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"command_test_total 7", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if !strings.HasPrefix(e.Addr(), "127.0.0.1:") || strings.HasSuffix(e.Addr(), ":0") {
		t.Errorf("Addr %q: want the port listened on", e.Addr())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(e.URL("/metrics")); err == nil {
		resp.Body.Close()
		t.Fatal("the endpoint answers after Close")
	}
	if _, err := command.ServeMetrics("127.0.0.1:-1", command.MetricsHandler(reg)); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("a bad address: %v, want an error naming --metrics-addr", err)
	}
}

func TestSizeFlag(t *testing.T) {
	var got int64
	read := func(cc *cli.Context) (err error) {
		got, err = command.SizeFlag(cc, "size")
		return err
	}
	flags := []cli.Flag{&cli.StringFlag{Name: "size"}}
	for _, c := range []struct {
		args []string
		want int64
	}{
		{nil, 0},
		{[]string{"--size", "4GiB"}, 4 << 30},
		{[]string{"--size", "1GB"}, 1e9},
		{[]string{"--size", "512"}, 512},
	} {
		if _, err := run(t, flags, read, c.args...); err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.args, got, err, c.want)
		}
	}
	_, err := run(t, flags, read, "--size", "4 parsecs")
	if err == nil || !strings.HasPrefix(err.Error(), `--size: size "4 parsecs"`) {
		t.Fatalf("a bad size: %v, want an error naming the flag and the value", err)
	}
}
