package dhchap

import (
	"fmt"
	"io"
	"os"
)

// maxKeyFile bounds what is read of a key file (a secret is under 100
// bytes).
const maxKeyFile = 4096

// ReadSecretFile reads a secret in the textual form from a key file that
// only its owner may read or write: a file open to group or others is
// refused, as ssh refuses such a private key, and so is anything but a
// regular file. The error never quotes the file's content.
func ReadSecretFile(path string) (*Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s is open to group or others (mode %04o): make it owner-only (chmod 600)", path, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("key file %s is larger than a secret (%d bytes or more)", path, maxKeyFile)
	}
	s, err := ParseSecret(string(b))
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return s, nil
}
