package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/lab"
	"github.com/urfave/cli/v2"
)

// runApp runs the CLI in-process and returns its output and the exit
// code it asked for (0 if none).
func runApp(t *testing.T, args ...string) (stdout, stderr string, code int, err error) {
	t.Helper()
	defer func(old func(int)) { cli.OsExiter = old }(cli.OsExiter)
	cli.OsExiter = func(c int) { code = c }
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	err = app.Run(append([]string{"nprdma-lab"}, args...))
	return out.String(), errOut.String(), code, err
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	for _, c := range newApp().Commands {
		out, _, _, err := runApp(t, c.Name, "--help")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range c.Flags {
			for _, name := range f.Names() {
				if len(name) > 1 && name != "help" && !strings.Contains(out, "--"+name) {
					t.Errorf("%s --help does not mention --%s", c.Name, name)
				}
			}
		}
	}
}

func TestBadArguments(t *testing.T) {
	script := filepath.Join(t.TempDir(), "s.sh")
	os.WriteFile(script, []byte("true\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--forward", "8080", script}, "HOSTPORT:GUESTPORT"},
		{[]string{"run", "--env", "NOVALUE", script}, "KEY=VALUE"},
		{[]string{"run"}, "one SCRIPT"},
	} {
		if _, _, _, err := runApp(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v; want one mentioning %q", tc.args, err, tc.want)
		}
	}
	if _, stderr, code, _ := runApp(t, "boot"); code != 2 || !strings.Contains(stderr, "unknown command") {
		t.Errorf("unknown command: exit %d, %q", code, stderr)
	}
}

// `nprdma-lab run` exits with the script's status and prints its output.
func TestGuestRunCommand(t *testing.T) {
	lab.Require(t)
	script := filepath.Join(t.TempDir(), "s.sh")
	os.WriteFile(script, []byte("step hello\necho hello from $(uname -r)\nstep fail\nexit 3\n"), 0o644)
	stdout, stderr, code, err := runApp(t, "run", "--quiet", "--modules", "nbd", "--env", "A=b", script)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 || !strings.Contains(stdout, "hello from 6.12") || !strings.Contains(stderr, `failed in step "fail"`) {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
