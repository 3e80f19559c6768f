package manage

import (
	"fmt"
	"os"
	"strings"
)

// MinTokenBytes is the shortest token accepted: a TCP endpoint guarded by
// a short one is not guarded.
const MinTokenBytes = 16

// ReadTokenFile reads the token of the TCP endpoint: the file's content,
// surrounding white space removed. The file must be a regular file that
// only its owner may read or write (mode 0600 or 0400), and the token at
// least MinTokenBytes long.
func ReadTokenFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("token file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("token file %s may be read or written by others than its owner (mode %04o): chmod 600 %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < MinTokenBytes {
		return "", fmt.Errorf("token file %s holds %d bytes of token, at least %d wanted (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(tok), MinTokenBytes, path)
	}
	return tok, nil
}
