package dhchap

import (
	"bytes"
	"errors"
	"testing"
)

func TestDHAgreementInEveryGroup(t *testing.T) {
	for _, id := range []DHGroupID{DHGroupFFDHE2048, DHGroupFFDHE3072, DHGroupFFDHE4096, DHGroupFFDHE6144, DHGroupFFDHE8192} {
		a, err := GenerateDHKey(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := GenerateDHKey(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.PublicValue()) != id.Size() || bytes.Equal(a.PublicValue(), b.PublicValue()) {
			t.Fatalf("%v: public values of %d bytes, equal %v", id, len(a.PublicValue()), bytes.Equal(a.PublicValue(), b.PublicValue()))
		}
		sa, err := a.SessionKey(b.PublicValue())
		if err != nil {
			t.Fatal(err)
		}
		sb, err := b.SessionKey(a.PublicValue())
		if err != nil || !bytes.Equal(sa, sb) || len(sa) != id.Size() {
			t.Fatalf("%v: session keys differ (%v)", id, err)
		}
	}
}

func TestDHRejectsDegenerateValues(t *testing.T) {
	k, err := GenerateDHKey(DHGroupFFDHE2048, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := DHGroupFFDHE2048.Size()
	p := katPrime(t)
	pMinus1 := bytes.Clone(p)
	pMinus1[n-1]--
	one := make([]byte, n)
	one[n-1] = 1
	for name, y := range map[string][]byte{
		"zero": make([]byte, n), "one": one, "p-1": pMinus1, "p": p,
		"all ones": bytes.Repeat([]byte{0xff}, n), "short": k.PublicValue()[1:], "long": append(k.PublicValue(), 0),
	} {
		if _, err := k.SessionKey(y); !errors.Is(err, ErrBadDHValue) {
			t.Errorf("%s: %v, want ErrBadDHValue", name, err)
		}
	}
	if _, err := GenerateDHKey(DHGroupNull, nil); err == nil {
		t.Error("a key in the null group")
	}
}

func katPrime(t *testing.T) []byte {
	t.Helper()
	g := groups[DHGroupFFDHE2048]
	g.init()
	return g.m.Nat().Bytes(g.m)
}
