package dhchap

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestSecretRoundTripAndErrors(t *testing.T) {
	for _, h := range []HashID{HashNone, HashSHA256, HashSHA384, HashSHA512} {
		for _, n := range KeyLengths {
			s, err := GenerateSecret(h, n, nil)
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseSecret(s.Encode())
			if err != nil || !back.Equal(s) || back.KeyLen() != n || back.Hash() != h {
				t.Fatalf("%v/%d: round trip: %v", h, n, err)
			}
			if !strings.HasPrefix(s.Encode(), fmt.Sprintf("DHHC-1:%02d:", h)) || !strings.HasSuffix(s.Encode(), ":") {
				t.Fatalf("textual form %q", s.Encode())
			}
		}
	}
	good := kat["secret1"]
	b64 := strings.TrimSuffix(strings.TrimPrefix(good, "DHHC-1:01:"), ":")
	raw, _ := base64.StdEncoding.DecodeString(b64)
	raw[3] ^= 1
	flipped := "DHHC-1:01:" + base64.StdEncoding.EncodeToString(raw) + ":"
	for name, in := range map[string]string{
		"no prefix":   strings.TrimPrefix(good, "DHHC-1:"),
		"hash 04":     strings.Replace(good, ":01:", ":04:", 1),
		"hash 1":      strings.Replace(good, ":01:", ":1:", 1),
		"not base64":  "DHHC-1:01:!!!!:",
		"short key":   "DHHC-1:00:" + base64.StdEncoding.EncodeToString(make([]byte, 20)) + ":",
		"crc":         flipped,
		"empty":       "",
		"only prefix": "DHHC-1:",
	} {
		if _, err := ParseSecret(in); !errors.Is(err, ErrBadSecret) {
			t.Errorf("%s: %v, want ErrBadSecret", name, err)
		} else if strings.Contains(err.Error(), b64[:12]) {
			t.Errorf("%s: the error quotes the secret: %v", name, err)
		}
	}
	if _, err := ParseSecret(strings.TrimSuffix(good, ":")); err != nil {
		t.Errorf("without the final colon: %v", err)
	}
	if _, err := GenerateSecret(HashSHA256, 40, nil); !errors.Is(err, ErrBadSecret) {
		t.Errorf("key length 40: %v", err)
	}
	if s, _ := GenerateSecret(HashSHA512, 0, nil); s.KeyLen() != 64 {
		t.Errorf("default key length for SHA-512: %d", s.KeyLen())
	}
}

// TestSecretNeverPrints formats a secret every way a log line or an error
// could and looks for its key, in base64 and in hex.
func TestSecretNeverPrints(t *testing.T) {
	s, err := ParseSecret(kat["secret1"])
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "secret", s, "creds", Credentials{Host: s})
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "secret", s)
	out := fmt.Sprintf("%v %s %+v %#v %q %x %X %d", s, s, s, s, s, s, s, s) + fmt.Sprint(s) + fmt.Sprintf("%v %+v", Credentials{Host: s}, &Credentials{Host: s}) + logged.String()
	b64 := strings.TrimSuffix(strings.TrimPrefix(kat["secret1"], "DHHC-1:01:"), ":")
	for _, leak := range []string{b64[:16], "000102030405", "AAECAwQF"} {
		if strings.Contains(out, leak) {
			t.Fatalf("the key shows in %q", out)
		}
	}
	if !strings.Contains(out, "DHHC-1:01:<redacted>") {
		t.Fatalf("no redacted form in %q", out)
	}
}
