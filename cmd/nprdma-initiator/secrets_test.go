package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/nvme/dhchap"
	"github.com/nprdma/nprdma/target"
)

type oneHostKeyring struct {
	host string
	c    dhchap.Credentials
}

func (k oneHostKeyring) DHCHAP(sub, host string) (dhchap.Credentials, bool) {
	return k.c, sub == subA && host == k.host
}

// TestDiscoverWithSecrets: a subsystem that requires authentication lists
// its namespaces to a host that gives its secret (by file, by value or in
// the environment, one- or bidirectionally) and says why it cannot to one
// that gives none or a wrong one.
func TestDiscoverWithSecrets(t *testing.T) {
	host := "nqn.2024-01.io.nprdma:secret-host"
	hs, _ := dhchap.GenerateSecret(dhchap.HashSHA256, 0, nil)
	cs, _ := dhchap.GenerateSecret(dhchap.HashSHA384, 0, nil)
	addr := startTarget(t, host, target.WithKeyring(oneHostKeyring{host, dhchap.Credentials{Host: hs, Controller: cs}}))
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	dir := t.TempDir()
	hostFile, ctrlFile := filepath.Join(dir, "host.key"), filepath.Join(dir, "ctrl.key")
	os.WriteFile(hostFile, []byte(hs.Encode()+"\n"), 0o600)
	os.WriteFile(ctrlFile, []byte(cs.Encode()+"\n"), 0o600)
	discover := func(args ...string) Discovery {
		t.Helper()
		var d Discovery
		out := runApp(t, append(append([]string{"--hostnqn", host}, args...), "discover", "--target", addr, "--json")...)
		if err := json.Unmarshal([]byte(out), &d); err != nil || len(d.Subsystems) != 1 {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return d
	}
	for _, args := range [][]string{
		{"--dhchap-secret-file", hostFile},
		{"--dhchap-secret", hs.Encode()},
		{"--dhchap-secret-file", hostFile, "--dhchap-ctrl-secret-file", ctrlFile},
	} {
		if d := discover(args...); d.Subsystems[0].Error != "" || len(d.Subsystems[0].Namespaces) != 2 {
			t.Errorf("%v: %+v", args[:1], d.Subsystems[0])
		}
	}
	t.Setenv(envDHCHAPSecret, hs.Encode())
	if d := discover(); d.Subsystems[0].Error != "" || len(d.Subsystems[0].Namespaces) != 2 {
		t.Errorf("secret in $%s: %+v", envDHCHAPSecret, d.Subsystems[0])
	}
	os.Unsetenv(envDHCHAPSecret)
	wrong, _ := dhchap.GenerateSecret(dhchap.HashSHA256, 0, nil)
	for want, args := range map[string][]string{
		"requires DH-HMAC-CHAP": nil,
		"refused host":          {"--dhchap-secret", wrong.Encode()},
		"did not prove":         {"--dhchap-secret", hs.Encode(), "--dhchap-ctrl-secret", wrong.Encode()},
	} {
		if d := discover(args...); !strings.Contains(d.Subsystems[0].Error, want) || len(d.Subsystems[0].Namespaces) != 0 {
			t.Errorf("%v: error %q, want it to say %q", args, d.Subsystems[0].Error, want)
		}
	}
	// Bad flags are refused before connecting, without quoting a secret.
	os.Chmod(hostFile, 0o644)
	for _, args := range [][]string{{"--dhchap-secret-file", hostFile}, {"--dhchap-secret", "DHHC-1:01:bm90LWEta2V5:"},
		{"--dhchap-ctrl-secret-file", ctrlFile}, {"--dhchap-secret", hs.Encode(), "--dhchap-secret-file", ctrlFile}} {
		a := newApp()
		var out bytes.Buffer
		a.Writer, a.ErrWriter = &out, &out
		err := a.Run(append(append([]string{"nprdma-initiator", "--hostnqn", host}, args...), "discover", "--target", addr))
		if err == nil || strings.Contains(err.Error(), "bm90LWEta2V5") || strings.Contains(err.Error(), hs.Encode()[10:30]) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
