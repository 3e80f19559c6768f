package dhchap

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeKeyFile(t *testing.T, path string, s *Secret, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s.Encode()+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestKeyFilesMustBeOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	s, _ := GenerateSecret(HashSHA384, 0, nil)
	path := filepath.Join(dir, "host.key")
	writeKeyFile(t, path, s, 0o600)
	got, err := ReadSecretFile(path)
	if err != nil || !got.Equal(s) {
		t.Fatalf("0600 key file: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o644} {
		writeKeyFile(t, path, s, mode)
		if _, err := ReadSecretFile(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("mode %04o: %v, want a refusal saying chmod 600", mode, err)
		}
	}
	if _, err := ReadSecretFile(dir); err == nil {
		t.Error("a directory read as a key file")
	}
	garbage := filepath.Join(dir, "garbage.key")
	os.WriteFile(garbage, []byte("DHHC-1:01:c2VjcmV0LXRoYXQtbXVzdC1ub3Qtc2hvdw==:"), 0o600)
	if _, err := ReadSecretFile(garbage); !errors.Is(err, ErrBadSecret) || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Errorf("malformed key file: %v", err)
	}
}
