package dhchap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Fuzz targets for every decoder of a message from the network, and for
// the two state machines fed arbitrary messages. The seed corpora are
// committed in testdata/fuzz/<name>/ (NPRDMA_WRITE_FUZZ_SEEDS=1 go test
// -run TestWriteFuzzSeeds ./nvme/dhchap writes them from the seeds below).

func messageSeeds() [][]byte {
	neg, _ := (&Negotiate{TID: 1, Hashes: DefaultHashes, DHGroups: DefaultDHGroups}).Marshal()
	twoDesc := append(bytes.Clone(neg), make([]byte, descriptorSize)...)
	twoDesc[7] = 2
	ch := (&Challenge{TID: 1, Hash: HashSHA256, DHGroup: DHGroupFFDHE2048, Seq: 9, Challenge: seqBytes(1, 32), DHValue: seqBytes(2, 256)}).Marshal()
	rep := (&Reply{TID: 1, Response: seqBytes(3, 48), Challenge: seqBytes(4, 48), Seq: 7, DHValue: seqBytes(5, 16)}).Marshal()
	s1 := (&Success1{TID: 1, HashLen: 64, Response: seqBytes(6, 64)}).Marshal()
	s2 := (&Success2{TID: 1}).Marshal()
	f1 := (&Failure{ID: MsgFailure1, TID: 1, Reason: ReasonFailed, Explanation: ExplanationFailed}).Marshal()
	f2 := (&Failure{ID: MsgFailure2, TID: 1, Reason: ReasonFailed, Explanation: ExplanationIncorrectPayload}).Marshal()
	return [][]byte{neg, twoDesc, ch, rep, s1, s2, f1, f2, ch[:20], append(rep, make([]byte, 100)...)}
}

// FuzzMessages: no decoder panics; what one accepts re-encodes to bytes it
// decodes to the same message.
func FuzzMessages(f *testing.F) {
	for _, s := range messageSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = PeekHeader(b)
		var n Negotiate
		if n.Unmarshal(b) == nil {
			again, err := n.Marshal()
			var n2 Negotiate
			if err != nil || n2.Unmarshal(again) != nil || fmt.Sprint(n2) != fmt.Sprint(n) {
				t.Fatalf("negotiate round trip: %+v / %+v (%v)", n, n2, err)
			}
		}
		var c Challenge
		if c.Unmarshal(b) == nil {
			var c2 Challenge
			if c2.Unmarshal(c.Marshal()) != nil || fmt.Sprint(c2) != fmt.Sprint(c) {
				t.Fatal("challenge round trip")
			}
		}
		var r Reply
		if r.Unmarshal(b) == nil {
			var r2 Reply
			if r2.Unmarshal(r.Marshal()) != nil || fmt.Sprint(r2) != fmt.Sprint(r) {
				t.Fatal("reply round trip")
			}
		}
		var s1 Success1
		if s1.Unmarshal(b) == nil {
			var again Success1
			if again.Unmarshal(s1.Marshal()) != nil || fmt.Sprint(again) != fmt.Sprint(s1) {
				t.Fatal("success1 round trip")
			}
		}
		var s2 Success2
		if s2.Unmarshal(b) == nil {
			var again Success2
			if again.Unmarshal(s2.Marshal()) != nil || again != s2 {
				t.Fatal("success2 round trip")
			}
		}
		var fl Failure
		if fl.Unmarshal(b) == nil {
			var again Failure
			if again.Unmarshal(fl.Marshal()) != nil || again != fl {
				t.Fatal("failure round trip")
			}
		}
	})
}

// splitMessages cuts fuzz input into messages: each a length byte and
// that many bytes.
func splitMessages(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(int(b[0]), len(b)-1)
		out = append(out, b[1:1+n])
		b = b[1+n:]
	}
	return out
}

func joinMessages(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		m = m[:min(len(m), 255)]
		b = append(append(b, byte(len(m))), m...)
	}
	return b
}

// FuzzController feeds a controller arbitrary Authentication Sends, each
// followed by a Receive: it never panics, answers within the allocation,
// and never counts the queue authenticated, since nobody here knows the
// host's secret.
func FuzzController(f *testing.F) {
	seeds := messageSeeds()
	f.Add(joinMessages(seeds[0], seeds[3], seeds[5]))
	f.Add(joinMessages(seeds[0]))
	f.Add(joinMessages(seeds[6], seeds[7], seeds[0], seeds[0]))
	secret, _ := NewSecret(seqBytes(0, 32), HashSHA256)
	f.Fuzz(func(t *testing.T, b []byte) {
		c := NewController(testHost, testSub, fixedCreds(Credentials{Host: secret, Controller: secret}),
			WithDHGroups(DHGroupNull), WithRand(bytes.NewReader(bytes.Repeat([]byte{0x5a}, 1<<16))))
		for _, m := range splitMessages(b) {
			_, _ = c.Send(m)
			if out, _, err := c.Receive(ReceiveLength); err == nil && len(out) != ReceiveLength {
				t.Fatalf("answer of %d bytes for an allocation of %d", len(out), ReceiveLength)
			}
			if c.Authenticated() {
				t.Fatal("authenticated without the secret")
			}
		}
	})
}

// scripted answers a host's Receives with fuzz messages.
type scripted struct{ msgs [][]byte }

func (s *scripted) Send(context.Context, []byte) error { return nil }

func (s *scripted) Receive(context.Context, int) ([]byte, error) {
	if len(s.msgs) == 0 {
		return nil, errors.New("no more")
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

// FuzzHost answers a bidirectional host with arbitrary messages: it never
// panics and never succeeds, since nobody here knows the controller
// secret.
func FuzzHost(f *testing.F) {
	seeds := messageSeeds()
	ch := (&Challenge{TID: 3, Hash: HashSHA256, DHGroup: DHGroupNull, Seq: 9, Challenge: seqBytes(1, 32)}).Marshal()
	f.Add(joinMessages(ch, seeds[4]))
	f.Add(joinMessages(ch, (&Success1{TID: 3, HashLen: 32}).Marshal()))
	f.Add(joinMessages(seeds[6]))
	secret, _ := NewSecret(seqBytes(0, 32), HashSHA256)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, _ := NewHost(testHost, testSub, secret, secret, WithRand(bytes.NewReader(bytes.Repeat([]byte{0xa5}, 1<<16))))
		if _, err := h.Authenticate(context.Background(), &scripted{msgs: splitMessages(b)}, 3); err == nil {
			t.Fatal("authenticated a controller without its secret")
		}
	})
}

// TestWriteFuzzSeeds writes the seed corpora when NPRDMA_WRITE_FUZZ_SEEDS=1;
// otherwise it checks that every fuzz target has its committed corpus.
func TestWriteFuzzSeeds(t *testing.T) {
	seeds := messageSeeds()
	ch := (&Challenge{TID: 3, Hash: HashSHA256, DHGroup: DHGroupNull, Seq: 9, Challenge: seqBytes(1, 32)}).Marshal()
	corpora := map[string][][]byte{
		"FuzzMessages":   seeds,
		"FuzzController": {joinMessages(seeds[0], seeds[3], seeds[5]), joinMessages(seeds[0]), joinMessages(seeds[6], seeds[7], seeds[0], seeds[0])},
		"FuzzHost":       {joinMessages(ch, seeds[4]), joinMessages(ch, (&Success1{TID: 3, HashLen: 32}).Marshal()), joinMessages(seeds[6])},
	}
	write := os.Getenv("NPRDMA_WRITE_FUZZ_SEEDS") == "1"
	for name, in := range corpora {
		dir := filepath.Join("testdata", "fuzz", name)
		if !write {
			files, err := os.ReadDir(dir)
			if err != nil || len(files) < len(in) {
				t.Errorf("%s: %d committed seeds, want %d (%v); run with NPRDMA_WRITE_FUZZ_SEEDS=1", dir, len(files), len(in), err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range in {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
